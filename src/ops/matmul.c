// Linear layers through BLAS. Transposes are chosen so BLAS reads every operand in place:
//   forward  out  = inp @ W^T        (NoTrans, Trans)
//   backward dinp = dout @ W         (NoTrans, NoTrans)
//            dW  += dout^T @ inp     (Trans, NoTrans, beta = 1)
// OpenBLAS splits a GEMM over M and N, never K, so for a fixed thread count the result is
// deterministic.
#include <cblas.h>

#include "ops/ops_cpu.h"

void cpu_matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int N,
                        int C, int OC) {
    // out(N,OC) = inp(N,C) @ weight(OC,C)^T
    if (N == 1) {
        // One row (generation's decode): sgemv reads the weight in place. OpenBLAS's sgemm packs
        // all of it first, which took 70% of a Qwen3-0.6B decode step (bench/generate.py).
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
