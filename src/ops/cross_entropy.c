// Softmax cross-entropy over all V columns of fp32 logits. Targets of -100 are ignored.
//
// A 151936-wide row is the bulk of the non-GEMM work of a small model, so every pass over it is
// written to vectorise: the max, and exp(x - max) with vexp (within 1 ulp of expf). The sum of
// the exps is taken in blocks of CE_BLOCK values in fp32 lanes, each block then added in double,
// so a long row loses nothing to summation order (the error of a 512-value block is ~1e-7 of
// it; the blocks' order is fixed, so results do not depend on the thread count).
#include <math.h>
#include <string.h>

#include "ops/ops_cpu.h"
#include "ops/vec_math.h"

#define CE_IGNORE (-100)
#define CE_BLOCK 512

CPU_SIMD_CLONES
static float row_max(const float *x, int V) {
    float m = x[0];
#pragma omp simd reduction(max : m)
    for (int i = 0; i < V; i++) m = x[i] > m ? x[i] : m;
    return m;
}

// sum(exp(x - m)) over the row.
CPU_SIMD_CLONES
static double row_exp_sum(const float *x, int V, float m) {
    double s = 0.0;
    for (int b = 0; b < V; b += CE_BLOCK) {
        const int e = b + CE_BLOCK < V ? b + CE_BLOCK : V;
        float part = 0.0f;
#pragma omp simd reduction(+ : part)
        for (int i = b; i < e; i++) part += vexp(x[i] - m);
        s += part;
    }
    return s;
}

// dx = scale * exp(x - m) * inv, elementwise (dx may alias x).
CPU_SIMD_CLONES
static void row_softmax_scaled(float *dx, const float *x, int V, float m, float inv, float scale) {
#pragma omp simd
    for (int i = 0; i < V; i++) dx[i] = scale * (vexp(x[i] - m) * inv);
}

void cpu_cross_entropy_forward(float *losses, const float *logits, const int32_t *targets, int N,
                               int V) {
#pragma omp parallel for schedule(static) if ((int64_t)N * V >= CPU_PAR_MIN)
    for (int n = 0; n < N; n++) {
        if (targets[n] == CE_IGNORE) {
            losses[n] = 0.0f;
            continue;
        }
        const float *x = logits + (size_t)n * V;
        const float m = row_max(x, V);
        // -log_softmax[t] = log(sum) - (x[t] - max)
        losses[n] = (float)(log(row_exp_sum(x, V, m)) - (double)(x[targets[n]] - m));
    }
}

void cpu_cross_entropy_backward(float *dlogits, const float *logits, const int32_t *targets,
                                float scale, int N, int V) {
#pragma omp parallel for schedule(static) if ((int64_t)N * V >= CPU_PAR_MIN)
    for (int n = 0; n < N; n++) {
        float *dx = dlogits + (size_t)n * V;
        if (targets[n] == CE_IGNORE) {
            memset(dx, 0, (size_t)V * sizeof(float));
            continue;
        }
        const float *x = logits + (size_t)n * V;
        const float m = row_max(x, V);
        const double inv = 1.0 / row_exp_sum(x, V, m);
        // p - 1 in double: near p = 1 the fp32 difference would cancel. Read x[t] before the
        // row is overwritten (dlogits may alias logits).
        const int t = targets[n];
        const float dt = scale * (float)((double)vexp(x[t] - m) * inv - 1.0);
        row_softmax_scaled(dx, x, V, m, (float)inv, scale);
        dx[t] = dt;
    }
}
