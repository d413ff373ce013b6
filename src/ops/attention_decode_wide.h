// attention_decode.c's vector kernels for one instruction set; that file includes this once per
// set (AVX-512, AVX2 with FMA), after defining:
//   WIDE(name)             the set's suffix on each function's name
//   WIDE_TARGET            the kernels' target attribute; WIDE_DP_TARGET the scores' (which, with
//                          V_DP, also needs AVX512-BF16)
//   VF, VW                 the fp32 vector type and its lanes
//   VB                     with PACED 0: how many vectors of outputs values_rows keeps per head
//   V_ZERO() V_SET1(x) V_LOAD(p) V_STORE(p, x) V_FMA(a, b, c) V_MUL(a, b)
//   V_LOAD_CACHE2(p, i, bf16, lo, hi)  2 VW cache values from element i on, widened to fp32 into
//                          lo and hi, in the set's order: a bf16 cache may come in an order that
//                          widens cheaper (AVX2's load8x2), an fp32 one comes in element order
//   V_STORE2(p, lo, hi, bf16)  stores lo and hi of that order back in element order
//   V_SUM(r)               lane x: the sum of r[x]'s lanes, for the VW vectors r[0 .. VW)
//   SROWS                  how many rows a pass of the scores takes (scores_rows)
//   PACED                  how the cache is fetched: 1, Zen 3's plan: each row's key prefetches
//                          spread over the steps of its scores, either cache, and the values
//                          read in their own pass, as they lie (values_stream); 0, Zen 4's: a
//                          bf16 row's keys and values prefetched before its first step, then
//                          the p·v pass per pair of heads (values_rows)
//   V_DP(r, q, k)          optional: r plus the products of VW bf16 pairs of q and k (VDPBF16PS)
// and INLINE and UNROLL. It undefines them all at its end.

// Whether the set's kernels take these heads: NH a multiple of VW, rep dividing VW (a group of VW
// heads reads whole kv heads), D whole steps of the scores (2 VW elements as bf16 pairs).
static bool WIDE(fits)(int NH, int rep, int D) {
    return D % (2 * VW) == 0 && NH % VW == 0 && VW % rep == 0;
}

// Scores of positions [j0, j1), S rows at a time, G = VW / S heads at a time: lane x of a group's
// sums is head h0 + x % G of row j + x / G. rep (= R, a constant) divides G, so a group reads
// G / R kv heads of each row, and each load of a key's elements serves R heads; q comes from its
// copy qp, laid out [D / W][NH][W] for W = 2 VW elements a step (pack_q, in V_LOAD_CACHE2's
// order), so a group's q loads lie at fixed offsets, each serving S rows. S = SROWS where R
// divides VW / SROWS, else 1. Each (row, head) sums the same products in the same order, and
// V_SUM adds each vector's lanes by the same tree, whatever S. dp: q and k as bf16 pairs, V_DP
// (products exact, sums in fp32); else two FMAs a step on the cache widened to fp32.
INLINE WIDE_DP_TARGET void WIDE(scores_rows)(const dec_call *a, int j0, int j1, const bool bf16,
                                             const bool dp, const int R) {
    const int S = (VW / SROWS) % R == 0 ? SROWS : 1, G = VW / S;
    const char *k = a->k;
    const size_t esize = bf16 ? 2 : 4, row_bytes = a->ldk * esize, D = (size_t)a->D;
    const size_t W = 2 * VW;
    const int NH = a->NH;
    const VF scale = V_SET1(a->scale);
    const size_t steps = (size_t)(NH / G) * (D / W);
    for (int j = j0; j < j1; j += S) {
        const int rows = j1 - j < S ? j1 - j : S; // the last of an odd count: its row twice
        const char *krow = k + (size_t)j * row_bytes;
        const char *kahead = j + DEC_AHEAD < a->T ? krow + DEC_AHEAD * row_bytes : NULL;
        const char *vrow = PACED ? NULL : (const char *)a->v + (krow - k); // for values_rows
        const size_t next = rows > 1 ? row_bytes : 0;
        // The rows' prefetches: their 64-byte lines, `per` at each step of the scores (the last
        // steps may have none left)
        const size_t lines = (rows * row_bytes + 63) / 64,
                     per = PACED ? (lines + steps - 1) / steps : lines;
        size_t step = 0;
        for (int h0 = 0; h0 < NH; h0 += G) {
            const char *kg = krow + (size_t)(h0 / R) * D * esize;
            VF r[VW];
            UNROLL
            for (int x = 0; x < VW; x++) r[x] = V_ZERO();
            for (size_t i = 0; i < D; i += W) {
                if (bf16 || PACED) prefetch_lines(kahead, vrow, step * per, per, lines);
                step++;
                const float *qi = a->qp + (dp ? i / 2 : i) * NH +
                                  (size_t)h0 * (dp ? VW : W); // a head: VW floats, or W
                // lane x reads kv head x % G / R of row x / G: unrolled with R constant, the R
                // loads of one key's elements are one load
                UNROLL
                for (int x = 0; x < VW; x++) {
                    const size_t at = (size_t)(x % G / R) * D + i;
                    const char *kx = kg + (size_t)(x / G) * next;
                    const float *qx = qi + (size_t)(x % G) * (dp ? VW : W);
#ifdef V_DP
                    if (dp) {
                        r[x] = V_DP(r[x], qx, (const uint16_t *)kx + at);
                        continue;
                    }
#endif
                    VF lo, hi;
                    V_LOAD_CACHE2(kx, at, bf16, lo, hi);
                    r[x] = V_FMA(V_LOAD(qx), lo, r[x]);
                    r[x] = V_FMA(V_LOAD(qx + VW), hi, r[x]);
                }
            }
            float *sj = a->s + (size_t)j * NH + h0;
            if (S == 1) {
                V_STORE(sj, V_MUL(V_SUM(r), scale));
                continue;
            }
            float sums[VW];
            V_STORE(sums, V_MUL(V_SUM(r), scale));
            for (int row = 0; row < rows; row++)
                memcpy(sj + (size_t)row * NH, sums + row * G, (size_t)G * sizeof *sums);
        }
    }
}

#define SCORES_REP(R)                                                                              \
    case R:                                                                                        \
        if (a->dp)                                                                                 \
            WIDE(scores_rows)(a, j0, j1, true, true, R);                                           \
        else if (a->bf16)                                                                          \
            WIDE(scores_rows)(a, j0, j1, true, false, R);                                          \
        else                                                                                       \
            WIDE(scores_rows)(a, j0, j1, false, false, R);                                         \
        return
static WIDE_DP_TARGET void WIDE(scores)(const dec_call *a, int j0, int j1) {
    switch (a->rep) {
        SCORES_REP(1);
        SCORES_REP(2);
        SCORES_REP(4);
        SCORES_REP(8);
#if VW >= 16
        SCORES_REP(16);
#endif
    }
}
#undef SCORES_REP

#if PACED
// values_stream's step for query head h and, if pair, h + 1 (both of kv head g): rows [j, j +
// rows) into their outputs o0 and o1, each v row loaded once for both heads.
INLINE WIDE_TARGET void WIDE(values_stream_heads)(const dec_call *a, float *o0, float *o1, int h,
                                                  int g, int j, int rows, const bool pair,
                                                  const bool bf16) {
    const size_t ldk = a->ldk, NH = (size_t)a->NH, D = (size_t)a->D;
    const float *p = a->s + (size_t)j * NH + h;
    VF w0[DEC_VROWS], w1[DEC_VROWS];
    UNROLL
    for (int r = 0; r < DEC_VROWS; r++)
        w0[r] = V_SET1(r < rows ? p[r * NH] : 0.0f),
        w1[r] = V_SET1(pair && r < rows ? p[r * NH + 1] : 0.0f);
    for (size_t i = 0; i < D; i += 2 * VW) {
        VF a0 = V_LOAD(o0 + i), b0 = V_LOAD(o0 + i + VW), a1 = V_ZERO(), b1 = V_ZERO();
        if (pair) a1 = V_LOAD(o1 + i), b1 = V_LOAD(o1 + i + VW);
        UNROLL
        for (int r = 0; r < DEC_VROWS; r++)
            if (r < rows) {
                VF lo, hi;
                V_LOAD_CACHE2(a->v, (size_t)(j + r) * ldk + (size_t)g * D + i, bf16, lo, hi);
                a0 = V_FMA(w0[r], lo, a0), b0 = V_FMA(w0[r], hi, b0);
                if (pair) a1 = V_FMA(w1[r], lo, a1), b1 = V_FMA(w1[r], hi, b1);
            }
        V_STORE(o0 + i, a0), V_STORE(o0 + i + VW, b0);
        if (pair) V_STORE(o1 + i, a1), V_STORE(o1 + i + VW, b1);
    }
}

// The products with v of positions [j0, j1) into o (every head's D outputs), the values read
// as they lie, DEC_VROWS rows at a time: o is read and written in L1 once a step (in
// V_LOAD_CACHE2's order, put back in element order at the end), and each (head, output) sums
// p_j v_j over j in order, as values_rows does, so the bits are the same. The rows DEC_AHEAD
// positions on are prefetched into L1, a kv head's share of their lines at a time.
INLINE WIDE_TARGET void WIDE(values_stream_rows)(const dec_call *a, float *o, int j0, int j1,
                                                 const bool bf16) {
    const size_t ldk = a->ldk, NH = (size_t)a->NH, D = (size_t)a->D, esize = bf16 ? 2 : 4;
    const int rep = a->rep, NKV = a->NH / a->rep;
    memset(o, 0, NH * D * sizeof *o);
    for (int j = j0; j < j1; j += DEC_VROWS) {
        const int rows = j1 - j < DEC_VROWS ? j1 - j : DEC_VROWS;
        const char *ahead = j + DEC_AHEAD + rows <= a->T
                                ? (const char *)a->v + ((size_t)j + DEC_AHEAD) * ldk * esize
                                : NULL;
        const size_t lines = ((size_t)rows * ldk * esize + 63) / 64, per = (lines + NKV - 1) / NKV;
        for (int g = 0; g < NKV; g++) {
            for (size_t line = g * per; ahead && line < (g + 1) * per && line < lines; line++)
                __asm__ volatile("prefetcht0 %0" : : "m"(ahead[64 * line]));
            for (int h = g * rep; h < (g + 1) * rep; h += 2) { // the kv head's heads in pairs
                float *o0 = o + (size_t)h * D;
                if (h + 1 < (g + 1) * rep)
                    WIDE(values_stream_heads)(a, o0, o0 + D, h, g, j, rows, true, bf16);
                else
                    WIDE(values_stream_heads)(a, o0, NULL, h, g, j, rows, false, bf16);
            }
        }
    }
    for (size_t i = 0; bf16 && i < NH * D; i += 2 * VW) {
        const VF lo = V_LOAD(o + i), hi = V_LOAD(o + i + VW);
        V_STORE2(o + i, lo, hi, true);
    }
}

static WIDE_TARGET void WIDE(values_stream)(const dec_call *a, float *o, int j0, int j1) {
    if (a->bf16)
        WIDE(values_stream_rows)(a, o, j0, j1, true);
    else
        WIDE(values_stream_rows)(a, o, j0, j1, false);
}
#else
// o of query heads h and h + 1 (n = 1 or 2, one kv head) over positions [j0, j1): VB VW outputs at
// a time held in registers (in V_LOAD_CACHE2's order until stored), each v row loaded once for
// both heads.
INLINE WIDE_TARGET void WIDE(values_rows)(const dec_call *a, float *o, size_t ostride, int h, int n,
                                          int j0, int j1, const bool bf16) {
    const void *v = a->v;
    const size_t ldk = a->ldk, voff = (size_t)(h / a->rep) * a->D, NH = (size_t)a->NH;
    const float *p0 = a->s + h, *p1 = p0 + (n > 1 ? 1 : 0);
    for (int i0 = 0; i0 < a->D; i0 += VB * VW) {
        const int nv = (a->D - i0 < VB * VW ? a->D - i0 : VB * VW) / VW;
        VF acc0[VB], acc1[VB];
        UNROLL
        for (int c = 0; c < VB; c++) acc0[c] = acc1[c] = V_ZERO();
        for (int j = j0; j < j1; j++) {
            const VF w0 = V_SET1(p0[j * NH]), w1 = V_SET1(p1[j * NH]);
            const size_t vr = (size_t)j * ldk + voff + i0;
            UNROLL
            for (int c = 0; c < VB; c += 2)
                if (c < nv) { // nv is even: D is whole steps of 2 VW
                    VF lo, hi;
                    V_LOAD_CACHE2(v, vr + VW * c, bf16, lo, hi);
                    acc0[c] = V_FMA(w0, lo, acc0[c]);
                    acc0[c + 1] = V_FMA(w0, hi, acc0[c + 1]);
                    acc1[c] = V_FMA(w1, lo, acc1[c]);
                    acc1[c + 1] = V_FMA(w1, hi, acc1[c + 1]);
                }
        }
        for (int c = 0; c < nv; c += 2) {
            V_STORE2(o + i0 + VW * c, acc0[c], acc0[c + 1], bf16);
            if (n > 1) V_STORE2(o + ostride + i0 + VW * c, acc1[c], acc1[c + 1], bf16);
        }
    }
}

static WIDE_TARGET void WIDE(values)(const dec_call *a, float *o, size_t ostride, int h, int n,
                                     int j0, int j1) {
    if (a->bf16)
        WIDE(values_rows)(a, o, ostride, h, n, j0, j1, true);
    else
        WIDE(values_rows)(a, o, ostride, h, n, j0, j1, false);
}
#endif

#undef WIDE
#undef WIDE_TARGET
#undef WIDE_DP_TARGET
#undef VF
#undef VW
#undef VB
#undef V_ZERO
#undef V_SET1
#undef V_LOAD
#undef V_STORE
#undef V_FMA
#undef V_MUL
#undef V_LOAD_CACHE2
#undef V_STORE2
#undef V_SUM
#undef SROWS
#undef PACED
#undef V_DP
