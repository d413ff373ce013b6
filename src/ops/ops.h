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

typedef struct ct_ops {
    const char *name;

    // out(N,C) = table(V,C)[ids[n]]. ids are in range (the model checks them).
    void (*embedding_forward)(float *out, const int32_t *ids, const float *table, int N, int C);
    // dtable[ids[n]] += dout(N,C)[n]; a token seen twice accumulates twice.
    void (*embedding_backward)(float *dtable, const float *dout, const int32_t *ids, int N, int C);

    // out(n) = a + b. out may alias a or b (residual adds and gradient sums).
    void (*add)(float *out, const float *a, const float *b, int64_t n);

    // out(N,OC) = inp(N,C) @ weight(OC,C)^T + bias(OC); bias may be NULL.
    void (*matmul_forward)(float *out, const float *inp, const float *weight, const float *bias,
                           int N, int C, int OC);
    // dinp(N,C) = dout @ weight (dinp may be NULL: not needed); dweight += dout^T @ inp;
    // dbias += column sums of dout (dbias may be NULL).
    void (*matmul_backward)(float *dinp, float *dweight, float *dbias, const float *dout,
                            const float *inp, const float *weight, int N, int C, int OC);

    // out(N,C) = weight * (inp * rstd), rstd(N) = 1/sqrt(mean(inp^2) + eps), in fp32.
    void (*rmsnorm_forward)(float *out, float *rstd, const float *inp, const float *weight, int N,
                            int C, float eps);
    // dinp may alias dout.
    void (*rmsnorm_backward)(float *dinp, float *dweight, const float *dout, const float *inp,
                             const float *weight, const float *rstd, int N, int C);

    // HF rotate_half RoPE over x(B,T,H,D) at positions 0..T-1; cos/sin are (T, D/2) tables.
    // out may alias inp. Backward applies the inverse rotation; dinp may alias dout.
    void (*rope_forward)(float *out, const float *inp, const float *cos, const float *sin, int B,
                         int T, int H, int D);
    void (*rope_backward)(float *dinp, const float *dout, const float *cos, const float *sin, int B,
                          int T, int H, int D);

    // Causal softmax attention with GQA: q(B,T,NH,D), k,v(B,T,NKV,D) -> out(B,T,NH,D).
    // Query head h reads kv head h / (NH/NKV). Scale D^-0.5, softmax in fp32.
    // The forward saves what its backward needs in `state`; how much is the kernel's business
    // (the CPU reference keeps the probabilities (B,NH,T,T); a flash kernel would keep (B,NH,T)
    // log-sum-exps), so the model sizes the buffers by asking:
    size_t (*attention_state_floats)(int B, int T, int NH, int NKV, int D);
    size_t (*attention_scratch_floats)(int B, int T, int NH, int NKV, int D);
    void (*attention_forward)(float *out, float *state, const float *q, const float *k,
                              const float *v, int B, int T, int NH, int NKV, int D);
    // dq(B,T,NH,D), dk, dv(B,T,NKV,D) are overwritten; scratch is the backward's workspace.
    void (*attention_backward)(float *dq, float *dk, float *dv, float *scratch, const float *dout,
                               const float *state, const float *q, const float *k, const float *v,
                               int B, int T, int NH, int NKV, int D);

    // out(n) = silu(gate) * up, elementwise over n values.
    void (*swiglu_forward)(float *out, const float *gate, const float *up, int64_t n);
    // dgate or dup may alias dout.
    void (*swiglu_backward)(float *dgate, float *dup, const float *dout, const float *gate,
                            const float *up, int64_t n);

    // Mixture-of-experts SwiGLU experts of one sparse layer (Qwen3-MoE). Token n is routed to
    // experts expert[n*K + k] (k < K; distinct, in [0, E)) with weights weight[n*K + k]:
    //   out(N,C)[n] = sum_k weight[n,k] * down_e(silu(gate_e(x[n])) * up_e(x[n])), e = expert[n,k]
    // the K terms added in ascending expert order, as HF's loop over experts adds them (each
    // term rounded to fp32 after the weight multiplies it). `w` holds the experts back to back:
    // expert e's block at w + e*3*F*C is gate_proj (F,C), up_proj (F,C) - together one (2F,C)
    // matrix - then down_proj (C,F). An expert that receives no token costs nothing.
    // The forward saves what its backward needs in `state` (sized by the kernel, as attention;
    // one per sparse layer) and works in `scratch` (shared by every layer and by the backward).
    size_t (*moe_state_floats)(int N, int C, int F, int E, int K);
    size_t (*moe_scratch_floats)(int N, int C, int F, int E, int K);
    void (*moe_forward)(float *out, float *state, float *scratch, const float *x,
                        const int32_t *expert, const float *weight, const float *w, int N, int C,
                        int F, int E, int K);
    // dx(N,C) and dweight(N,K) (the gradient of each routing weight, for the router) are
    // overwritten; dw (E*3*F*C, the layout of w) accumulates. scratch is the backward's
    // workspace.
    void (*moe_backward)(float *dx, float *dweight, float *dw, float *scratch, const float *dout,
                         const float *state, const float *x, const int32_t *expert,
                         const float *weight, const float *w, int N, int C, int F, int E, int K);

    // losses(N) = -log softmax(logits(N,V))[target]; 0 where target == -100.
    void (*cross_entropy_forward)(float *losses, const float *logits, const int32_t *targets, int N,
                                  int V);
    // dlogits(N,V) = scale * (softmax - onehot), 0 rows for ignored targets. May alias logits.
    void (*cross_entropy_backward)(float *dlogits, const float *logits, const int32_t *targets,
                                   float scale, int N, int V);
} ct_ops;

// The built-in CPU table (BLAS for matmuls, OpenMP for the rest), with the grouped MoE kernel.
extern const ct_ops ct_ops_cpu;

// model.moe_impl: "grouped" (the default: slots sorted by expert, one fused gate/up GEMM per
// expert) or "loop" (the reference: one GEMM per expert and projection). Copies `base` into *out
// with that expert kernel; returns -1 for an unknown name.
int ct_ops_with_moe_impl(ct_ops *out, const ct_ops *base, const char *moe_impl);
