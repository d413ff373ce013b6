// Rotary embeddings, HF rotate_half style: the two halves of each head are the (re, im) pairs,
// not interleaved neighbours. For i < D/2 with h = D/2, c = cos[t][i], s = sin[t][i]:
//   out[i]   = x[i] c - x[i+h] s
//   out[i+h] = x[i+h] c + x[i] s
// Backward is the transposed (inverse) rotation. Each pair is read before it is written, so
// out may alias inp.
#include "ops/ops_cpu.h"

// sign = +1 rotates by +angle (forward), -1 by -angle (backward).
static void rope_rotate(float *out, const float *inp, const float *cos, const float *sin, int B,
                        int T, int H, int D, float sign) {
    const int half = D / 2;
#pragma omp parallel for schedule(static) if ((int64_t)B * T * H * D >= CPU_PAR_MIN)
    for (int bt = 0; bt < B * T; bt++) {
        const int t = bt % T;
        const float *c = cos + (size_t)t * half;
        const float *s = sin + (size_t)t * half;
        for (int h = 0; h < H; h++) {
            const float *x = inp + ((size_t)bt * H + h) * D;
            float *y = out + ((size_t)bt * H + h) * D;
            for (int i = 0; i < half; i++) {
                const float x1 = x[i], x2 = x[i + half], si = sign * s[i];
                y[i] = x1 * c[i] - x2 * si;
                y[i + half] = x2 * c[i] + x1 * si;
            }
        }
    }
}

void cpu_rope_forward(float *out, const float *inp, const float *cos, const float *sin, int B,
                      int T, int H, int D) {
    rope_rotate(out, inp, cos, sin, B, T, H, D, 1.0f);
}

void cpu_rope_backward(float *dinp, const float *dout, const float *cos, const float *sin, int B,
                       int T, int H, int D) {
    rope_rotate(dinp, dout, cos, sin, B, T, H, D, -1.0f);
}
