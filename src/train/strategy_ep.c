// Expert parallelism (torchtitan's EP for Qwen3-MoE) with DDP for everything else: the
// data-parallel ranks (t->d) are cut into EP groups of ep consecutive ranks; rank r of a group
// holds experts [r*E/ep, (r+1)*E/ep) of every sparse layer (its local model, qwen3_config's
// expert_lo / local_experts) and the rest of the model whole. The model's qwen3_ep hook sends
// each token to its experts' owners by the backend's all-to-all (qwen3_ep.c). After the
// backward, the non-expert gradients are summed over t->d (all data-parallel ranks), each
// expert's over the ranks holding it (one per EP group: the "expert replicas", t->erep_group).
// The routing statistics (the aux loss, the aux-free bias) are summed over t->d, as one process
// on the global batch counts them. Checkpoints hold tensors by name in the one-process layout
// (format 4 shards: EP rank r writes its experts, rank 0 also the rest), so a run resumes at
// any EP degree or without EP.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optim/adamw.h"
#include "train/strategy.h"
#include "train/trainer_internal.h"

bool strategy_ep_is_expert(const char *name) {
    return strstr(name, ".mlp.experts.") != NULL;
}

// ---------------------------------------------------------------------------------------------
// The model's all-to-all (qwen3_ep): on the backend, waited with the step's deadline. After a
// failure the rest of the step's exchanges are skipped; the step reports the first error.

static void ep_alltoall(void *ctx, const void *send, const int *scounts, const int *sdispls,
                        void *recv, const int *rcounts, const int *rdispls, int bytes) {
    trainer *t = ctx;
    strategy_ep_state *s = &t->strat.ep;
    if (s->failed) return;
    dist *g = &t->ep_group;
    g->timeout_s = t->d->timeout_s;
    for (int q = 0; q < g->size; q++) {
        s->sc[q] = scounts[q] * bytes, s->sd[q] = sdispls[q] * bytes;
        s->rc[q] = rcounts[q] * bytes, s->rd[q] = rdispls[q] * bytes;
        if (q != g->rank) s->bytes += s->sc[q];
    }
    const ct_comm c = dist_comm(g);
    ct_request *req = NULL;
    ct_backend *be = t->model.be;
    int rc = be->comm_alltoall(be, &c, send, s->sc, s->sd, recv, s->rc, s->rd, CT_COMM_BYTE, &req,
                               &s->err);
    if (rc == 0) rc = dist_wait_requests(g, be, &req, 1, "an expert-parallel all-to-all", &s->err);
    if (rc != 0) s->failed = true;
}

// The describe lines' note on the experts' cut.
static const char *etp_note(const trainer *t) {
    return t->etp > 1 ? ", each cut by TP (expert_tensor_parallel_degree)" : "";
}

static void describe(const trainer *t, char *buf, size_t size) {
    snprintf(buf, size,
             "expert parallel over %d ranks (each holds 1/%d of every sparse layer's experts%s, "
             "tokens sent by all-to-all); replicated non-expert parameters (DDP) over %d, each "
             "expert over %d",
             t->ep, t->ep, etp_note(t),
             t->d->size, t->d->size * t->tp / t->etp / t->ep);
}

// Each layer's kept rows, weights, ids and the expert kernel's state, and the shared buffers.
static int alloc_buffers(trainer *t, ct_error *err) {
    qwen3_model *m = &t->model;
    qwen3_ep *ep = &t->strat.ep.ep;
    ct_backend *be = m->be;
    const qwen3_config *c = &m->cfg;
    const int G = t->ep_group.size, El = c->local_experts, K = c->num_experts_per_tok;
    const int N = t->B * t->T / (ep->shard ? t->tp : 1), C = c->hidden_size;
    const int Fm = c->moe_intermediate_size;
    const int S = N * K, L = m->n_sparse * ep->n_sets; // the kept state: per layer and set
    const int64_t rows = (int64_t)G * N * (K < El ? K : El);
    if (rows * C > INT32_MAX / 4)
        return ct_fail(err,
                       "expert parallelism: %lld rows of %d values may reach one rank, more than "
                       "an all-to-all's int counts hold; lower training.local_batch_size",
                       (long long)rows, C);
    ep->rows_max = (int)rows;
    const int R = ep->rows_max, I = S > R ? S : R;
    const bool bf16 = m->mem_opts.bf16 && m->mem_opts.bf16_experts;
    size_t state = bf16 ? m->ops->moe_bf16_state_floats(R, C, Fm, El, 1)
                        : m->ops->moe_state_floats(R, C, Fm, El, 1);
    size_t scratch = bf16 ? m->ops->moe_bf16_scratch_floats(m->ops, R, C, Fm, El, 1)
                          : m->ops->moe_scratch_floats(R, C, Fm, El, 1);
    if (state == SIZE_MAX || scratch == SIZE_MAX)
        return ct_fail(err, "expert parallelism: the expert kernel cannot plan %d rows", R);
    ep->h_expert = malloc((size_t)S * sizeof(int32_t));
    ep->h_perm = malloc((size_t)S * sizeof(int32_t));
    ep->h_tpos = malloc((size_t)S * sizeof(int32_t));
    ep->h_idx = malloc((size_t)I * sizeof(int32_t));
    ep->h_rperm = malloc((size_t)(R + 1) * sizeof(int32_t));
    ep->h_rcounts = calloc((size_t)L * G * El + 1, sizeof(int));
    ep->scounts = calloc((size_t)G * 6, sizeof(int));
    ep->x_rows = calloc((size_t)L + 1, sizeof(float *));
    ep->w_rows = calloc((size_t)L + 1, sizeof(float *));
    ep->state = calloc((size_t)L + 1, sizeof(float *));
    ep->e_rows = calloc((size_t)L + 1, sizeof(int32_t *));
    ep->n_rows = calloc((size_t)L + 1, sizeof(int));
    strategy_ep_state *s = &t->strat.ep;
    s->sc = calloc((size_t)G * 4, sizeof(int));
    if (!ep->h_expert || !ep->h_perm || !ep->h_tpos || !ep->h_idx || !ep->h_rperm ||
        !ep->h_rcounts || !ep->scounts || !ep->x_rows || !ep->w_rows || !ep->state || !ep->e_rows ||
        !ep->n_rows || !s->sc)
        return ct_fail(err, "expert parallelism: out of memory for the dispatch plan");
    s->sd = s->sc + G, s->rc = s->sd + G, s->rd = s->rc + G;
    ep->sdispls = ep->scounts + G, ep->rcounts = ep->sdispls + G, ep->rdispls = ep->rcounts + G;
    ep->ccounts = ep->rdispls + G, ep->cdispls = ep->ccounts + G;
    for (int q = 0; q < G; q++) ep->ccounts[q] = El, ep->cdispls[q] = q * El;
    const size_t f = sizeof(float);
    if (!(ep->counts_send = be->alloc(be, (size_t)G * El * 4, "the EP counts", err)) ||
        !(ep->counts_recv = be->alloc(be, (size_t)G * El * 4, "the EP counts", err)) ||
        !(ep->idx = be->alloc(be, (size_t)I * 4, "the EP indices", err)) ||
        !(ep->send = be->alloc(be, (size_t)S * C * f, "the EP send rows", err)) ||
        !(ep->sendw = be->alloc(be, (size_t)S * f, "the EP send weights", err)) ||
        !(ep->recv = be->alloc(be, (size_t)R * C * f + f, "the EP received rows", err)) ||
        !(ep->recvw = be->alloc(be, (size_t)R * f + f, "the EP received weights", err)) ||
        !(ep->y = be->alloc(be, (size_t)R * C * f + f, "the EP expert outputs", err)) ||
        !(ep->dw_rows = be->alloc(be, (size_t)R * f + f, "the EP weight gradients", err)) ||
        !(ep->scratch = be->alloc(be, scratch * f + f, "the EP expert scratch", err)))
        return -1;
    for (int l = 0; l < L; l++)
        if (!(ep->x_rows[l] = be->alloc(be, (size_t)R * C * f + f, "the EP layer rows", err)) ||
            !(ep->w_rows[l] = be->alloc(be, (size_t)R * f + f, "the EP layer weights", err)) ||
            !(ep->e_rows[l] = be->alloc(be, (size_t)R * 4 + 4, "the EP layer ids", err)) ||
            !(ep->state[l] = be->alloc(be, state * f + f, "the EP expert state", err)))
            return -1;
    return 0;
}

// The dispatch: the model's qwen3_ep hook over the EP group, and its buffers.
static int dispatch_setup(trainer *t, ct_error *err) {
    qwen3_model *m = &t->model;
    if (!m->ops->moe_ep_gather || !m->ops->moe_ep_combine)
        return ct_fail(err, "op table '%s' has no expert-parallel row moves (moe_ep_*)",
                       m->ops->name ? m->ops->name : "?");
    qwen3_ep *ep = &t->strat.ep.ep;
    // Under TP with etp 1 the group spans the TP ranks, each sending its own sequence shard;
    // with etp = tp each TP rank sends the gathered rows to its TP rank's slices of the experts.
    *ep = (qwen3_ep){.rank = t->ep_group.rank,
                     .size = t->ep_group.size,
                     .shard = t->tp > 1 && t->etp == 1,
                     .alltoall = ep_alltoall,
                     .ctx = t,
                     .n_sets = t->strat.ep.n_sets > 1 ? t->strat.ep.n_sets : 1};
    if (alloc_buffers(t, err) != 0) return -1;
    m->ep = ep;
    const double N = (double)t->B * t->T / (ep->shard ? t->tp : 1), C = m->cfg.hidden_size;
    const double k = m->cfg.num_experts_per_tok, G = t->ep;
    fprintf(t->log,
            "comm: expert parallel over %d ranks, %d experts each; per sparse layer and "
            "micro-batch up to %.2f MiB sent per all-to-all (k*N*C*4*(ep-1)/ep, balanced), 4 "
            "all-to-alls of rows\n",
            t->ep, m->cfg.local_experts, k * N * C * 4 * (G - 1) / G / (1024.0 * 1024.0));
    return 0;
}

static int setup(trainer *t, ct_error *err) {
    qwen3_model *m = &t->model;
    strategy *st = &t->strat;
    if (qwen3_parallelize(&st->plan, &m->cfg, m, err) != 0) return -1;
    if (adamw_init_shard(&t->opt, m->be, m->num_params, 0, m->num_params, err) != 0) return -1;
    for (int i = 0; i < m->n_params; i++) {
        const qwen3_param *p = &m->params[i];
        if (!trainer_param_decays(t, p) &&
            adamw_exclude_decay(&t->opt, p->offset, p->numel, err) != 0)
            return -1;
    }
    if (dispatch_setup(t, err) != 0) return -1;
    fprintf(t->log, "comm: gradients all-reduced after the backward, in float32 (DDP; each "
                    "expert's over the ranks holding it)\n");
    return 0;
}

static void dispatch_free(trainer *t) {
    qwen3_ep *ep = &t->strat.ep.ep;
    ct_backend *be = t->model.be;
    if (be) {
        void *bufs[] = {ep->counts_send, ep->counts_recv, ep->idx, ep->send,    ep->sendw,
                        ep->recv,        ep->recvw,       ep->y,   ep->dw_rows, ep->scratch};
        for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
            if (bufs[i]) be->free(be, bufs[i]);
        for (int l = 0; ep->x_rows && l < t->model.n_sparse * ep->n_sets; l++) {
            if (ep->x_rows[l]) be->free(be, ep->x_rows[l]);
            if (ep->w_rows[l]) be->free(be, ep->w_rows[l]);
            if (ep->e_rows[l]) be->free(be, ep->e_rows[l]);
            if (ep->state[l]) be->free(be, ep->state[l]);
        }
    }
    free(ep->h_expert), free(ep->h_perm), free(ep->h_tpos), free(ep->h_idx), free(ep->h_rperm);
    free(ep->h_rcounts), free(ep->scounts), free(ep->x_rows), free(ep->w_rows), free(ep->state);
    free(ep->e_rows), free(ep->n_rows);
    free(t->strat.ep.sc);
    memset(ep, 0, sizeof *ep);
    t->model.ep = NULL;
}

static void free_(trainer *t) {
    dispatch_free(t);
    qwen3_parallel_plan_free(&t->strat.plan);
}

// The global layout's tensor of the same name as local tensor p (names are global: the experts
// keep their ids).
static const qwen3_param *global_of(const qwen3_model *g, const qwen3_param *p, ct_error *err) {
    const qwen3_param *gp = qwen3_find_param(g, p->name);
    if (!gp) ct_fail(err, "expert parallelism: tensor %s is not in the global layout", p->name);
    return gp;
}

// The one-process init's values for the local tensors starting in [lo, hi): each drawn from its
// stream in the global table.
int strategy_ep_init_range(trainer *t, uint64_t seed, size_t lo, size_t hi, ct_error *err) {
    qwen3_model *m = &t->model, g;
    if (qwen3_init_layout(&g, &t->setup.model, err) != 0) return -1;
    size_t most = 0;
    for (int i = 0; i < m->n_params; i++)
        most = m->params[i].numel > most ? m->params[i].numel : most;
    float *x = malloc(most * sizeof *x + 1);
    int rc = x ? 0 : ct_fail(err, "random init: out of memory");
    for (int i = 0; i < m->n_params && rc == 0; i++) {
        const qwen3_param *p = &m->params[i], *gp = global_of(&g, p, err);
        if (!gp) {
            rc = -1;
            break;
        }
        if (p->offset < lo || p->offset >= hi) continue;
        qwen3_init_tensor(&g, gp, x, seed);
        rc = qwen3_params_write(m, p->name, 0, p->numel, x, err);
    }
    free(x);
    qwen3_free(&g);
    return rc;
}

static int init_random(trainer *t, uint64_t seed, ct_error *err) {
    return strategy_ep_init_range(t, seed, 0, t->model.num_params, err);
}

// An HF folder: this rank's tensors only (its experts among the others').
static int load_hf(trainer *t, hf_load_report *rep, const st_set *set, const char *from,
                   ct_error *err) {
    qwen3_model *m = &t->model;
    memset(rep, 0, sizeof *rep);
    rep->n_files = set->n_files;
    size_t most = 0;
    for (int i = 0; i < m->n_params; i++)
        most = m->params[i].numel > most ? m->params[i].numel : most;
    float *x = malloc(most * sizeof *x + 1);
    int rc = x ? 0 : ct_fail(err, "%s: out of memory", from);
    for (int i = 0; i < m->n_params && rc == 0; i++) {
        const qwen3_param *p = &m->params[i];
        const st_tensor *st = st_set_find(set, p->name);
        if (!st) {
            if (p->buffer) continue;
            rc = ct_fail(err, "%s: tensor \"%s\" is missing", from, p->name);
            break;
        }
        const int64_t n = st->ndim == 2 ? st->shape[0] * st->shape[1] : st->shape[0];
        if (st->ndim != p->ndim || (uint64_t)n != p->numel) {
            rc = ct_fail(err, "%s: tensor \"%s\" has %lld elements; the model's has %zu", from,
                         p->name, (long long)n, p->numel);
            break;
        }
        rc = st_tensor_range_to_f32(x, st, 0, p->numel, err);
        if (rc == 0) rc = qwen3_params_write(m, p->name, 0, p->numel, x, err);
        if (rc == 0 && rep->n_loaded++ == 0) rep->source_dtype = st->dtype;
    }
    free(x);
    return rc != 0 ? ct_wrap(err, "%s", from) : 0;
}

// ---------------------------------------------------------------------------------------------
// Checkpoints: the one-process layout's ranges. EP rank r holds (and loads) each of its tensors
// whole at the global tensor's range; it saves its experts, rank 0 also every other tensor.

strategy_keep_fn strategy_ep_saves(int r) {
    return r != 0 ? strategy_ep_is_expert : NULL;
}

// The ranks holding the same experts (t->erep_group) hold the same local model, bit for bit.
int strategy_ep_check_replicas(trainer *t, ct_error *err) {
    dist *e = &t->erep_group;
    if (e->size == 1) return 0;
    uint64_t mine = qwen3_params_hash(&t->model);
    uint64_t *all = malloc((size_t)e->size * sizeof *all);
    if (!all) return ct_fail(err, "out of memory");
    int rc = dist_allgather(e, &mine, all, sizeof mine, "the weights' checksums", err);
    for (int r = 1; rc == 0 && r < e->size; r++)
        if (all[r] != all[0])
            rc = ct_fail(err,
                         "at step %lld the expert replica %d of EP rank %d differs from replica 0 "
                         "(XXH64 %016llx vs %016llx): refusing to save",
                         (long long)t->state.step, r, t->ep_group.rank, (unsigned long long)all[r],
                         (unsigned long long)all[0]);
    free(all);
    return rc;
}

// EP rank r of the first replica: its experts (rank 0 every tensor), weights and moments.
static int write_shard(trainer *t, const qwen3_model *g, const char *tmp, int r, int P,
                       ckpt_shard_info info[2], ct_error *err) {
    float *src[3];
    int rc = strategy_local_state(t, false, src, err);
    if (rc == 0)
        rc = trainer_write_named_shard(t, g, tmp, src, strategy_ep_saves(r), r, P, info, err);
    strategy_local_state_free(t, false, src);
    return rc;
}

static int save_checkpoint(trainer *t, ct_error *err) {
    dist *grp = &t->ep_group;
    const int P = grp->size;
    const int64_t step = t->state.step;
    grp->timeout_s = t->erep_group.timeout_s = t->d->timeout_s;
    int rc = strategy_ep_check_replicas(t, err);
    if (rc == 0 && is_root(t)) rc = ckpt_begin(t->ckpt_root, step, t->save_tag, err);
    if (dist_agree(t->d, rc, "starting the checkpoint", err) != 0) return -1;
    qwen3_model g, layout;
    if (qwen3_init_layout(&g, &t->setup.model, err) != 0) return -1;
    trainer_shards sh;
    rc = trainer_shards_begin(t, &sh, P, err);
    // Rank 0 lists every shard's ranges: EP rank q's local layout, made here.
    for (int q = 0; rc == 0 && is_root(t) && q < P; q++) {
        qwen3_config lc = t->model.cfg;
        lc.expert_lo = q * lc.local_experts;
        if (qwen3_init_layout(&layout, &lc, err) != 0) {
            rc = -1;
            break;
        }
        if ((sh.n_of[q] = trainer_named_ranges(&g, &layout, strategy_ep_saves(q), &sh.of[q], err)) < 0) rc = -1;
        qwen3_free(&layout);
    }
    rc = dist_agree(t->d, rc, "the EP checkpoint's ranges", err);
    if (rc == 0 && t->erep_group.rank == 0)
        rc = write_shard(t, &g, sh.tmp, grp->rank, P, sh.mine, err);
    rc = trainer_shards_end(t, &sh, rc, t->d, grp, &g, ", one per EP rank", err);
    qwen3_free(&g);
    return rc;
}

// ---------------------------------------------------------------------------------------------
// The step.

static void weights_ready(trainer *t) {
    qwen3_refresh_bf16(&t->model);
}

static void begin_step(trainer *t) {
    t->strat.ep.failed = false;
    qwen3_zero_grad(&t->model);
}

static void begin_micro(trainer *t, bool last) {
    (void)t, (void)last;
}

static void unit_ready(void *ctx, int unit, int event) {
    (void)ctx, (void)unit, (void)event;
}

// The runs of consecutive tensors of one kind (experts or not), in layout order:
// fn(t, lo, hi, expert).
typedef int (*run_fn)(trainer *t, size_t lo, size_t hi, bool expert, void *ctx, ct_error *err);

static int each_run(trainer *t, run_fn fn, void *ctx, ct_error *err) {
    const qwen3_model *m = &t->model;
    size_t lo = 0;
    for (int i = 0; i < m->n_params; i++) {
        const bool x = strategy_ep_is_expert(m->params[i].name);
        const bool end = i + 1 == m->n_params || strategy_ep_is_expert(m->params[i + 1].name) != x;
        if (!end) continue;
        const size_t hi = m->params[i].offset + m->params[i].numel;
        if (fn(t, lo, hi, x, ctx, err) != 0) return -1;
        lo = hi;
    }
    return 0;
}

static int reduce_run(trainer *t, size_t lo, size_t hi, bool expert, void *ctx, ct_error *err) {
    (void)ctx;
    dist *g = expert ? &t->erep_group : t->d;
    if (g->size == 1) return 0;
    g->timeout_s = t->d->timeout_s;
    ct_backend *be = t->model.be;
    const ct_comm c = dist_comm(g);
    ct_request *req = NULL;
    int rc =
        be->comm_allreduce(be, &c, t->model.grad_mem + lo, (int)(hi - lo), CT_COMM_F32, &req, err);
    if (rc == 0)
        rc = dist_wait_requests(
            g, be, &req, 1, expert ? "the experts' gradient all-reduce" : "the gradient all-reduce",
            err);
    return rc;
}

// The exchanges' first failure, then the gradients summed: the non-expert ones over every
// data-parallel rank, the experts' over their replicas.
static int grads_final(trainer *t, ct_error *err) {
    if (t->strat.ep.failed) {
        *err = t->strat.ep.err;
        return -1;
    }
    return each_run(t, reduce_run, NULL, err);
}

static int square_run(trainer *t, size_t lo, size_t hi, bool expert, void *ctx, ct_error *err) {
    (void)err;
    double *sq = ctx, x;
    t->model.ops->sum_squares(&x, t->model.grad_mem + lo, hi - lo);
    sq[expert] += x;
    return 0;
}

// The non-expert squares (the same on every rank) once, the experts' summed over the EP group.
static int grad_sq(trainer *t, double *sq, ct_error *err) {
    double part[2] = {0, 0};
    each_run(t, square_run, part, err);
    if (dist_sum(&t->ep_group, part[1], &part[1], "the gradient norm", err) != 0) return -1;
    *sq = part[0] + part[1];
    return 0;
}

static strategy_shard shard(trainer *t) {
    qwen3_model *m = &t->model;
    return (strategy_shard){m->param_mem, m->grad_mem, m->param_bf16};
}

static int after_update(trainer *t, ct_error *err) {
    (void)t, (void)err;
    return 0;
}

static void after_eval(trainer *t) {
    (void)t;
}

static void take_comm(trainer *t, double *exposed, double *hidden) {
    (void)t;
    *exposed = *hidden = 0;
}

const strategy_vt strategy_ep = {.describe = describe,
                                 .memory_note = " (EP: this rank's experts)",
                                 .optimizer_sharded = false,
                                 .setup = setup,
                                 .free = free_,
                                 .init_random = init_random,
                                 .load_sharded = trainer_load_model_by_name,
                                 .load_hf = load_hf,
                                 .weights_ready = weights_ready,
                                 .begin_step = begin_step,
                                 .begin_micro = begin_micro,
                                 .unit_ready = unit_ready,
                                 .grads_final = grads_final,
                                 .grad_sq = grad_sq,
                                 .shard = shard,
                                 .after_update = after_update,
                                 .after_eval = after_eval,
                                 .take_comm = take_comm,
                                 .load_checkpoint = trainer_load_by_name,
                                 .save_checkpoint = save_checkpoint,
                                 .model_in_shards = false,
                                 .export_hf = strategy_ep_export,
                                 .export_from = "experts' EP ranks and the rest"};

// ---------------------------------------------------------------------------------------------
// EP beside FSDP (torchtitan's dp2ep): the EP groups are consecutive ranks of the shard group;
// strategy_fsdp keeps the weights (a sparse layer's experts cut over the shard ranks holding
// the same ones, everything else over all of them, its checkpoints in the one-process layout),
// this file the dispatch.

static void fsdp_describe(const trainer *t, char *buf, size_t size) {
    snprintf(buf, size,
             "expert parallel over %d ranks (each holds 1/%d of every sparse layer's experts%s, "
             "tokens sent by all-to-all) inside FSDP over %d ranks%s: the experts sharded over "
             "the %d holding the same ones, the rest over all %d",
             t->ep, t->ep, etp_note(t), t->shard_degree,
             t->d->size / t->shard_degree > 1 ? ", in each of the replica groups (HSDP)" : "",
             t->shard_degree * t->tp / t->etp / t->ep, t->shard_degree);
}

static int fsdp_setup(trainer *t, ct_error *err) {
    if (strategy_fsdp.setup(t, err) != 0) return -1;
    return dispatch_setup(t, err);
}

static void fsdp_free_(trainer *t) {
    dispatch_free(t);
    strategy_fsdp.free(t);
}

static void with_fsdp_begin_step(trainer *t) {
    t->strat.ep.failed = false;
    strategy_fsdp.begin_step(t);
}

static int fsdp_grads_final(trainer *t, ct_error *err) {
    if (t->strat.ep.failed) {
        *err = t->strat.ep.err;
        return -1;
    }
    return strategy_fsdp.grads_final(t, err);
}

// strategy_fsdp's table (its functions are not visible here) with the entries above: filled at
// the first call.
const strategy_vt *strategy_ep_fsdp(void) {
    static strategy_vt vt;
    if (!vt.setup) {
        vt = strategy_fsdp;
        vt.describe = fsdp_describe;
        vt.memory_note = " (FSDP shard, EP: this rank's experts)";
        vt.setup = fsdp_setup;
        vt.free = fsdp_free_;
        vt.begin_step = with_fsdp_begin_step;
        vt.grads_final = fsdp_grads_final;
    }
    return &vt;
}

// ---------------------------------------------------------------------------------------------
// The final HF export, streamed: world rank 0 writes the one-process folder; for an expert held
// by another EP rank it names the tensor to its EP group, and the owner broadcasts it. Only the
// first replica's EP group takes part.

typedef struct ep_export {
    trainer *t;
    const qwen3_model *g;
    int cur;
    float *full;
    const float *local; // this rank's weights (a host view)
} ep_export;

int strategy_ep_owner(const trainer *t, const char *name) {
    int layer, e;
    if (sscanf(name, "model.layers.%d.mlp.experts.%d.", &layer, &e) != 2) return -1;
    return e / t->model.cfg.local_experts;
}

int strategy_ep_fetch_expert(trainer *t, const qwen3_param *gp, const float *local, float *full,
                             ct_error *err) {
    const qwen3_model *m = &t->model;
    const int owner = strategy_ep_owner(t, gp->name);
    if (owner < 0) return ct_fail(err, "the EP export: %s is not an expert", gp->name);
    if (owner == t->ep_group.rank) {
        const qwen3_param *p = qwen3_find_param(m, gp->name);
        if (!p) return ct_fail(err, "the EP export: this rank lacks %s", gp->name);
        memcpy(full, local + p->offset, p->numel * sizeof *full);
    }
    return dist_bcast(&t->ep_group, full, gp->numel * sizeof(float), owner,
                      "the EP export's expert", err);
}

// Every rank of the group: global tensor i from its owner into x->full.
static int fetch_tensor(ep_export *x, int i, ct_error *err) {
    return strategy_ep_fetch_expert(x->t, &x->g->params[i], x->local, x->full, err);
}

static int read_full(float *dst, uint64_t lo, uint64_t n, void *ctx, ct_error *err) {
    ep_export *x = ctx;
    const qwen3_param *gp = qwen3_param_at(x->g, lo);
    const qwen3_param *p = qwen3_find_param(&x->t->model, gp->name);
    if (p) {
        memcpy(dst, x->local + p->offset + (lo - gp->offset), n * sizeof *dst);
        return 0;
    }
    int i = (int)(gp - x->g->params);
    if (i != x->cur) {
        if (dist_bcast(&x->t->ep_group, &i, sizeof i, 0, "the EP export's next tensor", err) != 0 ||
            fetch_tensor(x, i, err) != 0)
            return -1;
        x->cur = i;
    }
    memcpy(dst, x->full + (lo - gp->offset), n * sizeof *dst);
    return 0;
}

int strategy_ep_export(trainer *t, const char *dir, ct_dtype dtype, ct_error *err) {
    qwen3_model *m = &t->model, g;
    dist *grp = &t->ep_group;
    if (t->erep_group.rank != 0) return 0;
    if (qwen3_init_layout(&g, &t->setup.model, err) != 0) return -1;
    float *local = qwen3_params_view(m, true, err);
    size_t most = 0;
    for (int i = 0; i < g.n_params; i++) most = g.params[i].numel > most ? g.params[i].numel : most;
    ep_export x = {t, &g, -1, malloc(most * sizeof(float) + 1), local};
    int rc = local && x.full ? 0 : ct_fail(err, "the EP export: out of memory");
    grp->timeout_s = t->d->timeout_s;
    rc = dist_agree(grp, rc, "the EP export's buffers", err);
    if (rc == 0 && grp->rank == 0) {
        rc = ckpt_export_hf_from(&g, dir, dtype, 5000000000ull, t->cfg->model.tokenizer_path,
                                 read_full, &x, err);
        int done = -1;
        ct_error ignored;
        if (dist_bcast(grp, &done, sizeof done, 0, "the EP export's end", &ignored) != 0 && rc >= 0)
            rc = -1, *err = ignored;
    } else if (rc == 0) {
        for (int i; rc == 0;) {
            rc = dist_bcast(grp, &i, sizeof i, 0, "the EP export's next tensor", err);
            if (rc == 0 && i < 0) break;
            if (rc == 0) rc = fetch_tensor(&x, i, err);
        }
    }
    if (local) qwen3_params_view_release(m, local, false);
    free(x.full);
    qwen3_free(&g);
    return rc;
}
