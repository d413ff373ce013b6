/* ctitan plugin ABI, version 1: user kernels that override the ops the model calls.
 *
 * A plugin is a shared library that exports one function,
 *
 *     CTITAN_PLUGIN_EXPORT int ctitan_plugin_init(uint32_t api_version, ctitan_registry *reg);
 *
 * ctitan dlopens each library named by --override.imports before it builds the model, calls
 * ctitan_plugin_init with its own CTITAN_PLUGIN_API_VERSION, and the plugin registers its ops:
 *
 *     ctitan_register_op(reg, "rope_hf", (ctitan_fn)my_rope_fwd, (ctitan_fn)my_rope_bwd, 0);
 *
 * Return 0 on success; anything else refuses the plugin (call ctitan_plugin_error first to say
 * why, e.g. "this CPU has no AVX2"). Before ctitan trusts an override it runs it against the
 * built-in kernel on random inputs (`ctitan check-kernels`) and refuses one whose results differ
 * by more than the op's tolerance.
 *
 * Conventions, shared by every op below:
 *  - Tensors are dense, row-major, fp32, contiguous; shapes are given as (dim0, dim1, ...) with
 *    the last dimension varying fastest. Sizes are ints; element counts can exceed 2^31, so
 *    index with size_t or int64_t.
 *  - Outputs come first, then inputs, then sizes. Gradients of inputs are OVERWRITTEN (=);
 *    gradients of parameters ACCUMULATE (+=), because tied weights and gradient accumulation
 *    sum into them. Buffers never alias unless the op's comment says they may; where it says
 *    so, the model does call the op in place.
 *  - A kernel is called from one thread at a time. It may use its own threads (OpenMP,
 *    pthreads); it must not change the process's thread settings. Given the same inputs and
 *    thread count it should return the same bits (ctitan's runs are reproducible).
 *  - A forward-only override (flag CTITAN_OP_FORWARD_ONLY, backward NULL) runs with the
 *    built-in backward, so its forward must leave exactly what that backward reads (the saved
 *    state documented for rmsnorm and attention). moe_experts keeps a private state and cannot
 *    be overridden forward-only.
 *
 * This header is C99 and C++ compatible and depends only on <stddef.h> and <stdint.h>.
 * Changes that break existing plugins bump CTITAN_PLUGIN_API_VERSION; ctitan refuses a plugin
 * built against another version. */
#ifndef CTITAN_PLUGIN_H
#define CTITAN_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#define CTITAN_PLUGIN_API_VERSION 1u

/* The entry point's symbol name, as ctitan looks it up with dlsym. */
#define CTITAN_PLUGIN_ENTRY "ctitan_plugin_init"

#ifdef __cplusplus
#define CTITAN_EXTERN_C extern "C"
#else
#define CTITAN_EXTERN_C
#endif
#define CTITAN_PLUGIN_EXPORT CTITAN_EXTERN_C __attribute__((visibility("default")))

#ifdef __cplusplus
extern "C" {
#endif

/* ---- The ops: one forward and one backward type each. ---- */

/* "rmsnorm": out(N,C) = weight(C) * (inp(N,C) * rstd), rstd(N) = 1/sqrt(mean(inp^2) + eps),
 * as Hugging Face computes it in fp32 (x * rstd rounded first, then times the weight). The
 * forward saves rstd(N) for the backward. Backward: dinp(N,C) =, dweight(C) +=; dinp may alias
 * dout. */
typedef void (*ctitan_rmsnorm_forward_fn)(float *out, float *rstd, const float *inp,
                                          const float *weight, int N, int C, float eps);
typedef void (*ctitan_rmsnorm_backward_fn)(float *dinp, float *dweight, const float *dout,
                                           const float *inp, const float *weight, const float *rstd,
                                           int N, int C);

/* "rope_hf": rotary embedding in Hugging Face's rotate_half layout over x(B,T,H,D), positions
 * 0..T-1; cos and sin are (T, D/2) tables (D is even). With h = D/2, c = cos[t][i], s =
 * sin[t][i], for i < h:
 *     out[i] = x[i] c - x[i+h] s,     out[i+h] = x[i+h] c + x[i] s
 * Backward applies the inverse rotation (s -> -s) to dout. out may alias inp; dinp may alias
 * dout (the model calls both in place). */
typedef void (*ctitan_rope_hf_forward_fn)(float *out, const float *inp, const float *cos,
                                          const float *sin, int B, int T, int H, int D);
typedef void (*ctitan_rope_hf_backward_fn)(float *dinp, const float *dout, const float *cos,
                                           const float *sin, int B, int T, int H, int D);

/* "attention": causal softmax attention with grouped-query heads. q(B,T,NH,D), k and v
 * (B,T,NKV,D), out(B,T,NH,D); query head h reads kv head h / (NH/NKV); scores are scaled by
 * 1/sqrt(D) and the softmax is taken in fp32 over keys j <= t.
 * The forward saves what its backward needs in `state`, and the backward works in `scratch`.
 * By default both hold B*NH*T*T floats and the state is the built-in's: the probabilities
 * P(B,NH,T,T), zero above the diagonal; a forward-only override must write exactly that. An
 * override of both directions may keep anything in them, and may size them itself with
 * ctitan_register_workspace. Backward: dq, dk, dv are overwritten; it also gets the forward's
 * out (a flash-style backward needs rowsum(dout * out)). */
typedef void (*ctitan_attention_forward_fn)(float *out, float *state, const float *q,
                                            const float *k, const float *v, int B, int T, int NH,
                                            int NKV, int D);
typedef void (*ctitan_attention_backward_fn)(float *dq, float *dk, float *dv, float *scratch,
                                             const float *dout, const float *out,
                                             const float *state, const float *q, const float *k,
                                             const float *v, int B, int T, int NH, int NKV, int D);
typedef size_t (*ctitan_attention_floats_fn)(int B, int T, int NH, int NKV, int D);

/* "swiglu": out(n) = silu(gate) * up elementwise, silu(x) = x / (1 + exp(-x)). Backward:
 * dgate, dup =; either may alias dout. */
typedef void (*ctitan_swiglu_forward_fn)(float *out, const float *gate, const float *up, int64_t n);
typedef void (*ctitan_swiglu_backward_fn)(float *dgate, float *dup, const float *dout,
                                          const float *gate, const float *up, int64_t n);

/* "moe_experts": the SwiGLU experts of one Qwen3-MoE sparse layer. x(N,C); token n goes to
 * experts expert[n*K+k] (K distinct values in [0,E)) with weights weight[n*K+k]:
 *     out[n] = sum_k weight[n,k] * down_e(silu(gate_e(x[n])) * up_e(x[n])),  e = expert[n,k]
 * the K terms added in ascending expert order. w holds the experts back to back: expert e's
 * block at w + e*3*F*C is gate_proj (F,C), up_proj (F,C), then down_proj (C,F).
 * `state` (one per layer) carries forward -> backward; `scratch` is shared by every layer and
 * by the backward. Their sizes are the built-in's unless the plugin registers its own with
 * ctitan_register_workspace. Backward: dx(N,C) = and dweight(N,K) = (the gradient of each
 * routing weight); dw (the layout of w) += (dw may be NULL: frozen experts, as under LoRA). */
typedef void (*ctitan_moe_experts_forward_fn)(float *out, float *state, float *scratch,
                                              const float *x, const int32_t *expert,
                                              const float *weight, const float *w, int N, int C,
                                              int F, int E, int K);
typedef void (*ctitan_moe_experts_backward_fn)(float *dx, float *dweight, float *dw, float *scratch,
                                               const float *dout, const float *state,
                                               const float *x, const int32_t *expert,
                                               const float *weight, const float *w, int N, int C,
                                               int F, int E, int K);
typedef size_t (*ctitan_moe_experts_floats_fn)(int N, int C, int F, int E, int K);

/* "cross_entropy": losses(N) = -log softmax(logits(N,V))[target], 0 where target == -100.
 * Backward: dlogits(N,V) = scale * (softmax - onehot(target)), zero rows where target == -100;
 * dlogits may alias logits (the model calls it in place). */
typedef void (*ctitan_cross_entropy_forward_fn)(float *losses, const float *logits,
                                                const int32_t *targets, int N, int V);
typedef void (*ctitan_cross_entropy_backward_fn)(float *dlogits, const float *logits,
                                                 const int32_t *targets, float scale, int N, int V);

/* "matmul": out(N,OC) = inp(N,C) @ weight(OC,C)^T + bias(OC), the nn.Linear layout; bias may
 * be NULL. Backward: dinp(N,C) = dout @ weight (dinp may be NULL: not wanted); dweight(OC,C)
 * += dout^T @ inp (dweight may be NULL: a frozen weight, as under LoRA); dbias(OC) += column
 * sums of dout (dbias may be NULL). */
typedef void (*ctitan_matmul_forward_fn)(float *out, const float *inp, const float *weight,
                                         const float *bias, int N, int C, int OC);
typedef void (*ctitan_matmul_backward_fn)(float *dinp, float *dweight, float *dbias,
                                          const float *dout, const float *inp, const float *weight,
                                          int N, int C, int OC);

/* ---- Registration. ---- */

/* Any kernel passes through this type; cast back by ctitan according to the op's name. */
typedef void (*ctitan_fn)(void);

/* The backward is the built-in one; pass NULL as backward. */
#define CTITAN_OP_FORWARD_ONLY 1u

/* Filled by ctitan; a plugin calls it through the inline helpers below. Later ABI versions
 * only append members. */
typedef struct ctitan_registry ctitan_registry;
struct ctitan_registry {
    uint32_t api_version; /* ctitan's CTITAN_PLUGIN_API_VERSION */
    void *host;           /* ctitan's own state; do not touch */
    int (*register_op)(ctitan_registry *reg, uint32_t plugin_api_version, const char *op,
                       ctitan_fn forward, ctitan_fn backward, uint32_t flags);
    int (*register_counters)(ctitan_registry *reg, const char *op, const uint64_t *forward_calls,
                             const uint64_t *backward_calls);
    int (*register_workspace)(ctitan_registry *reg, const char *op, ctitan_fn state_floats,
                              ctitan_fn scratch_floats);
    void (*error)(ctitan_registry *reg, const char *message);
};

/* Overrides `op` ("rmsnorm", "rope_hf", "attention", "swiglu", "moe_experts", "cross_entropy"
 * or "matmul") with forward and backward kernels of the op's types above. Returns 0, or -1
 * when ctitan refuses (unknown op, taken by another plugin, ABI mismatch); ctitan then reports
 * the reason and the plugin should return non-zero from its init. */
static inline int ctitan_register_op(ctitan_registry *reg, const char *op, ctitan_fn forward,
                                     ctitan_fn backward, uint32_t flags) {
    return reg->register_op(reg, CTITAN_PLUGIN_API_VERSION, op, forward, backward, flags);
}

/* Optional: counters the plugin increments on each call of its forward and backward (either
 * may be NULL). ctitan reads them after training and verify and reports them in the log and in
 * JSON, as proof that the plugin's code ran. */
static inline int ctitan_register_counters(ctitan_registry *reg, const char *op,
                                           const uint64_t *forward_calls,
                                           const uint64_t *backward_calls) {
    return reg->register_counters(reg, op, forward_calls, backward_calls);
}

/* Optional, for "attention" (ctitan_attention_floats_fn) and "moe_experts"
 * (ctitan_moe_experts_floats_fn) overridden in both directions: how many floats the plugin's
 * state and scratch need, replacing the built-in's sizes. */
static inline int ctitan_register_workspace(ctitan_registry *reg, const char *op,
                                            ctitan_fn state_floats, ctitan_fn scratch_floats) {
    return reg->register_workspace(reg, op, state_floats, scratch_floats);
}

/* Says why the plugin refuses to load; ctitan prints it with the library's name. */
static inline void ctitan_plugin_error(ctitan_registry *reg, const char *message) {
    reg->error(reg, message);
}

/* The entry point every plugin defines. */
CTITAN_PLUGIN_EXPORT int ctitan_plugin_init(uint32_t api_version, ctitan_registry *reg);

#ifdef __cplusplus
}
#endif

#endif /* CTITAN_PLUGIN_H */
