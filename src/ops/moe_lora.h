// PEFT's LoRA on the MoE experts (ops.h's ct_moe_lora), what the fp32 grouped kernel
// (moe_experts.c, moe_lora_*) and the bf16 one (moe_experts_bf16.c, moe_bf16_lora_*) share: where
// each expert's adapter, saved A x and scratch lie, and the branch's dropout masks.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ops/ops.h"

// One layer's call: the adapter, the plan's perm (sorted row -> slot), the sizes (S = N*K).
typedef struct moe_lora_ctx {
    const ct_moe_lora *lora;
    const int32_t *perm;
    int C, F, E, K;
    size_t S;
} moe_lora_ctx;

// Expert e's gate (0), up (1) or down (2) as the adapter holds it, over e's sorted rows from r0:
// A (r, in), B (out, r), their gradients, u (its rows of the saved A x) and scratch (the
// expert's part of ct_moe_lora.scratch: n rows of moe_lora_row_floats, then its own 2 r (C + F)).
typedef struct expert_lora {
    const float *A, *B;
    float *dA, *dB, *u, *scratch;
    double *acc; // the expert's ct_moe_lora.acc, or NULL
    int in, out, e, m, r0;
} expert_lora;

// W = max(C, F): the widest branch input; the scratch holds two (n, W) blocks and an (n, r) one
// before the kernels' (moe_expert_lora_kernel_scratch).
size_t moe_lora_widest(const moe_lora_ctx *g);
// Whether module m of expert e is adapted; if so *o describes it.
bool moe_expert_lora_at(expert_lora *o, const moe_lora_ctx *g, int e, int m, int r0);
// lora_forward/backward's scratch for the expert's n rows, after the two (n, W) blocks and the
// (n, r) one.
float *moe_expert_lora_kernel_scratch(const moe_lora_ctx *g, const expert_lora *a, int n);
// dst (n, in) = the branch's input rows x through its dropout mask (may alias x); x itself when
// there is no dropout.
const float *moe_expert_lora_dropout(const moe_lora_ctx *g, const expert_lora *a, int n, float *dst,
                                     const float *x);
