// The bf16 linear layers without oneDNN's bf16 (a CPU without AVX-512, where Debian's oneDNN 2.6
// has no bf16 matmul), or when CTITAN_BF16_GEMM=emulated asks for it: OpenBLAS sgemm on the
// operands rounded to bf16 and held in fp32. A product of two bf16 values is exact in fp32, and
// the sums are fp32, so this computes what a bf16 GEMM with fp32 accumulation computes, up to
// the order of the additions; it is slower than fp32 (the extra rounding passes), never faster.
//
// The weight is widened OB rows at a time, so the scratch stays small whatever the vocabulary:
// the input (N*C), one block of weight rows (OB*C) and one block of output columns (N*OB).
//
// The forward and the input's gradient run on ctitan's own tiles (tile_gemm), not sgemm: each
// output is one fp32 FMA chain over k in order, so a token row's bits do not depend on how many
// rows share the product, nor where the row sits in it, nor on the threads. OpenBLAS's sgemm
// kernels for AVX2 give a row other bits at other row counts and offsets, which bf16's roundings
// carry to whole bf16 ulps: a packed batch then differed from its documents alone, and a parallel
// run from one process, by far more than fp32's error (docs/performance.md). The weight's
// gradient sums over the tokens, in an order no split keeps anyway, and stays on sgemm.
#include <cblas.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "ops/bf16_round.h"
#include "ops/matmul_bf16_internal.h"
#include "ops/ops_cpu.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#define TILE_AVX2 1
#endif

#define OB 256            // weight rows (output columns) per block
enum { MR = 6, NR = 16 }; // a tile: MR rows by NR columns of the output

// A block of the weight in panels, either way (whole panels of NR columns).
static size_t panels_floats(int ob, int C) {
    return (size_t)(ob + NR - 1) / NR * NR * ((size_t)(C + NR - 1) / NR * NR);
}

size_t mm_emulated_scratch_floats(int N, int C, int OC) {
    const int ob = OC < OB ? OC : OB;
    return (size_t)N * C + panels_floats(ob, C) + (size_t)N * ob;
}

// One tile: c[i][j] (i < mr, j < nr) = (acc ? c[i][j] : 0) + sum over k < K of a[i][k] b[k][j],
// k in order, one fp32 FMA each (row strides lda, ldb, ldc). The portable loop and the AVX2 one
// each give every element the same chain whatever mr, nr and the tile's place.
static void tile_plain(const float *a, size_t lda, const float *b, size_t ldb, float *c, size_t ldc,
                       int K, int mr, int nr, bool acc) {
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) {
            float s = acc ? c[i * ldc + j] : 0.0f;
            for (int k = 0; k < K; k++) s = fmaf(a[i * lda + k], b[k * ldb + j], s);
            c[i * ldc + j] = s;
        }
}

#ifdef TILE_AVX2
// Not instrumented by the sanitizers (make check's second pass): checked, the tiles ran 18x slower
// there than the sgemm they replace, which is not instrumented either, and doubled that suite's
// LoRA memory test. Their loads stay within the operands' rows (test_ops checks every tail shape).
#define AVX2 __attribute__((target("avx2,fma"), no_sanitize("address", "undefined")))
#ifdef __OPTIMIZE__ // whole unrolling over the rows, so the accumulators stay in registers
#define UNROLL _Pragma("GCC unroll 8")
#else
#define UNROLL
#endif
// mr a constant in each instantiation (tile_avx2's switch), so the 2 mr accumulators stay in
// registers; nr < NR loads and stores under a mask (the same FMAs on the lanes kept).
static inline __attribute__((always_inline)) AVX2 void
tile_avx2_rows(const float *a, size_t lda, const float *b, size_t ldb, float *c, size_t ldc, int K,
               const int mr, int nr, bool acc) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                  m0 = _mm256_cmpgt_epi32(_mm256_set1_epi32(nr), lane),
                  m1 = _mm256_cmpgt_epi32(_mm256_set1_epi32(nr - 8), lane);
    const bool full = nr == NR;
    __m256 s[MR][2];
    UNROLL
    for (int i = 0; i < mr; i++)
        for (int h = 0; h < 2; h++)
            s[i][h] = !acc   ? _mm256_setzero_ps()
                      : full ? _mm256_loadu_ps(c + i * ldc + 8 * h)
                             : _mm256_maskload_ps(c + i * ldc + 8 * h, h ? m1 : m0);
    for (int k = 0; k < K; k++) {
        const float *bk = b + (size_t)k * ldb;
        const __m256 b0 = full ? _mm256_loadu_ps(bk) : _mm256_maskload_ps(bk, m0),
                     b1 = full ? _mm256_loadu_ps(bk + 8) : _mm256_maskload_ps(bk + 8, m1);
        UNROLL
        for (int i = 0; i < mr; i++) {
            const __m256 ai = _mm256_broadcast_ss(a + i * lda + k);
            s[i][0] = _mm256_fmadd_ps(ai, b0, s[i][0]);
            s[i][1] = _mm256_fmadd_ps(ai, b1, s[i][1]);
        }
    }
    UNROLL
    for (int i = 0; i < mr; i++)
        for (int h = 0; h < 2; h++)
            if (full)
                _mm256_storeu_ps(c + i * ldc + 8 * h, s[i][h]);
            else
                _mm256_maskstore_ps(c + i * ldc + 8 * h, h ? m1 : m0, s[i][h]);
}

static AVX2 void tile_avx2(const float *a, size_t lda, const float *b, size_t ldb, float *c,
                           size_t ldc, int K, int mr, int nr, bool acc) {
    // whole tiles without the masks' test in the loop
#define TILE_ROWS(R)                                                                               \
    case R:                                                                                        \
        if (nr == NR)                                                                              \
            tile_avx2_rows(a, lda, b, ldb, c, ldc, K, R, NR, acc);                                 \
        else                                                                                       \
            tile_avx2_rows(a, lda, b, ldb, c, ldc, K, R, nr, acc);                                 \
        return;
    switch (mr) {
        TILE_ROWS(1)
        TILE_ROWS(2)
        TILE_ROWS(3)
        TILE_ROWS(4)
        TILE_ROWS(5)
        TILE_ROWS(6)
    }
#undef TILE_ROWS
}
#endif

// c (N x M, row stride ldc) = (acc ? c : 0) + a (N x K, stride lda) times b (K x M), in tiles of
// MR x NR over the threads. b's columns [j, j + NR) for j a multiple of NR start at
// b + (j / NR) * panel, their rows ldb apart (a row-major b: panel NR; packed panels: ldb NR).
// b's columns past M are never read.
static void tile_gemm(const float *a, size_t lda, const float *b, size_t ldb, size_t panel,
                      float *c, size_t ldc, int N, int M, int K, bool acc) {
    bool avx2 = false;
#ifdef TILE_AVX2
    avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
    const int tn = (N + MR - 1) / MR, tm = (M + NR - 1) / NR;
#pragma omp parallel for schedule(static) if ((int64_t)N * M * K >= 64 * CPU_PAR_MIN)
    for (int t = 0; t < tn * tm; t++) {
        const int i0 = t % tn * MR, j0 = t / tn * NR; // down a column of tiles: b's panel reused
        const int mr = N - i0 < MR ? N - i0 : MR, nr = M - j0 < NR ? M - j0 : NR;
        const float *at = a + (size_t)i0 * lda, *bt = b + (size_t)(j0 / NR) * panel;
        float *ct = c + (size_t)i0 * ldc + j0;
        if (acc) // the next tile's c, down the column: its first loads wait on memory otherwise
            for (int i = MR; i < 2 * MR && i0 + i < N; i++)
                __builtin_prefetch(ct + (size_t)i * ldc, 0, 3);
#ifdef TILE_AVX2
        if (avx2) {
            tile_avx2(at, lda, bt, ldb, ct, ldc, K, mr, nr, acc);
            continue;
        }
#endif
        (void)avx2;
        tile_plain(at, lda, bt, ldb, ct, ldc, K, mr, nr, acc);
    }
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

// m widened into a tile's b in panels of NR columns (the last one's columns past cols unset):
// panel p holds, for each row r, m[r][NR p + j] for j < NR contiguous, where m[r][c] is
// src[r * rs + c * cs]. The forward's b is a weight block transposed (rs 1, cs C); the input
// gradient's the block itself (rs C, cs 1): read in place, rows C apart, a column's loads fell in
// one L1 set when C is a multiple of 1024 (2.1x slower).
static void widened_panels(float *dst, const uint16_t *src, int rows, int cols, size_t rs,
                           size_t cs) {
    const int np = (cols + NR - 1) / NR;
#pragma omp parallel for schedule(static) if ((int64_t)rows * cols >= CPU_PAR_MIN)
    for (int p = 0; p < np; p++) {
        const int nr = cols - p * NR < NR ? cols - p * NR : NR;
        float *d = dst + (size_t)p * NR * rows;
        for (int r = 0; r < rows; r++)
            for (int j = 0; j < nr; j++)
                d[(size_t)r * NR + j] = bf16_value(src[r * rs + (size_t)(p * NR + j) * cs]);
    }
}

void mm_emulated_forward(float *out, uint16_t *out16, float *scratch, const float *inp,
                         const uint16_t *inp16, const uint16_t *weight, int N, int C, int OC) {
    const int ob_max = OC < OB ? OC : OB;
    float *x = scratch, *wb = x + (size_t)N * C, *yb = wb + panels_floats(ob_max, C);
    rounded_block(x, inp, inp16, N, C, (size_t)C);
    for (int o0 = 0; o0 < OC; o0 += OB) {
        const int ob = OC - o0 < OB ? OC - o0 : OB;
        widened_panels(wb, weight + (size_t)o0 * C, C, ob, 1, (size_t)C);
        // out[:, o0:o0+ob] = x @ wb, straight into out, or through yb when it is rounded.
        float *y = out16 ? yb : out + o0;
        const int ldy = out16 ? ob : OC;
        tile_gemm(x, (size_t)C, wb, NR, (size_t)NR * C, y, (size_t)ldy, N, ob, C, false);
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
    float *x = scratch, *wb = x + (size_t)N * C, *db = wb + panels_floats(ob_max, C);
    rounded_block(x, inp, inp16, N, C, (size_t)C);
    for (int o0 = 0; o0 < OC; o0 += OB) {
        const int ob = OC - o0 < OB ? OC - o0 : OB;
        rounded_block(db, dout16 ? NULL : dout + o0, dout16 ? dout16 + o0 : NULL, N, ob,
                      (size_t)OC);
        if (dinp) { // dinp = sum over blocks of db @ wb: each element's chain goes on in o's order
            widened_panels(wb, weight + (size_t)o0 * C, ob, C, (size_t)C, 1);
            tile_gemm(db, (size_t)ob, wb, NR, (size_t)NR * ob, dinp, (size_t)C, N, C, ob, o0 > 0);
        }
        // dW[o0:o0+ob] += db^T @ x (none for a frozen weight)
        if (dweight)
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, ob, C, N, 1.0f, db, ob, x, C, 1.0f,
                        dweight + (size_t)o0 * C, C);
    }
}
