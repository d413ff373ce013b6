// SwiGLU gate: out = silu(gate) * up, silu(g) = g * sigmoid(g) computed as torch does,
// g / (1 + exp(-g)), with vec_math.h's vectorisable exp (fused.c's swiglu_rows uses the same
// expressions, so the two give the same bits).
#include "ops/ops_cpu.h"
#include "ops/swiglu_bf16.h"
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

// bf16 mixed precision, the fused gate|up rows (N, 2F) in bf16: h (N,F) = silu(gate) * up, and
// the backward from the fp32 dh, each step rounded as torch computes on bf16 tensors
// (swiglu_bf16.h). dgate_up may alias gate_up: each element of a row is read before it is
// written.
void cpu_swiglu_rows_bf16_forward(uint16_t *h, const uint16_t *gate_up, int N, int F) {
#pragma omp parallel for schedule(static) if ((int64_t)N * F >= CPU_PAR_MIN)
    for (int n = 0; n < N; n++) {
        const uint16_t *g = gate_up + (size_t)n * 2 * F;
        swiglu_row(h + (size_t)n * F, g, g + F, F);
    }
}

void cpu_swiglu_rows_bf16_backward(uint16_t *dgate_up, const float *dh, const uint16_t *gate_up,
                                   int N, int F) {
#pragma omp parallel for schedule(static) if ((int64_t)N * F >= CPU_PAR_MIN)
    for (int n = 0; n < N; n++) {
        const uint16_t *g = gate_up + (size_t)n * 2 * F;
        uint16_t *dg = dgate_up + (size_t)n * 2 * F;
        swiglu_grad_row(dg, dg + F, dh + (size_t)n * F, 1.0f, g, g + F, F);
    }
}
