// Expert parallelism's row moves (model/qwen3_ep.c): the rows a sparse layer sends to the
// experts' owners and gets back, gathered by index lists the model builds from the routing, and
// the per-token sum of the rows that come back. Backend ops, so that the model's host code never
// touches backend memory.
#include <string.h>

#include "ops/ops_cpu.h"

void cpu_moe_ep_gather(void *dst, const void *src, const int32_t *idx, int n, int row_bytes) {
#pragma omp parallel for schedule(static) if ((int64_t)n * row_bytes >= 4 * CPU_PAR_MIN)
    for (int i = 0; i < n; i++)
        memcpy((char *)dst + (size_t)i * row_bytes, (const char *)src + (size_t)idx[i] * row_bytes,
               (size_t)row_bytes);
}

// out[t] = 0.0f, then += rows[tpos[t*K + j]] for j = 0 .. K-1: the order (ascending expert)
// and the rounding of moe_combine_rows, whose rows here are already weighted.
void cpu_moe_ep_combine(float *out, const float *rows, const int32_t *tpos, int N, int C, int K) {
#pragma omp parallel for schedule(static) if ((int64_t)N * K * C >= CPU_PAR_MIN)
    for (int t = 0; t < N; t++) {
        float *o = out + (size_t)t * C;
        for (int c = 0; c < C; c++) o[c] = 0.0f;
        for (int j = 0; j < K; j++) {
            const float *y = rows + (size_t)tpos[(size_t)t * K + j] * C;
            for (int c = 0; c < C; c++) o[c] += y[c];
        }
    }
}
