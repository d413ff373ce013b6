// Global-norm gradient clipping, as torch.nn.utils.clip_grad_norm_ (norm_type 2).
#pragma once
#include <stddef.h>

#include "ops/ops.h"

// Sum of squares of g (n floats) by the table's sum_squares (g lives where that table's kernels
// run): the CPU kernel accumulates in double over fixed chunks whose partial sums are added in
// order, so the result depends only on g, not on the thread count. Data parallelism sums these
// over shards before the square root.
double clip_sum_squares(const ct_ops *ops, const float *g, size_t n);
// torch's coefficient max_norm / (norm + 1e-6), formed in fp32, clamped to 1. Returns 1 when
// max_norm <= 0 (clipping off) or norm is not finite (the caller skips such a step).
float clip_coefficient(double total_norm, double max_norm);
// g *= coef (nothing when coef == 1), on host memory: the reference the trainer's fused
// update (adamw_step_scaled) is tested against.
void clip_scale(float *g, size_t n, float coef);
// All three, on host memory: returns the norm before clipping and scales g in place if it
// exceeds max_norm.
double clip_grad_norm(const ct_ops *ops, float *g, size_t n, double max_norm);
