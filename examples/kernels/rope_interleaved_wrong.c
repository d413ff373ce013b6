// WRONG ON PURPOSE: the test suite loads this plugin to prove that ctitan refuses a kernel that
// disagrees with its built-in one. Do not use it.
//
// It implements "rope_hf" with the GPT-J / original Meta layout, rotating interleaved
// neighbours (x[2i], x[2i+1]) by cos/sin[t][i], where Hugging Face's rotate_half rotates
// (x[i], x[i+D/2]). Both are valid rotations (forward and backward here are exact inverses of
// each other), so nothing blows up: the model just trains with scrambled positions. This is the
// classic mistake when porting Meta checkpoints to HF ones (whose q/k weights are permuted to
// match rotate_half), and exactly what a parity check against the built-in kernel catches.
#include <ctitan/plugin.h>

static uint64_t forward_calls, backward_calls;

static void rotate_interleaved(float *out, const float *inp, const float *cos, const float *sin,
                               int B, int T, int H, int D, float sign) {
    const int half = D / 2;
    for (int bt = 0; bt < B * T; bt++) {
        const float *c = cos + (size_t)(bt % T) * half;
        const float *s = sin + (size_t)(bt % T) * half;
        for (int h = 0; h < H; h++) {
            const float *x = inp + ((size_t)bt * H + h) * D;
            float *y = out + ((size_t)bt * H + h) * D;
            for (int i = 0; i < half; i++) {
                const float x1 = x[2 * i], x2 = x[2 * i + 1], si = sign * s[i];
                y[2 * i] = x1 * c[i] - x2 * si;
                y[2 * i + 1] = x2 * c[i] + x1 * si;
            }
        }
    }
}

static void rope_forward(float *out, const float *inp, const float *cos, const float *sin, int B,
                         int T, int H, int D) {
    forward_calls++;
    rotate_interleaved(out, inp, cos, sin, B, T, H, D, 1.0f);
}

static void rope_backward(float *dinp, const float *dout, const float *cos, const float *sin, int B,
                          int T, int H, int D) {
    backward_calls++;
    rotate_interleaved(dinp, dout, cos, sin, B, T, H, D, -1.0f);
}

CTITAN_PLUGIN_EXPORT int ctitan_plugin_init(uint32_t api_version, ctitan_registry *reg) {
    (void)api_version;
    if (ctitan_register_op(reg, "rope_hf", (ctitan_fn)rope_forward, (ctitan_fn)rope_backward, 0))
        return 1;
    return ctitan_register_counters(reg, "rope_hf", &forward_calls, &backward_calls) ? 1 : 0;
}
