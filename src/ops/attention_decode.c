// Generation's attention for one new token (ct_ops.attention_decode, contract in ops.h): its
// query row against the KV cache of positions [0, T), the token's own key and value last. GQA:
// query head h reads kv head h / (NH/NKV); the heads run in parallel, in pairs that share a kv
// head, so each cached row is read once for two heads. Per head: s_j = scale * q.k_j, p =
// softmax(s) (the exponentials in float, their sum in double, as the sdpa kernel's rows), out =
// sum_j p_j v_j; a head's bits do not depend on the pairing.
#include <math.h>
#include <stdbool.h>

#include "ops/ops_cpu.h"
#include "ops/vec_math.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#define DECODE_AVX512 1
#endif

// q . k over D, in 16 lanes: a single running sum is one dependent add per element, which
// made decode at 512 cached positions 50% slower than at 128 (it cannot be vectorized without
// reordering, which this does explicitly).
CPU_SIMD_CLONES
static float dot_lanes(const float *a, const float *b, int D) {
    float lane[16] = {0};
    int i = 0;
    for (; i + 16 <= D; i += 16)
        for (int j = 0; j < 16; j++) lane[j] += a[i + j] * b[i + j];
    float dot = 0.0f;
    for (int j = 0; j < 16; j++) dot += lane[j];
    for (; i < D; i++) dot += a[i] * b[i];
    return dot;
}

#ifdef DECODE_AVX512
// s[j] = scale * q.k_j for the block j in [j0, j0 + 16) ∩ [0, T), D a multiple of 16, with
// dot_lanes's sums bit for bit: each position's 16 lanes accumulate lane += q*k block by block (a
// multiply, then an add: ISO C contracts nothing into an FMA), then 0 + lane 0 + lane 1 + ... +
// lane 15 in that order. dot_lanes does that last sum as 16 dependent scalar adds read back from
// the stack, per position; here 16 positions' lane vectors are transposed in registers, so the
// same adds, in the same order, run once per 16 positions as vector adds.
__attribute__((target("avx512f"))) static void qk_block_avx512(float *s, const float *q,
                                                               const float *k, int j0, int T,
                                                               int D, int ldk, float scale) {
    {
        const int nb = T - j0 < 16 ? T - j0 : 16;
        __m512 r[16];
        for (int p = 0; p < 16; p++) {
            __m512 lane = _mm512_setzero_ps();
            if (p < nb) {
                const float *kp = k + (size_t)(j0 + p) * ldk;
                for (int i = 0; i < D; i += 16)
                    lane = _mm512_add_ps(
                        lane, _mm512_mul_ps(_mm512_loadu_ps(q + i), _mm512_loadu_ps(kp + i)));
            }
            r[p] = lane;
        }
        // transpose: t[k] holds lane k of positions 0..15
        __m512 t[16], u[16];
        for (int p = 0; p < 16; p += 2) {
            t[p] = _mm512_unpacklo_ps(r[p], r[p + 1]);
            t[p + 1] = _mm512_unpackhi_ps(r[p], r[p + 1]);
        }
        for (int p = 0; p < 16; p += 4)
            for (int h = 0; h < 2; h++) {
                const __m512d a = _mm512_castps_pd(t[p + h]), b = _mm512_castps_pd(t[p + 2 + h]);
                u[p + h] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
                u[p + 2 + h] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
            }
        for (int p = 0; p < 16; p += 8)
            for (int h = 0; h < 4; h++) {
                t[p + h] = _mm512_shuffle_f32x4(u[p + h], u[p + 4 + h], 0x88);
                t[p + 4 + h] = _mm512_shuffle_f32x4(u[p + h], u[p + 4 + h], 0xdd);
            }
        for (int h = 0; h < 8; h++) {
            u[h] = _mm512_shuffle_f32x4(t[h], t[h + 8], 0x88);
            u[h + 8] = _mm512_shuffle_f32x4(t[h], t[h + 8], 0xdd);
        }
        // u[m] now holds lane L(m) of each position: the order of lanes, undone below
        static const int lane_of[16] = {0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15};
        __m512 by_lane[16];
        for (int m = 0; m < 16; m++) by_lane[lane_of[m]] = u[m];
        __m512 dot = _mm512_setzero_ps();
        for (int l = 0; l < 16; l++) dot = _mm512_add_ps(dot, by_lane[l]);
        dot = _mm512_mul_ps(dot, _mm512_set1_ps(scale));
        _mm512_mask_storeu_ps(s + j0, (__mmask16)((1u << nb) - 1), dot);
    }
}

// The scores of the n query heads q[g * D] that share one kv head (GQA) into s[g * T], every
// block of [0, T) in turn: a block of key rows is read from memory once for all n heads, and each
// head's scores are the bits it gets alone. The rows are D floats 4 KiB or more apart (all kv
// heads of a position lie together), so every row starts a new page, which the hardware
// prefetchers do not cross: the next block's rows are asked for while this one computes.
__attribute__((target("avx512f"))) static void qk_rows_avx512(float *s, const float *q, int n,
                                                              const float *k, int T, int D,
                                                              int ldk, float scale) {
    for (int j0 = 0; j0 < T; j0 += 16) {
        for (int p = 16; p < 32 && j0 + p < T; p++)
            for (int i = 0; i < D; i += 16)
                _mm_prefetch((const char *)(k + (size_t)(j0 + p) * ldk + i), _MM_HINT_T0);
        for (int g = 0; g < n; g++)
            qk_block_avx512(s + (size_t)g * T, q + (size_t)g * D, k, j0, T, D, ldk, scale);
    }
}

// o[g * D] = sum_j (s[g * T + j] * inv[g]) v_j for n = 1 or 2 heads that share one kv head, D a
// multiple of 16: each element's sum from 0 in j order, as the plain loop, held in registers 128
// elements at a time instead of loaded and stored per j; each v_j is loaded once for both heads.
__attribute__((target("avx512f"))) static void pv_rows_avx512(float *o, const float *s,
                                                              const float *inv, int n,
                                                              const float *v, int T, int D,
                                                              int ldk) {
    for (int i0 = 0; i0 < D; i0 += 128) {
        const int nv = (D - i0 < 128 ? D - i0 : 128) / 16;
        __m512 acc[2][8];
        for (int c = 0; c < 8; c++) acc[0][c] = acc[1][c] = _mm512_setzero_ps();
        for (int j = 0; j < T; j++) {
            const __m512 p0 = _mm512_set1_ps(s[j] * inv[0]);
            const __m512 p1 = _mm512_set1_ps(n > 1 ? s[T + j] * inv[1] : 0.0f);
            const float *vj = v + (size_t)j * ldk + i0;
            if (j + 8 < T) // as in qk_rows_avx512: each row is on a page of its own
                for (int c = 0; c < nv; c++)
                    _mm_prefetch((const char *)(vj + (size_t)8 * ldk + 16 * c), _MM_HINT_T0);
            for (int c = 0; c < nv; c++) {
                const __m512 vv = _mm512_loadu_ps(vj + 16 * c);
                acc[0][c] = _mm512_add_ps(acc[0][c], _mm512_mul_ps(p0, vv));
                if (n > 1) acc[1][c] = _mm512_add_ps(acc[1][c], _mm512_mul_ps(p1, vv));
            }
        }
        for (int g = 0; g < n; g++)
            for (int c = 0; c < nv; c++) _mm512_storeu_ps(o + (size_t)g * D + i0 + 16 * c, acc[g][c]);
    }
}
#endif

// Softmax of one head's scores s[0, T) in place (the exponentials in float, their sum in double);
// returns 1 / the sum.
static float softmax_row(float *s, int T) {
    float m = -INFINITY;
    for (int j = 0; j < T; j++) m = s[j] > m ? s[j] : m;
    double sum = 0.0;
    for (int j = 0; j < T; j++) {
        s[j] = expf(s[j] - m);
        sum += s[j];
    }
    return (float)(1.0 / sum);
}

// One query head h: scores, softmax, p.v, in the portable loops.
static void head_plain(float *o, float *s, const float *qh, const float *kh, const float *vh,
                       int T, int D, int ldk, float scale) {
    for (int j = 0; j < T; j++) s[j] = dot_lanes(qh, kh + (size_t)j * ldk, D) * scale;
    const float inv = softmax_row(s, T);
    for (int i = 0; i < D; i++) o[i] = 0.0f;
    // out += p_j v_j, each element's sum in j order; o and v_j never overlap, so the elements
    // go in vectors (the compiler would not: it cannot prove that, and -O2's cost model
    // takes no runtime alias check; this scalar loop was the kernel's most).
    for (int j = 0; j < T; j++) {
        const float p = s[j] * inv, *vj = vh + (size_t)j * ldk;
#pragma omp simd
        for (int i = 0; i < D; i++) o[i] += p * vj[i];
    }
}

void cpu_attention_decode(float *out, float *scratch, const float *q, const float *k,
                          const float *v, int T, int NH, int NKV, int D) {
    const int rep = NH / NKV, ldk = NKV * D, pairs = (rep + 1) / 2;
    const float scale = (float)(1.0 / sqrt((double)D));
#ifdef DECODE_AVX512
    const bool wide = D % 16 == 0 && __builtin_cpu_supports("avx512f");
#else
    const bool wide = false;
#endif
    // Work items: up to two query heads of one kv head (h0, h0 + 1), which read its rows once.
#pragma omp parallel for schedule(static) if ((int64_t)NH * T * D >= CPU_PAR_MIN)
    for (int item = 0; item < NKV * pairs; item++) {
        const int kvh = item / pairs, h0 = kvh * rep + item % pairs * 2;
        const int n = rep - (h0 - kvh * rep) < 2 ? 1 : 2;
        const float *kh = k + (size_t)kvh * D, *vh = v + (size_t)kvh * D;
        float *s = scratch + (size_t)h0 * T, *o = out + (size_t)h0 * D;
        if (!wide) {
            for (int g = 0; g < n; g++)
                head_plain(o + (size_t)g * D, s + (size_t)g * T, q + (size_t)(h0 + g) * D, kh, vh,
                           T, D, ldk, scale);
            continue;
        }
#ifdef DECODE_AVX512
        qk_rows_avx512(s, q + (size_t)h0 * D, n, kh, T, D, ldk, scale);
        float inv[2];
        for (int g = 0; g < n; g++) inv[g] = softmax_row(s + (size_t)g * T, T);
        pv_rows_avx512(o, s, inv, n, vh, T, D, ldk);
#endif
    }
}
