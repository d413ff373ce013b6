#include "parallel/fsdp.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/grad_sync.h"

int fsdp_reshard_parse(fsdp_reshard *out, const char *name, ct_error *err) {
    static const char *names[] = {"default", "always", "never"};
    for (int i = 0; i < 3; i++)
        if (strcmp(name, names[i]) == 0) {
            *out = (fsdp_reshard)i;
            return 0;
        }
    return ct_fail(err,
                   "parallelism.fsdp_reshard_after_forward: expected \"default\", \"always\" or "
                   "\"never\", found \"%s\"",
                   name);
}

void fsdp_piece(const fsdp *f, int u, int s, size_t *lo, size_t *hi) {
    const fsdp_unit *x = &f->units[u];
    const int S = x->g->size;
    *lo = x->lo + grad_sync_shard_start(x->hi - x->lo, s, S);
    *hi = x->lo + grad_sync_shard_start(x->hi - x->lo, s + 1, S);
}

// A frozen model held in bf16 only: param_bf16 is its shard and its gathers; param_mem stays.
static bool bf16_only(const fsdp *f) {
    return f->o.frozen && f->params_bf16;
}

static void *alloc_zeroed(fsdp *f, size_t bytes, const char *what, ct_error *err) {
    return f->be->alloc(f->be, bytes, what, err);
}

int fsdp_init(fsdp *f, dist *world, const fsdp_opts *o, ct_backend *be, const ct_ops *ops,
              float *params, float *grads, uint16_t *params_bf16, size_t n, const size_t *lo,
              const size_t *hi, int n_units, bool tied, ct_error *err) {
    memset(f, 0, sizeof *f);
    f->world = world;
    f->o = *o;
    f->be = ct_backend_or_cpu(be);
    f->ops = ops;
    f->params = params;
    f->grads = grads;
    f->params_bf16 = o->bf16_params ? params_bf16 : NULL;
    f->n = n;
    f->tied = tied;
    f->reducing = -1;
    const int S = o->shard_degree, R = o->replicate_degree;
    if (S * R != world->size)
        return ct_fail(err, "FSDP: %d shard ranks x %d replicas is not the %d ranks", S, R,
                       world->size);
    if (o->bf16_params && !params_bf16)
        return ct_fail(err, "FSDP: bf16 gathers need the model's bf16 weight copy");
    if (!o->frozen && !grads) return ct_fail(err, "FSDP: a trained model needs its gradients");
    // torchtitan's mesh: the replica index is the outer one, the shard rank the inner one.
    const int ep = o->expert_degree > 1 ? o->expert_degree : 1;
    if (S % ep != 0)
        return ct_fail(err, "FSDP: expert_degree %d does not divide the %d shard ranks", ep, S);
    if (dist_split(world, world->rank / S, world->rank % S, &f->shard, err) != 0 ||
        dist_split(world, world->rank % S, world->rank / S, &f->replica, err) != 0 ||
        (ep > 1 && dist_split(&f->shard, f->shard.rank % ep, f->shard.rank / ep, &f->eshard,
                              err) != 0)) {
        fsdp_free(f);
        return -1;
    }
    f->units = calloc((size_t)n_units, sizeof *f->units);
    if (!f->units) {
        fsdp_free(f);
        return ct_fail(err, "out of memory for %d FSDP units", n_units);
    }
    f->n_units = n_units;
    for (int u = 0; u < n_units; u++) {
        fsdp_unit *x = &f->units[u];
        x->g = ep > 1 && o->expert_units && o->expert_units[u] ? &f->eshard : &f->shard;
        const int S = x->g->size, s = x->g->rank;
        x->lo = lo[u];
        x->hi = hi[u];
        if (hi[u] - lo[u] > INT_MAX) {
            fsdp_free(f);
            return ct_fail(err, "FSDP unit %d has %zu elements; MPI counts stop at %d", u,
                           hi[u] - lo[u], INT_MAX);
        }
        x->counts = malloc((size_t)S * sizeof *x->counts);
        x->displs = malloc((size_t)S * sizeof *x->displs);
        if (!x->counts || !x->displs) {
            fsdp_free(f);
            return ct_fail(err, "out of memory for the FSDP unit tables");
        }
        for (int r = 0; r < S; r++) {
            size_t a, b;
            fsdp_piece(f, u, r, &a, &b);
            x->counts[r] = (int)(b - a);
            x->displs[r] = (int)(a - x->lo);
        }
        fsdp_piece(f, u, s, &x->piece_lo, &x->piece_hi);
        x->at = f->n_shard;
        f->n_shard += x->piece_hi - x->piece_lo;
    }
    const size_t ns = f->n_shard ? f->n_shard : 1;
    int most = 1; // the largest piece, which the reduce-scatter receives into
    for (int u = 0; u < n_units; u++)
        for (int r = 0; r < f->units[u].g->size; r++)
            most = f->units[u].counts[r] > most ? f->units[u].counts[r] : most;
    const bool grad = !o->frozen, reduce16 = grad && o->bf16_reduce;
    if ((grad && !(f->ring_recv = alloc_zeroed(f, (size_t)most * sizeof(float),
                                               "the reduce-scatter's receive buffer", err))) ||
        (reduce16 &&
         !(f->ring_recv16 = alloc_zeroed(f, (size_t)most * sizeof(uint16_t),
                                         "the reduce-scatter's receive buffer", err))) ||
        (!bf16_only(f) &&
         !(f->shard_params = alloc_zeroed(f, ns * sizeof(float), "the FSDP weight shard", err))) ||
        (grad &&
         !(f->shard_grads = alloc_zeroed(f, ns * sizeof(float), "the FSDP gradient shard", err))) ||
        (o->bf16_params &&
         !(f->shard_bf16 = alloc_zeroed(f, ns * sizeof(uint16_t), "the FSDP bf16 shard", err))) ||
        (reduce16 && !(f->grads_bf16 = alloc_zeroed(f, n * sizeof(uint16_t),
                                                    "the bf16 gradient staging", err)))) {
        fsdp_free(f);
        return -1;
    }
    return 0;
}

void fsdp_free(fsdp *f) {
    if (f->be) {
        f->be->free(f->be, f->shard_params);
        f->be->free(f->be, f->shard_grads);
        f->be->free(f->be, f->shard_bf16);
        f->be->free(f->be, f->grads_bf16);
        f->be->free(f->be, f->ring_recv);
        f->be->free(f->be, f->ring_recv16);
    }
    for (int u = 0; u < f->n_units; u++) {
        free(f->units[u].counts);
        free(f->units[u].displs);
    }
    free(f->units);
    dist_group_free(&f->eshard);
    dist_group_free(&f->shard);
    dist_group_free(&f->replica);
    memset(f, 0, sizeof *f);
}

// The first failure sticks: later collectives are skipped (the ranks are out of step), and
// fsdp_finish reports it.
static void fail(fsdp *f, int rc) {
    if (rc != 0) f->failed = -1;
}

static void populate_grads(fsdp *f, int u) {
    if (!f->grads) return;
    f->be->populate(f->be, f->grads + f->units[u].lo,
                    (f->units[u].hi - f->units[u].lo) * sizeof(float));
}

// --- gathers

static void start_gather(fsdp *f, int u) {
    fsdp_unit *x = &f->units[u];
    if (f->failed || x->gathered || x->gathering) return;
    const size_t piece = x->piece_hi - x->piece_lo;
    x->gather_t0 = dist_clock();
    ct_backend *be = f->be;
    const ct_comm c = dist_comm(x->g);
    int rc;
    if (!bf16_only(f)) be->populate(be, f->params + x->lo, (x->hi - x->lo) * sizeof(float));
    if (f->params_bf16) {
        be->populate(be, f->params_bf16 + x->lo, (x->hi - x->lo) * sizeof(uint16_t));
        be->copy(be, f->params_bf16 + x->piece_lo, f->shard_bf16 + x->at, piece * sizeof(uint16_t));
        rc = be->comm_allgather(be, &c, f->params_bf16 + x->lo, x->counts, x->displs, CT_COMM_BF16,
                                &x->gather_req, &f->err);
    } else {
        be->copy(be, f->params + x->piece_lo, f->shard_params + x->at, piece * sizeof(float));
        rc = be->comm_allgather(be, &c, f->params + x->lo, x->counts, x->displs, CT_COMM_F32,
                                &x->gather_req, &f->err);
    }
    x->g->comm_s += dist_clock() - x->gather_t0;
    if (x->g->size > 1) f->gather_bytes += (double)(x->hi - x->lo) * (f->params_bf16 ? 2 : 4);
    if (rc != 0) {
        fail(f, ct_fail(&f->err, "rank %d: MPI failed to start the gather of FSDP unit %d",
                        x->g->rank, u));
        return;
    }
    x->gathering = true;
}

// A finished gather: bf16 weights are widened into the fp32 buffer too (norms, the embedding
// and the biases read fp32: bf16-rounded values, as FSDP2 casts every parameter).
static void gather_done(fsdp *f, int u) {
    fsdp_unit *x = &f->units[u];
    x->gathering = false;
    x->gathered = true;
    if (f->params_bf16 && !bf16_only(f))
        f->ops->bf16_to_f32(f->params + x->lo, f->params_bf16 + x->lo, x->hi - x->lo);
}

static void ensure_gathered(fsdp *f, int u) {
    fsdp_unit *x = &f->units[u];
    if (f->failed || x->gathered) return;
    start_gather(f, u);
    char what[64];
    snprintf(what, sizeof what, "the gather of FSDP unit %d", u);
    if (dist_wait_requests(x->g, f->be, &x->gather_req, 1, what, &f->err) != 0)
        return fail(f, -1);
    f->busy_s += dist_clock() - x->gather_t0;
    gather_done(f, u);
}

static void reshard(fsdp *f, int u) {
    fsdp_unit *x = &f->units[u];
    if (!x->gathered) return;
    x->gathered = false;
    if (!bf16_only(f)) f->be->discard(f->be, f->params + x->lo, (x->hi - x->lo) * sizeof(float));
    if (f->params_bf16)
        f->be->discard(f->be, f->params_bf16 + x->lo, (x->hi - x->lo) * sizeof(uint16_t));
}

// --- reduce-scatters
//
// A ring, by hand: MPI_Ireduce_scatter (Open MPI 4.1's libnbc) reduces to one rank and scatters,
// with a temporary buffer of the whole unit on every rank, where FSDP is meant to hold units one
// at a time. In step k (0 .. S-2) rank s sends its partial sum of block (s-k-1) mod S to rank
// s+1, receives block (s-k-2) mod S from rank s-1 and adds its own values into it; after S-1
// steps it holds the whole sum of its own block, s. The unit's gradient is the working buffer
// (bf16: its bf16 staging), so the only extra memory is one piece to receive into. The order of
// the additions is fixed for a given S: runs are deterministic.

static size_t block_at(const fsdp_unit *x, int b) {
    return x->lo + (size_t)x->displs[b];
}

// Posts step f->ring_step's send and receive.
static void ring_post(fsdp *f) {
    const fsdp_unit *x = &f->units[f->reducing];
    const int S = x->g->size, s = x->g->rank, k = f->ring_step;
    const int send = ((s - k - 1) % S + S) % S, recv = ((s - k - 2) % S + S) % S;
    const int right = (s + 1) % S, left = (s + S - 1) % S, tag = 7;
    double t0 = dist_clock();
    ct_backend *be = f->be;
    const ct_comm c = dist_comm(x->g);
    const bool b16 = f->grads_bf16 != NULL;
    const ct_comm_type type = b16 ? CT_COMM_BF16 : CT_COMM_F32;
    const void *out = b16 ? (const void *)(f->grads_bf16 + block_at(x, send))
                          : (const void *)(f->grads + block_at(x, send));
    void *in = b16 ? (void *)f->ring_recv16 : (void *)f->ring_recv;
    int rc =
        be->comm_send(be, &c, out, x->counts[send], type, right, tag, &f->ring_req[0], &f->err);
    if (rc == 0)
        rc = be->comm_recv(be, &c, in, x->counts[recv], type, left, tag, &f->ring_req[1], &f->err);
    x->g->comm_s += dist_clock() - t0;
    if (rc != 0)
        fail(f, ct_fail(&f->err,
                        "rank %d: MPI failed to post step %d of FSDP unit %d's reduce-scatter",
                        s, k, f->reducing));
}

// The received block of step f->ring_step added into this rank's (a bf16 sum rounds each
// addition to bf16, as a bf16 reduction does).
static void ring_add(fsdp *f) {
    const fsdp_unit *x = &f->units[f->reducing];
    const int S = x->g->size, s = x->g->rank, k = f->ring_step;
    const int b = ((s - k - 2) % S + S) % S, n = x->counts[b];
    if (f->grads_bf16)
        f->be->accumulate(f->be, f->grads_bf16 + block_at(x, b), CT_COMM_BF16, f->ring_recv16,
                          CT_COMM_BF16, (size_t)n);
    else
        f->be->accumulate(f->be, f->grads + block_at(x, b), CT_COMM_F32, f->ring_recv, CT_COMM_F32,
                          (size_t)n);
}

static void reduce_done(fsdp *f);

static void start_reduce(fsdp *f, int u) {
    fsdp_unit *x = &f->units[u];
    const size_t len = x->hi - x->lo;
    f->reduce_t0 = dist_clock();
    if (f->grads_bf16) {
        f->ops->f32_to_bf16(f->grads_bf16 + x->lo, f->grads + x->lo, len);
        f->be->discard(f->be, f->grads + x->lo, len * sizeof(float));
    }
    f->reducing = u;
    f->ring_step = 0;
    if (x->g->size == 1) return reduce_done(f); // experts held by one shard rank: nothing to sum
    f->reduce_bytes += (double)len * (f->grads_bf16 ? 2 : 4);
    ring_post(f);
}

// A finished reduce-scatter: this rank's sum, its own block, is added into its shard gradient;
// the unit's gradient memory goes back (zero for the next micro-batch).
static void reduce_done(fsdp *f) {
    const fsdp_unit *x = &f->units[f->reducing];
    const size_t len = x->hi - x->lo, piece = x->piece_hi - x->piece_lo;
    float *g = f->shard_grads + x->at;
    if (f->grads_bf16) {
        f->be->accumulate(f->be, g, CT_COMM_F32, f->grads_bf16 + x->piece_lo, CT_COMM_BF16, piece);
        f->be->discard(f->be, f->grads_bf16 + x->lo, len * sizeof(uint16_t));
    } else {
        f->be->accumulate(f->be, g, CT_COMM_F32, f->grads + x->piece_lo, CT_COMM_F32, piece);
        f->be->discard(f->be, f->grads + x->lo, len * sizeof(float));
    }
    f->busy_s += dist_clock() - f->reduce_t0;
    f->reducing = -1;
}

// Moves the ring on: as far as it can without waiting, or (`wait`) to its end.
static void advance_reduce(fsdp *f, bool wait) {
    while (f->reducing >= 0 && !f->failed) {
        dist *g = f->units[f->reducing].g;
        if (wait) {
            char what[80];
            snprintf(what, sizeof what, "step %d of the reduce-scatter of FSDP unit %d",
                     f->ring_step, f->reducing);
            if (dist_wait_requests(g, f->be, f->ring_req, 2, what, &f->err) != 0)
                return fail(f, -1);
        } else if (!dist_test_requests(g, f->be, f->ring_req, 2)) {
            return;
        }
        ring_add(f);
        if (++f->ring_step == g->size - 1)
            reduce_done(f);
        else
            ring_post(f);
    }
}

static void wait_reduce(fsdp *f) {
    advance_reduce(f, true);
}

// One round of progress on what is in flight (Open MPI moves non-blocking collectives only
// inside MPI calls): a gather that completed is finished, a reduce-scatter too.
static void progress(fsdp *f) {
    f->shard.timeout_s = f->replica.timeout_s = f->eshard.timeout_s = f->world->timeout_s;
    if (f->failed) return;
    advance_reduce(f, false);
    for (int u = 0; u < f->n_units; u++) {
        fsdp_unit *x = &f->units[u];
        const double t = dist_clock();
        if (x->gathering && dist_test_requests(x->g, f->be, &x->gather_req, 1)) {
            f->busy_s += t - x->gather_t0;
            gather_done(f, u);
        }
    }
}

// --- the hook

// FSDP2's reshard_after_forward: "never" keeps every unit for its backward, "default" only the
// head (its backward follows at once), "always" none. Under "default" a tied embedding, the
// head's weight as well, stays from its forward to its own backward, gathered once a
// micro-batch: its gradient lives from the head's backward to its own anyway, so the peak is
// the same.
static bool keep_after_forward(const fsdp *f, int u) {
    return f->o.reshard == FSDP_RESHARD_NEVER ||
           (f->o.reshard == FSDP_RESHARD_DEFAULT && (u == f->n_units - 1 || (f->tied && u == 0)));
}

void fsdp_forward(fsdp *f, int u) {
    progress(f);
    // A micro-batch starts with nothing being reduced: the last one's embedding (reduced in
    // place in its gradient, which a tied head's chunked loss adds into during the forward) is
    // done first, so at most one unit's gradient is ever in flight.
    if (u == 0) wait_reduce(f);
    if (u == f->n_units - 1) { // a chunked loss head writes its gradient in the forward
        populate_grads(f, u);
        if (f->tied) populate_grads(f, 0);
    }
    ensure_gathered(f, u);
    if (f->tied && u == f->n_units - 1) ensure_gathered(f, 0);
    if (u + 1 < f->n_units) start_gather(f, u + 1);
}

void fsdp_forward_done(fsdp *f, int u) {
    progress(f);
    if (keep_after_forward(f, u)) return;
    reshard(f, u);
    if (f->tied && u == f->n_units - 1) reshard(f, 0); // a tied head's embedding goes with it
}

void fsdp_backward(fsdp *f, int u) {
    progress(f);
    populate_grads(f, u);
    ensure_gathered(f, u);
    if (f->tied && u == f->n_units - 1) ensure_gathered(f, 0);
    if (u > 0) start_gather(f, u - 1);
}

void fsdp_backward_done(fsdp *f, int u) {
    progress(f);
    if (f->no_sync) return; // the stage's last micro-batch reduces the sum
    reshard(f, u);
    if (f->tied && u == f->n_units - 1 && f->o.reshard == FSDP_RESHARD_ALWAYS) reshard(f, 0);
    // One reduce-scatter in flight at a time: the previous one finishes first.
    wait_reduce(f);
    if (!f->failed && f->grads) start_reduce(f, u);
}

// --- outside the step

void fsdp_take(fsdp *f, int u) {
    fsdp_unit *x = &f->units[u];
    const size_t piece = x->piece_hi - x->piece_lo;
    if (bf16_only(f))
        f->be->copy(f->be, f->shard_bf16 + x->at, f->params_bf16 + x->piece_lo,
                    piece * sizeof(uint16_t));
    else
        f->be->copy(f->be, f->shard_params + x->at, f->params + x->piece_lo, piece * sizeof(float));
    x->gathered = true; // what the full buffer holds goes
    reshard(f, u);
}

void fsdp_reshard_all(fsdp *f) {
    for (int u = 0; u < f->n_units; u++) reshard(f, u);
}

void fsdp_weights_changed(fsdp *f, bool bf16_done) {
    if (f->shard_bf16 && f->shard_params && !bf16_done)
        f->ops->f32_to_bf16(f->shard_bf16, f->shard_params, f->n_shard);
    fsdp_reshard_all(f);
}

void fsdp_begin_step(fsdp *f) {
    f->no_sync = false;
    if (f->shard_grads) f->be->zero(f->be, f->shard_grads, f->n_shard * sizeof(float));
}

// HSDP: the R replicas of this shard add their sums (in rank order for a given layout). Nothing
// computes meanwhile, so its time is all exposed.
static void allreduce_replicas(fsdp *f) {
    ct_request *req = NULL;
    ct_backend *be = f->be;
    const ct_comm c = dist_comm(&f->replica);
    double t0 = dist_clock();
    uint16_t *h = f->grads_bf16; // free staging now: the reduce-scatters are done
    if (f->o.bf16_reduce) f->ops->f32_to_bf16(h, f->shard_grads, f->n_shard);
    int rc = f->o.bf16_reduce
                 ? be->comm_allreduce(be, &c, h, (int)f->n_shard, CT_COMM_BF16, &req, &f->err)
                 : be->comm_allreduce(be, &c, f->shard_grads, (int)f->n_shard, CT_COMM_F32, &req,
                                      &f->err);
    f->replica.comm_s += dist_clock() - t0;
    f->replica_bytes += (double)f->n_shard * (f->o.bf16_reduce ? 2 : 4);
    if (rc != 0)
        return fail(f, ct_fail(&f->err, "rank %d: MPI failed to start the replicas' all-reduce",
                               f->shard.rank));
    if (dist_wait_requests(&f->replica, be, &req, 1, "the replicas' gradient all-reduce",
                           &f->err) != 0)
        return fail(f, -1);
    f->busy_s += dist_clock() - t0;
    if (f->o.bf16_reduce) {
        f->ops->bf16_to_f32(f->shard_grads, h, f->n_shard);
        f->be->discard(f->be, h, f->n_shard * sizeof(uint16_t));
    }
}

int fsdp_finish(fsdp *f, ct_error *err) {
    progress(f);
    wait_reduce(f);
    if (!f->failed && f->replica.size > 1 && f->n_shard && f->shard_grads) allreduce_replicas(f);
    if (f->failed) {
        *err = f->err;
        return -1;
    }
    return 0;
}

void fsdp_take_comm(fsdp *f, double *exposed, double *hidden) {
    *exposed = f->shard.comm_s + f->eshard.comm_s + f->replica.comm_s;
    *hidden = f->busy_s > *exposed ? f->busy_s - *exposed : 0;
    f->shard.comm_s = f->eshard.comm_s = f->replica.comm_s = f->busy_s = 0;
}

// --- the memory estimate: the hooks' events replayed on sizes alone

typedef struct replay {
    const size_t *lo, *hi;
    bool *gathered, *grads; // per unit: weights gathered; gradients held in fp32
    int reducing;           // the unit whose (staged) gradients are being reduced, or -1
    double weight_bytes, reduce_bytes, now, peak;
} replay;

static void replay_note(replay *r, int n_units) {
    double b = 0;
    for (int u = 0; u < n_units; u++) {
        const double len = (double)(r->hi[u] - r->lo[u]);
        b += r->gathered[u] * len * r->weight_bytes + r->grads[u] * len * sizeof(float);
    }
    if (r->reducing >= 0) b += (double)(r->hi[r->reducing] - r->lo[r->reducing]) * r->reduce_bytes;
    if (b > r->peak) r->peak = b;
}

double fsdp_peak_gathered_bytes(const size_t *lo, const size_t *hi, int n_units, const fsdp_opts *o,
                                bool tied) {
    fsdp f = {.o = *o, .n_units = n_units}; // for keep_after_forward
    replay r = {.lo = lo, .hi = hi, .reducing = -1};
    r.gathered = calloc((size_t)n_units, sizeof *r.gathered);
    r.grads = calloc((size_t)n_units, sizeof *r.grads);
    if (!r.gathered || !r.grads) {
        free(r.gathered);
        free(r.grads);
        return 0;
    }
    // A gathered unit: its weights (fp32, plus the bf16 gather it is widened from; a frozen bf16
    // model's bf16 alone). A reducing one: its fp32 gradients, or their bf16 staging.
    r.weight_bytes = o->frozen && o->bf16_params
                         ? sizeof(uint16_t)
                         : sizeof(float) + (o->bf16_params ? sizeof(uint16_t) : 0);
    r.reduce_bytes = o->bf16_reduce ? sizeof(uint16_t) : sizeof(float);
    const int head = n_units - 1;
    for (int u = 0; u < n_units; u++) { // forward: the unit, its prefetch, the tied embedding
        r.gathered[u] = true;
        if (u < head) r.gathered[u + 1] = true;
        if (tied && u == head) r.gathered[0] = true;
        replay_note(&r, n_units);
        if (!keep_after_forward(&f, u)) {
            r.gathered[u] = false;
            if (tied && u == head) r.gathered[0] = false;
        }
    }
    for (int u = head; u >= 0; u--) { // backward: the unit, its prefetch, its gradients
        r.gathered[u] = true, r.grads[u] = !o->frozen;
        if (u > 0) r.gathered[u - 1] = true;
        if (tied && u == head) r.gathered[0] = true, r.grads[0] = !o->frozen;
        replay_note(&r, n_units);
        r.gathered[u] = false;
        if (tied && u == head && o->reshard == FSDP_RESHARD_ALWAYS) r.gathered[0] = false;
        r.grads[u] = false; // handed to the reduce-scatter, the previous one being done
        r.reducing = o->frozen ? -1 : u;
        replay_note(&r, n_units);
    }
    free(r.gathered);
    free(r.grads);
    return r.peak;
}
