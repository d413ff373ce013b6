// Global-norm gradient clipping, as torch.nn.utils.clip_grad_norm_ (norm_type 2).
#pragma once
#include <stddef.h>

// Sum of squares of g (n floats), accumulated in double over fixed chunks whose partial sums are
// added in order: the result depends only on g, not on the thread count. Data parallelism sums
// these over shards before the square root.
double clip_sum_squares(const float *g, size_t n);
// torch's coefficient max_norm / (norm + 1e-6), formed in fp32, clamped to 1. Returns 1 when
// max_norm <= 0 (clipping off) or norm is not finite (the caller skips such a step).
float clip_coefficient(double total_norm, double max_norm);
// g *= coef (nothing when coef == 1).
void clip_scale(float *g, size_t n, float coef);
// All three: returns the norm before clipping and scales g in place if it exceeds max_norm.
double clip_grad_norm(float *g, size_t n, double max_norm);
