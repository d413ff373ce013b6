// SwiGLU under bf16 mixed precision, shared by the dense MLP (swiglu.c's swiglu_rows_bf16_*) and
// the MoE experts (moe_experts_bf16.c). Inline, so that each caller's loops vectorise.
#pragma once
#include <stdint.h>

#include "ops/bf16_round.h"
#include "ops/vec_math.h"

// SwiGLU as torch 1.13 computes it on bf16 tensors: every operation in fp32, its result rounded
// to bf16 (bf below), with silu's exp that of the fp32 kernels (vec_math.h):
//   silu(g) = bf(g / bf(1 + bf(exp(-g)))),  h = bf(silu(g) * u)
// and the backward of h = silu(g) * u from its bf16 gradient dh:
//   du = bf(dh * silu(g)),  ds = bf(dh * u),  s = bf(1 / bf(1 + bf(exp(-g)))),
//   dg = bf(bf(ds * s) * bf(1 + bf(g * bf(1 - s))))
static inline float bf(float x) {
    return bf16_rounded(x);
}

// bf(1 + bf(exp(-g))): silu's and sigmoid's denominator.
static inline float denominator_bf16(float g) {
    return bf(1.0f + bf(vexp_inf(-g)));
}

static inline float silu_bf16(float g) {
    return bf(g / denominator_bf16(g));
}

// h = bf16(silu(g) * u) over one row of F.
CPU_SIMD_CLONES
static void swiglu_row(uint16_t *h, const uint16_t *g, const uint16_t *u, int F) {
#pragma omp simd
    for (int f = 0; f < F; f++) h[f] = bf16_round(silu_bf16(bf16_value(g[f])) * bf16_value(u[f]));
}

// dg | du of one row of F from U (dh = bf16(wt * U), as torch's down_proj backward rounds it).
CPU_SIMD_CLONES
static void swiglu_grad_row(uint16_t *dg, uint16_t *du, const float *U, float wt, const uint16_t *g,
                            const uint16_t *u, int F) {
#pragma omp simd
    for (int f = 0; f < F; f++) {
        const float dh = bf(wt * U[f]), gf = bf16_value(g[f]), uf = bf16_value(u[f]);
        const float den = denominator_bf16(gf), s = bf(1.0f / den);
        du[f] = bf16_round(dh * bf(gf / den));
        dg[f] = bf16_round(bf(bf(dh * uf) * s) * bf(1.0f + bf(gf * bf(1.0f - s))));
    }
}
