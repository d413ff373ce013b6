// attention_decode.c's vector kernels for one instruction set; that file includes this once per
// set (AVX-512, AVX2 with FMA), after defining:
//   WIDE(name)             the set's suffix on each function's name
//   WIDE_TARGET            the kernels' target attribute; WIDE_DP_TARGET the scores' (which, with
//                          V_DP, also needs AVX512-BF16)
//   VF, VW                 the fp32 vector type and its lanes
//   VB                     how many vectors of outputs a head keeps in registers in the values pass
//   V_ZERO() V_SET1(x) V_LOAD(p) V_STORE(p, x) V_FMA(a, b, c) V_MUL(a, b)
//   V_LOAD_CACHE2(p, i, bf16, lo, hi)  2 VW cache values from element i on, widened to fp32 into
//                          lo and hi, in the set's order: a bf16 cache may come in an order that
//                          widens cheaper (AVX2's load8x2), an fp32 one comes in element order
//   V_STORE2(p, lo, hi, bf16)  stores lo and hi of that order back in element order
//   V_SUM(r)               lane x: the sum of r[x]'s lanes, for the VW vectors r[0 .. VW)
//   PACED                  how a row's lines are fetched (prefetch_lines): 1, Zen 3's plan: a
//                          little at each step of its scores, for either cache; 0, Zen 4's: all
//                          before its first step, for a bf16 cache only
//   V_DP(r, q, k)          optional: r plus the products of VW bf16 pairs of q and k (VDPBF16PS)
// and INLINE and UNROLL. It undefines them all at its end.

// Whether the set's kernels take these heads: NH a multiple of VW, rep dividing VW (a group of VW
// heads reads whole kv heads), D whole steps of the scores (2 VW elements as bf16 pairs).
static bool WIDE(fits)(int NH, int rep, int D) {
    return D % (2 * VW) == 0 && NH % VW == 0 && VW % rep == 0;
}

// Scores of positions [j0, j1), row by row, VW heads at a time: lane x of a group's sums is head
// h0 + x. rep (= R, a constant) divides VW, so a group reads VW / R kv heads, and each load of a
// key's elements serves R heads; q comes from its copy qp, laid out [D / W][NH][W] for W = 2 VW
// elements a step (pack_q, in V_LOAD_CACHE2's order), so a group's q loads lie at fixed offsets.
// dp: q and k as bf16 pairs, V_DP (products exact, sums in fp32); else two FMAs a step on the
// cache widened to fp32.
INLINE WIDE_DP_TARGET void WIDE(scores_rows)(const dec_call *a, int j0, int j1, const bool bf16,
                                             const bool dp, const int R) {
    const char *k = a->k;
    const size_t esize = bf16 ? 2 : 4, row_bytes = a->ldk * esize, D = (size_t)a->D;
    const size_t W = 2 * VW;
    const int NH = a->NH;
    const VF scale = V_SET1(a->scale);
    // A row's prefetches: its 64-byte lines, `per` at each step of the scores (the last steps
    // may have none left)
    const size_t steps = (size_t)(NH / VW) * (D / W), lines = (row_bytes + 63) / 64,
                 per = PACED ? (lines + steps - 1) / steps : lines;
    for (int j = j0; j < j1; j++) {
        const char *krow = k + (size_t)j * row_bytes, *vrow = (const char *)a->v + (krow - k);
        const char *kahead = j + DEC_AHEAD < a->T ? krow + DEC_AHEAD * row_bytes : NULL;
        size_t step = 0;
        for (int h0 = 0; h0 < NH; h0 += VW) {
            const char *kg = krow + (size_t)(h0 / R) * D * esize;
            VF r[VW];
            UNROLL
            for (int x = 0; x < VW; x++) r[x] = V_ZERO();
            for (size_t i = 0; i < D; i += W) {
                if (bf16 || PACED) prefetch_lines(kahead, vrow, step * per, per, lines, PACED);
                step++;
                const float *qi = a->qp + (dp ? i / 2 : i) * NH +
                                  (size_t)h0 * (dp ? VW : W); // a head: VW floats, or W
                // lane x reads kv head x / R: unrolled with R constant, the R loads of one
                // key's elements are one load
                UNROLL
                for (int x = 0; x < VW; x++) {
                    const size_t at = (size_t)(x / R) * D + i;
#ifdef V_DP
                    if (dp) {
                        r[x] = V_DP(r[x], qi + x * VW, (const uint16_t *)kg + at);
                        continue;
                    }
#endif
                    VF lo, hi;
                    V_LOAD_CACHE2(kg, at, bf16, lo, hi);
                    r[x] = V_FMA(V_LOAD(qi + x * W), lo, r[x]);
                    r[x] = V_FMA(V_LOAD(qi + x * W + VW), hi, r[x]);
                }
            }
            V_STORE(a->s + (size_t)j * NH + h0, V_MUL(V_SUM(r), scale));
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
#undef PACED
#undef V_DP
