// Token embedding lookup and its scatter-add gradient.
#include <string.h>

#include "ops/ops_cpu.h"

void cpu_embedding_forward(float *out, const int32_t *ids, const float *table, int N, int C) {
#pragma omp parallel for schedule(static) if ((int64_t)N * C >= CPU_PAR_MIN)
    for (int n = 0; n < N; n++) {
        memcpy(out + (size_t)n * C, table + (size_t)ids[n] * C, (size_t)C * sizeof(float));
    }
}

void cpu_embedding_bf16_forward(float *out, const int32_t *ids, const uint16_t *table, int N,
                                int C) {
#pragma omp parallel for schedule(static) if ((int64_t)N * C >= CPU_PAR_MIN)
    for (int n = 0; n < N; n++) cpu_bf16_to_f32(out + (size_t)n * C, table + (size_t)ids[n] * C, C);
}

// Repeated tokens add into the same row, so rows cannot be split across threads; columns can.
// Each column block walks the tokens in order, which fixes the summation order.
void cpu_embedding_backward(float *dtable, const float *dout, const int32_t *ids, int N, int C) {
    const int nblocks = (C + CPU_COL_BLOCK - 1) / CPU_COL_BLOCK;
#pragma omp parallel for schedule(static) if ((int64_t)N * C >= CPU_PAR_MIN)
    for (int blk = 0; blk < nblocks; blk++) {
        const int c0 = blk * CPU_COL_BLOCK;
        const int c1 = c0 + CPU_COL_BLOCK < C ? c0 + CPU_COL_BLOCK : C;
        for (int n = 0; n < N; n++) {
            float *drow = dtable + (size_t)ids[n] * C;
            const float *g = dout + (size_t)n * C;
            for (int c = c0; c < c1; c++) drow[c] += g[c];
        }
    }
}
