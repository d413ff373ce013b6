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
// The vector kernels (attention_decode_wide.h) run at AVX-512's width, or at AVX2's with FMA
// where the CPU has no AVX-512 (AMD before Zen 4, most Intel desktops); the portable loops run
// only for head counts those do not fit. Each set sums in its own order, so the bits differ from
// one CPU family to another, never from one thread count to another.
//
// The positions split into chunks of DEC_CHUNK (flash-decoding's split): a chunk gives each head
// a partial softmax, its scores' max m, l = sum_j exp(s_j - m) and o = sum_j exp(s_j - m) v_j, and
// the partials merge in chunk order, out = sum_c e^(m_c - M) o_c / sum_c e^(m_c - M) l_c with M the
// largest m_c. The chunks and the merge do not depend on the thread count, so neither do the bits.
//
// Memory order: a position's keys (all kv heads) are one row of the cache. The threads take whole
// chunks, and a chunk's scores run row by row, every head's dot product with the row at once, so
// the keys stream in address order. Splitting the heads over the threads instead (each reading
// 512 bytes of every 4 KiB row, the earlier kernel) reached a third of the memory's rate. While a
// row's scores run, the key row DEC_AHEAD positions on is prefetched (the scores waited on each
// row's first load). Two plans for the values (PACED in attention_decode_wide.h):
// - AVX-512's (measured on Zen 4): the row's values are prefetched into L2 with its scores, for
//   a bf16 cache all at once (25% less time over a cache that is not in the caches; the fp32
//   cache none, no better or slower with it); the p·v pass then runs a kv head's pair of heads at
//   a time over the chunk's rows, the outputs in registers (values_rows).
// - AVX2's (Zen 3): the keys' prefetches paced over the row's steps (the burst held Zen 3 back),
//   and the p·v pass reads the values as they lie, DEC_VROWS rows at a time with the outputs in
//   L1, prefetching DEC_AHEAD rows on (values_stream). Against fetching the values during the
//   scores for a slice-wise pass (the loads stalled the scores), with the scores two rows a pass:
//   21% less time for an fp32 cache, 13% for bf16 (docs/performance.md).
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "ops/bf16_round.h"
#include "ops/ops_cpu.h"
#include "ops/vec_math.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#define DECODE_SIMD 1
#endif

enum { DEC_CHUNK = 64, DEC_AHEAD = 8, DEC_VROWS = 4 };

static size_t dec_chunks(int T) {
    return ((size_t)T + DEC_CHUNK - 1) / DEC_CHUNK;
}

// The scores (T x NH), q's copy qp (NH x D), then each chunk's partials: o (NH x D), m (NH) and
// l (NH).
size_t cpu_attention_decode_scratch_floats(int T, int NH, int D) {
    return (size_t)NH * T + (size_t)NH * D + dec_chunks(T) * NH * (D + 2);
}

// Which kernels run: the portable loops, or attention_decode_wide.h's at AVX2's or AVX-512's
// width.
typedef enum { DEC_PLAIN, DEC_AVX2, DEC_AVX512 } dec_isa;

typedef struct dec_call {
    const float *q, *qp; // qp: q laid out for scores_rows (pack_q)
    const void *k, *v;   // float or uint16_t (bf16)
    dec_isa isa;
    bool bf16, dp;   // dp: the products with VDPBF16PS
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

#ifdef DECODE_SIMD
#define INLINE static inline __attribute__((always_inline))
// Whole unrolling, so the accumulator arrays stay in registers (an unoptimised build has no
// constant trip counts to unroll by, and would warn).
#ifdef __OPTIMIZE__
#define UNROLL _Pragma("GCC unroll 16")
#else
#define UNROLL
#endif
#define AVX512 __attribute__((target("avx512f")))
#define AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512bf16")))
#define AVX2 __attribute__((target("avx2,fma")))

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
    UNROLL
    for (int p = 0; p < 16; p += 2) // 128-bit block: lanes of p, p + 1, p, p + 1
        a[p / 2] =
            _mm512_add_ps(_mm512_unpacklo_ps(r[p], r[p + 1]), _mm512_unpackhi_ps(r[p], r[p + 1]));
    UNROLL
    for (int p = 0; p < 8; p += 2) { // 128-bit block: p .. p + 3
        const __m512d x = _mm512_castps_pd(a[p]), y = _mm512_castps_pd(a[p + 1]);
        b[p / 2] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                                 _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    UNROLL
    for (int p = 0; p < 4; p += 2) // blocks: 4p'..+3 twice, 4p' + 4..+7 twice
        c[p / 2] = _mm512_add_ps(_mm512_shuffle_f32x4(b[p], b[p + 1], 0x88),
                                 _mm512_shuffle_f32x4(b[p], b[p + 1], 0xdd));
    return _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x88),
                         _mm512_shuffle_f32x4(c[0], c[1], 0xdd));
}

// 16 cache values from element i on as two vectors of 8 fp32. A bf16 cache widens by unpacking
// with zeros, one instruction for 8 values (where load16's way takes two), and so comes in
// unpack's order: lo holds elements 0-3 and 8-11, hi 4-7 and 12-15 (cache_order).
INLINE AVX2 void load8x2(const void *p, size_t i, bool bf16, __m256 *lo, __m256 *hi) {
    if (!bf16) {
        *lo = _mm256_loadu_ps((const float *)p + i);
        *hi = _mm256_loadu_ps((const float *)p + i + 8);
        return;
    }
    const __m256i x = _mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i)),
                  z = _mm256_setzero_si256();
    *lo = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, x));
    *hi = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, x));
}

// Stores load8x2's lo and hi at p in element order.
INLINE AVX2 void store8x2(float *p, __m256 lo, __m256 hi, bool bf16) {
    if (bf16) {
        const __m256 a = _mm256_permute2f128_ps(lo, hi, 0x20),
                     b = _mm256_permute2f128_ps(lo, hi, 0x31);
        lo = a, hi = b;
    }
    _mm256_storeu_ps(p, lo);
    _mm256_storeu_ps(p + 8, hi);
}

// The element that slot x (0-15) of load8x2's bf16 order holds: lo's 128-bit lane L holds
// elements 8L .. 8L+3, hi's 8L+4 .. 8L+7.
static int cache_order(int x) {
    return 8 * (x % 8 / 4) + 4 * (x / 8) + x % 4;
}

// sum16 at AVX2's 8 lanes.
INLINE AVX2 __m256 sum8(const __m256 r[8]) {
    __m256 a[4], b[2];
    UNROLL
    for (int p = 0; p < 8; p += 2) // 128-bit half: lanes of p, p + 1, p, p + 1
        a[p / 2] =
            _mm256_add_ps(_mm256_unpacklo_ps(r[p], r[p + 1]), _mm256_unpackhi_ps(r[p], r[p + 1]));
    UNROLL
    for (int p = 0; p < 4; p += 2) { // 128-bit half: p .. p + 3
        const __m256d x = _mm256_castps_pd(a[p]), y = _mm256_castps_pd(a[p + 1]);
        b[p / 2] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(x, y)),
                                 _mm256_castpd_ps(_mm256_unpackhi_pd(x, y)));
    }
    return _mm256_add_ps(_mm256_permute2f128_ps(b[0], b[1], 0x20),
                         _mm256_permute2f128_ps(b[0], b[1], 0x31));
}

// Lines [from, from + n) of a row (up to its `lines`): the key row DEC_AHEAD positions on into
// L1, and (vrow not NULL) the row's values for values_rows into L2. (On Zen 3, while the scores
// also loaded the values, the keys into L2 took 9% less time; with the values out of the scores,
// L1 takes 2-4% less: docs/performance.md.) In asm: GCC 12's dead-code pass removes a loop of
// nothing but _mm_prefetch.
static inline void prefetch_lines(const char *kahead, const char *vrow, size_t from, size_t n,
                                  size_t lines) {
    for (size_t line = from; line < from + n && line < lines; line++) {
        if (kahead) __asm__ volatile("prefetcht0 %0" : : "m"(kahead[64 * line]));
        if (vrow) __asm__ volatile("prefetcht1 %0" : : "m"(vrow[64 * line]));
    }
}

#define WIDE(name) name##_avx512
#define WIDE_TARGET AVX512
#define WIDE_DP_TARGET AVX512_BF16
#define VF __m512
#define VW 16
#define VB 8
#define V_ZERO() _mm512_setzero_ps()
#define V_SET1(x) _mm512_set1_ps(x)
#define V_LOAD(p) _mm512_loadu_ps(p)
#define V_STORE(p, x) _mm512_storeu_ps(p, x)
#define V_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define V_MUL(a, b) _mm512_mul_ps(a, b)
#define V_LOAD_CACHE2(p, i, bf16, lo, hi) (lo = load16(p, i, bf16), hi = load16(p, (i) + 16, bf16))
#define V_STORE2(p, lo, hi, bf16) (_mm512_storeu_ps(p, lo), _mm512_storeu_ps((p) + 16, hi))
#define V_SUM(r) sum16(r)
#define SROWS 1
#define PACED 0
#define V_DP(r, q, k)                                                                              \
    _mm512_dpbf16_ps(r, (__m512bh)_mm512_loadu_si512(q), (__m512bh)_mm512_loadu_si512(k))
#include "ops/attention_decode_wide.h"

#define WIDE(name) name##_avx2
#define WIDE_TARGET AVX2
#define WIDE_DP_TARGET AVX2
#define VF __m256
#define VW 8
#define V_ZERO() _mm256_setzero_ps()
#define V_SET1(x) _mm256_set1_ps(x)
#define V_LOAD(p) _mm256_loadu_ps(p)
#define V_STORE(p, x) _mm256_storeu_ps(p, x)
#define V_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define V_MUL(a, b) _mm256_mul_ps(a, b)
#define V_LOAD_CACHE2(p, i, bf16, lo, hi) load8x2(p, i, bf16, &(lo), &(hi))
#define V_STORE2(p, lo, hi, bf16) store8x2(p, lo, hi, bf16)
#define V_SUM(r) sum8(r)
#define SROWS 2
#define PACED 1
#include "ops/attention_decode_wide.h"

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

// qp: q laid out for scores_rows, W elements a step: in fp32 (in load8x2's order where
// unpacked), or (dp) as bf16 pairs (q holds bf16 values there).
static void pack_q(float *qp, const float *q, int NH, int D, int W, bool dp, bool unpacked) {
    for (int i = 0; i < D; i += W)
        for (int h = 0; h < NH; h++)
            for (int x = 0; x < W; x++) {
                const float e = q[(size_t)h * D + i + (unpacked ? cache_order(x) : x)];
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
static void run_chunk(const dec_call *a, int c) {
    const int j0 = c * DEC_CHUNK, j1 = j0 + DEC_CHUNK < a->T ? j0 + DEC_CHUNK : a->T, NH = a->NH;
    float *o = a->part + (size_t)c * NH * (a->D + 2), *m = o + (size_t)NH * a->D, *l = m + NH;
#ifdef DECODE_SIMD
    if (a->isa == DEC_AVX512)
        scores_avx512(a, j0, j1);
    else if (a->isa == DEC_AVX2)
        scores_avx2(a, j0, j1);
    else
#endif
        scores_plain(a, j0, j1);
    if (a->bf16) bf16_round_scaled(a->s + (size_t)j0 * NH, (size_t)(j1 - j0) * NH, a->bf16_scale);
    softmax_rows(a->s + (size_t)j0 * NH, m, l, j1 - j0, NH, a->bf16);
#ifdef DECODE_SIMD
    if (a->isa == DEC_AVX2) {
        values_stream_avx2(a, o, j0, j1);
        return;
    }
#endif
    for (int h = 0; h < NH; h++) {
#ifdef DECODE_SIMD
        if (a->isa != DEC_PLAIN) { // the heads of a kv head in pairs
            const int n = (h % a->rep) + 1 < a->rep ? 2 : 1;
            float *oh = o + (size_t)h * a->D;
            if (a->dp)
                values_dp(a, oh, (size_t)a->D, h, n, j0, j1);
            else
                values_avx512(a, oh, (size_t)a->D, h, n, j0, j1);
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
    dec_isa isa = DEC_PLAIN;
    bool dp = false;
#ifdef DECODE_SIMD
    if (__builtin_cpu_supports("avx512f") && fits_avx512(NH, rep, D))
        isa = DEC_AVX512, dp = bf16 && __builtin_cpu_supports("avx512bf16");
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             fits_avx2(NH, rep, D))
        isa = DEC_AVX2;
    if (isa != DEC_PLAIN)
        pack_q(qp, q, NH, D, isa == DEC_AVX512 ? 32 : 16, dp, isa == DEC_AVX2 && bf16);
#endif
    const dec_call a = {.q = q,
                        .qp = qp,
                        .k = k,
                        .v = v,
                        .isa = isa,
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
        for (int c = 0; c < nc; c++) run_chunk(&a, c);
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
