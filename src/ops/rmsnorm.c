// RMSNorm as Hugging Face computes it in fp32: y = w * (x * rsqrt(mean(x^2) + eps)).
// The mean of squares is summed in double, so the only fp32 roundings are the ones HF has.
#include <math.h>

#include "ops/ops_cpu.h"
#include "ops/rmsnorm_rows.h"
#include "ops/vec_math.h"

void cpu_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int N,
                         int C, float eps) {
#pragma omp parallel for schedule(static) if ((int64_t)N * C >= CPU_PAR_MIN)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float *y = out + (size_t)n * C;
        const float r = rmsnorm_row_rstd(x, C, eps);
        // Two roundings, in HF's order: (x * rstd) first, then the weight.
        for (int c = 0; c < C; c++) y[c] = weight[c] * (x[c] * r);
        rstd[n] = r;
    }
}

// dweight[c0:c1] += sum over rows of dy * (x * rstd), one row after another (double sums per
// column). The N*H rows are H heads of C per token: row (n, h) of x starts at
// x + n * xstride + h * C; dy and rstd are contiguous (N*H, C) and (N*H).
CPU_SIMD_CLONES
static void rmsnorm_dweight_block(float *dweight, const float *dy, const float *x,
                                  const float *rstd, int N, int H, size_t xstride, int C, int c0,
                                  int c1) {
    double acc[CPU_COL_BLOCK] = {0};
    for (int n = 0; n < N; n++) {
        for (int h = 0; h < H; h++) {
            const size_t m = (size_t)n * H + h;
            const float *xr = x + (size_t)n * xstride + (size_t)h * C, *g = dy + m * C;
            const float r = rstd[m];
#pragma omp simd
            for (int c = c0; c < c1; c++) acc[c - c0] += (double)g[c] * (xr[c] * r);
        }
    }
    for (int c = c0; c < c1; c++) dweight[c] += (float)acc[c - c0];
}

// All column blocks of dweight, in parallel: each block's sum is serial, so the bits do not
// depend on the thread count.
void cpu_rmsnorm_dweight(float *dweight, const float *dy, const float *x, const float *rstd, int N,
                         int H, size_t xstride, int C) {
    const int nblocks = (C + CPU_COL_BLOCK - 1) / CPU_COL_BLOCK;
#pragma omp parallel for schedule(static) if ((int64_t)N * H * C >= CPU_PAR_MIN)
    for (int blk = 0; blk < nblocks; blk++) {
        const int c0 = blk * CPU_COL_BLOCK;
        const int c1 = c0 + CPU_COL_BLOCK < C ? c0 + CPU_COL_BLOCK : C;
        rmsnorm_dweight_block(dweight, dy, x, rstd, N, H, xstride, C, c0, c1);
    }
}

// With xhat = x * r and g = w * dy:
//   dx = r * (g - xhat * mean(g * xhat)),   dw += sum over rows of dy * xhat.
// dweight is summed first, so that dinp may then overwrite dout row by row.
void cpu_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                          const float *weight, const float *rstd, int N, int C) {
    cpu_rmsnorm_dweight(dweight, dout, inp, rstd, N, 1, (size_t)C, C);
#pragma omp parallel for schedule(static) if ((int64_t)N * C >= CPU_PAR_MIN)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        const float *dy = dout + (size_t)n * C;
        float *dx = dinp + (size_t)n * C;
        const float r = rstd[n];
        const float m = rmsnorm_row_gxhat_mean(dy, x, weight, r, C);
        for (int c = 0; c < C; c++) dx[c] = r * (weight[c] * dy[c] - (x[c] * r) * m);
    }
}
