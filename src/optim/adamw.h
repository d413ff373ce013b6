// AdamW as torch.optim.AdamW computes it (torch 1.13, the single-tensor path, fp32), so the
// PyTorch reference and ctitan take the same steps. State lives in two buffers laid out like the
// parameters, plus the step count; a checkpoint saves m, v and step.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "core/error.h"

typedef struct adamw_hparams {
    double beta1, beta2; // torchtitan: (0.9, 0.95)
    double eps;          // 1e-8
    double weight_decay; // decoupled: p *= 1 - lr * weight_decay before the Adam update
} adamw_hparams;

// Elements [offset, offset + numel) of the parameter buffer (ops_list.h's ct_adamw_range).
typedef ct_adamw_range adamw_range;

typedef struct adamw {
    size_t total;   // floats in the parameter and gradient buffers
    size_t base;    // the state covers elements [base, base + n) of them (a ZeRO-1 shard)
    size_t n;       // floats in m and v
    ct_backend *be; // where m and v live
    float *m;       // exp_avg (n), zero at init
    float *v;       // exp_avg_sq (n), zero at init
    int64_t step;   // steps taken; adamw_step increments it first, so bias corrections start at 1
    adamw_range *no_decay; // sorted, disjoint ranges (relative to base) with no weight decay
    int n_no_decay;
} adamw;

// Allocates m and v (zeroed) in host memory for n parameters; step 0; every element decays.
int adamw_init(adamw *o, size_t n, ct_error *err);
// The same on backend be (NULL: the plain CPU one) for the shard [base, base + n) of a buffer of
// `total` floats (n may be 0 on a rank whose shard is empty).
int adamw_init_shard(adamw *o, ct_backend *be, size_t total, size_t base, size_t n, ct_error *err);
void adamw_free(adamw *o);
// Excludes [offset, offset + numel) of the whole buffer from weight decay (a second torch param
// group with weight_decay 0); only its part inside the shard is kept. Ranges may come in any
// order; overlapping or outside the buffer is an error.
// Called at setup, never inside a step.
int adamw_exclude_decay(adamw *o, size_t offset, size_t numel, ct_error *err);
// The rule for optimizer.decay_norms_and_embeddings = false: a tensor decays unless it is 1-D
// (norm weights, biases) or an embedding (its name contains "embed_tokens"). A tied lm_head is
// the embedding, so it does not decay either.
bool adamw_param_decays(const char *name, int ndim);

// One step at learning rate lr over the n elements of the shard (params and grads are the whole
// buffers), in torch's order:
//   step += 1
//   p *= 1 - lr*wd                                (skipped for excluded ranges)
//   m = m*beta1 + (1-beta1)*g                     (the add fused, like torch's vector kernel)
//   v = v*beta2 + ((1-beta2)*g)*g                 (fused likewise)
//   p += (-lr/(1-beta1^step) * m) / (sqrt(v)/sqrt(1-beta2^step) + eps)
// Scalars are formed in double and rounded to float once, as torch does with Python floats.
// Element-wise over OpenMP threads, so the result does not depend on the thread count. Runs the
// built-in CPU kernel on host buffers.
void adamw_step(adamw *o, float *params, const float *grads, const adamw_hparams *h, double lr);
// The same through the op table `ops` (its adamw_update; NULL: the built-in CPU one) on the
// buffers of o's backend, with every gradient first multiplied by grad_scale in fp32 (the
// clipping coefficient), as clip_scale and then adamw_step would do, bit for bit, in one pass
// instead of two; the gradients in memory are left as they were.
// params_bf16 (NULL: none): the shard's new weights are also rounded to bf16 there, in the same
// pass (bf16 mixed precision's weight copy).
void adamw_step_scaled(adamw *o, const ct_ops *ops, float *params, uint16_t *params_bf16,
                       const float *grads, const adamw_hparams *h, double lr, float grad_scale);
