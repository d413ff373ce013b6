// An example kernel plugin: "rmsnorm" written as fused AVX2+FMA row kernels.
//   forward:  per row, one pass for the sum of squares, one writing out (and rstd).
//   backward: one pass over the rows computes each row's dot product, its dinp, and its share
//             of dweight, instead of the built-in's separate dweight and dinp sweeps.
// Sums along a row are fp32 (8-lane accumulators): with C in the thousands that stays within
// a few ulps of the built-in's double sums, well inside rmsnorm's 1e-5 tolerance. dweight sums
// over every row of the batch (N can be 10^5), where fp32 would drift by ~sqrt(N) ulps, so it
// is accumulated in double.
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>

#include <ctitan/plugin.h>

// Problems smaller than this run on one thread: starting a team costs more than the work.
#define PAR_MIN 32768

static uint64_t forward_calls, backward_calls;

#define AVX2_FMA __attribute__((target("avx2,fma")))

AVX2_FMA static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

AVX2_FMA static void forward_row(float *y, float *rstd, const float *x, const float *w, int C,
                                 float eps) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(); // two chains hide FMA latency
    int c = 0;
    for (; c + 16 <= C; c += 16) {
        const __m256 x0 = _mm256_loadu_ps(x + c), x1 = _mm256_loadu_ps(x + c + 8);
        a0 = _mm256_fmadd_ps(x0, x0, a0);
        a1 = _mm256_fmadd_ps(x1, x1, a1);
    }
    float ss = hsum(_mm256_add_ps(a0, a1));
    for (; c < C; c++) ss += x[c] * x[c];
    const float r = 1.0f / sqrtf(ss / (float)C + eps);
    // HF's two roundings: (x * rstd) first, then the weight.
    const __m256 vr = _mm256_set1_ps(r);
    for (c = 0; c + 8 <= C; c += 8)
        _mm256_storeu_ps(y + c, _mm256_mul_ps(_mm256_loadu_ps(w + c),
                                              _mm256_mul_ps(_mm256_loadu_ps(x + c), vr)));
    for (; c < C; c++) y[c] = w[c] * (x[c] * r);
    *rstd = r;
}

// One row of the backward. With xhat = x * r and g = w * dy:
//     dx = r * (g - xhat * mean(g * xhat)),   dw += dy * xhat
// The first pass reads the whole row (dot product and dw), the second writes dx, so dx may
// alias dy. dw is the calling thread's double partial, or NULL with dwf the float dweight
// itself (the fallback when there was no memory for partials).
AVX2_FMA static void backward_row(float *dx, double *dw, float *dwf, const float *dy,
                                  const float *x, const float *w, float r, int C) {
    const __m256 vr = _mm256_set1_ps(r);
    __m256 acc = _mm256_setzero_ps();
    int c = 0;
    for (; c + 8 <= C; c += 8) {
        const __m256 d = _mm256_loadu_ps(dy + c);
        const __m256 xh = _mm256_mul_ps(_mm256_loadu_ps(x + c), vr);
        acc = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_loadu_ps(w + c), d), xh, acc);
        if (dw) { // float * float is exact in double: one rounding per term, as the built-in
            double *p = dw + c;
            _mm256_storeu_pd(p, _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(d)),
                                                _mm256_cvtps_pd(_mm256_castps256_ps128(xh)),
                                                _mm256_loadu_pd(p)));
            _mm256_storeu_pd(p + 4, _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(d, 1)),
                                                    _mm256_cvtps_pd(_mm256_extractf128_ps(xh, 1)),
                                                    _mm256_loadu_pd(p + 4)));
        } else {
            _mm256_storeu_ps(dwf + c,
                             _mm256_add_ps(_mm256_loadu_ps(dwf + c), _mm256_mul_ps(d, xh)));
        }
    }
    float dot = hsum(acc);
    for (; c < C; c++) {
        const float xh = x[c] * r;
        dot += (w[c] * dy[c]) * xh;
        if (dw)
            dw[c] += (double)dy[c] * xh;
        else
            dwf[c] += dy[c] * xh;
    }
    const float m = dot / (float)C;
    const __m256 vm = _mm256_set1_ps(m);
    for (c = 0; c + 8 <= C; c += 8) {
        const __m256 g = _mm256_mul_ps(_mm256_loadu_ps(w + c), _mm256_loadu_ps(dy + c));
        const __m256 xh = _mm256_mul_ps(_mm256_loadu_ps(x + c), vr);
        _mm256_storeu_ps(dx + c, _mm256_mul_ps(vr, _mm256_sub_ps(g, _mm256_mul_ps(xh, vm))));
    }
    for (; c < C; c++) dx[c] = r * (w[c] * dy[c] - (x[c] * r) * m);
}

static void rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int N,
                            int C, float eps) {
    forward_calls++;
#pragma omp parallel for schedule(static) if ((int64_t)N * C >= PAR_MIN)
    for (int n = 0; n < N; n++)
        forward_row(out + (size_t)n * C, rstd + n, inp + (size_t)n * C, weight, C, eps);
}

// dweight is deterministic for a given thread count: each thread sums its static block of rows
// into its own double partial, and the partials are added in thread order at the end (those of
// threads the runtime did not start stay zero).
static void rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                             const float *weight, const float *rstd, int N, int C) {
    backward_calls++;
    int nt = (int64_t)N * C >= PAR_MIN ? omp_get_max_threads() : 1;
    double *part = calloc((size_t)nt * C, sizeof *part);
    if (!part) nt = 1; // no memory: one thread, summing straight into dweight in float
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        double *dw = part ? part + (size_t)omp_get_thread_num() * C : NULL;
#pragma omp for schedule(static)
        for (int n = 0; n < N; n++) {
            const size_t o = (size_t)n * C;
            backward_row(dinp + o, dw, dweight, dout + o, inp + o, weight, rstd[n], C);
        }
    }
    if (!part) return;
    for (int c = 0; c < C; c++) {
        double s = 0.0;
        for (int t = 0; t < nt; t++) s += part[(size_t)t * C + c];
        dweight[c] += (float)s;
    }
    free(part);
}

CTITAN_PLUGIN_EXPORT int ctitan_plugin_init(uint32_t api_version, ctitan_registry *reg) {
    (void)api_version;
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
        ctitan_plugin_error(reg, "this CPU has no AVX2/FMA");
        return 1;
    }
    if (ctitan_register_op(reg, "rmsnorm", (ctitan_fn)rmsnorm_forward, (ctitan_fn)rmsnorm_backward,
                           0))
        return 1;
    return ctitan_register_counters(reg, "rmsnorm", &forward_calls, &backward_calls) ? 1 : 0;
}
