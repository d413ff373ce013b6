// Flash-style causal GQA attention: the math and layouts of attention.c without the (T,T)
// probabilities. Per (batch b, head h), with Q, K, V the head views (leading dimension NH*D or
// NKV*D) and tiles of FLASH_ROWS queries by flash_cols(D) keys:
//   forward:  S = scale Q K^T per tile, online softmax (running row max m and sum l, the output
//             rescaled by exp(m_old - m_new) when the max grows), O = (sum_j p_j v_j) / l; only
//             lse = m + log l (B,NH,T) is saved.
//   backward: each tile's P = exp(S - lse) is recomputed; with Di = rowsum(dO_i * O_i)
//             (= rowsum(P_i * dP_i)) and dP = dO V^T:
//             dS = scale P (dP - Di),  dQ = dS K,  dK = sum_h dS^T Q,  dV = sum_h P^T dO
//             over the query heads h of a kv group (the scale is folded into S and dS).
// Key tiles past a block's last query are skipped; the diagonal tiles are masked inside.
//
// Threads: one OpenMP loop over independent work items, each running its tiles' products as
// OpenBLAS sgemms on the calling thread. Each product has M*N*K <= FLASH_GEMM_MAX, and OpenBLAS
// runs a gemm that small single-threaded (interface/gemm.c: at most 65536 *
// GEMM_MULTITHREAD_THRESHOLD, 4 by default; the SkylakeX/Cooperlake small-matrix kernels go to
// 1e6; an OpenMP build of OpenBLAS runs single-threaded inside a parallel region anyway), so
// the pthreads build's pool is never woken from inside the team. (Large serial sgemms with an
// OpenMP loop per tile for the row work, attention.c's layout, measured 3-25x slower on 2
// cores, the more the busier the machine: the two thread pools spin against each other at
// every tile.)
// Forward items are (b, h, query block), each writing its own rows of out and lse. In the
// backward dQ is summed over key blocks and dK, dV over query blocks and heads, so: either one
// item per (b, kv head) that does all of its group's tiles (5 products per tile), or, when
// that leaves too much of the team idle, two loops that recompute the tiles, items (b, kv
// head, key block) owning rows of dK and dV and items (b, h, query block) rows of dQ (7
// products per tile). Both run the same tile products and sum every output element in the
// same order (heads, then query blocks, for dK and dV; key blocks for dQ), so they give the same
// bits: no atomics, and the results depend neither on the schedule nor on the thread count.
//
// bf16 mixed precision (cpu_attention_flash_bf16_*): the caller gives q, k, v and dO holding
// bf16 values, and the tiles round where torch's autocast rounds HF's eager attention: the
// scores S = bf16(bf16(Q K^T) * bf16(scale)), P to bf16 before P V (the forward's unnormalised
// exp(S - m), torch's normalised P: the same relative rounding), dP = bf16(dO V^T), and dS =
// bf16(bf16(P (dP - Di)) * bf16(scale)), with P to bf16 for dV. The softmax, its statistics and
// every accumulation stay fp32.
//
// state: lse (B,NH,T). scratch: Di (B,NH,T). The tiles live on each thread's stack (32 KiB).
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "ops/bf16_round.h"
#include "ops/ops_cpu.h"
#include "ops/vec_math.h"

// Query rows (and at most keys) per tile: 64 x 64 tiles keep every product of a D = 64 head at
// M*N*K = 2^18 and the diagonal's masked half (the only wasted work) small (~3% at T = 2048).
#define FLASH_ROWS 64
// The largest M*N*K of one tile product: OpenBLAS's single-thread limit (see above).
#define FLASH_GEMM_MAX (1 << 18)
// Below this many scores (B*NH*T*T/2) the whole op runs on one thread: a team costs more.
#define FLASH_PAR_MIN 32768

static int imin(int a, int b) {
    return a < b ? a : b;
}

// Keys per tile: FLASH_ROWS, fewer for heads wider than 64 so products stay <= FLASH_GEMM_MAX
// (at least 8, so absurdly wide heads still make progress, if on OpenBLAS's threads).
static int flash_cols(int D) {
    const int c = FLASH_GEMM_MAX / (FLASH_ROWS * D);
    return c > FLASH_ROWS ? FLASH_ROWS : c < 8 ? 8 : c;
}

size_t cpu_attention_flash_state_floats(int B, int T, int NH, int NKV, int D) {
    (void)NKV, (void)D;
    return B > 0 && T > 0 && NH > 0 ? (size_t)B * NH * T : 0; // lse
}

size_t cpu_attention_flash_scratch_floats(int B, int T, int NH, int NKV, int D) {
    (void)NKV, (void)D;
    return B > 0 && T > 0 && NH > 0 ? (size_t)B * NH * T : 0; // Di
}

// Query t sees keys c0 .. c0+n-1 of a tile starting at key c0 with nc keys.
static int valid_keys(int t, int c0, int nc) {
    const int n = t - c0 + 1;
    return n < 0 ? 0 : n > nc ? nc : n;
}

// The row work below (the exps) is a quarter of the op's time at SSE2 width: CPU_SIMD_CLONES.

// Max and sum of a row in FLASH_LANES partial lanes that GCC turns into one vector (an
// `omp simd` reduction leaves a long scalar epilogue per row, a third of the softmax's time).
#define FLASH_LANES 16

static inline float row_max(const float *x, int n, float init) {
    float lane[FLASH_LANES];
    for (int l = 0; l < FLASH_LANES; l++) lane[l] = init;
    int j = 0;
    for (; j + FLASH_LANES <= n; j += FLASH_LANES)
        for (int l = 0; l < FLASH_LANES; l++) lane[l] = x[j + l] > lane[l] ? x[j + l] : lane[l];
    for (; j < n; j++) lane[0] = x[j] > lane[0] ? x[j] : lane[0];
    float m = lane[0];
    for (int l = 1; l < FLASH_LANES; l++) m = lane[l] > m ? lane[l] : m;
    return m;
}

static inline float row_sum(const float *x, int n) {
    float lane[FLASH_LANES] = {0};
    int j = 0;
    for (; j + FLASH_LANES <= n; j += FLASH_LANES)
        for (int l = 0; l < FLASH_LANES; l++) lane[l] += x[j + l];
    for (; j < n; j++) lane[0] += x[j];
    float sum = 0.0f;
    for (int l = 0; l < FLASH_LANES; l++) sum += lane[l];
    return sum;
}

// The keys [j0, j1) of a tile (nc keys from c0) that query t sees: up to itself (valid_keys),
// and, with a document mask (lo: the pair's first key the row sees, NULL: key 0), from lo.
typedef struct key_span {
    int j0, j1;
} key_span;

static inline key_span tile_keys(int t, int c0, int nc, const int32_t *lo, int i) {
    const int j1 = valid_keys(t, c0, nc);
    int j0 = lo ? lo[i] - c0 : 0;
    j0 = j0 < 0 ? 0 : j0 > j1 ? j1 : j0;
    return (key_span){j0, j1};
}

// Online softmax over a score tile s (nr queries from r0, nc keys from c0, leading dimension
// ldt; lo as tile_keys'): s becomes p = exp(s - m_new), 0 where masked; the running max m and sum
// l advance, and the output rows o (leading dimension ldo) are rescaled for the new max unless
// this is the block's first tile (whose P V product overwrites them). A row that has seen no key
// yet keeps m = -inf and l = 0.
CPU_SIMD_CLONES
static void softmax_tile(float *s, int ldt, int nr, int nc, int r0, int c0, const int32_t *lo,
                         int first, float *m, float *l, float *o, int ldo, int D) {
    for (int i = 0; i < nr; i++) {
        float *si = s + (size_t)i * ldt;
        const key_span k = tile_keys(r0 + i, c0, nc, lo, i);
        const float mx = row_max(si + k.j0, k.j1 - k.j0, first ? -INFINITY : m[i]);
        for (int j = 0; j < k.j0; j++) si[j] = 0.0f;
#pragma omp simd
        for (int j = k.j0; j < k.j1; j++) si[j] = vexp(si[j] - mx);
        const float sum = row_sum(si + k.j0, k.j1 - k.j0);
        for (int j = k.j1; j < nc; j++) si[j] = 0.0f;
        if (first) {
            l[i] = sum;
        } else if (k.j1 > k.j0) {
            const float alpha = expf(m[i] - mx);
            float *oi = o + (size_t)i * ldo;
            l[i] = l[i] * alpha + sum;
#pragma omp simd
            for (int d = 0; d < D; d++) oi[d] *= alpha;
        }
        m[i] = mx;
    }
}

// bf16: a tile's values rounded to bf16, times `scale` and rounded again when scale != 1.
static void round_tile(float *s, int ldt, int nr, int nc, float scale) {
    for (int i = 0; i < nr; i++) bf16_round_scaled(s + (size_t)i * ldt, (size_t)nc, scale);
}

// Backward row work on a tile (layout and lo as above): the scores s become P = exp(s - lse)
// and dP in ds becomes dS = scale P (dP - Di); both 0 where masked, so the products read whole
// tiles. bf16: dS and the P that dV reads rounded as the header says.
CPU_SIMD_CLONES
static void grad_tile(float *s, float *ds, int ldt, int nr, int nc, int r0, int c0,
                      const int32_t *lo, const float *lse, const float *di, float scale, int bf16) {
    for (int i = 0; i < nr; i++) {
        float *si = s + (size_t)i * ldt, *dsi = ds + (size_t)i * ldt;
        const key_span k = tile_keys(r0 + i, c0, nc, lo, i);
        const float li = lse[i], dii = di[i];
        for (int j = 0; j < k.j0; j++) si[j] = dsi[j] = 0.0f;
        if (bf16) {
#pragma omp simd
            for (int j = k.j0; j < k.j1; j++) {
                const float p = vexp(si[j] - li);
                si[j] = bf16_rounded(p);
                dsi[j] = bf16_rounded(bf16_rounded(p * (dsi[j] - dii)) * scale);
            }
        } else {
#pragma omp simd
            for (int j = k.j0; j < k.j1; j++) {
                const float p = vexp(si[j] - li);
                si[j] = p;
                dsi[j] = scale * (p * (dsi[j] - dii));
            }
        }
        for (int j = k.j1; j < nc; j++) si[j] = dsi[j] = 0.0f;
    }
}

typedef struct flash_dims {
    int B, T, NH, NKV, D, rep, ldq, ldk, nr, nc, nqb, nkb;
    float scale;
    int bf16; // round as bf16 mixed precision does (see the header)
} flash_dims;

static flash_dims flash_dims_of(int B, int T, int NH, int NKV, int D, int bf16) {
    const int nr = FLASH_ROWS, nc = flash_cols(D);
    return (flash_dims){.bf16 = bf16,
                        .B = B,
                        .T = T,
                        .NH = NH,
                        .NKV = NKV,
                        .D = D,
                        .rep = NH / NKV,
                        .ldq = NH * D,
                        .ldk = NKV * D,
                        .nr = nr,
                        .nc = nc,
                        .nqb = (T + nr - 1) / nr,
                        .nkb = (T + nc - 1) / nc,
                        // bf16: torch multiplies the bf16 scores by the scale rounded to bf16
                        .scale = bf16 ? bf16_rounded((float)(1.0 / sqrt((double)D)))
                                      : (float)(1.0 / sqrt((double)D))};
}

// A pair's document mask (block-causal attention under context parallelism): query i sees only
// the keys at or after its document's start, doc[i], in the coordinates where the pair's key 0
// is at k0 (so its first key in the pair is doc[i] - k0). NULL: no mask.
typedef struct pair_docs {
    const int32_t *doc;
    int k0;
} pair_docs;

static void pair_fwd_block(const flash_dims *f, float *out, float *lse_all, const float *q,
                           const float *k, const float *v, int Tk, bool causal,
                           const pair_docs *docs, int h, int qb);

// Forward of query block qb of head h in batch b: its rows of out and lse (the causal pair of
// the batch's sequence with itself).
static void fwd_block(const flash_dims *f, float *out, float *lse_all, const float *q,
                      const float *k, const float *v, int b, int h, int qb) {
    const size_t row = (size_t)b * f->T;
    pair_fwd_block(f, out + row * f->ldq, lse_all + row * f->NH, q + row * f->ldq,
                   k + row * f->ldk, v + row * f->ldk, f->T, true, NULL, h, qb);
}

static void flash_forward(float *out, float *state, const float *q, const float *k, const float *v,
                          int B, int T, int NH, int NKV, int D, int bf16) {
    if (B <= 0 || T <= 0 || NH <= 0) return;
    const flash_dims f = flash_dims_of(B, T, NH, NKV, D, bf16);
    const int bh = B * NH, items = bh * f.nqb;
    // Longest items (last query blocks) first, handed out one at a time: balanced, and the
    // results do not depend on who runs what.
#pragma omp parallel for schedule(dynamic, 1) if ((double)bh * T * T >= 2.0 * FLASH_PAR_MIN)
    for (int it = 0; it < items; it++)
        fwd_block(&f, out, state, q, k, v, it % bh / NH, it % NH, f.nqb - 1 - it / bh);
}

void cpu_attention_flash_forward(float *out, float *state, const float *q, const float *k,
                                 const float *v, int B, int T, int NH, int NKV, int D) {
    flash_forward(out, state, q, k, v, B, T, NH, NKV, D, 0);
}

void cpu_attention_flash_bf16_forward(float *out, float *state, const float *q, const float *k,
                                      const float *v, int B, int T, int NH, int NKV, int D) {
    flash_forward(out, state, q, k, v, B, T, NH, NKV, D, 1);
}

typedef struct flash_bwd {
    flash_dims f;
    float *dq, *dk, *dv;
    const float *di, *dout, *lse, *q, *k, *v;
} flash_bwd;

// One backward tile: query block qb of head h against key block kb (batch b). Recomputes P
// and dS, then dQ (+)= dS K when want_dq, and dK += dS^T Q, dV += P^T dO when want_dkv.
static void bwd_tile(const flash_bwd *w, int b, int h, int qb, int kb, int want_dq, int want_dkv) {
    float s[FLASH_ROWS * FLASH_ROWS], ds[FLASH_ROWS * FLASH_ROWS];
    const flash_dims *f = &w->f;
    const int T = f->T, D = f->D, ldq = f->ldq, ldk = f->ldk, ldt = f->nc;
    const int r0 = qb * f->nr, nr = imin(r0 + f->nr, T) - r0;
    const int c0 = kb * f->nc, nc = imin(c0 + f->nc, r0 + nr) - c0; // keys up to the last query
    const size_t qoff = ((size_t)b * T + r0) * ldq + (size_t)h * D;
    const size_t kvoff = ((size_t)b * T + c0) * ldk + (size_t)(h / f->rep) * D;
    const size_t roff = ((size_t)b * f->NH + h) * T + r0;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nr, nc, D, f->bf16 ? 1.0f : f->scale,
                w->q + qoff, ldq, w->k + kvoff, ldk, 0.0f, s, ldt);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nr, nc, D, 1.0f, w->dout + qoff, ldq,
                w->v + kvoff, ldk, 0.0f, ds, ldt);
    if (f->bf16) round_tile(s, ldt, nr, nc, f->scale), round_tile(ds, ldt, nr, nc, 1.0f);
    grad_tile(s, ds, ldt, nr, nc, r0, c0, NULL, w->lse + roff, w->di + roff, f->scale, f->bf16);
    if (want_dq)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nr, D, nc, 1.0f, ds, ldt,
                    w->k + kvoff, ldk, kb == 0 ? 0.0f : 1.0f, w->dq + qoff, ldq);
    if (want_dkv) {
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nc, D, nr, 1.0f, ds, ldt, w->q + qoff,
                    ldq, 1.0f, w->dk + kvoff, ldk);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nc, D, nr, 1.0f, s, ldt,
                    w->dout + qoff, ldq, 1.0f, w->dv + kvoff, ldk);
    }
}

// Zeroes n rows of kv head g (batch b) from row t0 in dk and dv.
static void zero_kv_rows(const flash_bwd *w, int b, int g, int t0, int n) {
    for (int t = t0; t < t0 + n; t++) {
        const size_t off = ((size_t)b * w->f.T + t) * w->f.ldk + (size_t)g * w->f.D;
        memset(w->dk + off, 0, (size_t)w->f.D * sizeof(float));
        memset(w->dv + off, 0, (size_t)w->f.D * sizeof(float));
    }
}

// Single pass, one item per kv group: all of its dK, dV and its heads' dQ.
static void bwd_group(const flash_bwd *w, int b, int g) {
    const flash_dims *f = &w->f;
    zero_kv_rows(w, b, g, 0, f->T);
    for (int h = g * f->rep; h < (g + 1) * f->rep; h++)
        for (int qb = 0; qb < f->nqb; qb++)
            for (int kb = 0; kb * f->nc < imin((qb + 1) * f->nr, f->T); kb++)
                bwd_tile(w, b, h, qb, kb, 1, 1);
}

// Two passes. dK, dV rows of key block kb of group g, summed over the group's heads and the
// query blocks that see the keys, in that order.
static void bwd_kv_block(const flash_bwd *w, int b, int g, int kb) {
    const flash_dims *f = &w->f;
    const int c0 = kb * f->nc;
    zero_kv_rows(w, b, g, c0, imin(c0 + f->nc, f->T) - c0);
    for (int h = g * f->rep; h < (g + 1) * f->rep; h++)
        for (int qb = c0 / f->nr; qb < f->nqb; qb++) bwd_tile(w, b, h, qb, kb, 0, 1);
}

// dQ rows of query block qb of head h, summed over its key blocks in order.
static void bwd_q_block(const flash_bwd *w, int b, int h, int qb) {
    const int r1 = imin((qb + 1) * w->f.nr, w->f.T);
    for (int kb = 0; kb * w->f.nc < r1; kb++) bwd_tile(w, b, h, qb, kb, 1, 0);
}

// The single pass does 5 products per tile, the two passes 7 (S, dP and the exps twice) but
// keep any team busy: take the single pass unless its B*NKV items would idle more than a
// quarter of the threads.
static int single_pass(int groups, int threads) {
    const int rounds = (groups + threads - 1) / threads;
    return 4 * groups >= 3 * rounds * threads;
}

static void flash_backward(float *dq, float *dk, float *dv, float *scratch, const float *dout,
                           const float *out, const float *state, const float *q, const float *k,
                           const float *v, int B, int T, int NH, int NKV, int D, int bf16) {
    if (B <= 0 || T <= 0 || NH <= 0) return;
    const flash_bwd w = {
        flash_dims_of(B, T, NH, NKV, D, bf16), dq, dk, dv, scratch, dout, state, q, k, v};
    const flash_dims *f = &w.f;
    const int bh = B * NH, bg = B * NKV, par = (double)bh * T * T >= 2.0 * FLASH_PAR_MIN;
    const int one = single_pass(bg, par ? omp_get_max_threads() : 1);
    const int64_t rows = (int64_t)bh * T;
    float *di_all = scratch;
#pragma omp parallel if (par)
    {
        // Di = rowsum(dO * O) in double (it cancels), stored (B,NH,T) like lse.
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            const int t = (int)(r % T), h = (int)(r / T % NH), b = (int)(r / T / NH);
            const size_t off = ((size_t)b * T + t) * f->ldq + (size_t)h * D;
            double dot = 0.0;
            for (int d = 0; d < D; d++) dot += (double)dout[off + d] * out[off + d];
            di_all[r] = (float)dot;
        }
        if (one) {
#pragma omp for schedule(dynamic, 1)
            for (int it = 0; it < bg; it++) bwd_group(&w, it / NKV, it % NKV);
        } else {
            // Longest first: key blocks ascending, query blocks descending.
#pragma omp for schedule(dynamic, 1) nowait
            for (int it = 0; it < bg * f->nkb; it++)
                bwd_kv_block(&w, it % bg / NKV, it % NKV, it / bg);
#pragma omp for schedule(dynamic, 1)
            for (int it = 0; it < bh * f->nqb; it++)
                bwd_q_block(&w, it % bh / NH, it % NH, f->nqb - 1 - it / bh);
        }
    }
}

void cpu_attention_flash_backward(float *dq, float *dk, float *dv, float *scratch,
                                  const float *dout, const float *out, const float *state,
                                  const float *q, const float *k, const float *v, int B, int T,
                                  int NH, int NKV, int D) {
    flash_backward(dq, dk, dv, scratch, dout, out, state, q, k, v, B, T, NH, NKV, D, 0);
}

void cpu_attention_flash_bf16_backward(float *dq, float *dk, float *dv, float *scratch,
                                       const float *dout, const float *out, const float *state,
                                       const float *q, const float *k, const float *v, int B, int T,
                                       int NH, int NKV, int D) {
    flash_backward(dq, dk, dv, scratch, dout, out, state, q, k, v, B, T, NH, NKV, D, 1);
}

// ---------------------------------------------------------------------------------------------
// Ring attention's pieces (context parallelism, model/qwen3.c): one chunk of Tq queries against
// one chunk of Tk keys, with the tiles and the rounding above. `causal`: the chunks are the same
// positions (Tq == Tk, the diagonal, masked inside its tiles); else every query sees every key
// (a key chunk wholly in the queries' past). q_doc (block-causal): each query's document start
// in the coordinates where key 0 is at k0, so it sees keys from q_doc[i] - k0 on; a row that sees
// none gets out 0 and lse -inf. q, out (Tq, NH*D) and k, v (Tk, NKV*D) rows, as
// the (B,T,...) buffers' rows; lse and di (NH, Tq). The model merges the chunks' outputs by their
// lse (attention_lse_merge) and runs each pair's backward with the merged out and lse, which is
// exactly the whole softmax's (its P = exp(S - lse)).

// The row an unmasked tile's queries pass to the masking helpers: past every key.
#define PAIR_UNMASKED (1 << 28)

static flash_dims pair_dims(int Tq, int Tk, int NH, int NKV, int D, bool bf16) {
    flash_dims f = flash_dims_of(1, Tq, NH, NKV, D, bf16);
    f.nkb = (Tk + f.nc - 1) / f.nc;
    return f;
}

// Keys [0, end) that query block r0..r1 attends to.
// (pair_fwd_block is also the whole-sequence forward's block: fwd_block above.)
static int pair_keys(bool causal, int r1, int Tk) {
    return causal ? r1 : Tk;
}

// Query rows r0..r0+nr's first keys under the mask (lo, in the pair's key coordinates) and the
// start of the first key tile any of them sees (0 without a mask, then lo is NULL).
static int block_docs(const pair_docs *docs, int r0, int nr, int nc, int32_t *lo,
                      const int32_t **lop) {
    *lop = NULL;
    if (!docs) return 0;
    int start = INT32_MAX;
    for (int i = 0; i < nr; i++) {
        lo[i] = docs->doc[r0 + i] - docs->k0;
        start = lo[i] < start ? lo[i] : start;
    }
    *lop = lo;
    return start < 0 ? 0 : start / nc * nc;
}

static void pair_fwd_block(const flash_dims *f, float *out, float *lse_all, const float *q,
                           const float *k, const float *v, int Tk, bool causal,
                           const pair_docs *docs, int h, int qb) {
    float s[FLASH_ROWS * FLASH_ROWS], m[FLASH_ROWS], l[FLASH_ROWS];
    int32_t lo[FLASH_ROWS];
    const int32_t *lop;
    const int D = f->D, ldq = f->ldq, ldk = f->ldk, ldt = f->nc;
    const int r0 = qb * f->nr, r1 = imin(r0 + f->nr, f->T), nr = r1 - r0;
    const int end = pair_keys(causal, r1, Tk), rm = causal ? r0 : PAIR_UNMASKED;
    const int start = block_docs(docs, r0, nr, f->nc, lo, &lop);
    const float *qr = q + (size_t)r0 * ldq + (size_t)h * D;
    const float *kh = k + (size_t)(h / f->rep) * D, *vh = v + (size_t)(h / f->rep) * D;
    float *orow = out + (size_t)r0 * ldq + (size_t)h * D;
    for (int i = 0; i < nr; i++) l[i] = 0.0f, m[i] = -INFINITY; // rows no tile reaches
    for (int c0 = start; c0 < end; c0 += f->nc) {
        const int nc = imin(c0 + f->nc, end) - c0;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nr, nc, D, f->bf16 ? 1.0f : f->scale,
                    qr, ldq, kh + (size_t)c0 * ldk, ldk, 0.0f, s, ldt);
        if (f->bf16) round_tile(s, ldt, nr, nc, f->scale);
        softmax_tile(s, ldt, nr, nc, rm, c0, lop, c0 == start, m, l, orow, ldq, D);
        if (f->bf16) round_tile(s, ldt, nr, nc, 1.0f);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nr, D, nc, 1.0f, s, ldt,
                    vh + (size_t)c0 * ldk, ldk, c0 == start ? 0.0f : 1.0f, orow, ldq);
    }
    float *lse = lse_all + (size_t)h * f->T + r0;
    for (int i = 0; i < nr; i++) {
        float *o = orow + (size_t)i * ldq;
        if (l[i] == 0.0f) { // the mask hides every key of the pair from this row
            memset(o, 0, (size_t)D * sizeof *o);
            lse[i] = -INFINITY;
            continue;
        }
        const float inv = 1.0f / l[i];
#pragma omp simd
        for (int d = 0; d < D; d++) o[d] *= inv;
        lse[i] = m[i] + logf(l[i]);
    }
}

void cpu_attention_pair_forward(float *out, float *lse, const float *q, const float *k,
                                const float *v, int Tq, int Tk, int NH, int NKV, int D,
                                bool causal, const int32_t *q_doc, int k0, bool bf16) {
    if (Tq <= 0 || Tk <= 0 || NH <= 0) return;
    const flash_dims f = pair_dims(Tq, Tk, NH, NKV, D, bf16);
    const pair_docs docs = {q_doc, k0};
    const int items = NH * f.nqb;
#pragma omp parallel for schedule(dynamic, 1) if ((double)NH * Tq * Tk >= FLASH_PAR_MIN)
    for (int it = 0; it < items; it++)
        pair_fwd_block(&f, out, lse, q, k, v, Tk, causal, q_doc ? &docs : NULL, it % NH,
                       f.nqb - 1 - it / NH);
}

typedef struct pair_bwd {
    flash_bwd w;
    int Tk;
    bool causal;
    const pair_docs *docs;
} pair_bwd;

// bwd_tile's products for a pair (T is the queries'; keys from c0 up to the mask or Tk): dQ +=
// dS K when want_dq, dK += dS^T Q and dV += P^T dO when want_dkv. Everything accumulates. A
// tile the document mask hides from every row is skipped.
static void pair_tile(const pair_bwd *p, int h, int qb, int kb, int want_dq, int want_dkv) {
    float s[FLASH_ROWS * FLASH_ROWS], ds[FLASH_ROWS * FLASH_ROWS];
    int32_t lo[FLASH_ROWS];
    const int32_t *lop;
    const flash_bwd *w = &p->w;
    const flash_dims *f = &w->f;
    const int T = f->T, D = f->D, ldq = f->ldq, ldk = f->ldk, ldt = f->nc;
    const int r0 = qb * f->nr, nr = imin(r0 + f->nr, T) - r0;
    const int c0 = kb * f->nc, nc = imin(c0 + f->nc, pair_keys(p->causal, r0 + nr, p->Tk)) - c0;
    if (nc <= 0 || block_docs(p->docs, r0, nr, f->nc, lo, &lop) > c0) return;
    const size_t qoff = (size_t)r0 * ldq + (size_t)h * D;
    const size_t kvoff = (size_t)c0 * ldk + (size_t)(h / f->rep) * D;
    const size_t roff = (size_t)h * T + r0;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nr, nc, D, f->bf16 ? 1.0f : f->scale,
                w->q + qoff, ldq, w->k + kvoff, ldk, 0.0f, s, ldt);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nr, nc, D, 1.0f, w->dout + qoff, ldq,
                w->v + kvoff, ldk, 0.0f, ds, ldt);
    if (f->bf16) round_tile(s, ldt, nr, nc, f->scale), round_tile(ds, ldt, nr, nc, 1.0f);
    grad_tile(s, ds, ldt, nr, nc, p->causal ? r0 : PAIR_UNMASKED, c0, lop, w->lse + roff,
              w->di + roff, f->scale, f->bf16);
    if (want_dq)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nr, D, nc, 1.0f, ds, ldt,
                    w->k + kvoff, ldk, 1.0f, w->dq + qoff, ldq);
    if (want_dkv) {
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nc, D, nr, 1.0f, ds, ldt, w->q + qoff,
                    ldq, 1.0f, w->dk + kvoff, ldk);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nc, D, nr, 1.0f, s, ldt,
                    w->dout + qoff, ldq, 1.0f, w->dv + kvoff, ldk);
    }
}

// The two passes of flash_backward (recomputing the tiles), so that every output element is
// summed in one order whatever the threads: dK, dV rows of key block kb of group g over the
// group's heads, then the query blocks; dQ rows of query block qb of head h over the key blocks.
void cpu_attention_pair_backward(float *dq, float *dk, float *dv, float *di, const float *dout,
                                 const float *out, const float *lse, const float *q,
                                 const float *k, const float *v, int Tq, int Tk, int NH, int NKV,
                                 int D, bool causal, const int32_t *q_doc, int k0, bool bf16) {
    if (Tq <= 0 || Tk <= 0 || NH <= 0) return;
    const pair_docs docs = {q_doc, k0};
    const pair_bwd p = {{pair_dims(Tq, Tk, NH, NKV, D, bf16), dq, dk, dv, di, dout, lse, q, k, v},
                        Tk,
                        causal,
                        q_doc ? &docs : NULL};
    const flash_dims *f = &p.w.f;
    const int par = (double)NH * Tq * Tk >= FLASH_PAR_MIN;
#pragma omp parallel if (par)
    {
#pragma omp for schedule(static)
        for (int64_t r = 0; r < (int64_t)NH * Tq; r++) {
            const int t = (int)(r % Tq), h = (int)(r / Tq);
            const size_t off = (size_t)t * f->ldq + (size_t)h * D;
            double dot = 0.0;
            for (int d = 0; d < D; d++) dot += (double)dout[off + d] * out[off + d];
            di[r] = (float)dot;
        }
#pragma omp for schedule(dynamic, 1) nowait
        for (int it = 0; it < NKV * f->nkb; it++) {
            const int g = it % NKV, kb = it / NKV;
            for (int h = g * f->rep; h < (g + 1) * f->rep; h++)
                for (int qb = causal ? kb * f->nc / f->nr : 0; qb < f->nqb; qb++)
                    pair_tile(&p, h, qb, kb, 0, 1);
        }
#pragma omp for schedule(dynamic, 1)
        for (int it = 0; it < NH * f->nqb; it++) {
            const int h = it % NH, qb = f->nqb - 1 - it / NH;
            for (int kb = 0; kb < f->nkb; kb++) pair_tile(&p, h, qb, kb, 1, 0);
        }
    }
}

// Two chunks' attention of the same queries merged (torchtitan's ring merge, in fp32):
// out -= sigmoid(lse_b - lse) (out - out_b), lse -= logsigmoid(lse - lse_b), per query and head.
// A row with lse = -inf (no key seen yet, out 0) takes out_b and lse_b exactly.
CPU_SIMD_CLONES
void cpu_attention_lse_merge(float *out, float *lse, const float *out_b, const float *lse_b, int T,
                             int NH, int D) {
    const size_t ld = (size_t)NH * D;
#pragma omp parallel for schedule(static) if ((double)T * NH * D >= 1 << 20)
    for (int h = 0; h < NH; h++) {
        for (int t = 0; t < T; t++) {
            const float a = lse[(size_t)h * T + t], b = lse_b[(size_t)h * T + t];
            if (b == -INFINITY) continue; // a chunk the document mask hid wholly: nothing new
            const float w = 1.0f / (1.0f + expf(a - b)); // sigmoid(b - a)
            float *o = out + (size_t)t * ld + (size_t)h * D;
            const float *ob = out_b + (size_t)t * ld + (size_t)h * D;
#pragma omp simd
            for (int d = 0; d < D; d++) o[d] -= w * (o[d] - ob[d]);
            // -logsigmoid(a - b) = log(1 + exp(b - a)), written stably
            lse[(size_t)h * T + t] = a > b ? a + log1pf(expf(b - a)) : b + log1pf(expf(a - b));
        }
    }
}
