// The built-in CPU kernels behind ct_ops_cpu, one family per file. Declared here so the table in
// ops_cpu.c can list them; everything else reaches them through ct_ops.
#pragma once
#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>

#include "ops/ops_list.h"

// Column sums (bias, norm weight, embedding grads) are parallelised over blocks of this many
// columns (one 64-byte cache line), each block summing its rows serially in row order: the
// result does not depend on the thread count, and no two threads write one cache line.
#define CPU_COL_BLOCK 16

// Loops touching fewer values than this run on one thread: waking a team costs more than the
// work (and on a loaded machine a barrier can wait a whole time slice). Every loop gives the
// same bits on one thread as on many, so the switch does not affect results.
#define CPU_PAR_MIN 32768

void cpu_embedding_forward(float *out, const int32_t *ids, const float *table, int N, int C);
void cpu_embedding_bf16_forward(float *out, const int32_t *ids, const uint16_t *table, int N,
                                int C);
void cpu_embedding_backward(float *dtable, const float *dout, const int32_t *ids, int N, int C);
void cpu_add(float *out, const float *a, const float *b, int64_t n);

void cpu_matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int N,
                        int C, int OC);
void cpu_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                         const float *inp, const float *weight, int N, int C, int OC);
void cpu_matmul_add_bias(float *out, const float *bias, int N, int OC);
// Rows [0, n) of a one-row product run as fn(ctx, r0, r1) over OpenMP's threads (on one where
// !parallel), each thread its contiguous share in steps, then the steps left in the others'
// (matmul.c). A row's result must not depend on which thread runs it.
void cpu_rows_shared(int n, bool parallel, void (*fn)(void *ctx, int r0, int r1), void *ctx);
void cpu_matmul_bias_grad(float *dbias, const float *dout, int N, int OC);
// bf16 mixed precision (matmul_bf16.c, oneDNN; the contracts are ops.h's). `ops` is the table
// the call came through: its kernel state (cpu_kernels.h) holds the shapes' primitives.
size_t cpu_matmul_bf16_scratch_floats(const struct ct_ops *ops, int N, int C, int OC, bool staged);
// Whether the bf16 GEMMs of the table's kernel state are emulated on sgemm
// (matmul_bf16_emulated.c); for a table bound to no backend, whether a new state's would be.
bool cpu_matmul_bf16_emulated(const struct ct_ops *ops);
void cpu_matmul_bf16_forward(const struct ct_ops *ops, float *out, uint16_t *out16, float *scratch,
                             const float *inp, const uint16_t *inp16, const uint16_t *weight,
                             const float *bias, int N, int C, int OC);
void cpu_matmul_bf16_backward(const struct ct_ops *ops, float *dinp, float *dweight, float *dbias,
                              float *scratch, const float *dout, const uint16_t *dout16,
                              const float *inp, const uint16_t *inp16, const uint16_t *weight,
                              int N, int C, int OC);
void cpu_f32_to_bf16(uint16_t *dst, const float *src, size_t n);
void cpu_round_to_bf16(uint16_t *dst, float *x, size_t n);
void cpu_bf16_to_f32(float *dst, const uint16_t *src, size_t n);
void cpu_swiglu_rows_bf16_forward(uint16_t *h, const uint16_t *gate_up, int N, int F);
void cpu_swiglu_rows_bf16_backward(uint16_t *dgate_up, const float *dh, const uint16_t *gate_up,
                                   int N, int F);
void cpu_cross_entropy_forward_backward(float *losses, float *dlogits, const float *logits,
                                        const int32_t *targets, float scale, float *scratch, int N,
                                        int V);
void cpu_cross_entropy_bf16_forward_backward(float *losses, uint16_t *dlogits,
                                             const uint16_t *logits, const int32_t *targets,
                                             float scale, float *scratch, int N, int V);
// Loss parallel (tensor parallelism): the cross-entropy of rows whose V logits are this rank's
// columns of P ranks' (cross_entropy.c).
void cpu_cross_entropy_tp_max(float *maxes, const void *logits, bool bf16, int N, int V);
void cpu_cross_entropy_tp_sums(float *sums, const float *maxes, int P, const void *logits,
                               bool bf16, const int32_t *targets, int N, int V);
void cpu_cross_entropy_tp_finish(float *losses, void *dlogits, const float *maxes, int P,
                                 const float *sums, const void *logits, bool bf16,
                                 const int32_t *targets, float scale, int N, int V);
void cpu_cross_entropy_bf16_forward(float *losses, const uint16_t *logits, const int32_t *targets,
                                    int N, int V);
void cpu_cross_entropy_bf16_backward(uint16_t *dlogits, const uint16_t *logits,
                                     const int32_t *targets, float scale, int N, int V);

void cpu_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int N,
                         int C, float eps);
void cpu_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                          const float *weight, const float *rstd, int N, int C);
// dweight(C) += sum over N*H rows of dy * (x * rstd) (the norm weight's gradient), by column
// blocks with rows in order. Row (n, h) of x starts at x + n * xstride + h * C (the q/k heads
// inside the fused q|k|v rows); dy (N*H, C) and rstd (N*H) are contiguous.
void cpu_rmsnorm_dweight(float *dweight, const float *dy, const float *x, const float *rstd, int N,
                         int H, size_t xstride, int C);

void cpu_rope_forward(float *out, const float *inp, const float *cos, const float *sin, int B,
                      int T, int H, int D);
void cpu_rope_backward(float *dinp, const float *dout, const float *cos, const float *sin, int B,
                       int T, int H, int D);

size_t cpu_attention_state_floats(int B, int T, int NH, int NKV, int D);
size_t cpu_attention_scratch_floats(int B, int T, int NH, int NKV, int D);
void cpu_attention_forward(float *out, float *probs, const float *q, const float *k, const float *v,
                           int B, int T, int NH, int NKV, int D);
void cpu_attention_backward(float *dq, float *dk, float *dv, float *dscores, const float *dout,
                            const float *out, const float *probs, const float *q, const float *k,
                            const float *v, int B, int T, int NH, int NKV, int D);
// PEFT's LoRA branch (lora.c; ops.h has the contracts).
void cpu_lora_forward(float *y, uint16_t *y16, int ldy, float *u, float *scratch, const float *x,
                      const float *A, const float *B, float scale, bool bf16, int N, int in, int r,
                      int out);
void cpu_lora_backward(float *dx, float *dA, float *dB, float *scratch, const float *dy,
                       const uint16_t *dy16, int ldy, const float *u, const float *x,
                       const float *A, const float *B, float scale, bool bf16, int N, int in, int r,
                       int out);
// The same with acc (ct_lora_acc_doubles, or NULL: as cpu_lora_backward): in fp32, the three
// rank-r products (dB, dA and the branch's middle gradient) summed in double, in row blocks of
// LORA_ACC_ROWS. An expert's adapter sees few tokens: its gradients are short sums that cancel,
// and Adam's normalised step magnifies fp32's rounding of them (issue 31).
#define LORA_ACC_ROWS 64
void cpu_lora_backward_acc(float *dx, float *dA, float *dB, float *scratch, const float *dy,
                           const uint16_t *dy16, int ldy, const float *u, const float *x,
                           const float *A, const float *B, float scale, bool bf16, int N, int in,
                           int r, int out, double *acc);
// t (N, out) = the branch's term as lora_forward adds it, from u (N, r) = A x as it saved it
// (bf16: B rounded into Bb (out, r), the product and the scaled term rounded).
void cpu_lora_term(float *t, float *Bb, const float *u, const float *B, float scale, bool bf16,
                   int N, int r, int out);
void cpu_lora_dropout(float *out, const float *x, int64_t n, float p, uint64_t seed,
                      uint64_t first);
void cpu_attention_decode(float *out, float *scratch, const float *q, const float *k,
                          const float *v, int T, int NH, int NKV, int D);
void cpu_attention_decode_bf16(float *out, float *scratch, const float *q, const uint16_t *k,
                               const uint16_t *v, int T, int NH, int NKV, int D);
size_t cpu_attention_decode_scratch_floats(int T, int NH, int D);

void cpu_swiglu_forward(float *out, const float *gate, const float *up, int64_t n);
void cpu_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                         const float *up, int64_t n);

// Fused elementwise kernels (fused.c): the same bits as the sequences of the kernels above that
// ops.h describes, in one pass. They ignore `ops` (the composites use it).
struct ct_ops;
void cpu_add_rmsnorm_forward(const struct ct_ops *ops, float *sum, float *out, float *rstd,
                             const float *a, const float *b, const float *weight, int N, int C,
                             float eps);
void cpu_rmsnorm_backward_add(const struct ct_ops *ops, float *dresid, float *dweight,
                              float *scratch, const float *dout, const float *inp,
                              const float *weight, const float *rstd, int N, int C);
void cpu_qk_norm_rope_forward(const struct ct_ops *ops, float *qr, float *kr, float *v,
                              float *q_rstd, float *k_rstd, float *scratch, const float *qkv,
                              const float *q_norm, const float *k_norm, const float *cos,
                              const float *sin, int B, int T, int NH, int NKV, int D, float eps);
void cpu_qk_norm_rope_backward(const struct ct_ops *ops, float *dqkv, float *dq_norm,
                               float *dk_norm, float *dqr, float *dkr, const float *dv,
                               const float *qkv, const float *q_norm, const float *k_norm,
                               const float *q_rstd, const float *k_rstd, const float *cos,
                               const float *sin, int B, int T, int NH, int NKV, int D);
void cpu_swiglu_rows_forward(const struct ct_ops *ops, float *h, float *scratch,
                             const float *gate_up, int N, int F);
void cpu_swiglu_rows_backward(const struct ct_ops *ops, float *dgate_up, float *scratch,
                              const float *dh, const float *gate_up, int N, int F);

// Mixture-of-experts experts (moe_experts.c): "loop" is the per-expert reference, "grouped"
// (the table's) sorts slots by expert and fuses gate|up into one GEMM per expert.
size_t cpu_moe_loop_state_floats(int N, int C, int F, int E, int K);
size_t cpu_moe_loop_scratch_floats(int N, int C, int F, int E, int K);
void cpu_moe_loop_forward(float *out, float *state, float *scratch, const float *x,
                          const int32_t *expert, const float *weight, const float *w, int N, int C,
                          int F, int E, int K);
void cpu_moe_loop_backward(float *dx, float *dweight, float *dw, float *scratch, const float *dout,
                           const float *state, const float *x, const int32_t *expert,
                           const float *weight, const float *w, int N, int C, int F, int E, int K);
// Expert parallelism's row moves (moe_ep.c): dst row i = src row idx[i] (rows of row_bytes);
// out[t] = the sum from 0.0f of rows tpos[t*K .. t*K+K) in that order.
void cpu_moe_ep_gather(void *dst, const void *src, const int32_t *idx, int n, int row_bytes);
void cpu_moe_ep_combine(float *out, const float *rows, const int32_t *tpos, int N, int C, int K);
size_t cpu_moe_grouped_state_floats(int N, int C, int F, int E, int K);
size_t cpu_moe_grouped_scratch_floats(int N, int C, int F, int E, int K);
void cpu_moe_grouped_forward(float *out, float *state, float *scratch, const float *x,
                             const int32_t *expert, const float *weight, const float *w, int N,
                             int C, int F, int E, int K);
void cpu_moe_grouped_backward(float *dx, float *dweight, float *dw, float *scratch,
                              const float *dout, const float *state, const float *x,
                              const int32_t *expert, const float *weight, const float *w, int N,
                              int C, int F, int E, int K);
// The grouped kernel with PEFT's LoRA on each expert's projections (ops.h's moe_lora_*).
void cpu_moe_grouped_lora_forward(float *out, float *state, float *scratch, const float *x,
                                  const int32_t *expert, const float *weight, const float *w,
                                  const struct ct_moe_lora *lora, int N, int C, int F, int E,
                                  int K);
void cpu_moe_grouped_lora_backward(float *dx, float *dweight, float *scratch, const float *dout,
                                   const float *state, const float *x, const int32_t *expert,
                                   const float *weight, const float *w,
                                   const struct ct_moe_lora *lora, int N, int C, int F, int E,
                                   int K);
// The same two under bf16 mixed precision (moe_experts_bf16.c, oneDNN): x16 is the input in
// bf16, w the bf16 copy of the experts' weights. The scratch size query creates the shape's oneDNN
// matmuls (SIZE_MAX: oneDNN could not make them) in the kernel state of `ops`, the table the
// call came through (cpu_kernels.h).
size_t cpu_moe_loop_bf16_state_floats(int N, int C, int F, int E, int K);
size_t cpu_moe_loop_bf16_scratch_floats(const struct ct_ops *ops, int N, int C, int F, int E,
                                        int K);
void cpu_moe_loop_bf16_forward(const struct ct_ops *ops, float *out, float *state, float *scratch,
                               const uint16_t *x16, const int32_t *expert, const float *weight,
                               const uint16_t *w, int N, int C, int F, int E, int K);
void cpu_moe_loop_bf16_backward(const struct ct_ops *ops, float *dx, float *dweight, float *dw,
                                float *scratch, const float *dout, const float *state,
                                const uint16_t *x16, const int32_t *expert, const float *weight,
                                const uint16_t *w, int N, int C, int F, int E, int K);
size_t cpu_moe_grouped_bf16_state_floats(int N, int C, int F, int E, int K);
size_t cpu_moe_grouped_bf16_scratch_floats(const struct ct_ops *ops, int N, int C, int F, int E,
                                           int K);
void cpu_moe_grouped_bf16_forward(const struct ct_ops *ops, float *out, float *state,
                                  float *scratch, const uint16_t *x16, const int32_t *expert,
                                  const float *weight, const uint16_t *w, int N, int C, int F,
                                  int E, int K);
void cpu_moe_grouped_bf16_backward(const struct ct_ops *ops, float *dx, float *dweight, float *dw,
                                   float *scratch, const float *dout, const float *state,
                                   const uint16_t *x16, const int32_t *expert, const float *weight,
                                   const uint16_t *w, int N, int C, int F, int E, int K);

// The grouped bf16 kernel with PEFT's LoRA on each expert's projections (ops.h's
// moe_bf16_lora_*).
void cpu_moe_grouped_bf16_lora_forward(const struct ct_ops *ops, float *out, float *state,
                                       float *scratch, const uint16_t *x16, const int32_t *expert,
                                       const float *weight, const uint16_t *w,
                                       const struct ct_moe_lora *lora, int N, int C, int F, int E,
                                       int K);
void cpu_moe_grouped_bf16_lora_backward(const struct ct_ops *ops, float *dx, float *dweight,
                                        float *scratch, const float *dout, const float *state,
                                        const uint16_t *x16, const int32_t *expert,
                                        const float *weight, const uint16_t *w,
                                        const struct ct_moe_lora *lora, int N, int C, int F, int E,
                                        int K);

void cpu_cross_entropy_forward(float *losses, const float *logits, const int32_t *targets, int N,
                               int V);
void cpu_cross_entropy_backward(float *dlogits, const float *logits, const int32_t *targets,
                                float scale, int N, int V);
// Flash-style attention (attention_flash.c): the same op without the (T,T) probabilities. The
// state holds the rows' log-sum-exps (B,NH,T), the scratch rowsum(dout * out) (B,NH,T); a table
// using it must take its backward and sizes too (the built-in backward reads probabilities).
size_t cpu_attention_flash_state_floats(int B, int T, int NH, int NKV, int D);
size_t cpu_attention_flash_scratch_floats(int B, int T, int NH, int NKV, int D);
void cpu_attention_flash_forward(float *out, float *state, const float *q, const float *k,
                                 const float *v, int B, int T, int NH, int NKV, int D);
void cpu_attention_flash_backward(float *dq, float *dk, float *dv, float *scratch,
                                  const float *dout, const float *out, const float *state,
                                  const float *q, const float *k, const float *v, int B, int T,
                                  int NH, int NKV, int D);
void cpu_attention_flash_bf16_forward(float *out, float *state, const float *q, const float *k,
                                      const float *v, int B, int T, int NH, int NKV, int D);
void cpu_attention_flash_bf16_backward(float *dq, float *dk, float *dv, float *scratch,
                                       const float *dout, const float *out, const float *state,
                                       const float *q, const float *k, const float *v, int B, int T,
                                       int NH, int NKV, int D);

// Ring attention's pieces (context parallelism; attention_flash.c, ops.h's contract).
void cpu_attention_pair_forward(float *out, float *lse, const float *q, const float *k,
                                const float *v, int Tq, int Tk, int NH, int NKV, int D, bool causal,
                                const int32_t *q_doc, int k0, bool bf16);
void cpu_attention_pair_backward(float *dq, float *dk, float *dv, float *di, const float *dout,
                                 const float *out, const float *lse, const float *q, const float *k,
                                 const float *v, int Tq, int Tk, int NH, int NKV, int D,
                                 bool causal, const int32_t *q_doc, int k0, bool bf16);
void cpu_attention_lse_merge(float *out, float *lse, const float *out_b, const float *lse_b, int T,
                             int NH, int D);

// The routing (moe_router.h), the reductions (reduce.c) and the optimizer's update
// (adamw_update.c). host_out: a result the caller reads on the host.
void cpu_loss_sum(double *host_out, const float *losses, const int32_t *targets, int ignore, int N);
void cpu_sum_squares(double *host_out, const float *x, size_t n);
void cpu_first_nonfinite(size_t *host_out, const float *x, size_t n);
void cpu_hash_xxh64(uint64_t *host_out, const void *p, size_t bytes);
void cpu_adamw_update(float *p, uint16_t *p16, const float *g, float *m, float *v, size_t n,
                      const ct_adamw_range *no_decay, int n_no_decay, bool decay,
                      const ct_adamw_coeffs *k);
