// RMSNorm's per-row arithmetic, shared by rmsnorm.c and the fused kernels (fused.c) so that the
// two give the same bits by construction.
#pragma once
#include <math.h>

// 1 / sqrt(mean(x^2) + eps): the squares summed in double, in column order (not vectorisable
// without reordering the sum, which would change the bits).
static inline float rmsnorm_row_rstd(const float *x, int C, float eps) {
    double ss = 0.0;
    for (int c = 0; c < C; c++) ss += (double)x[c] * x[c];
    const float var = (float)(ss / C);
    return 1.0f / sqrtf(var + eps);
}

// mean(g * xhat) of rmsnorm's backward, g = w * dy, xhat = x * r, summed in double.
static inline float rmsnorm_row_gxhat_mean(const float *dy, const float *x, const float *w, float r,
                                           int C) {
    double dot = 0.0;
    for (int c = 0; c < C; c++) dot += (double)(w[c] * dy[c]) * (x[c] * r);
    return (float)(dot / C);
}
