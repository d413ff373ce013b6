// The op list: every entry of the op table ct_ops, once (ggml's style: an X-macro, an enum, a
// name table and a static assertion on the count). Everything that walks the table is generated
// from it: the ct_ops fields (ops.h), the built-in CPU table (ops_cpu.c), the model's
// completeness check (qwen3_layout.c), the profiler's enum, names and timing wrappers
// (ops_profile.c) and where each plugin override point's kernels go (plugin/override.c).
// Adding an op is one line here plus its kernels.
//
// X(kind, field, type, cpu, need, op, dir, params, args):
//   kind    PLUGIN       a plugin override point's kernel: its type is plugin.h's, timed
//           PLUGIN_SIZE  a plugin override point's workspace size query (plugin.h's type)
//           OWN          a built-in op (the type is declared below from params), timed
//           OWN_SIZE     a built-in size query (the type is declared below)
//           FUSED        a fused kernel (fused.c): its first parameter is the table it runs
//                        through; timed as one op against the untimed table
//           An OWN or OWN_SIZE entry whose first parameter is `const struct ct_ops *ops` (the
//           bf16 matmul and experts) reads the kernel state of the backend that table is bound
//           to (ct_ops.kernel_state, cpu_kernels.h); wrappers pass the caller's table on.
//   field   the ct_ops member (the name the model code calls)
//   type    its function pointer type
//   cpu     the kernel in ct_ops_cpu (NULL: none)
//   need    ALL (every model calls it), MOE (a MoE model does) or OPT (may be NULL)
//   op      the op's name: the plugin override point's ("rope_hf"), the profiler's row
//   dir     forward, backward, both (a forward and its backward at once), none (add), state or
//           scratch (the workspace size queries)
//   params  the parameter list, checked against `type` at compile time
//   args    the arguments that pass params on (for a FUSED op, without the table)
//
// The contracts (shapes, aliasing, what accumulates) are plugin.h's for the PLUGIN entries and
// ops.h's for the rest.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ctitan/plugin.h"

struct ct_ops;
struct ct_moe_lora;

// The types the optimizer's entry takes: elements [offset, offset + numel) of the parameter
// shard, and the step's scalars, each a Python float in torch rounded to fp32 where it meets a
// tensor.
typedef struct ct_adamw_range {
    size_t offset, numel;
} ct_adamw_range;
typedef struct ct_adamw_coeffs {
    float decay_mul;     // 1 - lr*wd
    float beta1, one_b1; // beta1, 1 - beta1
    float beta2, one_b2; // beta2, 1 - beta2
    float bc2_sqrt;      // sqrt(1 - beta2^step)
    float eps;
    float neg_step_size; // -lr / (1 - beta1^step)
    float grad_scale;    // the clipping coefficient (1: none; x * 1 is exact)
} ct_adamw_coeffs;

// clang-format off
#define CT_OPS_LIST(X)                                                                             \
    X(OWN, embedding_forward, ct_embedding_forward_fn, cpu_embedding_forward, ALL, "embedding",    \
      forward, (float *out, const int32_t *ids, const float *table, int N, int C),                 \
      (out, ids, table, N, C))                                                                     \
    X(OWN, embedding_bf16_forward, ct_embedding_bf16_forward_fn, cpu_embedding_bf16_forward, OPT, \
      "embedding", forward, (float *out, const int32_t *ids, const uint16_t *table, int N, int C), \
      (out, ids, table, N, C))                                                                     \
    X(OWN, embedding_backward, ct_embedding_backward_fn, cpu_embedding_backward, ALL, "embedding", \
      backward, (float *dtable, const float *dout, const int32_t *ids, int N, int C),              \
      (dtable, dout, ids, N, C))                                                                   \
    X(OWN, add, ct_add_fn, cpu_add, ALL, "add", none,                                              \
      (float *out, const float *a, const float *b, int64_t n), (out, a, b, n))                     \
    X(PLUGIN, matmul_forward, ctitan_matmul_forward_fn, cpu_matmul_forward, ALL, "matmul",         \
      forward,                                                                                     \
      (float *out, const float *inp, const float *weight, const float *bias, int N, int C,         \
       int OC),                                                                                    \
      (out, inp, weight, bias, N, C, OC))                                                          \
    X(PLUGIN, matmul_backward, ctitan_matmul_backward_fn, cpu_matmul_backward, ALL, "matmul",      \
      backward,                                                                                    \
      (float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,             \
       const float *weight, int N, int C, int OC),                                                 \
      (dinp, dweight, dbias, dout, inp, weight, N, C, OC))                                         \
    X(PLUGIN, rmsnorm_forward, ctitan_rmsnorm_forward_fn, cpu_rmsnorm_forward, ALL, "rmsnorm",     \
      forward,                                                                                     \
      (float *out, float *rstd, const float *inp, const float *weight, int N, int C, float eps),   \
      (out, rstd, inp, weight, N, C, eps))                                                         \
    X(PLUGIN, rmsnorm_backward, ctitan_rmsnorm_backward_fn, cpu_rmsnorm_backward, ALL, "rmsnorm",  \
      backward,                                                                                    \
      (float *dinp, float *dweight, const float *dout, const float *inp, const float *weight,      \
       const float *rstd, int N, int C),                                                           \
      (dinp, dweight, dout, inp, weight, rstd, N, C))                                              \
    X(PLUGIN, rope_forward, ctitan_rope_hf_forward_fn, cpu_rope_forward, ALL, "rope_hf", forward,  \
      (float *out, const float *inp, const float *cos, const float *sin, int B, int T, int H,      \
       int D),                                                                                     \
      (out, inp, cos, sin, B, T, H, D))                                                            \
    X(PLUGIN, rope_backward, ctitan_rope_hf_backward_fn, cpu_rope_backward, ALL, "rope_hf",        \
      backward,                                                                                    \
      (float *dinp, const float *dout, const float *cos, const float *sin, int B, int T, int H,    \
       int D),                                                                                     \
      (dinp, dout, cos, sin, B, T, H, D))                                                          \
    X(PLUGIN_SIZE, attention_state_floats, ctitan_attention_floats_fn,                             \
      cpu_attention_state_floats, ALL, "attention", state,                                         \
      (int B, int T, int NH, int NKV, int D), (B, T, NH, NKV, D))                                  \
    X(PLUGIN_SIZE, attention_scratch_floats, ctitan_attention_floats_fn,                           \
      cpu_attention_scratch_floats, ALL, "attention", scratch,                                     \
      (int B, int T, int NH, int NKV, int D), (B, T, NH, NKV, D))                                  \
    X(PLUGIN, attention_forward, ctitan_attention_forward_fn, cpu_attention_forward, ALL,          \
      "attention", forward,                                                                        \
      (float *out, float *state, const float *q, const float *k, const float *v, int B, int T,     \
       int NH, int NKV, int D),                                                                    \
      (out, state, q, k, v, B, T, NH, NKV, D))                                                     \
    X(PLUGIN, attention_backward, ctitan_attention_backward_fn, cpu_attention_backward, ALL,       \
      "attention", backward,                                                                       \
      (float *dq, float *dk, float *dv, float *scratch, const float *dout, const float *out,       \
       const float *state, const float *q, const float *k, const float *v, int B, int T, int NH,   \
       int NKV, int D),                                                                            \
      (dq, dk, dv, scratch, dout, out, state, q, k, v, B, T, NH, NKV, D))                          \
    X(PLUGIN, swiglu_forward, ctitan_swiglu_forward_fn, cpu_swiglu_forward, ALL, "swiglu",         \
      forward, (float *out, const float *gate, const float *up, int64_t n), (out, gate, up, n))    \
    X(PLUGIN, swiglu_backward, ctitan_swiglu_backward_fn, cpu_swiglu_backward, ALL, "swiglu",      \
      backward,                                                                                    \
      (float *dgate, float *dup, const float *dout, const float *gate, const float *up,            \
       int64_t n),                                                                                 \
      (dgate, dup, dout, gate, up, n))                                                             \
    X(PLUGIN_SIZE, moe_state_floats, ctitan_moe_experts_floats_fn, cpu_moe_grouped_state_floats,   \
      MOE, "moe_experts", state, (int N, int C, int F, int E, int K), (N, C, F, E, K))             \
    X(PLUGIN_SIZE, moe_scratch_floats, ctitan_moe_experts_floats_fn,                               \
      cpu_moe_grouped_scratch_floats, MOE, "moe_experts", scratch,                                 \
      (int N, int C, int F, int E, int K), (N, C, F, E, K))                                        \
    X(PLUGIN, moe_forward, ctitan_moe_experts_forward_fn, cpu_moe_grouped_forward, MOE,            \
      "moe_experts", forward,                                                                      \
      (float *out, float *state, float *scratch, const float *x, const int32_t *expert,            \
       const float *weight, const float *w, int N, int C, int F, int E, int K),                    \
      (out, state, scratch, x, expert, weight, w, N, C, F, E, K))                                  \
    X(PLUGIN, moe_backward, ctitan_moe_experts_backward_fn, cpu_moe_grouped_backward, MOE,         \
      "moe_experts", backward,                                                                     \
      (float *dx, float *dweight, float *dw, float *scratch, const float *dout,                    \
       const float *state, const float *x, const int32_t *expert, const float *weight,             \
       const float *w, int N, int C, int F, int E, int K),                                         \
      (dx, dweight, dw, scratch, dout, state, x, expert, weight, w, N, C, F, E, K))                \
    X(PLUGIN, cross_entropy_forward, ctitan_cross_entropy_forward_fn, cpu_cross_entropy_forward,   \
      ALL, "cross_entropy", forward,                                                               \
      (float *losses, const float *logits, const int32_t *targets, int N, int V),                  \
      (losses, logits, targets, N, V))                                                             \
    X(PLUGIN, cross_entropy_backward, ctitan_cross_entropy_backward_fn,                            \
      cpu_cross_entropy_backward, ALL, "cross_entropy", backward,                                  \
      (float *dlogits, const float *logits, const int32_t *targets, float scale, int N, int V),    \
      (dlogits, logits, targets, scale, N, V))                                                     \
    X(FUSED, add_rmsnorm_forward, ct_add_rmsnorm_forward_fn, cpu_add_rmsnorm_forward, ALL,         \
      "add+rmsnorm", forward,                                                                      \
      (const struct ct_ops *ops, float *sum, float *out, float *rstd, const float *a,              \
       const float *b, const float *weight, int N, int C, float eps),                              \
      (sum, out, rstd, a, b, weight, N, C, eps))                                                   \
    X(FUSED, rmsnorm_backward_add, ct_rmsnorm_backward_add_fn, cpu_rmsnorm_backward_add, ALL,      \
      "rmsnorm+add", backward,                                                                     \
      (const struct ct_ops *ops, float *dresid, float *dweight, float *scratch,                    \
       const float *dout, const float *inp, const float *weight, const float *rstd, int N,         \
       int C),                                                                                     \
      (dresid, dweight, scratch, dout, inp, weight, rstd, N, C))                                   \
    X(FUSED, qk_norm_rope_forward, ct_qk_norm_rope_forward_fn, cpu_qk_norm_rope_forward, ALL,      \
      "qk_norm+rope", forward,                                                                     \
      (const struct ct_ops *ops, float *qr, float *kr, float *v, float *q_rstd, float *k_rstd,     \
       float *scratch, const float *qkv, const float *q_norm, const float *k_norm,                 \
       const float *cos, const float *sin, int B, int T, int NH, int NKV, int D, float eps),       \
      (qr, kr, v, q_rstd, k_rstd, scratch, qkv, q_norm, k_norm, cos, sin, B, T, NH, NKV, D,        \
       eps))                                                                                       \
    X(FUSED, qk_norm_rope_backward, ct_qk_norm_rope_backward_fn, cpu_qk_norm_rope_backward, ALL,   \
      "qk_norm+rope", backward,                                                                    \
      (const struct ct_ops *ops, float *dqkv, float *dq_norm, float *dk_norm, float *dqr,          \
       float *dkr, const float *dv, const float *qkv, const float *q_norm, const float *k_norm,    \
       const float *q_rstd, const float *k_rstd, const float *cos, const float *sin, int B,        \
       int T, int NH, int NKV, int D),                                                             \
      (dqkv, dq_norm, dk_norm, dqr, dkr, dv, qkv, q_norm, k_norm, q_rstd, k_rstd, cos, sin, B, T,  \
       NH, NKV, D))                                                                                \
    X(FUSED, swiglu_rows_forward, ct_swiglu_rows_forward_fn, cpu_swiglu_rows_forward, ALL,         \
      "swiglu_rows", forward,                                                                      \
      (const struct ct_ops *ops, float *h, float *scratch, const float *gate_up, int N, int F),    \
      (h, scratch, gate_up, N, F))                                                                 \
    X(FUSED, swiglu_rows_backward, ct_swiglu_rows_backward_fn, cpu_swiglu_rows_backward, ALL,      \
      "swiglu_rows", backward,                                                                     \
      (const struct ct_ops *ops, float *dgate_up, float *scratch, const float *dh,                 \
       const float *gate_up, int N, int F),                                                        \
      (dgate_up, scratch, dh, gate_up, N, F))                                                      \
    X(OWN_SIZE, swiglu_rows_scratch_floats, ct_swiglu_rows_scratch_floats_fn, NULL, OPT,           \
      "swiglu_rows", scratch, (int N, int F), (N, F))                                              \
    X(OWN, moe_route_forward, ct_moe_route_forward_fn, moe_route_forward, MOE, "moe_router",       \
      forward,                                                                                     \
      (int32_t *expert, float *weight, float *probs, const float *bias, int N, int E, int K,       \
       bool norm, float *scratch, int threads),                                                    \
      (expert, weight, probs, bias, N, E, K, norm, scratch, threads))                              \
    X(OWN, moe_route_backward, ct_moe_route_backward_fn, moe_route_backward, MOE, "moe_router",    \
      backward,                                                                                    \
      (float *dlogits, const float *dweight, const float *aux_dprob, const float *probs,           \
       const int32_t *expert, const float *weight, int N, int E, int K, bool norm),                \
      (dlogits, dweight, aux_dprob, probs, expert, weight, N, E, K, norm))                         \
    X(OWN, moe_route_stats, ct_moe_route_stats_fn, moe_route_stats, MOE, "moe_route_stats", none,  \
      (double *load, double *prob_sum, const int32_t *expert, const float *probs, int N, int E,    \
       int K),                                                                                     \
      (load, prob_sum, expert, probs, N, E, K))                                                    \
    X(OWN, moe_ep_gather, ct_moe_ep_gather_fn, cpu_moe_ep_gather, OPT, "moe_ep", none,             \
      (void *dst, const void *src, const int32_t *idx, int n, int row_bytes),                      \
      (dst, src, idx, n, row_bytes))                                                               \
    X(OWN, moe_ep_combine, ct_moe_ep_combine_fn, cpu_moe_ep_combine, OPT, "moe_ep", none,          \
      (float *out, const float *rows, const int32_t *tpos, int N, int C, int K),                   \
      (out, rows, tpos, N, C, K))                                                                  \
    X(OWN, loss_sum, ct_loss_sum_fn, cpu_loss_sum, ALL, "loss_sum", none,                          \
      (double *host_out, const float *losses, const int32_t *targets, int ignore, int N),          \
      (host_out, losses, targets, ignore, N))                                                      \
    X(OWN, sum_squares, ct_sum_squares_fn, cpu_sum_squares, ALL, "sum_squares", none,              \
      (double *host_out, const float *x, size_t n), (host_out, x, n))                              \
    X(OWN, first_nonfinite, ct_first_nonfinite_fn, cpu_first_nonfinite, ALL, "first_nonfinite",    \
      none, (size_t *host_out, const float *x, size_t n), (host_out, x, n))                        \
    X(OWN, hash_xxh64, ct_hash_xxh64_fn, cpu_hash_xxh64, ALL, "hash_xxh64", none,                  \
      (uint64_t *host_out, const void *p, size_t bytes), (host_out, p, bytes))                     \
    X(OWN, adamw_update, ct_adamw_update_fn, cpu_adamw_update, ALL, "adamw", none,                 \
      (float *p, uint16_t *p16, const float *g, float *m, float *v, size_t n,                      \
       const ct_adamw_range *no_decay, int n_no_decay, bool decay, const ct_adamw_coeffs *k),      \
      (p, p16, g, m, v, n, no_decay, n_no_decay, decay, k))                                                 \
    X(OWN_SIZE, matmul_bf16_scratch_floats, ct_matmul_bf16_scratch_floats_fn,                      \
      cpu_matmul_bf16_scratch_floats, OPT, "matmul_bf16", scratch,                                 \
      (const struct ct_ops *ops, int N, int C, int OC, bool staged), (ops, N, C, OC, staged))      \
    X(OWN, matmul_bf16_forward, ct_matmul_bf16_forward_fn, cpu_matmul_bf16_forward, OPT,           \
      "matmul_bf16", forward,                                                                      \
      (const struct ct_ops *ops, float *out, uint16_t *out16, float *scratch, const float *inp,    \
       const uint16_t *inp16, const uint16_t *weight, const float *bias, int N, int C, int OC),    \
      (ops, out, out16, scratch, inp, inp16, weight, bias, N, C, OC))                              \
    X(OWN, matmul_bf16_backward, ct_matmul_bf16_backward_fn, cpu_matmul_bf16_backward, OPT,        \
      "matmul_bf16", backward,                                                                     \
      (const struct ct_ops *ops, float *dinp, float *dweight, float *dbias, float *scratch,        \
       const float *dout, const uint16_t *dout16, const float *inp, const uint16_t *inp16,         \
       const uint16_t *weight, int N, int C, int OC),                                              \
      (ops, dinp, dweight, dbias, scratch, dout, dout16, inp, inp16, weight, N, C, OC))            \
    X(OWN_SIZE, moe_bf16_state_floats, ct_moe_bf16_floats_fn,                                      \
      cpu_moe_grouped_bf16_state_floats, OPT, "experts_bf16", state,                               \
      (int N, int C, int F, int E, int K), (N, C, F, E, K))                                        \
    X(OWN_SIZE, moe_bf16_scratch_floats, ct_moe_bf16_scratch_floats_fn,                            \
      cpu_moe_grouped_bf16_scratch_floats, OPT, "experts_bf16", scratch,                           \
      (const struct ct_ops *ops, int N, int C, int F, int E, int K), (ops, N, C, F, E, K))         \
    X(OWN, moe_bf16_forward, ct_moe_bf16_forward_fn, cpu_moe_grouped_bf16_forward, OPT,            \
      "experts_bf16", forward,                                                                     \
      (const struct ct_ops *ops, float *out, float *state, float *scratch, const uint16_t *x16,    \
       const int32_t *expert, const float *weight, const uint16_t *w, int N, int C, int F, int E,  \
       int K),                                                                                     \
      (ops, out, state, scratch, x16, expert, weight, w, N, C, F, E, K))                           \
    X(OWN, moe_bf16_backward, ct_moe_bf16_backward_fn, cpu_moe_grouped_bf16_backward, OPT,         \
      "experts_bf16", backward,                                                                    \
      (const struct ct_ops *ops, float *dx, float *dweight, float *dw, float *scratch,             \
       const float *dout, const float *state, const uint16_t *x16, const int32_t *expert,          \
       const float *weight, const uint16_t *w, int N, int C, int F, int E, int K),                 \
      (ops, dx, dweight, dw, scratch, dout, state, x16, expert, weight, w, N, C, F, E, K))         \
    X(OWN, f32_to_bf16, ct_f32_to_bf16_fn, cpu_f32_to_bf16, OPT, "to_bf16", none,                  \
      (uint16_t *dst, const float *src, size_t n), (dst, src, n))                                  \
    X(OWN, round_to_bf16, ct_round_to_bf16_fn, cpu_round_to_bf16, OPT, "to_bf16", none,            \
      (uint16_t *dst, float *x, size_t n), (dst, x, n))                                            \
    X(OWN, bf16_to_f32, ct_bf16_to_f32_fn, cpu_bf16_to_f32, OPT, "from_bf16", none,                \
      (float *dst, const uint16_t *src, size_t n), (dst, src, n))                                  \
    X(OWN, cross_entropy_bf16_forward, ct_cross_entropy_bf16_forward_fn,                           \
      cpu_cross_entropy_bf16_forward, OPT, "cross_entropy_bf16", forward,                          \
      (float *losses, const uint16_t *logits, const int32_t *targets, int N, int V),               \
      (losses, logits, targets, N, V))                                                             \
    X(OWN, cross_entropy_bf16_backward, ct_cross_entropy_bf16_backward_fn,                         \
      cpu_cross_entropy_bf16_backward, OPT, "cross_entropy_bf16", backward,                        \
      (uint16_t *dlogits, const uint16_t *logits, const int32_t *targets, float scale, int N,      \
       int V),                                                                                     \
      (dlogits, logits, targets, scale, N, V))                                                     \
    X(OWN, cross_entropy_forward_backward, ct_cross_entropy_forward_backward_fn,                   \
      cpu_cross_entropy_forward_backward, OPT, "cross_entropy", both,                              \
      (float *losses, float *dlogits, const float *logits, const int32_t *targets, float scale,    \
       float *scratch, int N, int V),                                                              \
      (losses, dlogits, logits, targets, scale, scratch, N, V))                                    \
    X(OWN, cross_entropy_bf16_forward_backward, ct_cross_entropy_bf16_forward_backward_fn,         \
      cpu_cross_entropy_bf16_forward_backward, OPT, "cross_entropy_bf16", both,                    \
      (float *losses, uint16_t *dlogits, const uint16_t *logits, const int32_t *targets,           \
       float scale, float *scratch, int N, int V),                                                 \
      (losses, dlogits, logits, targets, scale, scratch, N, V))                                    \
    X(OWN, cross_entropy_tp_max, ct_cross_entropy_tp_max_fn, cpu_cross_entropy_tp_max, OPT,        \
      "cross_entropy_tp", forward, (float *maxes, const void *logits, bool bf16, int N, int V),    \
      (maxes, logits, bf16, N, V))                                                                 \
    X(OWN, cross_entropy_tp_sums, ct_cross_entropy_tp_sums_fn, cpu_cross_entropy_tp_sums, OPT,     \
      "cross_entropy_tp", forward,                                                                 \
      (float *sums, const float *maxes, int P, const void *logits, bool bf16,                      \
       const int32_t *targets, int N, int V),                                                      \
      (sums, maxes, P, logits, bf16, targets, N, V))                                               \
    X(OWN, cross_entropy_tp_finish, ct_cross_entropy_tp_finish_fn, cpu_cross_entropy_tp_finish,    \
      OPT, "cross_entropy_tp", both,                                                               \
      (float *losses, void *dlogits, const float *maxes, int P, const float *sums,                 \
       const void *logits, bool bf16, const int32_t *targets, float scale, int N, int V),          \
      (losses, dlogits, maxes, P, sums, logits, bf16, targets, scale, N, V))                       \
    X(OWN, swiglu_rows_bf16_forward, ct_swiglu_rows_bf16_forward_fn,                               \
      cpu_swiglu_rows_bf16_forward, OPT, "swiglu_rows_bf16", forward,                              \
      (uint16_t *h, const uint16_t *gate_up, int N, int F), (h, gate_up, N, F))                    \
    X(OWN, swiglu_rows_bf16_backward, ct_swiglu_rows_bf16_backward_fn,                             \
      cpu_swiglu_rows_bf16_backward, OPT, "swiglu_rows_bf16", backward,                            \
      (uint16_t *dgate_up, const float *dh, const uint16_t *gate_up, int N, int F),                \
      (dgate_up, dh, gate_up, N, F))                                                               \
    X(OWN, attention_bf16_forward, ct_attention_bf16_forward_fn, NULL, OPT, "attention_bf16",      \
      forward,                                                                                     \
      (float *out, float *state, const float *q, const float *k, const float *v, int B, int T,     \
       int NH, int NKV, int D),                                                                    \
      (out, state, q, k, v, B, T, NH, NKV, D))                                                     \
    X(OWN, attention_bf16_backward, ct_attention_bf16_backward_fn, NULL, OPT, "attention_bf16",    \
      backward,                                                                                    \
      (float *dq, float *dk, float *dv, float *scratch, const float *dout, const float *out,       \
       const float *state, const float *q, const float *k, const float *v, int B, int T, int NH,   \
       int NKV, int D),                                                                            \
      (dq, dk, dv, scratch, dout, out, state, q, k, v, B, T, NH, NKV, D))                          \
    X(OWN, lora_forward, ct_lora_forward_fn, cpu_lora_forward, OPT, "lora", forward,              \
      (float *y, uint16_t *y16, int ldy, float *u, float *scratch, const float *x, const float *A, \
       const float *B, float scale, bool bf16, int N, int in, int r, int out),                     \
      (y, y16, ldy, u, scratch, x, A, B, scale, bf16, N, in, r, out))                              \
    X(OWN, lora_backward, ct_lora_backward_fn, cpu_lora_backward, OPT, "lora", backward,           \
      (float *dx, float *dA, float *dB, float *scratch, const float *dy, const uint16_t *dy16,     \
       int ldy, const float *u, const float *x, const float *A, const float *B, float scale,       \
       bool bf16, int N, int in, int r, int out),                                                  \
      (dx, dA, dB, scratch, dy, dy16, ldy, u, x, A, B, scale, bf16, N, in, r, out))                \
    X(OWN, moe_lora_forward, ct_moe_lora_forward_fn, cpu_moe_grouped_lora_forward, OPT,            \
      "moe_lora", forward,                                                                         \
      (float *out, float *state, float *scratch, const float *x, const int32_t *expert,            \
       const float *weight, const float *w, const struct ct_moe_lora *lora, int N, int C, int F,   \
       int E, int K),                                                                              \
      (out, state, scratch, x, expert, weight, w, lora, N, C, F, E, K))                            \
    X(OWN, moe_lora_backward, ct_moe_lora_backward_fn, cpu_moe_grouped_lora_backward, OPT,         \
      "moe_lora", backward,                                                                        \
      (float *dx, float *dweight, float *scratch, const float *dout, const float *state,           \
       const float *x, const int32_t *expert, const float *weight, const float *w,                 \
       const struct ct_moe_lora *lora, int N, int C, int F, int E, int K),                         \
      (dx, dweight, scratch, dout, state, x, expert, weight, w, lora, N, C, F, E, K))              \
    X(OWN, moe_bf16_lora_forward, ct_moe_bf16_lora_forward_fn, cpu_moe_grouped_bf16_lora_forward,  \
      OPT, "experts_bf16_lora", forward,                                                           \
      (const struct ct_ops *ops, float *out, float *state, float *scratch, const uint16_t *x16,    \
       const int32_t *expert, const float *weight, const uint16_t *w,                              \
       const struct ct_moe_lora *lora, int N, int C, int F, int E, int K),                         \
      (ops, out, state, scratch, x16, expert, weight, w, lora, N, C, F, E, K))                     \
    X(OWN, moe_bf16_lora_backward, ct_moe_bf16_lora_backward_fn,                                   \
      cpu_moe_grouped_bf16_lora_backward, OPT, "experts_bf16_lora", backward,                      \
      (const struct ct_ops *ops, float *dx, float *dweight, float *scratch, const float *dout,     \
       const float *state, const uint16_t *x16, const int32_t *expert, const float *weight,        \
       const uint16_t *w, const struct ct_moe_lora *lora, int N, int C, int F, int E, int K),      \
      (ops, dx, dweight, scratch, dout, state, x16, expert, weight, w, lora, N, C, F, E, K))       \
    X(OWN, lora_dropout, ct_lora_dropout_fn, cpu_lora_dropout, OPT, "lora_dropout", none,          \
      (float *out, const float *x, int64_t n, float p, uint64_t seed, uint64_t first),            \
      (out, x, n, p, seed, first))                                                                 \
    X(OWN, attention_pair_forward, ct_attention_pair_forward_fn, cpu_attention_pair_forward, OPT, \
      "attention_pair", forward,                                                                   \
      (float *out, float *lse, const float *q, const float *k, const float *v, int Tq, int Tk,    \
       int NH, int NKV, int D, bool causal, const int32_t *q_doc, int k0, bool bf16),              \
      (out, lse, q, k, v, Tq, Tk, NH, NKV, D, causal, q_doc, k0, bf16))                            \
    X(OWN, attention_pair_backward, ct_attention_pair_backward_fn, cpu_attention_pair_backward,   \
      OPT, "attention_pair", backward,                                                             \
      (float *dq, float *dk, float *dv, float *di, const float *dout, const float *out,           \
       const float *lse, const float *q, const float *k, const float *v, int Tq, int Tk, int NH,   \
       int NKV, int D, bool causal, const int32_t *q_doc, int k0, bool bf16),                      \
      (dq, dk, dv, di, dout, out, lse, q, k, v, Tq, Tk, NH, NKV, D, causal, q_doc, k0, bf16))      \
    X(OWN, attention_lse_merge, ct_attention_lse_merge_fn, cpu_attention_lse_merge, OPT,           \
      "attention_lse_merge", none,                                                                 \
      (float *out, float *lse, const float *out_b, const float *lse_b, int T, int NH, int D),      \
      (out, lse, out_b, lse_b, T, NH, D))                                                          \
    X(OWN, attention_decode, ct_attention_decode_fn, cpu_attention_decode, ALL,                    \
      "attention_decode", forward,                                                                 \
      (float *out, float *scratch, const float *q, const float *k, const float *v, int T, int NH,  \
       int NKV, int D),                                                                            \
      (out, scratch, q, k, v, T, NH, NKV, D))                                                      \
    X(OWN, attention_decode_bf16, ct_attention_decode_bf16_fn, cpu_attention_decode_bf16, ALL,     \
      "attention_decode", forward,                                                                 \
      (float *out, float *scratch, const float *q, const uint16_t *k, const uint16_t *v, int T,    \
       int NH, int NKV, int D),                                                                    \
      (out, scratch, q, k, v, T, NH, NKV, D))                                                      \
    X(OWN_SIZE, attention_decode_scratch_floats, ct_attention_decode_scratch_floats_fn,            \
      cpu_attention_decode_scratch_floats, ALL, "attention_decode", scratch,                       \
      (int T, int NH, int D), (T, NH, D))
// clang-format on

// What each kind returns, and which kinds are timed by the profiler (CT_OP_IF_TIMED_<kind>(x)
// is x for those, nothing for the size queries).
#define CT_OP_RET_PLUGIN void
#define CT_OP_RET_PLUGIN_SIZE size_t
#define CT_OP_RET_OWN void
#define CT_OP_RET_OWN_SIZE size_t
#define CT_OP_RET_FUSED void
#define CT_OP_IF_TIMED_PLUGIN(...) __VA_ARGS__
#define CT_OP_IF_TIMED_PLUGIN_SIZE(...)
#define CT_OP_IF_TIMED_OWN(...) __VA_ARGS__
#define CT_OP_IF_TIMED_OWN_SIZE(...)
#define CT_OP_IF_TIMED_FUSED(...) __VA_ARGS__
#define CT_OP_UNPACK(...) __VA_ARGS__

// The types of the entries plugin.h does not declare, from their parameter lists; and for
// every entry, a compile-time check that its parameter list is its type's (so the generated
// wrappers and the plugin ABI cannot drift apart).
#define CT_OP_TYPEDEF(kind, field, type, cpu, need, op, dir, params, args)                         \
    CT_OP_TYPEDEF_##kind(CT_OP_RET_##kind, type, params)
#define CT_OP_TYPEDEF_PLUGIN(ret, type, params)
#define CT_OP_TYPEDEF_PLUGIN_SIZE(ret, type, params)
#define CT_OP_TYPEDEF_OWN(ret, type, params) typedef ret(*type) params;
#define CT_OP_TYPEDEF_OWN_SIZE(ret, type, params) typedef ret(*type) params;
#define CT_OP_TYPEDEF_FUSED(ret, type, params) typedef ret(*type) params;
CT_OPS_LIST(CT_OP_TYPEDEF)
#undef CT_OP_TYPEDEF

#define CT_OP_CHECK_TYPE(kind, field, type, cpu, need, op, dir, params, args)                      \
    _Static_assert(_Generic((CT_OP_RET_##kind(*) params)0, type : 1, default : 0),                 \
                   "the list's parameters of " #field " are not its type's");
CT_OPS_LIST(CT_OP_CHECK_TYPE)
#undef CT_OP_CHECK_TYPE

// The enum and the name table: CT_OP_<field> indexes ct_op_field_names ("rope_forward").
typedef enum ct_op_id {
#define CT_OP_ENUM(kind, field, ...) CT_OP_##field,
    CT_OPS_LIST(CT_OP_ENUM)
#undef CT_OP_ENUM
        CT_OP_COUNT
} ct_op_id;

// Adding an op changes this count: update it with the list (and its kernels).
_Static_assert(CT_OP_COUNT == 73, "the op list has 73 entries");

extern const char *const ct_op_field_names[CT_OP_COUNT];

// Which direction an entry is (the plugin registry puts an override's kernels by it).
typedef enum ct_op_dir {
    CT_OP_DIR_forward,
    CT_OP_DIR_backward,
    CT_OP_DIR_none,
    CT_OP_DIR_both,
    CT_OP_DIR_state,
    CT_OP_DIR_scratch
} ct_op_dir;
