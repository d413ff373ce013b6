// Expert parallelism's dispatch (model/qwen3_ep.c) bit for bit against one process: G ranks,
// each a thread with its own slice of the experts and N tokens, exchange rows through an
// in-process all-to-all; every rank's layer output, input gradient and routing-weight gradient,
// and every expert's weight gradient, must equal the one-process expert kernel's on the G*N
// tokens exactly (the same rows reach each expert's GEMMs in the same order, and each token's
// rows are summed in the same order). Both expert kernels; random routing, a routing where
// every token picks the same experts (the other experts, and whole ranks, get no row), and
// top-3 (where the combine's order matters). One BLAS and one OpenMP thread per rank, so the
// GEMMs round alike.
#include <cblas.h>
#include <omp.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "model/qwen3_internal.h"
#include "ops/ops.h"
#include "ops/ops_cpu.h"

enum { MAXG = 4 };

static uint64_t seed = 0x9e3779b97f4a7c15ull;
static float frand(float lo, float hi) { // xorshift64*, uniform in [lo, hi)
    seed ^= seed >> 12, seed ^= seed << 25, seed ^= seed >> 27;
    return lo + (hi - lo) * (float)((seed * 2685821657736338717ull) >> 40) / 16777216.0f;
}

typedef struct exchange {
    pthread_barrier_t bar;
    const void *send[MAXG];
    const int *sc[MAXG], *sd[MAXG];
    int bad; // a rank expected another count than its peer sent
} exchange;

typedef struct rank_ctx {
    exchange *x;
    int r, G;
    qwen3_model m;
    qwen3_ep ep;
    qwen3_layer_weights w, g;
    qwen3_layer_acts a;
    float *y, *dx, *dweight, *dout;
} rank_ctx;

// The all-to-all among the threads: every rank publishes its send buffer, then copies its part
// of every peer's.
static void thread_alltoall(void *ctx, const void *send, const int *scounts, const int *sdispls,
                            void *recv, const int *rcounts, const int *rdispls, int bytes) {
    rank_ctx *c = ctx;
    exchange *x = c->x;
    x->send[c->r] = send, x->sc[c->r] = scounts, x->sd[c->r] = sdispls;
    pthread_barrier_wait(&x->bar);
    for (int q = 0; q < c->G; q++) {
        if (x->sc[q][c->r] != rcounts[q]) x->bad = 1;
        memcpy((char *)recv + (size_t)rdispls[q] * bytes,
               (const char *)x->send[q] + (size_t)x->sd[q][c->r] * bytes,
               (size_t)rcounts[q] * bytes);
    }
    pthread_barrier_wait(&x->bar);
}

static void *rank_main(void *arg) {
    rank_ctx *c = arg;
    omp_set_num_threads(1);
    qwen3_ep_forward(&c->m, &c->w, &c->a, c->y);
    qwen3_ep_backward(&c->m, &c->w, &c->g, &c->a, c->dx, c->dweight, c->dout);
    return NULL;
}

static void *zalloc(size_t bytes) {
    return calloc(1, bytes + 16);
}

// The EP buffers strategy_ep.c allocates, for one sparse layer.
static void ep_buffers(qwen3_ep *ep, const ct_ops *ops, int G, int N, int C, int F, int El, int K) {
    const int S = N * K, R = G * N * (K < El ? K : El), ni = S > R ? S : R;
    ep->rows_max = R;
    ep->h_expert = zalloc((size_t)S * 4), ep->h_perm = zalloc((size_t)S * 4);
    ep->h_tpos = zalloc((size_t)S * 4), ep->h_idx = zalloc((size_t)ni * 4);
    ep->h_rperm = zalloc((size_t)R * 4), ep->h_rcounts = zalloc((size_t)G * El * sizeof(int));
    ep->scounts = zalloc(6 * (size_t)G * sizeof(int));
    ep->sdispls = ep->scounts + G, ep->rcounts = ep->sdispls + G, ep->rdispls = ep->rcounts + G;
    ep->ccounts = ep->rdispls + G, ep->cdispls = ep->ccounts + G;
    for (int q = 0; q < G; q++) ep->ccounts[q] = El, ep->cdispls[q] = q * El;
    ep->counts_send = zalloc((size_t)G * El * 4), ep->counts_recv = zalloc((size_t)G * El * 4);
    ep->idx = zalloc((size_t)ni * 4);
    ep->send = zalloc((size_t)S * C * 4), ep->sendw = zalloc((size_t)S * 4);
    ep->recv = zalloc((size_t)R * C * 4), ep->recvw = zalloc((size_t)R * 4);
    ep->y = zalloc((size_t)R * C * 4), ep->dw_rows = zalloc((size_t)R * 4);
    ep->scratch = zalloc(ops->moe_scratch_floats(R, C, F, El, 1) * 4);
    ep->x_rows = zalloc(sizeof(float *)), ep->w_rows = zalloc(sizeof(float *));
    ep->state = zalloc(sizeof(float *)), ep->e_rows = zalloc(sizeof(int32_t *));
    ep->n_rows = zalloc(sizeof(int));
    ep->x_rows[0] = zalloc((size_t)R * C * 4), ep->w_rows[0] = zalloc((size_t)R * 4);
    ep->e_rows[0] = zalloc((size_t)R * 4);
    ep->state[0] = zalloc(ops->moe_state_floats(R, C, F, El, 1) * 4);
}

static void ep_free(qwen3_ep *ep) {
    void *p[] = {ep->h_expert,  ep->h_perm,  ep->h_tpos,      ep->h_idx,       ep->h_rperm,
                 ep->h_rcounts, ep->scounts, ep->counts_send, ep->counts_recv, ep->idx,
                 ep->send,      ep->sendw,   ep->recv,        ep->recvw,       ep->y,
                 ep->dw_rows,   ep->scratch, ep->x_rows[0],   ep->w_rows[0],   ep->e_rows[0],
                 ep->state[0],  ep->x_rows,  ep->w_rows,      ep->state,       ep->e_rows,
                 ep->n_rows};
    for (size_t i = 0; i < sizeof p / sizeof *p; i++) free(p[i]);
}

// mode 0: random routing; 1: every token picks experts E-1, E-2, ... (the rest get no row).
static void run_case(const ct_ops *ops, const char *name, int G, int N, int C, int F, int E, int K,
                     int mode) {
    const int NG = G * N, S = NG * K, El = E / G;
    const size_t blk = (size_t)3 * F * C;
    float *x = malloc((size_t)NG * C * 4), *w = malloc(E * blk * 4), *wt = malloc((size_t)S * 4);
    float *dout = malloc((size_t)NG * C * 4);
    int32_t *expert = malloc((size_t)S * 4);
    for (size_t i = 0; i < (size_t)NG * C; i++) x[i] = frand(-1, 1), dout[i] = frand(-1, 1);
    for (size_t i = 0; i < E * blk; i++) w[i] = frand(-0.1f, 0.1f);
    for (int n = 0; n < NG; n++)
        for (int k = 0; k < K; k++) {
            int e = E - 1 - k, dup;
            if (mode == 0) do {
                    e = (int)frand(0, (float)E) % E;
                    dup = 0;
                    for (int j = 0; j < k; j++) dup |= expert[n * K + j] == e;
                } while (dup);
            expert[n * K + k] = e;
            wt[n * K + k] = frand(0.1f, 1.0f);
        }
    // One process on all G*N tokens.
    float *out1 = malloc((size_t)NG * C * 4), *dx1 = malloc((size_t)NG * C * 4);
    float *dwt1 = malloc((size_t)S * 4), *dw1 = calloc(E * blk, 4);
    float *st = zalloc(ops->moe_state_floats(NG, C, F, E, K) * 4);
    float *sc = zalloc(ops->moe_scratch_floats(NG, C, F, E, K) * 4);
    ops->moe_forward(out1, st, sc, x, expert, wt, w, NG, C, F, E, K);
    ops->moe_backward(dx1, dwt1, dw1, sc, dout, st, x, expert, wt, w, NG, C, F, E, K);
    // G ranks.
    exchange xc = {0};
    pthread_barrier_init(&xc.bar, NULL, (unsigned)G);
    rank_ctx rc[MAXG];
    pthread_t th[MAXG];
    float *dw_ep = calloc(E * blk, 4);
    for (int r = 0; r < G; r++) {
        rank_ctx *c = &rc[r];
        memset(c, 0, sizeof *c);
        c->x = &xc, c->r = r, c->G = G;
        c->m.cfg.hidden_size = C, c->m.cfg.moe_intermediate_size = F, c->m.cfg.num_experts = E;
        c->m.cfg.num_experts_per_tok = K, c->m.cfg.local_experts = El;
        c->m.cfg.expert_lo = r * El;
        c->m.be = ct_backend_cpu(), c->m.ops = ops, c->m.B = 1, c->m.T = N, c->m.n_sparse = 1;
        c->ep = (qwen3_ep){.rank = r, .size = G, .alltoall = thread_alltoall, .ctx = c};
        ep_buffers(&c->ep, ops, G, N, C, F, El, K);
        c->m.ep = &c->ep;
        c->w.experts = w + (size_t)r * El * blk;
        c->g.experts = dw_ep + (size_t)r * El * blk;
        c->a.expert = expert + (size_t)r * N * K, c->a.route_w = wt + (size_t)r * N * K;
        c->a.ln2 = x + (size_t)r * N * C, c->a.sparse_index = 0;
        c->y = malloc((size_t)N * C * 4), c->dx = malloc((size_t)N * C * 4);
        c->dweight = malloc((size_t)N * K * 4), c->dout = dout + (size_t)r * N * C;
    }
    for (int r = 0; r < G; r++) pthread_create(&th[r], NULL, rank_main, &rc[r]);
    for (int r = 0; r < G; r++) pthread_join(th[r], NULL);
    CHECK(!xc.bad, "%s G%d: an all-to-all's counts did not match", name, G);
    int same_y = 1, same_dx = 1, same_dwt = 1;
    for (int r = 0; r < G; r++) {
        same_y &= !memcmp(rc[r].y, out1 + (size_t)r * N * C, (size_t)N * C * 4);
        same_dx &= !memcmp(rc[r].dx, dx1 + (size_t)r * N * C, (size_t)N * C * 4);
        same_dwt &= !memcmp(rc[r].dweight, dwt1 + (size_t)r * N * K, (size_t)N * K * 4);
    }
    CHECK(same_y, "%s G%d N%d E%d K%d mode %d: the layer output differs from one process's", name,
          G, N, E, K, mode);
    CHECK(same_dx, "%s G%d N%d E%d K%d mode %d: the input gradient differs", name, G, N, E, K,
          mode);
    CHECK(same_dwt, "%s G%d N%d E%d K%d mode %d: the routing weights' gradient differs", name, G, N,
          E, K, mode);
    CHECK(!memcmp(dw_ep, dw1, E * blk * 4),
          "%s G%d N%d E%d K%d mode %d: the experts' gradient "
          "differs",
          name, G, N, E, K, mode);
    for (int r = 0; r < G; r++) {
        ep_free(&rc[r].ep);
        free(rc[r].y), free(rc[r].dx), free(rc[r].dweight);
    }
    pthread_barrier_destroy(&xc.bar);
    free(x), free(w), free(wt), free(dout), free(expert), free(out1), free(dx1), free(dwt1);
    free(dw1), free(st), free(sc), free(dw_ep);
}

int main(void) {
    omp_set_num_threads(1);
    openblas_set_num_threads(1);
    ct_ops loop, grouped;
    CHECK(ct_ops_with_moe_impl(&loop, &ct_ops_cpu, "loop") == 0, "the loop kernel");
    CHECK(ct_ops_with_moe_impl(&grouped, &ct_ops_cpu, "grouped") == 0, "the grouped kernel");
    const struct {
        const ct_ops *ops;
        const char *name;
    } impl[2] = {{&grouped, "grouped"}, {&loop, "loop"}};
    for (int i = 0; i < 2; i++) {
        run_case(impl[i].ops, impl[i].name, 2, 24, 32, 16, 8, 2, 0);
        run_case(impl[i].ops, impl[i].name, 4, 16, 32, 16, 8, 2, 0);
        run_case(impl[i].ops, impl[i].name, 2, 24, 32, 16, 6, 3, 0);
        run_case(impl[i].ops, impl[i].name, 4, 16, 32, 16, 8, 2, 1); // experts 7, 6: rank 3 only
        run_case(impl[i].ops, impl[i].name, 2, 16, 32, 16, 8, 1, 1); // every token to expert 7
    }
    return check_summary();
}
