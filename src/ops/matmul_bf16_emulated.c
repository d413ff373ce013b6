// The bf16 linear layers without oneDNN's bf16 (a CPU without AVX-512, where Debian's oneDNN 2.6
// has no bf16 matmul), or when CTITAN_BF16_GEMM=emulated asks for it: OpenBLAS sgemm on the
// operands rounded to bf16 and held in fp32. A product of two bf16 values is exact in fp32, and
// the sums are fp32, so this computes what a bf16 GEMM with fp32 accumulation computes, up to
// the order of the additions; it is slower than fp32 (the extra rounding passes), never faster.
//
// The weight is widened OB rows at a time, so the scratch stays small whatever the vocabulary:
// the input (N*C), one block of weight rows (OB*C) and one block of output columns (N*OB).
#include <cblas.h>
#include <stdint.h>

#include "ops/bf16_round.h"
#include "ops/matmul_bf16_internal.h"
#include "ops/ops_cpu.h"

#define OB 256 // weight rows (output columns) per block

size_t mm_emulated_scratch_floats(int N, int C, int OC) {
    const size_t ob = OC < OB ? (size_t)OC : OB;
    return (size_t)N * C + ob * C + (size_t)N * ob;
}

// dst (rows, cols) = src's values rounded to bf16, src with row stride ld (fp32) or, when src16,
// widened from it (row stride ld too).
static void rounded_block(float *dst, const float *src, const uint16_t *src16, int rows, int cols,
                          size_t ld) {
#pragma omp parallel for schedule(static) if ((int64_t)rows * cols >= CPU_PAR_MIN)
    for (int r = 0; r < rows; r++) {
        float *d = dst + (size_t)r * cols;
        if (src16)
            for (int c = 0; c < cols; c++) d[c] = bf16_value(src16[r * ld + c]);
        else
            for (int c = 0; c < cols; c++) d[c] = bf16_value(bf16_round(src[r * ld + c]));
    }
}

void mm_emulated_forward(float *out, uint16_t *out16, float *scratch, const float *inp,
                         const uint16_t *inp16, const uint16_t *weight, int N, int C, int OC) {
    const int ob_max = OC < OB ? OC : OB;
    float *x = scratch, *wb = x + (size_t)N * C, *yb = wb + (size_t)ob_max * C;
    rounded_block(x, inp, inp16, N, C, (size_t)C);
    for (int o0 = 0; o0 < OC; o0 += OB) {
        const int ob = OC - o0 < OB ? OC - o0 : OB;
        rounded_block(wb, NULL, weight + (size_t)o0 * C, ob, C, (size_t)C);
        // out[:, o0:o0+ob] = x @ wb^T, straight into out, or through yb when it is rounded.
        float *y = out16 ? yb : out + o0;
        const int ldy = out16 ? ob : OC;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, ob, C, 1.0f, x, C, wb, C, 0.0f, y,
                    ldy);
        if (out16)
            for (int n = 0; n < N; n++)
                for (int o = 0; o < ob; o++)
                    out16[(size_t)n * OC + o0 + o] = bf16_round(yb[(size_t)n * ob + o]);
    }
}

void mm_emulated_backward(float *dinp, float *dweight, float *scratch, const float *dout,
                          const uint16_t *dout16, const float *inp, const uint16_t *inp16,
                          const uint16_t *weight, int N, int C, int OC) {
    const int ob_max = OC < OB ? OC : OB;
    float *x = scratch, *wb = x + (size_t)N * C, *db = wb + (size_t)ob_max * C;
    rounded_block(x, inp, inp16, N, C, (size_t)C);
    for (int o0 = 0; o0 < OC; o0 += OB) {
        const int ob = OC - o0 < OB ? OC - o0 : OB;
        rounded_block(db, dout16 ? NULL : dout + o0, dout16 ? dout16 + o0 : NULL, N, ob,
                      (size_t)OC);
        if (dinp) { // dinp = sum over blocks of db @ wb
            rounded_block(wb, NULL, weight + (size_t)o0 * C, ob, C, (size_t)C);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, ob, 1.0f, db, ob, wb, C,
                        o0 ? 1.0f : 0.0f, dinp, C);
        }
        // dW[o0:o0+ob] += db^T @ x (none for a frozen weight)
        if (dweight)
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, ob, C, N, 1.0f, db, ob, x, C, 1.0f,
                    dweight + (size_t)o0 * C, C);
    }
}
