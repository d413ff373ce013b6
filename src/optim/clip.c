// Global-norm clipping. The norm is accumulated in double (torch sums per-tensor fp32 norms; the
// two agree to ~1e-7 relative) over chunks fixed by n alone, so the value is reproducible for
// any OpenMP thread count, which exact resume needs.
#include "optim/clip.h"

#include <math.h>

double clip_sum_squares(const ct_ops *ops, const float *g, size_t n) {
    double sum;
    ops->sum_squares(&sum, g, n);
    return sum;
}

float clip_coefficient(double total_norm, double max_norm) {
    if (!(max_norm > 0) || !isfinite(total_norm)) return 1.0f;
    // torch: max_norm / (total_norm + 1e-6) on an fp32 tensor is reciprocal() * max_norm.
    float coef = (1.0f / ((float)total_norm + 1e-6f)) * (float)max_norm;
    return coef < 1.0f ? coef : 1.0f;
}

void clip_scale(float *g, size_t n, float coef) {
    if (coef == 1.0f) return;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) g[i] *= coef;
}

double clip_grad_norm(const ct_ops *ops, float *g, size_t n, double max_norm) {
    double norm = sqrt(clip_sum_squares(ops, g, n));
    clip_scale(g, n, clip_coefficient(norm, max_norm));
    return norm;
}
