// Softmax cross-entropy over all V columns in fp32 logits; exp sums are accumulated in double
// so a 151936-wide row loses nothing to summation order. Targets of -100 are ignored.
#include <math.h>
#include <string.h>

#include "ops/ops_cpu.h"

#define CE_IGNORE (-100)

// max and sum(exp(x - max)) of one row.
static void ce_row_stats(float *maxv, double *sum, const float *x, int V) {
    float m = x[0];
    for (int i = 1; i < V; i++) m = x[i] > m ? x[i] : m;
    double s = 0.0;
    for (int i = 0; i < V; i++) s += (double)expf(x[i] - m);
    *maxv = m;
    *sum = s;
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
        float m;
        double s;
        ce_row_stats(&m, &s, x, V);
        // -log_softmax[t] = log(sum) - (x[t] - max)
        losses[n] = (float)(log(s) - (double)(x[targets[n]] - m));
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
        float m;
        double s;
        ce_row_stats(&m, &s, x, V);
        const double inv = 1.0 / s;
        // p - 1 in double: near p = 1 the fp32 difference would cancel. Read x[t] before the
        // row is overwritten (dlogits may alias logits).
        const int t = targets[n];
        const float dt = scale * (float)((double)expf(x[t] - m) * inv - 1.0);
        for (int i = 0; i < V; i++) dx[i] = scale * (float)((double)expf(x[i] - m) * inv);
        dx[t] = dt;
    }
}
