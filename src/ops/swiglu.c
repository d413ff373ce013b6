// SwiGLU gate: out = silu(gate) * up, silu(g) = g * sigmoid(g) computed as torch does,
// g / (1 + exp(-g)), with vec_math.h's vectorisable exp (fused.c's swiglu_rows uses the same
// expressions, so the two give the same bits).
#include "ops/ops_cpu.h"
#include "ops/vec_math.h"

// The flat range is cut into spans so that each thread's work runs in a SIMD clone.
#define SWIGLU_SPAN 4096

CPU_SIMD_CLONES
static void swiglu_forward_span(float *out, const float *gate, const float *up, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) out[i] = swiglu_value(gate[i], up[i]);
}

// d silu(g)/dg = s * (1 + g * (1 - s)), s = sigmoid(g). dout[i] is read before either output
// is written, so dgate or dup may alias dout.
CPU_SIMD_CLONES
static void swiglu_backward_span(float *dgate, float *dup, const float *dout, const float *gate,
                                 const float *up, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        const float d = dout[i]; // read first: dgate or dup may alias dout
        swiglu_grad(&dgate[i], &dup[i], d, gate[i], up[i]);
    }
}

void cpu_swiglu_forward(float *out, const float *gate, const float *up, int64_t n) {
    const int64_t spans = (n + SWIGLU_SPAN - 1) / SWIGLU_SPAN;
#pragma omp parallel for schedule(static) if (n >= CPU_PAR_MIN)
    for (int64_t b = 0; b < spans; b++) {
        const int64_t i = b * SWIGLU_SPAN, len = n - i < SWIGLU_SPAN ? n - i : SWIGLU_SPAN;
        swiglu_forward_span(out + i, gate + i, up + i, len);
    }
}

void cpu_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                         const float *up, int64_t n) {
    const int64_t spans = (n + SWIGLU_SPAN - 1) / SWIGLU_SPAN;
#pragma omp parallel for schedule(static) if (n >= CPU_PAR_MIN)
    for (int64_t b = 0; b < spans; b++) {
        const int64_t i = b * SWIGLU_SPAN, len = n - i < SWIGLU_SPAN ? n - i : SWIGLU_SPAN;
        swiglu_backward_span(dgate + i, dup + i, dout + i, gate + i, up + i, len);
    }
}
