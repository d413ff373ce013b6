// An example kernel plugin: "rope_hf" (rotary embeddings, Hugging Face rotate_half layout) with
// AVX2, eight pairs at a time. Build it as a shared library and load it with
//     ctitan train --override.imports build/examples/kernels/librope_hf_avx2.so ...
// ctitan checks it against the built-in kernel before trusting it (`ctitan check-kernels`);
// rope's tolerance is tight, so this kernel does exactly the built-in's float operations.
//
// For each head vector x of length D, with h = D/2, c = cos[t][i], s = sin[t][i], i < h:
//     out[i] = x[i] c - x[i+h] s,     out[i+h] = x[i+h] c + x[i] s
// and the backward is the same with -s.
#include <immintrin.h>

#include <ctitan/plugin.h>

// Problems smaller than this run on one thread: starting a team costs more than the work.
#define PAR_MIN 32768

// Proof that this code ran: ctitan reads these after training and reports them.
static uint64_t forward_calls, backward_calls;

// One position: its H head vectors, all rotated by the same angles c[i], s[i].
// target("avx2") enables the intrinsics for this function only, so the library still loads on
// any x86-64 CPU and init can refuse politely. FMA is deliberately NOT enabled: a fused
// multiply-add rounds once where the built-in rounds twice, and rope must match bit for bit,
// so the compiler must not be allowed to contract mul + sub into an FMA.
__attribute__((target("avx2"))) static void rope_position(float *out, const float *inp,
                                                          const float *c, const float *s, int H,
                                                          int D, float sign) {
    const int half = D / 2;
    const __m256 vsign = _mm256_set1_ps(sign);
    for (int hd = 0; hd < H; hd++) {
        // Both halves of a pair are loaded before either is stored: out may alias inp.
        const float *x = inp + (size_t)hd * D;
        float *y = out + (size_t)hd * D;
        int i = 0;
        for (; i + 8 <= half; i += 8) {
            const __m256 x1 = _mm256_loadu_ps(x + i), x2 = _mm256_loadu_ps(x + i + half);
            const __m256 vc = _mm256_loadu_ps(c + i);
            const __m256 si = _mm256_mul_ps(vsign, _mm256_loadu_ps(s + i));
            _mm256_storeu_ps(y + i, _mm256_sub_ps(_mm256_mul_ps(x1, vc), _mm256_mul_ps(x2, si)));
            _mm256_storeu_ps(y + i + half,
                             _mm256_add_ps(_mm256_mul_ps(x2, vc), _mm256_mul_ps(x1, si)));
        }
        for (; i < half; i++) { // the tail when D/2 is not a multiple of 8
            const float x1 = x[i], x2 = x[i + half], si = sign * s[i];
            y[i] = x1 * c[i] - x2 * si;
            y[i + half] = x2 * c[i] + x1 * si;
        }
    }
}

// sign = +1 rotates by +angle (forward), -1 by -angle (backward). The OpenMP loop stays out of
// the target("avx2") function: not every compiler passes the attribute on to the outlined body.
static void rope_rotate(float *out, const float *inp, const float *cos, const float *sin, int B,
                        int T, int H, int D, float sign) {
    const int half = D / 2;
#pragma omp parallel for schedule(static) if ((int64_t)B * T * H * D >= PAR_MIN)
    for (int bt = 0; bt < B * T; bt++) {
        const size_t row = (size_t)bt * H * D, t = (size_t)(bt % T);
        rope_position(out + row, inp + row, cos + t * half, sin + t * half, H, D, sign);
    }
}

static void rope_forward(float *out, const float *inp, const float *cos, const float *sin, int B,
                         int T, int H, int D) {
    forward_calls++;
    rope_rotate(out, inp, cos, sin, B, T, H, D, 1.0f);
}

static void rope_backward(float *dinp, const float *dout, const float *cos, const float *sin, int B,
                          int T, int H, int D) {
    backward_calls++;
    rope_rotate(dinp, dout, cos, sin, B, T, H, D, -1.0f);
}

// The one exported symbol (the build hides everything else).
CTITAN_PLUGIN_EXPORT int ctitan_plugin_init(uint32_t api_version, ctitan_registry *reg) {
    (void)api_version; // ctitan checks the version we were built against in register_op
    if (!__builtin_cpu_supports("avx2")) {
        ctitan_plugin_error(reg, "this CPU has no AVX2");
        return 1;
    }
    // The casts are safe: ctitan casts back to the op's types (ctitan_rope_hf_*_fn).
    if (ctitan_register_op(reg, "rope_hf", (ctitan_fn)rope_forward, (ctitan_fn)rope_backward, 0))
        return 1;
    return ctitan_register_counters(reg, "rope_hf", &forward_calls, &backward_calls) ? 1 : 0;
}
