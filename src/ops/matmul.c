// Linear layers through BLAS. Transposes are chosen so BLAS reads every operand in place:
//   forward  out  = inp @ W^T        (NoTrans, Trans)
//   backward dinp = dout @ W         (NoTrans, NoTrans)
//            dW  += dout^T @ inp     (Trans, NoTrans, beta = 1)
// OpenBLAS splits a GEMM over M and N, never K, so for a fixed thread count the result is
// deterministic.
#include <cblas.h>
#include <omp.h>

#include "ops/ops_cpu.h"

#include "ops/vec_math.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#define ROW_SIMD 1

// Rows [o0, o1) of the one-row product out = W x: each row one sequential read, 16-lane FMAs into
// four accumulators over its 64-element strides, then 16-element steps and a masked tail; the
// four are added (0 + 1) + (2 + 3), then across the lanes. Each output is one thread's sum in a
// fixed order, so the bits do not depend on the thread count.
__attribute__((target("avx512f"))) static void rows_f32(float *out, const float *x, const float *w,
                                                        int C, int o0, int o1) {
    const int quad = C / 64 * 64, full = C / 16 * 16;
    const __mmask16 tail = (__mmask16)((1u << (C - full)) - 1);
    for (int o = o0; o < o1; o++) {
        const float *wo = w + (size_t)o * C;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int k = 0; k < quad; k += 64) {
            a0 = _mm512_fmadd_ps(_mm512_loadu_ps(wo + k), _mm512_loadu_ps(x + k), a0);
            a1 = _mm512_fmadd_ps(_mm512_loadu_ps(wo + k + 16), _mm512_loadu_ps(x + k + 16), a1);
            a2 = _mm512_fmadd_ps(_mm512_loadu_ps(wo + k + 32), _mm512_loadu_ps(x + k + 32), a2);
            a3 = _mm512_fmadd_ps(_mm512_loadu_ps(wo + k + 48), _mm512_loadu_ps(x + k + 48), a3);
        }
        for (int k = quad; k < full; k += 16)
            a0 = _mm512_fmadd_ps(_mm512_loadu_ps(wo + k), _mm512_loadu_ps(x + k), a0);
        if (tail)
            a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, wo + full),
                                 _mm512_maskz_loadu_ps(tail, x + full), a1);
        out[o] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
    }
}

// rows_f32 at AVX2's 8 lanes (with FMA), for CPUs without AVX-512: 32-element strides, then
// 8-element steps and a masked tail, summed in the same pattern.
__attribute__((target("avx2,fma"))) static void
rows_f32_avx2(float *out, const float *x, const float *w, int C, int o0, int o1) {
    const int quad = C / 32 * 32, full = C / 8 * 8;
    const __m256i tail =
        _mm256_cmpgt_epi32(_mm256_set1_epi32(C - full), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    for (int o = o0; o < o1; o++) {
        const float *wo = w + (size_t)o * C;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int k = 0; k < quad; k += 32) {
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(wo + k), _mm256_loadu_ps(x + k), a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(wo + k + 8), _mm256_loadu_ps(x + k + 8), a1);
            a2 = _mm256_fmadd_ps(_mm256_loadu_ps(wo + k + 16), _mm256_loadu_ps(x + k + 16), a2);
            a3 = _mm256_fmadd_ps(_mm256_loadu_ps(wo + k + 24), _mm256_loadu_ps(x + k + 24), a3);
        }
        for (int k = quad; k < full; k += 8)
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(wo + k), _mm256_loadu_ps(x + k), a0);
        if (C > full)
            a1 = _mm256_fmadd_ps(_mm256_maskload_ps(wo + full, tail),
                                 _mm256_maskload_ps(x + full, tail), a1);
        out[o] = hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    }
}
#endif

// The portable one-row product: each output one thread's sum in 16 lanes, in a fixed order.
CPU_SIMD_CLONES
static float dot_f32(const float *w, const float *x, int C) {
    float lane[16] = {0};
    int k = 0;
    for (; k + 16 <= C; k += 16)
        for (int j = 0; j < 16; j++) lane[j] += w[k + j] * x[k + j];
    float sum = 0;
    for (int j = 0; j < 16; j++) sum += lane[j];
    for (; k < C; k++) sum += w[k] * x[k];
    return sum;
}

// Rows [o0, o1) of the one-row product with the widest kernel this CPU has.
static void rows_any(float *out, const float *x, const float *w, int C, int o0, int o1) {
#ifdef ROW_SIMD
    if (__builtin_cpu_supports("avx512f")) {
        rows_f32(out, x, w, C, o0, o1);
        return;
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        rows_f32_avx2(out, x, w, C, o0, o1);
        return;
    }
#endif
    for (int o = o0; o < o1; o++) out[o] = dot_f32(w + (size_t)o * C, x, C);
}

// A thread's share of the rows: the first row of its next step, and its end (a cache line each).
enum { ROW_STEP = 128, ROW_SHARES = 64 };
typedef struct {
    _Alignas(64) int next;
    int end;
} row_share;

// Each thread runs its contiguous share ROW_STEP rows at a time, then the steps left in the
// others' shares: on a 2-vCPU VM the two threads' times for the same bytes of a bf16 decode
// product differed by 10-18% of its time, 4% with the steps (rdtsc, in place), and a decode
// step's products took less time in 5 of 7 alternating pairs (docs/performance.md).
void cpu_rows_shared(int n, bool parallel, void (*fn)(void *ctx, int r0, int r1), void *ctx) {
    row_share share[ROW_SHARES];
    const int ns = omp_get_max_threads() < ROW_SHARES ? omp_get_max_threads() : ROW_SHARES;
    for (int u = 0; u < ns; u++)
        share[u].next = (int)((int64_t)n * u / ns), share[u].end = (int)((int64_t)n * (u + 1) / ns);
#pragma omp parallel if (parallel)
    {
        const int t = omp_get_thread_num();
        for (int u = 0; u < ns; u++) { // its own share, then what is left of the others'
            row_share *sh = &share[(t + u) % ns];
            for (;;) {
                int r0;
#pragma omp atomic capture
                {
                    r0 = sh->next;
                    sh->next += ROW_STEP;
                }
                if (r0 >= sh->end) break;
                fn(ctx, r0, r0 + ROW_STEP < sh->end ? r0 + ROW_STEP : sh->end);
            }
        }
    }
}

// rows_any over rows [o0, o1) for cpu_rows_shared.
typedef struct {
    float *out;
    const float *x, *w;
    int C;
} f32_rows;

static void f32_rows_run(void *ctx, int o0, int o1) {
    const f32_rows *a = ctx;
    rows_any(a->out, a->x, a->w, a->C, o0, o1);
}

void cpu_matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int N,
                        int C, int OC) {
    // out(N,OC) = inp(N,C) @ weight(OC,C)^T
    if (N == 1) {
        // One row (generation's decode) reads the weight in place: OpenBLAS's sgemm packs all of
        // it first, which took 70% of a Qwen3-0.6B decode step (bench/generate.py). The rows
        // split over OpenMP's threads (cpu_rows_shared), one stream each: with AVX-512, 11%
        // less time than OpenBLAS's sgemv over decode's products; each output is one thread's
        // sum, so the bits do not depend on the thread count (sgemv's did); and a decode
        // without OpenBLAS can keep its threads spinning between regions (cmd_generate.c;
        // docs/performance.md).
        f32_rows a = {out, inp, weight, C};
        cpu_rows_shared(OC, (int64_t)C * OC >= CPU_PAR_MIN, f32_rows_run, &a);
        if (bias) cpu_matmul_add_bias(out, bias, N, OC);
        return;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, weight, C, 0.0f,
                out, OC);
    if (bias) cpu_matmul_add_bias(out, bias, N, OC);
}

// Added after the product, as torch's addmm does: out = (inp @ W^T) + bias.
void cpu_matmul_add_bias(float *out, const float *bias, int N, int OC) {
#pragma omp parallel for schedule(static) if ((int64_t)N * OC >= CPU_PAR_MIN)
    for (int n = 0; n < N; n++) {
        float *row = out + (size_t)n * OC;
        for (int o = 0; o < OC; o++) row[o] += bias[o];
    }
}

void cpu_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                         const float *inp, const float *weight, int N, int C, int OC) {
    if (dinp) {
        // dinp(N,C) = dout(N,OC) @ weight(OC,C)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, weight, C,
                    0.0f, dinp, C);
    }
    // dweight(OC,C) += dout(N,OC)^T @ inp(N,C); none for a frozen weight
    if (dweight)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f,
                    dweight, C);
    if (dbias) cpu_matmul_bias_grad(dbias, dout, N, OC);
}

// dbias(OC) += the column sums of dout (N,OC), by column blocks, rows in order, in double.
void cpu_matmul_bias_grad(float *dbias, const float *dout, int N, int OC) {
    const int nblocks = (OC + CPU_COL_BLOCK - 1) / CPU_COL_BLOCK;
#pragma omp parallel for schedule(static) if ((int64_t)N * OC >= CPU_PAR_MIN)
    for (int blk = 0; blk < nblocks; blk++) {
        const int o0 = blk * CPU_COL_BLOCK;
        const int o1 = o0 + CPU_COL_BLOCK < OC ? o0 + CPU_COL_BLOCK : OC;
        double acc[CPU_COL_BLOCK] = {0};
        for (int n = 0; n < N; n++) {
            const float *g = dout + (size_t)n * OC;
            for (int o = o0; o < o1; o++) acc[o - o0] += g[o];
        }
        for (int o = o0; o < o1; o++) dbias[o] += (float)acc[o - o0];
    }
}
