// Elementwise sum: the residual stream in forward, gradient contributions in backward.
#include "ops/ops_cpu.h"

void cpu_add(float *out, const float *a, const float *b, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}
