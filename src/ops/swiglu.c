// SwiGLU gate: out = silu(gate) * up, silu(g) = g * sigmoid(g) computed as torch does,
// g / (1 + exp(-g)).
#include <math.h>

#include "ops/ops_cpu.h"

void cpu_swiglu_forward(float *out, const float *gate, const float *up, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        const float g = gate[i];
        out[i] = (g / (1.0f + expf(-g))) * up[i];
    }
}

// d silu(g)/dg = s * (1 + g * (1 - s)), s = sigmoid(g). dout[i] is read before either output
// is written, so dgate or dup may alias dout.
void cpu_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                         const float *up, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        const float g = gate[i], u = up[i], d = dout[i];
        const float s = 1.0f / (1.0f + expf(-g));
        dgate[i] = d * u * (s * (1.0f + g * (1.0f - s)));
        dup[i] = d * (g / (1.0f + expf(-g)));
    }
}
