// Tensor parallelism with sequence parallelism (torchtitan's parallelize_qwen3, dense and MoE
// without EP): each rank of a TP group holds the local model of qwen3_tp_config (its heads, MLP
// width, experts' width and vocabulary rows) and runs the model's qwen3_tp hook with the
// backend's collectives on the group. Data parallelism over the other ranks (t->d) is another
// strategy's on the local model: replicate (DDP), or FSDP/HSDP (2D/3D: each rank's TP-sliced
// model sharded over its DP-shard group; the TP peers of a rank hold the same local layout, so
// the same shard ranges). The replicated tensors (norms, q/k norms, o_proj's bias, the MoE
// router) have partial gradients on each rank: summed over the group after the data-parallel
// reduction (under FSDP on the shards' pieces of them). The MoE expert bias is a buffer, left
// out of that sum: every rank updates it alike from the same routing statistics, which the
// balance component sums over t->d (the DP group) only, since every rank of a TP group routes
// the same gathered rows. The norm counts every sharded tensor's shards once and each
// replicated tensor once, so clipping equals one process's.
#include <stdlib.h>
#include <string.h>

#include "model/qwen3_parallelize.h"
#include "train/strategy.h"
#include "train/trainer_internal.h"

// ---------------------------------------------------------------------------------------------
// The model's collectives (qwen3_tp): started on the backend and waited with the group's
// deadline (the trainer's current one). After a failure the rest of the step's collectives are
// skipped; the peers then fail at their deadline, and the step reports the first error.

static bool tp_start(trainer *t) {
    strategy_tp_state *s = &t->strat.tp;
    s->group->timeout_s = t->d->timeout_s;
    return !s->failed;
}

static void tp_wait(trainer *t, int rc, ct_request *req, const char *what) {
    strategy_tp_state *s = &t->strat.tp;
    if (rc == 0) rc = dist_wait_requests(s->group, t->model.be, &req, 1, what, &s->err);
    if (rc != 0) s->failed = true;
}

static void tp_gather(void *ctx, float *buf, size_t n) {
    trainer *t = ctx;
    if (!tp_start(t)) return;
    const dist *g = t->strat.tp.group;
    int counts[g->size], displs[g->size];
    for (int r = 0; r < g->size; r++) counts[r] = (int)n, displs[r] = r * (int)n;
    const ct_comm c = dist_comm(g);
    ct_request *req = NULL;
    int rc = t->model.be->comm_allgather(t->model.be, &c, buf, counts, displs, CT_COMM_F32, &req,
                                         &t->strat.tp.err);
    tp_wait(t, rc, req, "a tensor-parallel all-gather");
}

static void tp_reduce_scatter(void *ctx, float *buf, size_t n) {
    trainer *t = ctx;
    if (!tp_start(t)) return;
    const dist *g = t->strat.tp.group;
    int counts[g->size];
    for (int r = 0; r < g->size; r++) counts[r] = (int)n;
    const ct_comm c = dist_comm(g);
    ct_request *req = NULL;
    int rc = t->model.be->comm_reduce_scatter(t->model.be, &c, buf, counts, CT_COMM_F32, &req,
                                              &t->strat.tp.err);
    tp_wait(t, rc, req, "a tensor-parallel reduce-scatter");
}

static void tp_allreduce(void *ctx, float *buf, size_t n) {
    trainer *t = ctx;
    if (!tp_start(t)) return;
    const ct_comm c = dist_comm(t->strat.tp.group);
    ct_request *req = NULL;
    int rc = t->model.be->comm_allreduce(t->model.be, &c, buf, (int)n, CT_COMM_F32, &req,
                                         &t->strat.tp.err);
    tp_wait(t, rc, req, "a tensor-parallel all-reduce");
}

// ---------------------------------------------------------------------------------------------

// The data-parallel strategy under TP (ZeRO-1 is refused in trainer_setup.c): known from the
// config alone, before setup (the memory estimate).
static const strategy_vt *dp_of(const trainer *t) {
    return t->shard_degree > 1 ? &strategy_fsdp : &strategy_replicate;
}

static bool fsdp_on(const trainer *t) {
    return dp_of(t) == &strategy_fsdp;
}

static void describe(const trainer *t, char *buf, size_t size) {
    char dp[256];
    dp_of(t)->describe(t, dp, sizeof dp);
    snprintf(buf, size,
             "tensor parallel over %d ranks with sequence parallelism and loss parallel; %s over "
             "%d",
             t->tp, dp, t->d->size);
}

// The memory estimate under TP: this rank's local model (its 1/tp of every cut tensor, the
// replicated ones whole) for the weights, gradients and AdamW's moments; its activations with
// the sequence-parallel buffers at N / tp rows and the gathered GEMM inputs at N; the loss
// parallel's own buffers (ids, targets, each row's max per rank and two sums). Under FSDP,
// FSDP's shares of that local model.
static int estimate(const trainer *t, run_memory *mem, ct_error *err) {
    qwen3_config local;
    if (qwen3_tp_config(&local, &t->setup.model, t->tp, err) != 0) return -1;
    qwen3_memory_opts o = t->setup.mem_opts;
    o.sp = t->tp;
    const double N = (double)t->B * t->T;
    mem->model = qwen3_memory_plan_ops(&local, &t->setup.ops, t->B, t->T, &o);
    mem->model.activations += (size_t)(2 * N * sizeof(int32_t) + (t->tp + 2) * N * sizeof(float));
    mem->optimizer = 2.0 * (double)mem->model.params;
    mem->total = (double)mem->model.params + mem->model.weights_bf16 + mem->model.grads +
                 mem->optimizer + mem->model.activations + mem->batch;
    mem->node = mem->total * mem->ranks_per_node;
    fprintf(t->log,
            "memory, TP: this rank's 1/%d of the cut tensors (and every replicated one) %.3f GiB "
            "of weights; activations with sequence parallelism %.2f MiB\n",
            t->tp, mem->model.params / GIB, mem->model.activations / (1024.0 * 1024.0));
    return fsdp_on(t) ? strategy_fsdp_estimate_of(t, &local, mem, err) : 0;
}

static int setup(trainer *t, ct_error *err) {
    if (t->model.mem_opts.sp != t->tp)
        return ct_fail(err, "tensor parallelism: the model was planned for sequence parallelism "
                            "over %d ranks, not %d",
                       t->model.mem_opts.sp, t->tp);
    t->strat.tp.dp = dp_of(t);
    if (t->strat.tp.dp->setup(t, err) != 0) return -1;
    qwen3_model *m = &t->model;
    strategy_tp_state *s = &t->strat.tp;
    const size_t N = (size_t)t->B * t->T;
    s->group = &t->tp_group;
    qwen3_tp *tp = &s->tp;
    *tp = (qwen3_tp){.rank = s->group->rank,
                     .size = s->group->size,
                     .vocab_lo = s->group->rank * m->cfg.vocab_size,
                     .vocab_total = t->setup.model.vocab_size,
                     .gather = tp_gather,
                     .reduce_scatter = tp_reduce_scatter,
                     .allreduce = tp_allreduce,
                     .ctx = t};
    tp->host_ids = malloc(N * sizeof *tp->host_ids);
    tp->host_targets = malloc(N * sizeof *tp->host_targets);
    if (!tp->host_ids || !tp->host_targets) return ct_fail(err, "out of memory for the TP ids");
    ct_backend *be = m->be;
    if (!(tp->ids = be->alloc(be, N * sizeof(int32_t), "the TP ids", err)) ||
        !(tp->targets = be->alloc(be, N * sizeof(int32_t), "the TP targets", err)) ||
        !(tp->ce_max = be->alloc(be, N * tp->size * sizeof(float), "the TP loss maxes", err)) ||
        !(tp->ce_sums = be->alloc(be, 2 * N * sizeof(float), "the TP loss sums", err)))
        return -1;
    if (!m->ops->cross_entropy_tp_max || !m->ops->cross_entropy_tp_sums ||
        !m->ops->cross_entropy_tp_finish)
        return ct_fail(err, "op table '%s' has no loss-parallel cross-entropy (cross_entropy_tp_*)",
                       m->ops->name ? m->ops->name : "?");
    m->tp = tp;
    return 0;
}

static void free_(trainer *t) {
    qwen3_tp *tp = &t->strat.tp.tp;
    ct_backend *be = t->model.be;
    if (be) {
        if (tp->ids) be->free(be, tp->ids);
        if (tp->targets) be->free(be, tp->targets);
        if (tp->ce_max) be->free(be, tp->ce_max);
        if (tp->ce_sums) be->free(be, tp->ce_sums);
    }
    free(tp->host_ids);
    free(tp->host_targets);
    memset(tp, 0, sizeof *tp);
    t->model.tp = NULL;
    if (t->strat.tp.dp) t->strat.tp.dp->free(t);
}

// Rank r's slice of the global tensor `full` (gshape) as the local tensor p holds it, into out.
static void take_slice(float *out, const float *full, const int64_t gshape[2],
                       const qwen3_param *p, int r) {
    switch (qwen3_tp_cut_of(p->name)) {
    case QWEN3_TP_WHOLE:
        memcpy(out, full, p->numel * sizeof *out);
        break;
    case QWEN3_TP_ROWS: // rows [r*rows, (r+1)*rows): contiguous
        memcpy(out, full + (size_t)r * p->numel, p->numel * sizeof *out);
        break;
    case QWEN3_TP_COLUMNS: // columns [r*cols, (r+1)*cols) of every row
        for (int64_t i = 0; i < p->shape[0]; i++)
            memcpy(out + i * p->shape[1], full + i * gshape[1] + (int64_t)r * p->shape[1],
                   (size_t)p->shape[1] * sizeof *out);
        break;
    }
}

// The one-process init's values: each global tensor drawn from its own stream (its index in
// the global table, which orders tensors as the local one), this rank's slice kept.
static int init_random(trainer *t, uint64_t seed, ct_error *err) {
    qwen3_model *m = &t->model, g;
    if (qwen3_init_layout(&g, &t->setup.model, err) != 0) return -1;
    size_t most = 0;
    for (int i = 0; i < g.n_params; i++) most = g.params[i].numel > most ? g.params[i].numel : most;
    float *full = malloc(most * sizeof *full), *mine = malloc(most * sizeof *mine);
    int rc = full && mine ? 0 : ct_fail(err, "random init: out of memory");
    for (int i = 0; i < m->n_params && rc == 0; i++) {
        const qwen3_param *p = &m->params[i];
        qwen3_init_tensor(&g, &g.params[i], full, seed);
        take_slice(mine, full, g.params[i].shape, p, t->strat.tp.group->rank);
        rc = qwen3_params_write(m, p->name, 0, p->numel, mine, err);
    }
    free(full);
    free(mine);
    qwen3_free(&g);
    if (rc == 0 && fsdp_on(t)) strategy_fsdp_take_all(t);
    return rc;
}

// An HF folder: only this rank's slice of each tensor is read (a row cut is one range, a
// column cut one range per row).
static int load_hf(trainer *t, hf_load_report *rep, const st_set *set, const char *from,
                   ct_error *err) {
    qwen3_model *m = &t->model;
    const int r = t->strat.tp.group->rank;
    memset(rep, 0, sizeof *rep);
    rep->n_files = set->n_files;
    size_t most = 0;
    for (int i = 0; i < m->n_params; i++) most = m->params[i].numel > most ? m->params[i].numel : most;
    float *mine = malloc(most * sizeof *mine);
    if (!mine) return ct_fail(err, "%s: out of memory", from);
    int rc = 0;
    for (int i = 0; i < m->n_params && rc == 0; i++) {
        const qwen3_param *p = &m->params[i];
        const st_tensor *st = st_set_find(set, p->name);
        if (!st) {
            if (p->buffer) continue;
            rc = ct_fail(err, "%s: tensor \"%s\" is missing", from, p->name);
            break;
        }
        const qwen3_tp_cut cut = qwen3_tp_cut_of(p->name);
        const int64_t rows = p->shape[0], cols = p->ndim == 2 ? p->shape[1] : 1;
        const int64_t grows = st->shape[0], gcols = st->ndim == 2 ? st->shape[1] : 1;
        const bool fits = st->ndim == p->ndim &&
                          (cut == QWEN3_TP_WHOLE     ? grows == rows && gcols == cols
                           : cut == QWEN3_TP_ROWS    ? grows == rows * t->tp && gcols == cols
                                                     : grows == rows && gcols == cols * t->tp);
        if (!fits) {
            rc = ct_fail(err, "%s: tensor \"%s\" does not have the shape this model's tensor "
                              "parallel slice comes from",
                         from, p->name);
            break;
        }
        if (cut == QWEN3_TP_COLUMNS) {
            for (int64_t i2 = 0; i2 < rows && rc == 0; i2++)
                rc = st_tensor_range_to_f32(mine + i2 * cols, st,
                                            (uint64_t)(i2 * gcols + (int64_t)r * cols),
                                            (uint64_t)cols, err);
        } else {
            const uint64_t first = cut == QWEN3_TP_ROWS ? (uint64_t)r * p->numel : 0;
            rc = st_tensor_range_to_f32(mine, st, first, p->numel, err);
        }
        if (rc == 0) rc = qwen3_params_write(m, p->name, 0, p->numel, mine, err);
        if (rc == 0 && rep->n_loaded++ == 0) rep->source_dtype = st->dtype;
    }
    free(mine);
    if (rc == 0 && fsdp_on(t)) strategy_fsdp_take_all(t);
    return rc != 0 ? ct_wrap(err, "%s", from) : 0;
}

static int load_sharded(trainer *t, const char *dir, ct_error *err) {
    (void)t, (void)dir;
    return ct_fail(err, "parallelism.tensor_parallel_degree > 1: loading a checkpoint's model "
                        "shards is not supported under tensor parallelism yet");
}

static int load_checkpoint(trainer *t, const char *dir, float *moments[2], ct_error *err) {
    (void)t, (void)dir, (void)moments;
    return ct_fail(err, "parallelism.tensor_parallel_degree > 1: checkpoints are not supported "
                        "under tensor parallelism yet");
}

static int save_checkpoint(trainer *t, ct_error *err) {
    return load_checkpoint(t, NULL, NULL, err);
}

static void begin_step(trainer *t) {
    t->strat.tp.failed = false;
    t->strat.tp.dp->begin_step(t);
}

// Each tensor's elements among the gradients this rank's optimizer steps (the whole local
// model, or under FSDP its shard's pieces): fn(ctx, grads, count, replicated).
typedef void (*grad_range_fn)(trainer *t, float *g, size_t n, bool whole, void *ctx);

static void each_grad_range(trainer *t, grad_range_fn fn, void *ctx) {
    qwen3_model *m = &t->model;
    const fsdp *f = &t->strat.fsdp;
    for (int i = 0; i < m->n_params; i++) {
        const qwen3_param *p = &m->params[i];
        const bool whole = qwen3_tp_cut_of(p->name) == QWEN3_TP_WHOLE;
        if (!fsdp_on(t)) {
            fn(t, m->grad_mem + p->offset, p->numel, whole, ctx);
            continue;
        }
        for (int u = 0; u < f->n_units; u++) {
            const fsdp_unit *x = &f->units[u];
            const size_t lo = p->offset > x->piece_lo ? p->offset : x->piece_lo;
            const size_t hi =
                p->offset + p->numel < x->piece_hi ? p->offset + p->numel : x->piece_hi;
            if (lo < hi) fn(t, f->shard_grads + x->at + (lo - x->piece_lo), hi - lo, whole, ctx);
        }
    }
}

static void sum_whole(trainer *t, float *g, size_t n, bool whole, void *ctx) {
    (void)ctx;
    if (whole) tp_allreduce(t, g, n);
}

// After the data-parallel reduction: the replicated tensors' partial gradients summed over the
// group (each rank saw its sequence shard, or its heads). Under FSDP, on this rank's pieces:
// its TP peers hold the same pieces of the same local layout.
static int grads_final(trainer *t, ct_error *err) {
    strategy_tp_state *s = &t->strat.tp;
    if (s->dp->grads_final(t, err) != 0) return -1;
    each_grad_range(t, sum_whole, NULL);
    if (s->failed) {
        *err = s->err;
        return -1;
    }
    return 0;
}

static void add_squares(trainer *t, float *g, size_t n, bool whole, void *ctx) {
    double *sq = ctx, x;
    t->model.ops->sum_squares(&x, g, n);
    sq[whole] += x;
}

// Sharded tensors: this rank's squares summed over the group; replicated ones once; under
// FSDP, then summed over the shard group (each rank its pieces).
static int grad_sq(trainer *t, double *sq, ct_error *err) {
    double part[2] = {0, 0}; // sharded, whole
    each_grad_range(t, add_squares, part);
    if (dist_sum(t->strat.tp.group, part[0], &part[0], "the gradient norm", err) != 0) return -1;
    *sq = part[0] + part[1];
    if (fsdp_on(t)) return dist_sum(&t->strat.fsdp.shard, *sq, sq, "the gradient norm", err);
    return 0;
}

// The rest is the data-parallel strategy's over t->d.
static void weights_ready(trainer *t) {
    t->strat.tp.dp->weights_ready(t);
}
static void begin_micro(trainer *t, bool last) {
    t->strat.tp.dp->begin_micro(t, last);
}
static void unit_ready(void *ctx, int unit, int event) {
    ((trainer *)ctx)->strat.tp.dp->unit_ready(ctx, unit, event);
}
static strategy_shard shard(trainer *t) {
    return t->strat.tp.dp->shard(t);
}
static int after_update(trainer *t, ct_error *err) {
    return t->strat.tp.dp->after_update(t, err);
}
static void after_eval(trainer *t) {
    t->strat.tp.dp->after_eval(t);
}
static void take_comm(trainer *t, double *exposed, double *hidden) {
    t->strat.tp.dp->take_comm(t, exposed, hidden);
}

const strategy_vt strategy_tp = {
    .describe = describe, .memory_note = " (TP shares)", .optimizer_sharded = false,
    .estimate = estimate, .setup = setup,
    .free = free_, .init_random = init_random, .load_sharded = load_sharded, .load_hf = load_hf,
    .weights_ready = weights_ready, .begin_step = begin_step, .begin_micro = begin_micro,
    .unit_ready = unit_ready, .grads_final = grads_final, .grad_sq = grad_sq, .shard = shard,
    .after_update = after_update, .after_eval = after_eval, .take_comm = take_comm,
    .load_checkpoint = load_checkpoint, .save_checkpoint = save_checkpoint,
    .model_in_shards = false};

// ---------------------------------------------------------------------------------------------
// The final HF export (checkpoint.last_save_in_hf): every TP group assembles the global tensors
// from its ranks' slices (host all-gathers, tensor by tensor) into the global layout; world rank
// 0 writes them, the same files one process writes for the same weights.

typedef struct tp_export {
    const float *full;
} tp_export;

static int read_full(float *dst, uint64_t lo, uint64_t n, void *ctx, ct_error *err) {
    (void)err;
    memcpy(dst, ((const tp_export *)ctx)->full + lo, n * sizeof *dst);
    return 0;
}

int strategy_tp_export(trainer *t, const char *dir, ct_dtype dtype, ct_error *err) {
    qwen3_model *m = &t->model, g;
    dist *grp = t->strat.tp.group;
    const int P = grp->size;
    if (qwen3_init_layout(&g, &t->setup.model, err) != 0) return -1;
    size_t most = 0;
    for (int i = 0; i < m->n_params; i++) most = m->params[i].numel > most ? m->params[i].numel : most;
    float *full = malloc(g.num_params * sizeof *full), *all = malloc(most * P * sizeof *all);
    // The local model: the full buffer, or under FSDP assembled from the shard group's pieces.
    float *local = fsdp_on(t) ? malloc(m->num_params * sizeof *local)
                              : qwen3_params_view(m, true, err);
    int rc = full && all && local ? 0 : ct_fail(err, "the TP export: out of memory");
    if (rc == 0 && fsdp_on(t)) rc = strategy_fsdp_gather_weights(t, local, err);
    for (int i = 0; i < m->n_params && rc == 0; i++) {
        const qwen3_param *p = &m->params[i], *gp = &g.params[i];
        rc = dist_allgather(grp, local + p->offset, all, (int)(p->numel * sizeof(float)),
                            "the TP export", err);
        float *out = full + gp->offset;
        switch (qwen3_tp_cut_of(p->name)) {
        case QWEN3_TP_WHOLE:
            memcpy(out, all, p->numel * sizeof *out);
            break;
        case QWEN3_TP_ROWS:
            memcpy(out, all, p->numel * P * sizeof *out);
            break;
        case QWEN3_TP_COLUMNS:
            for (int r = 0; r < P; r++)
                for (int64_t row = 0; row < p->shape[0]; row++)
                    memcpy(out + row * gp->shape[1] + r * p->shape[1],
                           all + r * p->numel + row * p->shape[1],
                           (size_t)p->shape[1] * sizeof *out);
            break;
        }
    }
    if (local && fsdp_on(t))
        free(local);
    else if (local)
        qwen3_params_view_release(m, local, false);
    tp_export ctx = {full};
    if (rc == 0 && is_root(t))
        rc = hf_save_folder_from(&g, dir, dtype, 5000000000ull, false, read_full, &ctx, err);
    free(full);
    free(all);
    qwen3_free(&g);
    return rc;
}
