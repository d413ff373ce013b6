// Expert parallelism, the model's side (qwen3_ep in qwen3.h): a sparse layer's experts when
// this rank holds only El of them. The plan of a layer (which rows go where) is built on the
// host from the routing, read back; the rows move by the table's moe_ep ops and the strategy's
// all-to-all, so host code never touches backend memory.
#include <string.h>

#include "model/qwen3_internal.h"

typedef struct ep_plan {
    int N, K, E, El, G, C, Fm, S, R;
    int rowbytes; // a dispatched input row: C floats, or C bf16 values
    size_t own;   // the first routed row's element in ln2 (its sequence shard's, under shard)
} ep_plan;

static ep_plan plan_of(const qwen3_model *m, const qwen3_layer_acts *a) {
    const qwen3_ep *ep = m->ep;
    const qwen3_config *c = &m->cfg;
    ep_plan p = {.N = qwen3_moe_rows(m, m->B * m->T),
                 .K = c->num_experts_per_tok,
                 .E = c->num_experts,
                 .El = qwen3_local_experts(c),
                 .G = ep->size,
                 .C = c->hidden_size,
                 .Fm = c->moe_intermediate_size};
    p.S = p.N * p.K;
    p.rowbytes = qwen3_bf16_experts(&m->mem_opts) ? 2 * p.C : 4 * p.C;
    p.own = ep->shard ? (size_t)m->tp->rank * p.N * p.C : 0;
    (void)a;
    return p;
}

// The kept state's entry of the layer in the activation set in use.
static int kept_of(const qwen3_model *m, const qwen3_layer_acts *a) {
    return m->ep->set * m->n_sparse + a->sparse_index;
}

// The layer's routing sorted by expert, then token (moe_plan_build's order): h_perm (sorted
// position -> slot), h_tpos (each token's K positions, ascending, i.e. by ascending expert), the
// rows sent to each rank (scounts, sdispls) and h_idx = the inverse of h_perm (slot -> position).
static void send_plan(const qwen3_model *m, const qwen3_layer_acts *a, const ep_plan *p) {
    const qwen3_ep *ep = m->ep;
    m->be->read(m->be, ep->h_expert, a->expert, (size_t)p->S * sizeof(int32_t));
    int off[p->E + 1];
    memset(off, 0, sizeof off);
    for (int s = 0; s < p->S; s++) off[ep->h_expert[s] + 1]++;
    for (int e = 0; e < p->E; e++) off[e + 1] += off[e];
    for (int q = 0; q < p->G; q++) {
        ep->sdispls[q] = off[q * p->El];
        ep->scounts[q] = off[(q + 1) * p->El] - off[q * p->El];
    }
    for (int s = 0; s < p->S; s++) ep->h_perm[off[ep->h_expert[s]]++] = s;
    for (int r = 0; r < p->S; r++) ep->h_idx[ep->h_perm[r]] = r;
    memcpy(ep->h_tpos, ep->h_idx, (size_t)p->S * sizeof *ep->h_tpos);
    for (int t = 0; t < p->N; t++) {
        int32_t *q = ep->h_tpos + (size_t)t * p->K;
        for (int i = 1; i < p->K; i++) {
            const int32_t v = q[i];
            int j = i;
            for (; j > 0 && q[j - 1] > v; j--) q[j] = q[j - 1];
            q[j] = v;
        }
    }
}

// From this layer's received counts (h_rcounts: source s, local expert j): the rows from each
// rank (rcounts, rdispls), their total R, and h_rperm: expert-major row -> arrival row (an
// expert's rows by source rank, then token, as one process orders the global batch's).
static void recv_plan(const qwen3_model *m, ep_plan *p, const int *rc) {
    const qwen3_ep *ep = m->ep;
    int R = 0;
    for (int s = 0; s < p->G; s++) {
        ep->rdispls[s] = R;
        ep->rcounts[s] = 0;
        for (int j = 0; j < p->El; j++) ep->rcounts[s] += rc[s * p->El + j];
        R += ep->rcounts[s];
    }
    p->R = R;
    int pos = 0;
    for (int j = 0; j < p->El; j++)
        for (int s = 0; s < p->G; s++) {
            int at = ep->rdispls[s];
            for (int i = 0; i < j; i++) at += rc[s * p->El + i];
            for (int i = 0; i < rc[s * p->El + j]; i++) ep->h_rperm[pos++] = at + i;
        }
}

static void put_idx(const qwen3_model *m, const int32_t *h, int n) {
    m->be->write(m->be, m->ep->idx, h, (size_t)n * sizeof(int32_t));
}

// h_idx = the inverse of h_rperm (arrival row -> expert-major row).
static void inverse_rperm(const qwen3_ep *ep, int R) {
    for (int i = 0; i < R; i++) ep->h_idx[ep->h_rperm[i]] = i;
}

static const uint16_t *bf16_of(const qwen3_model *m, const float *w) {
    return m->param_bf16 + (w - m->param_mem);
}

void qwen3_ep_forward(const qwen3_model *m, const qwen3_layer_weights *w, const qwen3_layer_acts *a,
                      float *y) {
    const qwen3_ep *ep = m->ep;
    const ct_ops *op = m->ops;
    ct_backend *be = m->be;
    ep_plan p = plan_of(m, a);
    const int li = kept_of(m, a);
    const bool bf16 = qwen3_bf16_experts(&m->mem_opts);
    send_plan(m, a, &p);
    // The counts: rank q gets this rank's count for each of its El experts.
    int32_t cnt[p.E];
    memset(cnt, 0, sizeof cnt);
    for (int s = 0; s < p.S; s++) cnt[ep->h_expert[s]]++;
    be->write(be, ep->counts_send, cnt, sizeof cnt);
    ep->alltoall(ep->ctx, ep->counts_send, ep->ccounts, ep->cdispls, ep->counts_recv, ep->ccounts,
                 ep->cdispls, (int)sizeof(int32_t));
    int *rc = ep->h_rcounts + (size_t)li * p.G * p.El;
    be->read(be, rc, ep->counts_recv, (size_t)p.G * p.El * sizeof(int32_t));
    recv_plan(m, &p, rc);
    ep->n_rows[li] = p.R;
    // The rows and their routing weights, sorted by expert, to the owners.
    for (int i = 0; i < p.S; i++) ep->h_idx[i] = ep->h_perm[i] / p.K;
    put_idx(m, ep->h_idx, p.S);
    op->moe_ep_gather(ep->send,
                      bf16 ? (const void *)(a->ln2_16 + p.own) : (const void *)(a->ln2 + p.own),
                      ep->idx, p.S, p.rowbytes);
    put_idx(m, ep->h_perm, p.S);
    op->moe_ep_gather(ep->sendw, a->route_w, ep->idx, p.S, 4);
    ep->alltoall(ep->ctx, ep->send, ep->scounts, ep->sdispls, ep->recv, ep->rcounts, ep->rdispls,
                 p.rowbytes);
    ep->alltoall(ep->ctx, ep->sendw, ep->scounts, ep->sdispls, ep->recvw, ep->rcounts, ep->rdispls,
                 4);
    // Expert-major, kept for the backward with the rows' local expert ids.
    put_idx(m, ep->h_rperm, p.R);
    op->moe_ep_gather(ep->x_rows[li], ep->recv, ep->idx, p.R, p.rowbytes);
    op->moe_ep_gather(ep->w_rows[li], ep->recvw, ep->idx, p.R, 4);
    int pos = 0;
    for (int j = 0; j < p.El; j++)
        for (int s = 0; s < p.G; s++)
            for (int i = 0; i < rc[s * p.El + j]; i++) ep->h_idx[pos++] = j;
    be->write(be, ep->e_rows[li], ep->h_idx, (size_t)p.R * sizeof(int32_t));
    // Each row's weighted output (K = 1: out row = 0.0f + weight * y).
    if (p.R > 0) {
        if (bf16)
            op->moe_bf16_forward(op, ep->y, ep->state[li], ep->scratch,
                                 (const uint16_t *)ep->x_rows[li], ep->e_rows[li], ep->w_rows[li],
                                 bf16_of(m, w->experts), p.R, p.C, p.Fm, p.El, 1);
        else
            op->moe_forward(ep->y, ep->state[li], ep->scratch, ep->x_rows[li], ep->e_rows[li],
                            ep->w_rows[li], w->experts, p.R, p.C, p.Fm, p.El, 1);
    }
    // Back in arrival order to their tokens' ranks, then each token's K rows summed.
    inverse_rperm(ep, p.R);
    put_idx(m, ep->h_idx, p.R);
    op->moe_ep_gather(ep->recv, ep->y, ep->idx, p.R, 4 * p.C);
    ep->alltoall(ep->ctx, ep->recv, ep->rcounts, ep->rdispls, ep->send, ep->scounts, ep->sdispls,
                 4 * p.C);
    put_idx(m, ep->h_tpos, p.S);
    op->moe_ep_combine(y, ep->send, ep->idx, p.N, p.C, p.K);
}

void qwen3_ep_backward(const qwen3_model *m, const qwen3_layer_weights *w, qwen3_layer_weights *g,
                       const qwen3_layer_acts *a, float *dx, float *dweight, const float *dout) {
    const qwen3_ep *ep = m->ep;
    const ct_ops *op = m->ops;
    ep_plan p = plan_of(m, a);
    const int li = kept_of(m, a);
    const bool bf16 = qwen3_bf16_experts(&m->mem_opts);
    send_plan(m, a, &p);
    recv_plan(m, &p, ep->h_rcounts + (size_t)li * p.G * p.El);
    // The output gradient's rows go where the forward's went, expert-major on arrival.
    for (int i = 0; i < p.S; i++) ep->h_idx[i] = ep->h_perm[i] / p.K;
    put_idx(m, ep->h_idx, p.S);
    op->moe_ep_gather(ep->send, dout, ep->idx, p.S, 4 * p.C);
    ep->alltoall(ep->ctx, ep->send, ep->scounts, ep->sdispls, ep->recv, ep->rcounts, ep->rdispls,
                 4 * p.C);
    put_idx(m, ep->h_rperm, p.R);
    op->moe_ep_gather(ep->y, ep->recv, ep->idx, p.R, 4 * p.C);
    if (p.R > 0) {
        if (bf16)
            op->moe_bf16_backward(op, ep->recv, ep->dw_rows, g->experts, ep->scratch, ep->y,
                                  ep->state[li], (const uint16_t *)ep->x_rows[li], ep->e_rows[li],
                                  ep->w_rows[li], bf16_of(m, w->experts), p.R, p.C, p.Fm, p.El, 1);
        else
            op->moe_backward(ep->recv, ep->dw_rows, g->experts, ep->scratch, ep->y, ep->state[li],
                             ep->x_rows[li], ep->e_rows[li], ep->w_rows[li], w->experts, p.R, p.C,
                             p.Fm, p.El, 1);
    }
    // The input gradient's rows and the weights' gradient back in arrival order.
    inverse_rperm(ep, p.R);
    put_idx(m, ep->h_idx, p.R);
    op->moe_ep_gather(ep->y, ep->recv, ep->idx, p.R, 4 * p.C);
    op->moe_ep_gather(ep->recvw, ep->dw_rows, ep->idx, p.R, 4);
    ep->alltoall(ep->ctx, ep->y, ep->rcounts, ep->rdispls, ep->send, ep->scounts, ep->sdispls,
                 4 * p.C);
    ep->alltoall(ep->ctx, ep->recvw, ep->rcounts, ep->rdispls, ep->sendw, ep->scounts, ep->sdispls,
                 4);
    put_idx(m, ep->h_tpos, p.S);
    op->moe_ep_combine(dx, ep->send, ep->idx, p.N, p.C, p.K);
    // dweight[slot] = its sorted position's (h_perm's inverse).
    for (int r = 0; r < p.S; r++) ep->h_idx[ep->h_perm[r]] = r;
    put_idx(m, ep->h_idx, p.S);
    op->moe_ep_gather(dweight, ep->sendw, ep->idx, p.S, 4);
}
