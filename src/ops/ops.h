// The op table: every numerical kernel the model calls goes through one ct_ops. The built-in
// CPU table is the reference; faster variants, user plugins and a GPU backend provide other
// tables without touching the model code.
//
// Conventions (llm.c style): outputs first, then inputs, then sizes. All tensors are dense,
// row-major fp32. Gradients of parameters ACCUMULATE (+=), so tied weights and gradient
// accumulation work; gradients of inputs are OVERWRITTEN (=). Buffers do not alias unless a
// comment says they may. Results are deterministic for a fixed thread count.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "ctitan/plugin.h"

typedef struct ct_ops {
    const char *name;

    // out(N,C) = table(V,C)[ids[n]]. ids are in range (the model checks them).
    void (*embedding_forward)(float *out, const int32_t *ids, const float *table, int N, int C);
    // dtable[ids[n]] += dout(N,C)[n]; a token seen twice accumulates twice.
    void (*embedding_backward)(float *dtable, const float *dout, const int32_t *ids, int N, int C);

    // out(n) = a + b. out may alias a or b (residual adds and gradient sums).
    void (*add)(float *out, const float *a, const float *b, int64_t n);

    // The ops below are the plugin ABI's override points, so their types and their contracts
    // (shapes, layouts, aliasing, saved state) are those of include/ctitan/plugin.h.
    ctitan_matmul_forward_fn matmul_forward;
    ctitan_matmul_backward_fn matmul_backward;
    ctitan_rmsnorm_forward_fn rmsnorm_forward;
    ctitan_rmsnorm_backward_fn rmsnorm_backward;
    ctitan_rope_hf_forward_fn rope_forward; // the op "rope_hf"
    ctitan_rope_hf_backward_fn rope_backward;

    // How many floats the attention state and scratch hold is the kernel's business (the CPU
    // reference keeps the probabilities (B,NH,T,T); a flash kernel would keep (B,NH,T)
    // log-sum-exps), so the model sizes the buffers by asking.
    ctitan_attention_floats_fn attention_state_floats;
    ctitan_attention_floats_fn attention_scratch_floats;
    ctitan_attention_forward_fn attention_forward;
    ctitan_attention_backward_fn attention_backward;

    ctitan_swiglu_forward_fn swiglu_forward;
    ctitan_swiglu_backward_fn swiglu_backward;

    // The op "moe_experts": the state is per sparse layer, the scratch shared by every layer.
    ctitan_moe_experts_floats_fn moe_state_floats;
    ctitan_moe_experts_floats_fn moe_scratch_floats;
    ctitan_moe_experts_forward_fn moe_forward;
    ctitan_moe_experts_backward_fn moe_backward;

    ctitan_cross_entropy_forward_fn cross_entropy_forward;
    ctitan_cross_entropy_backward_fn cross_entropy_backward;

    // Fused elementwise kernels (fused.c; not plugin override points). Each computes what a
    // sequence of the ops above computes, bit for bit, in one pass over memory. `ops` is the
    // table the model calls through: the built-in fused kernels ignore it, and the composites
    // that ct_ops_fit_fusions installs (when a plugin replaces rmsnorm, rope_hf or swiglu) run
    // the sequence through it, so a plugin's kernel is always the one that runs.

    // sum(N,C) = a + b; out, rstd = rmsnorm_forward(sum, weight). sum may alias a or b.
    void (*add_rmsnorm_forward)(const struct ct_ops *ops, float *sum, float *out, float *rstd,
                                const float *a, const float *b, const float *weight, int N, int C,
                                float eps);
    // dresid(N,C) += the rmsnorm_backward input gradient; dweight +=. scratch (N,C) is free
    // memory the composite may use.
    void (*rmsnorm_backward_add)(const struct ct_ops *ops, float *dresid, float *dweight,
                                 float *scratch, const float *dout, const float *inp,
                                 const float *weight, const float *rstd, int N, int C);
    // qkv (N, NH*D + 2*NKV*D) is the fused q|k|v projection, row by row. qr (N,NH,D) =
    // rope(rmsnorm(q, q_norm)), kr (N,NKV,D) likewise, v (N,NKV,D) a copy of the v part;
    // q_rstd (N*NH), k_rstd (N*NKV) as rmsnorm saves them. scratch (N, NH*D) is free memory.
    void (*qk_norm_rope_forward)(const struct ct_ops *ops, float *qr, float *kr, float *v,
                                 float *q_rstd, float *k_rstd, float *scratch, const float *qkv,
                                 const float *q_norm, const float *k_norm, const float *cos,
                                 const float *sin, int B, int T, int NH, int NKV, int D, float eps);
    // dqkv (N, NH*D + 2*NKV*D) =, dq_norm, dk_norm +=, from the gradients of qr, kr and v.
    // dqr and dkr are clobbered (used as scratch).
    void (*qk_norm_rope_backward)(const struct ct_ops *ops, float *dqkv, float *dq_norm,
                                  float *dk_norm, float *dqr, float *dkr, const float *dv,
                                  const float *qkv, const float *q_norm, const float *k_norm,
                                  const float *q_rstd, const float *k_rstd, const float *cos,
                                  const float *sin, int B, int T, int NH, int NKV, int D);
    // gate_up (N, 2F) is the fused gate|up projection, row by row: h (N,F) = silu(gate) * up.
    // scratch holds swiglu_rows_scratch_floats(N, F) floats of free memory (the composite
    // copies gate and up apart into it, so that a plugin's swiglu runs once over all N*F
    // values; the built-in kernel needs none).
    void (*swiglu_rows_forward)(const struct ct_ops *ops, float *h, float *scratch,
                                const float *gate_up, int N, int F);
    // dgate_up (N, 2F) = (dgate | dup) from dh (N,F). scratch as above. dgate_up may alias
    // gate_up (the model calls it in place: the layer's backward is gate_up's last reader).
    void (*swiglu_rows_backward)(const struct ct_ops *ops, float *dgate_up, float *scratch,
                                 const float *dh, const float *gate_up, int N, int F);
    size_t (*swiglu_rows_scratch_floats)(int N, int F); // NULL: none
} ct_ops;

// The built-in CPU table (BLAS for matmuls, OpenMP for the rest), with the grouped MoE kernel.
extern const ct_ops ct_ops_cpu;

// model.moe_impl: "grouped" (the default: slots sorted by expert, one fused gate/up GEMM per
// expert) or "loop" (the reference: one GEMM per expert and projection). Copies `base` into *out
// with that expert kernel; returns -1 for an unknown name.
int ct_ops_with_moe_impl(ct_ops *out, const ct_ops *base, const char *moe_impl);

// model.attn_backend: "sdpa" (the reference, and ct_ops_cpu's: materialised (B,NH,T,T)
// probabilities, batched GEMMs) or "flash" (tiled with an online softmax, recomputation in the
// backward: O(T) memory per head). Copies `base` into *out with that attention kernel; returns
// -1 for an unknown name.
int ct_ops_with_attention(ct_ops *out, const ct_ops *base, const char *backend);

// Points each fused entry at the built-in fused kernel if the ops it stands for are the built-in
// ones, else at the composite that calls them through the table. Call after changing any of
// rmsnorm, rope or swiglu (override_apply does).
void ct_ops_fit_fusions(ct_ops *ops);
