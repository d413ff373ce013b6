// RMSNorm as Hugging Face computes it in fp32: y = w * (x * rsqrt(mean(x^2) + eps)).
// The mean of squares is summed in double, so the only fp32 roundings are the ones HF has.
#include <math.h>

#include "ops/ops_cpu.h"

void cpu_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int N,
                         int C, float eps) {
#pragma omp parallel for schedule(static) if ((int64_t)N * C >= CPU_PAR_MIN)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float *y = out + (size_t)n * C;
        double ss = 0.0;
        for (int c = 0; c < C; c++) ss += (double)x[c] * x[c];
        const float var = (float)(ss / C);
        const float r = 1.0f / sqrtf(var + eps);
        // Two roundings, in HF's order: (x * rstd) first, then the weight.
        for (int c = 0; c < C; c++) y[c] = weight[c] * (x[c] * r);
        rstd[n] = r;
    }
}

// With xhat = x * r and g = w * dy:
//   dx = r * (g - xhat * mean(g * xhat)),   dw += sum over rows of dy * xhat.
// dweight is summed first (column blocks, rows in order: independent of the thread count),
// so that dinp may then overwrite dout row by row.
void cpu_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                          const float *weight, const float *rstd, int N, int C) {
    const int nblocks = (C + CPU_COL_BLOCK - 1) / CPU_COL_BLOCK;
#pragma omp parallel for schedule(static) if ((int64_t)N * C >= CPU_PAR_MIN)
    for (int blk = 0; blk < nblocks; blk++) {
        const int c0 = blk * CPU_COL_BLOCK;
        const int c1 = c0 + CPU_COL_BLOCK < C ? c0 + CPU_COL_BLOCK : C;
        double acc[CPU_COL_BLOCK] = {0};
        for (int n = 0; n < N; n++) {
            const float *x = inp + (size_t)n * C;
            const float *dy = dout + (size_t)n * C;
            const float r = rstd[n];
            for (int c = c0; c < c1; c++) acc[c - c0] += (double)dy[c] * (x[c] * r);
        }
        for (int c = c0; c < c1; c++) dweight[c] += (float)acc[c - c0];
    }
#pragma omp parallel for schedule(static) if ((int64_t)N * C >= CPU_PAR_MIN)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        const float *dy = dout + (size_t)n * C;
        float *dx = dinp + (size_t)n * C;
        const float r = rstd[n];
        double dot = 0.0; // sum of g * xhat
        for (int c = 0; c < C; c++) dot += (double)(weight[c] * dy[c]) * (x[c] * r);
        const float m = (float)(dot / C);
        for (int c = 0; c < C; c++) dx[c] = r * (weight[c] * dy[c] - (x[c] * r) * m);
    }
}
