// Context parallelism's ring attention (qwen3_cp, qwen3.h): this rank's queries against every
// rank's keys and values, chunk pair by chunk pair, on the table's attention_pair kernels, the
// pairs' outputs merged by their log-sum-exps. Each rank holds two chunks of each sequence
// (headtail): its rows [0, c) are chunk `rank`, [c, 2c) chunk 2P - 1 - rank (c = T/2, P ranks).
// A query chunk attends to a key chunk in its past whole, to its own causally, and skips one in
// its future. The order of every sum (the merges, dQ over the pairs, each owner's dK and dV over
// the ranks) is the same whichever rotate method moved the keys, so both give the same bits.
// Block-causal (the forward had positions): each query also sees only the keys from its
// document's start on (cp_doc: its global index minus its position), so a document that
// crosses chunks, and ranks, is found by its boundaries as one process finds it; a pair whose
// keys its queries' documents all start after contributes nothing (lse -inf, skipped by the
// merge).
#include <string.h>

#include "model/qwen3.h"
#include "model/qwen3_internal.h"

// The global chunk of this rank's half h (0: rows [0, c), 1: [c, 2c)) of a rank's rows.
static int chunk_of(int rank, int P, int h) {
    return h == 0 ? rank : 2 * P - 1 - rank;
}

// n tokens' RoPE rows from token `at` (of the N) on: the table's rows from `from` on.
static void rope_rows(qwen3_model *m, size_t at, size_t from, size_t n) {
    qwen3_acts *s = m->acts;
    const size_t half = (size_t)m->cfg.head_dim / 2, bytes = n * half * sizeof(float);
    m->be->copy(m->be, s->pos_cos + at * half, s->rope_cos + from * half, bytes);
    m->be->copy(m->be, s->pos_sin + at * half, s->rope_sin + from * half, bytes);
}

void qwen3_cp_positions(qwen3_model *m, const int32_t *positions) {
    qwen3_acts *s = m->acts;
    const qwen3_cp *cp = m->cp;
    const int c = m->T / 2;
    if (!positions) {
        if (s->cp_rows == cp->rank && !s->cp_docs) return;
        for (int b = 0; b < m->B; b++)
            for (int h = 0; h < 2; h++)
                rope_rows(m, (size_t)b * m->T + h * c, (size_t)chunk_of(cp->rank, cp->size, h) * c,
                          c);
        s->cp_rows = cp->rank;
        s->cp_docs = false;
        return;
    }
    // Each run of consecutive positions is one copy; a token's document starts `position`
    // tokens before its global index.
    for (int b = 0; b < m->B; b++)
        for (int h = 0; h < 2; h++) {
            const size_t at = (size_t)b * m->T + (size_t)h * c;
            const int32_t *p = positions + at;
            const int g0 = chunk_of(cp->rank, cp->size, h) * c;
            for (int t0 = 0, t1; t0 < c; t0 = t1) {
                for (t1 = t0 + 1; t1 < c && p[t1] == p[t1 - 1] + 1;) t1++;
                rope_rows(m, at + t0, (size_t)p[t0], (size_t)(t1 - t0));
            }
            for (int t = 0; t < c; t++) s->cp_doc_host[at + t] = g0 + t - p[t];
        }
    m->be->write(m->be, s->cp_doc, s->cp_doc_host, (size_t)m->B * m->T * sizeof(int32_t));
    s->cp_rows = cp->rank;
    s->cp_docs = true;
}

int qwen3_cp_check_positions(const qwen3_model *m, const int32_t *positions, int64_t rows,
                             ct_error *err) {
    const qwen3_cp *cp = m->cp;
    const int c = m->T / 2;
    for (int64_t b = 0; b < rows; b++)
        for (int h = 0; h < 2; h++) {
            const int32_t *p = positions + (size_t)b * m->T + (size_t)h * c;
            const int g0 = chunk_of(cp->rank, cp->size, h) * c;
            for (int t = 0; t < c; t++) {
                if (p[t] < 0 || p[t] > g0 + t)
                    return ct_fail(err,
                                   "positions[%lld, %d] (global token %d of the sequence, context "
                                   "parallel rank %d) is %d, expected 0..%d",
                                   (long long)b, h * c + t, g0 + t, cp->rank, p[t], g0 + t);
                if (t > 0 && p[t] != 0 && p[t] != p[t - 1] + 1)
                    return ct_fail(err,
                                   "positions[%lld, %d] (global token %d of the sequence) is %d, "
                                   "expected %d (the document goes on) or 0 (a new one starts)",
                                   (long long)b, h * c + t, g0 + t, p[t], p[t - 1] + 1);
            }
        }
    return 0;
}

typedef struct ring {
    const qwen3_model *m;
    qwen3_dims d;
    int P, r, c;
    size_t QD, KVD, KV; // a row's query and key widths, the rank's keys' floats (N * KVD)
    const int32_t *doc; // block-causal: each token's document start (cp_doc), else NULL
    bool bf16;
} ring;

static ring ring_of(const qwen3_model *m, bool bf16) {
    const qwen3_dims d = qwen3_dims_of(&m->cfg, m->B, m->T);
    const qwen3_acts *s = m->acts;
    const size_t KVD = (size_t)d.NKV * d.D;
    return (ring){m, d, m->cp->size, m->cp->rank, d.T / 2, (size_t)d.NH * d.D, KVD,
                  (size_t)d.N * KVD, s->cp_docs ? s->cp_doc : NULL, bf16};
}

// Where this rank's half h of row b starts: in rows, and in an (NH, c) block of the lse layout.
static size_t row_at(const ring *g, int b, int h) {
    return (size_t)b * g->d.T + (size_t)h * g->c;
}
static size_t lse_at(const ring *g, int b, int h) {
    return ((size_t)b * 2 + h) * g->d.NH * g->c;
}

// The document starts of this rank's half h of row b (NULL: no mask).
static const int32_t *docs_at(const ring *g, int b, int h) {
    return g->doc ? g->doc + row_at(g, b, h) : NULL;
}

// The pairs of step i (keys of rank src, in kv: K then V, (N, KVD) each): in order of row, query
// half, key half. Forward: the first pair of a query chunk (step 0's first key chunk: its own
// diagonal, or the tail chunk's first past chunk) writes atty and lse; the others merge.
static void step_forward(const ring *g, qwen3_layer_acts *a, const float *kv, int src, int i) {
    const ct_ops *op = g->m->ops;
    qwen3_acts *s = g->m->acts;
    const qwen3_dims d = g->d;
    for (int b = 0; b < d.B; b++)
        for (int qh = 0; qh < 2; qh++)
            for (int kh = 0; kh < 2; kh++) {
                const int qc = chunk_of(g->r, g->P, qh), kc = chunk_of(src, g->P, kh);
                if (kc > qc) continue; // wholly in the queries' future
                const size_t q = row_at(g, b, qh) * g->QD, k = row_at(g, b, kh) * g->KVD;
                const size_t l = lse_at(g, b, qh);
                const bool first = i == 0 && kh == 0;
                float *out = first ? a->atty + q : s->cp_out + q;
                float *lse = first ? a->att + l : s->cp_lse + l;
                op->attention_pair_forward(out, lse, a->qr + q, kv + k, kv + g->KV + k, g->c, g->c,
                                           d.NH, d.NKV, d.D, kc == qc, docs_at(g, b, qh),
                                           kc * g->c, g->bf16);
                if (!first)
                    op->attention_lse_merge(a->atty + q, a->att + l, out, lse, g->c, d.NH, d.D);
            }
}

// The backward's pairs of step i: dQ into s->dq, this rank's share of src's dK|dV into dkv.
static void step_backward(const ring *g, const qwen3_layer_acts *a, qwen3_acts *s, const float *kv,
                          float *dkv, int src) {
    const ct_ops *op = g->m->ops;
    const qwen3_dims d = g->d;
    for (int b = 0; b < d.B; b++)
        for (int qh = 0; qh < 2; qh++)
            for (int kh = 0; kh < 2; kh++) {
                const int qc = chunk_of(g->r, g->P, qh), kc = chunk_of(src, g->P, kh);
                if (kc > qc) continue;
                const size_t q = row_at(g, b, qh) * g->QD, k = row_at(g, b, kh) * g->KVD;
                op->attention_pair_backward(s->dq + q, dkv + k, dkv + g->KV + k, s->cp_di,
                                            s->datty + q, a->atty + q, a->att + lse_at(g, b, qh),
                                            a->qr + q, kv + k, kv + g->KV + k, g->c, g->c, d.NH,
                                            d.NKV, d.D, kc == qc, docs_at(g, b, qh), kc * g->c,
                                            g->bf16);
            }
}

// This rank's keys and values as one K|V block at dst.
static void own_kv(const ring *g, const qwen3_layer_acts *a, float *dst) {
    ct_backend *be = g->m->be;
    be->copy(be, dst, a->kr, g->KV * sizeof(float));
    be->copy(be, dst + g->KV, a->v, g->KV * sizeof(float));
}

void qwen3_ring_forward(const qwen3_model *m, qwen3_layer_acts *a, bool bf16) {
    const ring g = ring_of(m, bf16);
    const qwen3_cp *cp = m->cp;
    float *kv = ((qwen3_acts *)m->acts)->cp_kv;
    const size_t blk = 2 * g.KV;
    if (!cp->ring) { // every rank's K|V at slot rank
        own_kv(&g, a, kv + g.r * blk);
        cp->gather(cp->ctx, kv, blk);
        for (int i = 0; i < g.P; i++) {
            const int src = (g.r - i + g.P) % g.P;
            step_forward(&g, a, kv + src * blk, src, i);
        }
        return;
    }
    // Step i holds rank (r - i)'s keys and passes them on while it computes with them.
    float *cur = kv, *next = kv + blk;
    own_kv(&g, a, cur);
    for (int i = 0; i < g.P; i++) {
        if (i + 1 < g.P) cp->sendrecv(cp->ctx, cur, next, blk, 0);
        step_forward(&g, a, cur, (g.r - i + g.P) % g.P, i);
        if (i + 1 < g.P) cp->wait(cp->ctx);
        float *t = cur;
        cur = next, next = t;
    }
}

// dQ, dK, dV of the layer's attention into s->dq, s->dk, s->dv from s->datty.
void qwen3_ring_backward(const qwen3_model *m, const qwen3_layer_acts *a, qwen3_acts *s,
                         bool bf16) {
    const ring g = ring_of(m, bf16);
    const qwen3_cp *cp = m->cp;
    ct_backend *be = m->be;
    const size_t blk = 2 * g.KV;
    be->zero(be, s->dq, (size_t)g.d.N * g.QD * sizeof(float));
    if (!cp->ring) {
        // kv: every rank's K|V; mine: this rank's share of each rank's dK|dV; theirs: the
        // shares of this rank's, from each rank, summed here from rank r on.
        float *kv = s->cp_kv, *mine = kv + g.P * blk, *theirs = mine + g.P * blk;
        own_kv(&g, a, kv + g.r * blk);
        cp->gather(cp->ctx, kv, blk);
        be->zero(be, mine, g.P * blk * sizeof(float));
        for (int i = 0; i < g.P; i++) {
            const int src = (g.r - i + g.P) % g.P;
            step_backward(&g, a, s, kv + src * blk, mine + src * blk, src);
        }
        cp->alltoall(cp->ctx, mine, theirs, blk);
        for (int j = 1; j < g.P; j++)
            be->accumulate(be, theirs + g.r * blk, CT_COMM_F32, theirs + (g.r + j) % g.P * blk,
                           CT_COMM_F32, blk);
        be->copy(be, s->dk, theirs + g.r * blk, g.KV * sizeof(float));
        be->copy(be, s->dv, theirs + g.r * blk + g.KV, g.KV * sizeof(float));
        return;
    }
    // Two slots of dK|dV|K|V travelling together, and this rank's share of the one at hand: the
    // share of rank src's gradient leaves rank src (r - i) first, so it is summed from src on.
    // The keys go on at the start of a step (behind its compute), the gradient after it; the
    // last step only returns the gradient to its owner (rank r + 1's is its own).
    float *cur = s->cp_kv, *next = cur + 2 * blk, *share = next + 2 * blk;
    own_kv(&g, a, cur + blk);
    for (int i = 0; i < g.P; i++) {
        if (i + 1 < g.P) cp->sendrecv(cp->ctx, cur + blk, next + blk, blk, 1);
        be->zero(be, share, blk * sizeof(float));
        step_backward(&g, a, s, cur + blk, share, (g.r - i + g.P) % g.P);
        if (i == 0)
            be->copy(be, cur, share, blk * sizeof(float));
        else
            be->accumulate(be, cur, CT_COMM_F32, share, CT_COMM_F32, blk);
        cp->sendrecv(cp->ctx, cur, next, blk, 2);
        cp->wait(cp->ctx);
        float *t = cur;
        cur = next, next = t;
    }
    be->copy(be, s->dk, cur, g.KV * sizeof(float));
    be->copy(be, s->dv, cur + g.KV, g.KV * sizeof(float));
}
