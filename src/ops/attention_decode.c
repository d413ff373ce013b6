// Generation's attention for one new token (ct_ops.attention_decode and attention_decode_bf16,
// contracts in ops.h): its query row against the KV cache of positions [0, T), the token's own
// key and value last, the cache in fp32 or bf16. GQA: query head h reads kv head h / (NH/NKV).
//
// bf16 rounds where the flash kernel's bf16 forward rounds (torch's autocast over HF's eager
// attention, attention_flash.c): the scores s = bf16(bf16(q k) * bf16(scale)), and each chunk's
// probabilities exp(s - m) to bf16 before the products with v (l sums them unrounded). So a
// decoded token sees the arithmetic a prefill of the same positions runs, and with AVX512-BF16
// the products with v are VDPBF16PS on bf16 pairs, two positions an instruction.
//
// The positions split into chunks of DEC_CHUNK (flash-decoding's split): a chunk gives each head
// a partial softmax, its scores' max m, l = sum_j exp(s_j - m) and o = sum_j exp(s_j - m) v_j, and
// the partials merge in chunk order, out = sum_c e^(m_c - M) o_c / sum_c e^(m_c - M) l_c with M the
// largest m_c. The chunks and the merge do not depend on the thread count, so neither do the bits.
//
// Memory order: a position's keys (all kv heads) are one row of the cache. The threads take whole
// chunks, and a chunk's scores run row by row, every head's dot product with the row at once, so
// the keys stream in address order; the products with v then run a kv head at a time over the
// chunk's rows. Splitting the heads over the threads instead (each reading 512 bytes of every
// 4 KiB row, the earlier kernel) reached a third of the memory's rate. While a row's scores run,
// a bf16 cache's key row DEC_AHEAD positions on is prefetched (the scores waited on each row's
// first load), and the row's values into L2 for the p·v pass, which reads each value row in
// kv-head slices: 25% less time over a cache that is not in the caches. The fp32 cache measured
// no better or slower with either, and has none (docs/performance.md).
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "ops/bf16_round.h"
#include "ops/ops_cpu.h"
#include "ops/vec_math.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#define DECODE_AVX512 1
#endif

enum { DEC_CHUNK = 64, DEC_AHEAD = 8 };

static size_t dec_chunks(int T) {
    return ((size_t)T + DEC_CHUNK - 1) / DEC_CHUNK;
}

// The scores (T x NH), q's copy qp (NH x D), then each chunk's partials: o (NH x D), m (NH) and
// l (NH).
size_t cpu_attention_decode_scratch_floats(int T, int NH, int D) {
    return (size_t)NH * T + (size_t)NH * D + dec_chunks(T) * NH * (D + 2);
}

typedef struct dec_call {
    const float *q, *qp; // qp: q laid out for scores_rows (pack_q)
    const void *k, *v;   // float or uint16_t (bf16)
    bool bf16, dp;       // dp: the products with VDPBF16PS
    float *s, *part; // scratch: scores s[j * NH + h]; chunk c's partials at part[c * NH * (D + 2)]
    int T, NH, D, rep;
    size_t ldk;       // elements between positions
    float scale;      // what the scores' sums are multiplied by: 1/sqrt(D), or 1 under bf16
    float bf16_scale; // bf16: bf16(1/sqrt(D)), applied with the roundings (bf16_round_scaled)
} dec_call;

static inline float cache_at(const dec_call *a, const void *p, size_t i) {
    return a->bf16 ? bf16_value(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

// The portable loops: scores of positions [j0, j1), every head; then head h's o over them.
static void scores_plain(const dec_call *a, int j0, int j1) {
    for (int j = j0; j < j1; j++)
        for (int h = 0; h < a->NH; h++) {
            const size_t kr = (size_t)j * a->ldk + (size_t)(h / a->rep) * a->D;
            const float *qh = a->q + (size_t)h * a->D;
            float dot = 0;
#pragma omp simd reduction(+ : dot)
            for (int i = 0; i < a->D; i++) dot += qh[i] * cache_at(a, a->k, kr + i);
            a->s[(size_t)j * a->NH + h] = dot * a->scale;
        }
}

static void values_plain(const dec_call *a, float *o, int h, int j0, int j1) {
    for (int i = 0; i < a->D; i++) o[i] = 0.0f;
    for (int j = j0; j < j1; j++) {
        const size_t vr = (size_t)j * a->ldk + (size_t)(h / a->rep) * a->D;
        const float p = a->s[(size_t)j * a->NH + h];
#pragma omp simd
        for (int i = 0; i < a->D; i++) o[i] += p * cache_at(a, a->v, vr + i);
    }
}

#ifdef DECODE_AVX512
#define AVX512 __attribute__((target("avx512f")))
#define AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512bf16")))
#define INLINE static inline __attribute__((always_inline))
// Whole unrolling, so the accumulator arrays stay in registers (an unoptimised build has no
// constant trip counts to unroll by, and would warn).
#ifdef __OPTIMIZE__
#define UNROLL _Pragma("GCC unroll 16")
#else
#define UNROLL
#endif

// 16 cache values from element i on, widened to fp32 (a bf16 value is the top half of its fp32).
INLINE AVX512 __m512 load16(const void *p, size_t i, bool bf16) {
    if (!bf16) return _mm512_loadu_ps((const float *)p + i);
    const __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// Lane p of the result: the sum of r[p]'s 16 lanes, for 16 vectors at once (a transpose that
// adds as it goes: 45 instructions where 16 separate reductions take about 130).
INLINE AVX512 __m512 sum16(const __m512 r[16]) {
    __m512 a[8], b[4], c[2];
    for (int p = 0; p < 16; p += 2) // 128-bit block: lanes of p, p + 1, p, p + 1
        a[p / 2] =
            _mm512_add_ps(_mm512_unpacklo_ps(r[p], r[p + 1]), _mm512_unpackhi_ps(r[p], r[p + 1]));
    for (int p = 0; p < 8; p += 2) { // 128-bit block: p .. p + 3
        const __m512d x = _mm512_castps_pd(a[p]), y = _mm512_castps_pd(a[p + 1]);
        b[p / 2] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                                 _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    for (int p = 0; p < 4; p += 2) // blocks: 4p'..+3 twice, 4p' + 4..+7 twice
        c[p / 2] = _mm512_add_ps(_mm512_shuffle_f32x4(b[p], b[p + 1], 0x88),
                                 _mm512_shuffle_f32x4(b[p], b[p + 1], 0xdd));
    return _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x88),
                         _mm512_shuffle_f32x4(c[0], c[1], 0xdd));
}

// Scores of positions [j0, j1), row by row, 16 heads at a time: lane x of a group's sums is head
// h0 + x. NH is a multiple of 16 and rep (= R, a constant) divides 16, so a group reads 16 / R
// kv heads, and each load of a key's elements serves R heads; q comes from its copy qp, laid out
// [D / W][NH][W] for W elements a step, so a group's q loads lie at fixed offsets. dp: W = 32,
// q and k as bf16 pairs, VDPBF16PS (products exact, sums in fp32); else W = 16, FMA on the
// cache widened to fp32.
INLINE AVX512_BF16 void scores_rows(const dec_call *a, int j0, int j1, const bool bf16,
                                    const bool dp, const int R) {
    const char *k = a->k;
    const size_t esize = bf16 ? 2 : 4, row_bytes = a->ldk * esize, D = (size_t)a->D;
    const size_t W = dp ? 32 : 16;
    const int NH = a->NH;
    const __m512 scale = _mm512_set1_ps(a->scale);
    for (int j = j0; j < j1; j++) {
        const char *krow = k + (size_t)j * row_bytes, *vrow = (const char *)a->v + (krow - k);
        if (bf16)
            for (size_t b = 0; b < row_bytes; b += 64) {
                if (j + DEC_AHEAD < a->T)
                    _mm_prefetch(krow + DEC_AHEAD * row_bytes + b, _MM_HINT_T0);
                _mm_prefetch(vrow + b, _MM_HINT_T1);
            }
        for (int h0 = 0; h0 < NH; h0 += 16) {
            const char *kg = krow + (size_t)(h0 / R) * D * esize;
            __m512 r[16];
            UNROLL
            for (int x = 0; x < 16; x++) r[x] = _mm512_setzero_ps();
            for (size_t i = 0; i < D; i += W) {
                const float *qi =
                    a->qp + (dp ? i / 2 : i) * NH + (size_t)h0 * 16; // 64 bytes a head
                // lane x reads kv head x / R: unrolled with R constant, the R loads of one
                // key's elements are one load
                UNROLL
                for (int x = 0; x < 16; x++) {
                    const size_t at = (size_t)(x / R) * D + i;
                    if (dp)
                        r[x] = _mm512_dpbf16_ps(
                            r[x], (__m512bh)_mm512_loadu_si512(qi + x * 16),
                            (__m512bh)_mm512_loadu_si512((const uint16_t *)kg + at));
                    else
                        r[x] = _mm512_fmadd_ps(_mm512_loadu_ps(qi + x * 16), load16(kg, at, bf16),
                                               r[x]);
                }
            }
            _mm512_storeu_ps(a->s + (size_t)j * NH + h0, _mm512_mul_ps(sum16(r), scale));
        }
    }
}

#define SCORES_REP(R)                                                                              \
    case R:                                                                                        \
        if (a->dp)                                                                                 \
            scores_rows(a, j0, j1, true, true, R);                                                 \
        else if (a->bf16)                                                                          \
            scores_rows(a, j0, j1, true, false, R);                                                \
        else                                                                                       \
            scores_rows(a, j0, j1, false, false, R);                                               \
        return
static AVX512_BF16 void scores_wide(const dec_call *a, int j0, int j1) {
    switch (a->rep) {
        SCORES_REP(1);
        SCORES_REP(2);
        SCORES_REP(4);
        SCORES_REP(8);
        SCORES_REP(16);
    }
}
#undef SCORES_REP

// o of query heads h and h + 1 (n = 1 or 2, one kv head) over positions [j0, j1): 128 outputs
// at a time held in registers, each v row loaded once for both heads.
INLINE AVX512 void values_rows(const dec_call *a, float *o, size_t ostride, int h, int n, int j0,
                               int j1, const bool bf16) {
    const void *v = a->v;
    const size_t ldk = a->ldk, voff = (size_t)(h / a->rep) * a->D, NH = (size_t)a->NH;
    const float *p0 = a->s + h, *p1 = p0 + (n > 1 ? 1 : 0);
    for (int i0 = 0; i0 < a->D; i0 += 128) {
        const int nv = (a->D - i0 < 128 ? a->D - i0 : 128) / 16;
        __m512 acc0[8], acc1[8];
        UNROLL
        for (int c = 0; c < 8; c++) acc0[c] = acc1[c] = _mm512_setzero_ps();
        for (int j = j0; j < j1; j++) {
            const __m512 w0 = _mm512_set1_ps(p0[j * NH]), w1 = _mm512_set1_ps(p1[j * NH]);
            const size_t vr = (size_t)j * ldk + voff + i0;
            UNROLL
            for (int c = 0; c < 8; c++)
                if (c < nv) {
                    const __m512 vv = load16(v, vr + 16 * c, bf16);
                    acc0[c] = _mm512_fmadd_ps(w0, vv, acc0[c]);
                    acc1[c] = _mm512_fmadd_ps(w1, vv, acc1[c]);
                }
        }
        for (int c = 0; c < nv; c++) {
            _mm512_storeu_ps(o + i0 + 16 * c, acc0[c]);
            if (n > 1) _mm512_storeu_ps(o + ostride + i0 + 16 * c, acc1[c]);
        }
    }
}

static AVX512 void values_wide(const dec_call *a, float *o, size_t ostride, int h, int n, int j0,
                               int j1) {
    if (a->bf16)
        values_rows(a, o, ostride, h, n, j0, j1, true);
    else
        values_rows(a, o, ostride, h, n, j0, j1, false);
}

// The bf16 probabilities of positions j and j + 1 (both bf16 values: their top halves) as one
// bf16 pair, j's in the low half.
static inline uint32_t bf16_pair(float pj, float pj1) {
    uint32_t a, b;
    memcpy(&a, &pj, 4);
    memcpy(&b, &pj1, 4);
    return a >> 16 | (b & 0xffff0000u);
}

// One step of values_dp: positions j and j + 1 (pair; else j alone, its partner zero) into the
// accumulators of nb 32-element blocks.
INLINE AVX512_BF16 void values_dp_step(__m512 acc0[8], __m512 acc1[8], const uint16_t *r0,
                                       size_t ldk, __m512i w0, __m512i w1, int nb,
                                       const bool pair) {
    UNROLL
    for (int c = 0; c < 4; c++)
        if (c < nb) {
            const __m512i x0 = _mm512_loadu_si512(r0 + 32 * c),
                          x1 =
                              pair ? _mm512_loadu_si512(r0 + ldk + 32 * c) : _mm512_setzero_si512();
            const __m512bh lo = (__m512bh)_mm512_unpacklo_epi16(x0, x1),
                           hi = (__m512bh)_mm512_unpackhi_epi16(x0, x1);
            acc0[2 * c] = _mm512_dpbf16_ps(acc0[2 * c], (__m512bh)w0, lo);
            acc0[2 * c + 1] = _mm512_dpbf16_ps(acc0[2 * c + 1], (__m512bh)w0, hi);
            acc1[2 * c] = _mm512_dpbf16_ps(acc1[2 * c], (__m512bh)w1, lo);
            acc1[2 * c + 1] = _mm512_dpbf16_ps(acc1[2 * c + 1], (__m512bh)w1, hi);
        }
}

// values_rows for bf16 probabilities with VDPBF16PS: each instruction adds two positions' exact
// products (p_j v_j + p_j+1 v_j+1, in fp32). Rows j and j + 1 interleaved by unpacklo/hi_epi16
// give, in 128-bit lane L of a 32-element block, its elements 8L..8L+3 (lo) and 8L+4..8L+7 (hi);
// the stores put them back in order.
static AVX512_BF16 void values_dp(const dec_call *a, float *o, size_t ostride, int h, int n, int j0,
                                  int j1) {
    const uint16_t *v = a->v;
    const size_t ldk = a->ldk, voff = (size_t)(h / a->rep) * a->D, NH = (size_t)a->NH;
    const float *p0 = a->s + h, *p1 = p0 + (n > 1 ? 1 : 0);
    const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23),
                  second = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29,
                                             30, 31);
    for (int i0 = 0; i0 < a->D; i0 += 128) {
        const int nb = (a->D - i0 < 128 ? a->D - i0 : 128) / 32;
        __m512 acc0[8], acc1[8];
        UNROLL
        for (int c = 0; c < 8; c++) acc0[c] = acc1[c] = _mm512_setzero_ps();
        int j = j0;
        for (; j + 1 < j1; j += 2)
            values_dp_step(acc0, acc1, v + (size_t)j * ldk + voff + i0, ldk,
                           _mm512_set1_epi32((int)bf16_pair(p0[j * NH], p0[(j + 1) * NH])),
                           _mm512_set1_epi32((int)bf16_pair(p1[j * NH], p1[(j + 1) * NH])), nb,
                           true);
        if (j < j1)
            values_dp_step(acc0, acc1, v + (size_t)j * ldk + voff + i0, ldk,
                           _mm512_set1_epi32((int)bf16_pair(p0[j * NH], 0.0f)),
                           _mm512_set1_epi32((int)bf16_pair(p1[j * NH], 0.0f)), nb, false);
        for (int c = 0; c < nb; c++) {
            float *oc = o + i0 + 32 * c;
            _mm512_storeu_ps(oc, _mm512_permutex2var_ps(acc0[2 * c], first, acc0[2 * c + 1]));
            _mm512_storeu_ps(oc + 16, _mm512_permutex2var_ps(acc0[2 * c], second, acc0[2 * c + 1]));
            if (n > 1) {
                _mm512_storeu_ps(oc + ostride,
                                 _mm512_permutex2var_ps(acc1[2 * c], first, acc1[2 * c + 1]));
                _mm512_storeu_ps(oc + ostride + 16,
                                 _mm512_permutex2var_ps(acc1[2 * c], second, acc1[2 * c + 1]));
            }
        }
    }
}

// qp: q laid out for scores_rows, in fp32 or (dp) as bf16 pairs (q holds bf16 values there).
static void pack_q(float *qp, const float *q, int NH, int D, bool dp) {
    const int W = dp ? 32 : 16;
    for (int i = 0; i < D; i += W)
        for (int h = 0; h < NH; h++)
            for (int x = 0; x < W; x++) {
                const float e = q[(size_t)h * D + i + x];
                const size_t at = (size_t)i * NH + (size_t)h * W + x;
                if (dp)
                    ((uint16_t *)qp)[at] = bf16_round(e);
                else
                    qp[at] = e;
            }
}
#endif

// The softmax of n rows of scores s (a row: every head's) against each head's max over them,
// in place: m and l get each head's max and sum. bf16: the probabilities then rounded to bf16
// (l keeps their unrounded sum, as the flash kernel's).
CPU_SIMD_CLONES
static void softmax_rows(float *s, float *m, float *l, int n, int NH, bool bf16) {
    for (int h = 0; h < NH; h++) m[h] = -INFINITY, l[h] = 0.0f;
    for (int j = 0; j < n; j++)
#pragma omp simd
        for (int h = 0; h < NH; h++)
            m[h] = s[(size_t)j * NH + h] > m[h] ? s[(size_t)j * NH + h] : m[h];
    for (int j = 0; j < n; j++)
#pragma omp simd
        for (int h = 0; h < NH; h++) {
            float *e = s + (size_t)j * NH + h;
            *e = vexp(*e - m[h]);
            l[h] += *e;
        }
    if (bf16) bf16_round_scaled(s, (size_t)n * NH, 1.0f);
}

// Chunk c: every head's scores, their softmax against the chunk's max, and the partials.
static void run_chunk(const dec_call *a, int c, bool wide) {
    const int j0 = c * DEC_CHUNK, j1 = j0 + DEC_CHUNK < a->T ? j0 + DEC_CHUNK : a->T, NH = a->NH;
    float *o = a->part + (size_t)c * NH * (a->D + 2), *m = o + (size_t)NH * a->D, *l = m + NH;
#ifdef DECODE_AVX512
    if (wide)
        scores_wide(a, j0, j1);
    else
#endif
        scores_plain(a, j0, j1);
    if (a->bf16) bf16_round_scaled(a->s + (size_t)j0 * NH, (size_t)(j1 - j0) * NH, a->bf16_scale);
    softmax_rows(a->s + (size_t)j0 * NH, m, l, j1 - j0, NH, a->bf16);
    for (int h = 0; h < NH; h++) {
#ifdef DECODE_AVX512
        if (wide) { // the heads of a kv head in pairs
            const int n = (h % a->rep) + 1 < a->rep ? 2 : 1;
            if (a->dp)
                values_dp(a, o + (size_t)h * a->D, (size_t)a->D, h, n, j0, j1);
            else
                values_wide(a, o + (size_t)h * a->D, (size_t)a->D, h, n, j0, j1);
            h += n - 1;
            continue;
        }
#endif
        values_plain(a, o + (size_t)h * a->D, h, j0, j1);
    }
}

// Head h's output from the chunks' partials, in chunk order.
CPU_SIMD_CLONES
static void merge_head(const dec_call *a, float *out, int h) {
    const size_t nc = dec_chunks(a->T), cs = (size_t)a->NH * (a->D + 2), D = (size_t)a->D;
    const float *m = a->part + (size_t)a->NH * D + h, *l = m + a->NH;
    float M = -INFINITY, sum = 0.0f;
    for (size_t c = 0; c < nc; c++) M = m[c * cs] > M ? m[c * cs] : M;
    for (size_t i = 0; i < D; i++) out[i] = 0.0f;
    for (size_t c = 0; c < nc; c++) {
        const float *oc = a->part + c * cs + h * D, w = vexp(m[c * cs] - M);
        sum += w * l[c * cs];
#pragma omp simd
        for (size_t i = 0; i < D; i++) out[i] += w * oc[i];
    }
    const float inv = 1.0f / sum;
#pragma omp simd
    for (size_t i = 0; i < D; i++) out[i] *= inv;
}

static void attention_decode(float *out, float *scratch, const float *q, const void *k,
                             const void *v, bool bf16, int T, int NH, int NKV, int D) {
    const int rep = NH / NKV;
    float *qp = scratch + (size_t)NH * T;
#ifdef DECODE_AVX512
    const bool wide = D % 32 == 0 && NH % 16 == 0 && 16 % rep == 0 &&
                      __builtin_cpu_supports("avx512f"),
               dp = wide && bf16 && __builtin_cpu_supports("avx512bf16");
    if (wide) pack_q(qp, q, NH, D, dp);
#else
    const bool wide = false, dp = false;
#endif
    const dec_call a = {.q = q,
                        .qp = qp,
                        .k = k,
                        .v = v,
                        .bf16 = bf16,
                        .dp = dp,
                        .s = scratch,
                        .part = scratch + (size_t)NH * T + (size_t)NH * D,
                        .T = T,
                        .NH = NH,
                        .D = D,
                        .rep = rep,
                        .ldk = (size_t)NKV * D,
                        .scale = bf16 ? 1.0f : (float)(1.0 / sqrt((double)D)),
                        .bf16_scale = bf16_rounded((float)(1.0 / sqrt((double)D)))};
    const int nc = (int)dec_chunks(T);
#pragma omp parallel if ((int64_t)NH * T * D >= CPU_PAR_MIN)
    {
        // Dynamic: with an odd number of chunks a static split leaves one thread a whole chunk
        // behind (560 positions, 9 chunks: 2.05 -> 1.98 ms over 28 layers); the bits do not
        // depend on which thread runs a chunk.
#pragma omp for schedule(dynamic, 1)
        for (int c = 0; c < nc; c++) run_chunk(&a, c, wide);
#pragma omp for schedule(static)
        for (int h = 0; h < NH; h++) merge_head(&a, out + (size_t)h * D, h);
    }
}

void cpu_attention_decode(float *out, float *scratch, const float *q, const float *k,
                          const float *v, int T, int NH, int NKV, int D) {
    attention_decode(out, scratch, q, k, v, false, T, NH, NKV, D);
}

void cpu_attention_decode_bf16(float *out, float *scratch, const float *q, const uint16_t *k,
                               const uint16_t *v, int T, int NH, int NKV, int D) {
    attention_decode(out, scratch, q, k, v, true, T, NH, NKV, D);
}
