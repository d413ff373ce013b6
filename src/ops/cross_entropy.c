// Softmax cross-entropy over all V columns of fp32 logits. Targets of -100 are ignored.
//
// A 151936-wide row is the bulk of the non-GEMM work of a small model, so every pass over it is
// written to vectorise: the max, and exp(x - max) with vexp (within 1 ulp of expf). The sum of
// the exps is taken in blocks of CE_BLOCK values in fp32 lanes, each block then added in double,
// so a long row loses nothing to summation order (the error of a 512-value block is ~1e-7 of
// it; the blocks' order is fixed, so results do not depend on the thread count).
#include <math.h>
#include <omp.h>
#include <string.h>

#include "ops/bf16_round.h"
#include "ops/ops_cpu.h"
#include "ops/vec_math.h"

#define CE_IGNORE (-100)
#define CE_BLOCK 512

// The row passes and the kernels, once for fp32 logits and once for bf16 logits (bf16 mixed
// precision: torch's autocast computes the lm_head in bf16 and the loss in fp32 over
// `logits.float()`; its gradient is rounded back to bf16). LOAD widens an element to fp32, STORE
// writes one; in fp32 they are the identity, so both read the same arithmetic. Each kernel has
// a forward, a backward and both at once (the training head's: max and sum taken once), and the
// three give the same bits.
// clang-format off
#define CE_KERNELS(T, LOAD, STORE, KEEP, forward, backward, both)                                  \
    CPU_SIMD_CLONES                                                                                \
    static float forward##_row_max(const T *x, int V) {                                            \
        float m = LOAD(x[0]);                                                                      \
        _Pragma("omp simd reduction(max : m)")                                                     \
        for (int i = 0; i < V; i++) {                                                              \
            const float v = LOAD(x[i]);                                                            \
            m = v > m ? v : m;                                                                     \
        }                                                                                          \
        return m;                                                                                  \
    }                                                                                              \
    /* sum(exp(x - m)) over the row; each exp kept in keep[i] too unless keep is NULL (keep may    \
       alias x when T is float: element i is read before it is written). */                       \
    CPU_SIMD_CLONES                                                                                \
    static double forward##_row_exp_sum(const T *x, int V, float m, float *keep) {                 \
        double s = 0.0;                                                                            \
        for (int b = 0; b < V; b += CE_BLOCK) {                                                    \
            const int e = b + CE_BLOCK < V ? b + CE_BLOCK : V;                                     \
            float part = 0.0f;                                                                     \
            if (keep) {                                                                            \
                _Pragma("omp simd reduction(+ : part)")                                            \
                for (int i = b; i < e; i++) {                                                      \
                    const float p = vexp(LOAD(x[i]) - m);                                          \
                    keep[i] = p;                                                                   \
                    part += p;                                                                     \
                }                                                                                  \
            } else {                                                                               \
                _Pragma("omp simd reduction(+ : part)")                                            \
                for (int i = b; i < e; i++) part += vexp(LOAD(x[i]) - m);                          \
            }                                                                                      \
            s += part;                                                                             \
        }                                                                                          \
        return s;                                                                                  \
    }                                                                                              \
    /* dx = scale * exp(x - m) * inv, elementwise, the exps from keep when kept (dx may alias x    \
       and keep). */                                                                               \
    CPU_SIMD_CLONES                                                                                \
    static void forward##_row_softmax_scaled(T *dx, const T *x, const float *keep, int V, float m, \
                                             float inv, float scale) {                             \
        if (keep) {                                                                                \
            _Pragma("omp simd")                                                                    \
            for (int i = 0; i < V; i++) dx[i] = STORE(scale * (keep[i] * inv));                   \
        } else {                                                                                   \
            _Pragma("omp simd")                                                                    \
            for (int i = 0; i < V; i++) dx[i] = STORE(scale * (vexp(LOAD(x[i]) - m) * inv));      \
        }                                                                                          \
    }                                                                                              \
    /* One row: its loss (when loss) and its gradient (when dx; may alias x). -log_softmax[t] =    \
       log(sum) - (x[t] - max); p - 1 in double: near p = 1 the fp32 difference would cancel.      \
       x[t] is read before the row is overwritten. */                                              \
    static void forward##_row(float *loss, T *dx, const T *x, int t, float scale, float *spare,    \
                              int V) {                                                             \
        if (t == CE_IGNORE) {                                                                      \
            if (loss) *loss = 0.0f;                                                                \
            if (dx) memset(dx, 0, (size_t)V * sizeof(T));                                          \
            return;                                                                                \
        }                                                                                          \
        const float m = forward##_row_max(x, V), xt = LOAD(x[t]);                                  \
        float *keep = dx ? KEEP(dx, spare) : NULL;                                                 \
        const double sum = forward##_row_exp_sum(x, V, m, keep);                                   \
        if (loss) *loss = (float)(log(sum) - (double)(xt - m));                                    \
        if (!dx) return;                                                                           \
        const double inv = 1.0 / sum;                                                              \
        const float dt = scale * (float)((double)vexp(xt - m) * inv - 1.0);                        \
        forward##_row_softmax_scaled(dx, x, keep, V, m, (float)inv, scale);                        \
        dx[t] = STORE(dt);                                                                         \
    }                                                                                              \
    void both(float *losses, T *dlogits, const T *logits, const int32_t *targets, float scale,     \
              float *scratch, int N, int V) {                                                      \
        _Pragma("omp parallel for schedule(static) if ((int64_t)N * V >= CPU_PAR_MIN)")            \
        for (int n = 0; n < N; n++)                                                                \
            forward##_row(losses ? losses + n : NULL, dlogits ? dlogits + (size_t)n * V : NULL,    \
                          logits + (size_t)n * V, targets[n], scale,                               \
                          scratch ? scratch + (size_t)omp_get_thread_num() * V : NULL, V);         \
    }                                                                                              \
    void forward(float *losses, const T *logits, const int32_t *targets, int N, int V) {           \
        both(losses, NULL, logits, targets, 0.0f, NULL, N, V);                                     \
    }                                                                                              \
    void backward(T *dlogits, const T *logits, const int32_t *targets, float scale, int N,         \
                  int V) {                                                                         \
        both(NULL, dlogits, logits, targets, scale, NULL, N, V);                                   \
    }
// clang-format on

#define CE_F32(v) (v)
// Where a row's exps are kept between the sum and the write pass (one exp per logit, not two):
// fp32 in the gradient row itself, bf16 in the calling thread's row of `scratch` (V fp32 values
// per thread) when given, else they are computed again.
#define CE_KEEP_IN_DX(dx, spare) ((void)(spare), (dx))
#define CE_KEEP_IN_SPARE(dx, spare) (spare)
CE_KERNELS(float, CE_F32, CE_F32, CE_KEEP_IN_DX, cpu_cross_entropy_forward,
           cpu_cross_entropy_backward, cpu_cross_entropy_forward_backward)
CE_KERNELS(uint16_t, bf16_value, bf16_round, CE_KEEP_IN_SPARE, cpu_cross_entropy_bf16_forward,
           cpu_cross_entropy_bf16_backward, cpu_cross_entropy_bf16_forward_backward)

// ---------------------------------------------------------------------------------------------
// Loss parallel (tensor parallelism, torchtitan's loss_parallel): each of P ranks holds V of a
// row's columns (fp32 logits, or bf16 ones under mixed precision). Three steps, with the
// caller's collectives between them: each row's local max (gathered: maxes is P x N, rank r's
// at r*N); its sum of exp(x - max) over the local columns and, on the rank whose columns hold
// the target, x[t] - max (summed over the ranks: sums is N x 2); then the loss and the
// gradient, as the one-process row above computes them (the same formulas; the sum of the exps
// is each rank's double sum, rounded to fp32 for the reduction). targets: the local column of
// the target, -1 when another rank holds it, CE_IGNORE (-100) for an ignored row.

static inline float tp_load(const void *x, bool bf16, size_t i) {
    return bf16 ? bf16_value(((const uint16_t *)x)[i]) : ((const float *)x)[i];
}

static inline float tp_row_max(const float *maxes, int P, int N, int n) {
    float m = maxes[n];
    for (int r = 1; r < P; r++) m = maxes[(size_t)r * N + n] > m ? maxes[(size_t)r * N + n] : m;
    return m;
}

void cpu_cross_entropy_tp_max(float *maxes, const void *logits, bool bf16, int N, int V) {
#pragma omp parallel for schedule(static) if ((int64_t)N * V >= CPU_PAR_MIN)
    for (int n = 0; n < N; n++) {
        const size_t row = (size_t)n * V;
        float m = tp_load(logits, bf16, row);
        for (int i = 1; i < V; i++) {
            const float v = tp_load(logits, bf16, row + i);
            m = v > m ? v : m;
        }
        maxes[n] = m;
    }
}

void cpu_cross_entropy_tp_sums(float *sums, const float *maxes, int P, const void *logits,
                               bool bf16, const int32_t *targets, int N, int V) {
#pragma omp parallel for schedule(static) if ((int64_t)N * V >= CPU_PAR_MIN)
    for (int n = 0; n < N; n++) {
        const size_t row = (size_t)n * V;
        const float m = tp_row_max(maxes, P, N, n);
        double s = 0.0;
        for (int b = 0; b < V; b += CE_BLOCK) {
            const int e = b + CE_BLOCK < V ? b + CE_BLOCK : V;
            float part = 0.0f;
            for (int i = b; i < e; i++) part += vexp(tp_load(logits, bf16, row + i) - m);
            s += part;
        }
        const int t = targets[n];
        sums[2 * n] = t == CE_IGNORE ? 0.0f : (float)s;
        sums[2 * n + 1] = t >= 0 ? tp_load(logits, bf16, row + t) - m : 0.0f;
    }
}

void cpu_cross_entropy_tp_finish(float *losses, void *dlogits, const float *maxes, int P,
                                 const float *sums, const void *logits, bool bf16,
                                 const int32_t *targets, float scale, int N, int V) {
#pragma omp parallel for schedule(static) if ((int64_t)N * V >= CPU_PAR_MIN)
    for (int n = 0; n < N; n++) {
        const size_t row = (size_t)n * V;
        const int t = targets[n];
        float *d32 = dlogits && !bf16 ? (float *)dlogits + row : NULL;
        uint16_t *d16 = dlogits && bf16 ? (uint16_t *)dlogits + row : NULL;
        if (t == CE_IGNORE) {
            if (losses) losses[n] = 0.0f;
            if (d32) memset(d32, 0, (size_t)V * sizeof *d32);
            if (d16) memset(d16, 0, (size_t)V * sizeof *d16);
            continue;
        }
        const float m = tp_row_max(maxes, P, N, n), xt_m = sums[2 * n + 1];
        const double sum = (double)sums[2 * n];
        if (losses) losses[n] = (float)(log(sum) - (double)xt_m);
        if (!dlogits) continue;
        const double inv = 1.0 / sum;
        const float finv = (float)inv;
        for (int i = 0; i < V; i++) {
            const float g = scale * (vexp(tp_load(logits, bf16, row + i) - m) * finv);
            if (d32) d32[i] = g;
            else d16[i] = bf16_round(g);
        }
        if (t >= 0) {
            const float dt = scale * (float)((double)vexp(xt_m) * inv - 1.0);
            if (d32) d32[t] = dt;
            else d16[t] = bf16_round(dt);
        }
    }
}
