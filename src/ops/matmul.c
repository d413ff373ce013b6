// Linear layers through BLAS. Transposes are chosen so BLAS reads every operand in place:
//   forward  out  = inp @ W^T        (NoTrans, Trans)
//   backward dinp = dout @ W         (NoTrans, NoTrans)
//            dW  += dout^T @ inp     (Trans, NoTrans, beta = 1)
// OpenBLAS splits a GEMM over M and N, never K, so for a fixed thread count the result is
// deterministic.
#include <cblas.h>
#include <omp.h>

#include "ops/ops_cpu.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#define ROW_AVX512 1

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
#endif

void cpu_matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int N,
                        int C, int OC) {
    // out(N,OC) = inp(N,C) @ weight(OC,C)^T
    if (N == 1) {
        // One row (generation's decode) reads the weight in place: OpenBLAS's sgemm packs all of
        // it first, which took 70% of a Qwen3-0.6B decode step (bench/generate.py). With AVX-512
        // the rows split over OpenMP's threads in contiguous blocks, one stream each: 11% less
        // time than OpenBLAS's sgemv over decode's products, and a decode without OpenBLAS can
        // keep its threads spinning between regions (cmd_generate.c; docs/performance.md).
#ifdef ROW_AVX512
        if (__builtin_cpu_supports("avx512f")) {
#pragma omp parallel if ((int64_t)C * OC >= CPU_PAR_MIN)
            {
                const int t = omp_get_thread_num(), nt = omp_get_num_threads();
                rows_f32(out, inp, weight, C, (int)((int64_t)OC * t / nt),
                         (int)((int64_t)OC * (t + 1) / nt));
            }
            if (bias) cpu_matmul_add_bias(out, bias, N, OC);
            return;
        }
#endif
        cblas_sgemv(CblasRowMajor, CblasNoTrans, OC, C, 1.0f, weight, C, inp, 1, 0.0f, out, 1);
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
