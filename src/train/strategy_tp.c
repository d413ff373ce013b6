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
// With expert parallelism (expert_tensor_parallel_degree 1, torchtitan's default), the
// data-parallel strategy is strategy_ep (DDP for the rest): its EP groups are ep consecutive ranks
// of the world (under PP of the stage's ranks), TP groups whole, so the experts are not cut by TP
// (QWEN3_TP_EXPERT: an EP rank holds its experts whole, their gradients summed over the expert
// replicas only) and each rank's sparse layers route and dispatch its own sequence shard
// (qwen3_ep.shard). With expert_tensor_parallel_degree = tp (torchtitan's ExpertTensorParallel) the
// EP groups are ep consecutive ranks of t->d (one TP rank's), each expert is cut by TP as the dense
// MLP (gate/up by rows, down by columns) and the sparse layers run as under TP alone (the gathered
// rows routed alike on every TP rank, the experts' partial sums reduce-scattered onto the shards),
// the dispatch over the EP group in between; the experts' gradients are summed over the expert
// replicas only, their squares over the EP and TP groups. Checkpoints are the first EP block's
// shards (ep_block: the first EP group, with etp = tp its TP peers too), one per rank: TP's ranges
// of the rest on the first TP group, the experts by id (whole, or each rank its TP ranges of its
// experts).
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
    t->strat.tp.bytes[TP_AG] += (double)n * g->size * sizeof(float);
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
    t->strat.tp.bytes[TP_RS] += (double)n * g->size * sizeof(float);
    int rc = t->model.be->comm_reduce_scatter(t->model.be, &c, buf, counts, CT_COMM_F32, &req,
                                              &t->strat.tp.err);
    tp_wait(t, rc, req, "a tensor-parallel reduce-scatter");
}

static void tp_allreduce_of(trainer *t, float *buf, size_t n, int kind) {
    if (!tp_start(t)) return;
    const ct_comm c = dist_comm(t->strat.tp.group);
    ct_request *req = NULL;
    t->strat.tp.bytes[kind] += (double)n * sizeof(float);
    int rc = t->model.be->comm_allreduce(t->model.be, &c, buf, (int)n, CT_COMM_F32, &req,
                                         &t->strat.tp.err);
    tp_wait(t, rc, req, "a tensor-parallel all-reduce");
}

static void tp_allreduce(void *ctx, float *buf, size_t n) {
    tp_allreduce_of(ctx, buf, n, TP_AR);
}

// ---------------------------------------------------------------------------------------------

// The data-parallel strategy under TP (ZeRO-1 is refused in trainer_setup.c): known from the
// config alone, before setup (the memory estimate). FSDP with EP is strategy_fsdp's table with
// EP's dispatch.
static const strategy_vt *dp_of(const trainer *t) {
    const bool fsdp = t->shard_degree > 1;
    return t->ep > 1 ? (fsdp ? strategy_ep_fsdp() : &strategy_ep)
           : fsdp    ? &strategy_fsdp
                     : &strategy_replicate;
}

// Under EP, an expert's tensor (whole on its EP rank, or with etp = tp its TP slice there).
static bool ep_expert(const trainer *t, const char *name) {
    return t->ep > 1 && strategy_ep_is_expert(name);
}

// How this rank holds tensor `name`: the plan's cut, or under EP with etp 1 an expert whole.
static qwen3_tp_cut cut_of(const trainer *t, const char *name) {
    return t->etp == 1 && ep_expert(t, name) ? QWEN3_TP_EXPERT : qwen3_tp_cut_of(name);
}

// The global layout's tensor named as local tensor p (under EP the local model has fewer).
static const qwen3_param *global_of(const qwen3_model *g, const qwen3_param *p, ct_error *err) {
    const qwen3_param *gp = qwen3_find_param(g, p->name);
    if (!gp) ct_fail(err, "tensor parallelism: tensor %s is not in the global layout", p->name);
    return gp;
}

static bool fsdp_on(const trainer *t) {
    return t->shard_degree > 1;
}

static void describe(const trainer *t, char *buf, size_t size) {
    char dp[256];
    dp_of(t)->describe(t, dp, sizeof dp);
    char over[32] = ""; // under EP the data-parallel part names its own rank counts
    if (t->ep <= 1) snprintf(over, sizeof over, " over %d", t->d->size);
    snprintf(buf, size,
             "tensor parallel over %d ranks with sequence parallelism and loss parallel; %s%s",
             t->tp, dp, over);
}

// The memory estimate under TP: this rank's local model (its 1/tp of every cut tensor, the
// replicated ones whole) for the weights, gradients and AdamW's moments; its activations with
// the sequence-parallel buffers at N / tp rows and the gathered GEMM inputs at N; the loss
// parallel's own buffers (ids, targets, each row's max per rank and two sums). Under FSDP,
// FSDP's shares of that local model.
static int estimate(const trainer *t, run_memory *mem, ct_error *err) {
    qwen3_config local;
    if (qwen3_tp_config(&local, &t->setup.model, t->tp, t->etp, err) != 0) return -1;
    if (t->ep > 1) local.local_experts = local.num_experts / t->ep;
    qwen3_memory_opts o = t->setup.mem_opts;
    o.sp = t->tp;
    const int T = t->T / t->cp; // under CP the model's rows of each sequence
    const double N = (double)t->B * T;
    mem->model = qwen3_memory_plan_ops(&local, &t->setup.ops, t->B, T, &o);
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

int strategy_tp_buffers(trainer *t, qwen3_tp *tp, ct_error *err) {
    const size_t N = (size_t)t->B * t->T;
    tp->ids = tp->targets = tp->host_ids = tp->host_targets = NULL;
    tp->ce_max = tp->ce_sums = NULL;
    tp->host_ids = malloc(N * sizeof *tp->host_ids);
    tp->host_targets = malloc(N * sizeof *tp->host_targets);
    if (!tp->host_ids || !tp->host_targets) return ct_fail(err, "out of memory for the TP ids");
    ct_backend *be = t->model.be;
    if (!(tp->ids = be->alloc(be, N * sizeof(int32_t), "the TP ids", err)) ||
        !(tp->targets = be->alloc(be, N * sizeof(int32_t), "the TP targets", err)) ||
        !(tp->ce_max = be->alloc(be, N * tp->size * sizeof(float), "the TP loss maxes", err)) ||
        !(tp->ce_sums = be->alloc(be, 2 * N * sizeof(float), "the TP loss sums", err)))
        return -1;
    return 0;
}

void strategy_tp_buffers_free(trainer *t, qwen3_tp *tp) {
    ct_backend *be = t->model.be;
    if (be) {
        if (tp->ids) be->free(be, tp->ids);
        if (tp->targets) be->free(be, tp->targets);
        if (tp->ce_max) be->free(be, tp->ce_max);
        if (tp->ce_sums) be->free(be, tp->ce_sums);
    }
    free(tp->host_ids);
    free(tp->host_targets);
    tp->ids = tp->targets = tp->host_ids = tp->host_targets = NULL;
    tp->ce_max = tp->ce_sums = NULL;
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
    if (strategy_tp_buffers(t, tp, err) != 0) return -1;
    if (!m->ops->cross_entropy_tp_max || !m->ops->cross_entropy_tp_sums ||
        !m->ops->cross_entropy_tp_finish)
        return ct_fail(err, "op table '%s' has no loss-parallel cross-entropy (cross_entropy_tp_*)",
                       m->ops->name ? m->ops->name : "?");
    m->tp = tp;
    return 0;
}

static void free_(trainer *t) {
    qwen3_tp *tp = &t->strat.tp.tp;
    strategy_tp_buffers_free(t, tp);
    memset(tp, 0, sizeof *tp);
    t->model.tp = NULL;
    if (t->strat.tp.dp) t->strat.tp.dp->free(t);
}

// Rank r's slice of the global tensor `full` (gshape) as the local tensor p holds it, into out.
static void take_slice(float *out, const float *full, const int64_t gshape[2], const qwen3_param *p,
                       qwen3_tp_cut cut, int r) {
    switch (cut) {
    case QWEN3_TP_WHOLE:
    case QWEN3_TP_EXPERT:
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
// the global table; found by name: under PP the local model holds some of them), this rank's
// slice kept.
static int init_random(trainer *t, uint64_t seed, ct_error *err) {
    qwen3_model *m = &t->model, g;
    if (qwen3_init_layout(&g, &t->setup.model, err) != 0) return -1;
    size_t most = 0;
    for (int i = 0; i < g.n_params; i++) most = g.params[i].numel > most ? g.params[i].numel : most;
    float *full = malloc(most * sizeof *full), *mine = malloc(most * sizeof *mine);
    int rc = full && mine ? 0 : ct_fail(err, "random init: out of memory");
    for (int i = 0; i < m->n_params && rc == 0; i++) {
        const qwen3_param *p = &m->params[i], *gp = global_of(&g, p, err);
        if (!gp) {
            rc = -1;
            break;
        }
        qwen3_init_tensor(&g, gp, full, seed);
        take_slice(mine, full, gp->shape, p, cut_of(t, p->name), t->strat.tp.group->rank);
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
        const qwen3_tp_cut cut = cut_of(t, p->name);
        const int64_t rows = p->shape[0], cols = p->ndim == 2 ? p->shape[1] : 1;
        const int64_t grows = st->shape[0], gcols = st->ndim == 2 ? st->shape[1] : 1;
        const bool fits =
            st->ndim == p->ndim &&
            (cut == QWEN3_TP_WHOLE || cut == QWEN3_TP_EXPERT ? grows == rows && gcols == cols
             : cut == QWEN3_TP_ROWS ? grows == rows * t->tp && gcols == cols
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

// ---------------------------------------------------------------------------------------------
// Checkpoints. A TP checkpoint is an ordinary one of model and optimizer shards over flat ranges
// of the one-process layout (format 4, as FSDP writes), so that every loader, `ctitan verify`
// and `ctitan export` read it unchanged, at any degree. TP rank r of P writes shard r: its slice
// of each row-cut tensor (one range), rows [R r / P, R (r + 1) / P) of each column-cut one
// (assembled from the group's column slices, one tensor at a time) and, on rank 0, the whole
// tensors; the moments follow the weights. A load asks for exactly its slices: a row cut is one
// range, a column cut one range per row; the ranges, in order, are its local layout. Under EP
// every rank of the first EP group writes one shard (its experts, and on the first TP group its
// slices of the rest).

// The ranges of the global layout g that TP rank r of P writes (save) or holds (its slices, in
// the order of its local model m); `rest`: the tensors besides EP's experts too (else only those).
// *out malloc'd; returns their count, or -1.
static int tp_ranges(const trainer *t, const qwen3_model *g, const qwen3_model *m, int r, int P,
                     bool save, bool rest, ckpt_range **out, ct_error *err) {
    size_t n = 0;
    for (int i = 0; i < m->n_params; i++)
        n += !save && cut_of(t, m->params[i].name) == QWEN3_TP_COLUMNS
                 ? (size_t)m->params[i].shape[0]
                 : 1;
    ckpt_range *x = malloc(n * sizeof *x);
    if (!x) return ct_fail(err, "out of memory for the TP checkpoint's ranges");
    int k = 0;
    for (int i = 0; i < m->n_params; i++) {
        const qwen3_param *p = &m->params[i], *gp = global_of(g, p, err);
        if (!gp) {
            free(x);
            return -1;
        }
        const size_t o = gp->offset;
        const qwen3_tp_cut cut = cut_of(t, p->name);
        if (!rest && !ep_expert(t, p->name)) continue;
        switch (cut) {
        case QWEN3_TP_EXPERT:
            x[k++] = (ckpt_range){o, o + gp->numel};
            break;
        case QWEN3_TP_WHOLE:
            if (!save || r == 0) x[k++] = (ckpt_range){o, o + gp->numel};
            break;
        case QWEN3_TP_ROWS:
            x[k++] = (ckpt_range){o + r * p->numel, o + (r + 1) * p->numel};
            break;
        case QWEN3_TP_COLUMNS: {
            const size_t R = (size_t)gp->shape[0], C = (size_t)gp->shape[1],
                         c = (size_t)p->shape[1];
            if (save) {
                const size_t lo = R * r / P, hi = R * (r + 1) / P;
                if (hi > lo) x[k++] = (ckpt_range){o + lo * C, o + hi * C};
            } else {
                for (size_t row = 0; row < R; row++)
                    x[k++] = (ckpt_range){o + row * C + r * c, o + row * C + (r + 1) * c};
            }
            break;
        }
        }
    }
    *out = x;
    return k;
}

// This rank's slices of a checkpoint's model (and, with moments, of its AdamW moments: views
// of the optimizer's), from a checkpoint of any layout. Without FSDP the optimizer spans the
// local model, and the slices are read in place. Under FSDP (2D/3D) they are read whole into
// the full buffer (the weights, then each unit's piece kept, as a load from an HF folder) and
// into host buffers of the local model's size (the moments, whose pieces go to the views).
static int load_slices(trainer *t, const char *dir, float *moments[2], train_state *st,
                       ct_error *err) {
    qwen3_model *m = &t->model, g;
    const bool sharded = fsdp_on(t);
    const size_t spans = sharded ? t->strat.fsdp.n_shard : m->num_params;
    if (moments && (t->opt.base != 0 || t->opt.n != spans))
        return ct_fail(err, "the TP optimizer does not span the local model%s",
                       sharded ? "'s FSDP shard" : "");
    if (qwen3_init_layout(&g, &t->setup.model, err) != 0) return -1;
    ckpt_range *x = NULL;
    int n =
        tp_ranges(t, &g, m, t->strat.tp.group->rank, t->strat.tp.group->size, false, true, &x, err);
    float *host = n >= 0 ? qwen3_params_view(m, false, err) : NULL, *local[2] = {NULL, NULL};
    int rc = host ? 0 : -1;
    if (rc == 0 && moments && sharded) {
        local[0] = malloc(2 * m->num_params * sizeof *local[0]);
        local[1] = local[0] + m->num_params;
        if (!local[0]) rc = ct_fail(err, "out of memory for the TP checkpoint's moments");
    }
    float **into = sharded ? local : moments;
    if (rc == 0)
        rc = ckpt_load_ranges(dir, &g, x, n, host, moments ? into[0] : NULL,
                              moments ? into[1] : NULL, st, NULL, err);
    if (host) qwen3_params_view_release(m, host, rc == 0);
    if (rc == 0 && sharded) {
        strategy_fsdp_take_all(t);
        for (int k = 0; moments && k < 2; k++) strategy_fsdp_pieces(t, local[k], moments[k]);
    }
    free(local[0]);
    free(x);
    qwen3_free(&g);
    return rc;
}

static int load_sharded(trainer *t, const char *dir, ct_error *err) {
    return load_slices(t, dir, NULL, NULL, err);
}

static int load_checkpoint(trainer *t, const char *dir, float *moments[2], ct_error *err) {
    return load_slices(t, dir, moments, &t->state, err);
}

// Shard r of the first replica's TP group (every rank of it calls this, in step: the column
// cuts are all-gathers): the model and moment values of its save ranges x, from src (host, the
// local layout: the weights and the two moments), then the files.
// Shard `shard` of S: `rest` says whether it holds the tensors besides EP's experts (the whole
// TP group then takes part alike).
static int write_shard(trainer *t, const qwen3_model *g, const char *tmp, int shard, int S,
                       bool rest, const ckpt_range *x, int n, float *const src[3],
                       ckpt_shard_info info[2], ct_error *err) {
    qwen3_model *m = &t->model;
    dist *grp = t->strat.tp.group;
    const int P = grp->size, r = grp->rank;
    size_t total = 0, most = 0;
    for (int i = 0; i < n; i++) total += x[i].hi - x[i].lo;
    for (int i = 0; i < m->n_params; i++)
        if (cut_of(t, m->params[i].name) == QWEN3_TP_COLUMNS && m->params[i].numel > most)
            most = m->params[i].numel;
    float *buf = malloc((3 * total + 1) * sizeof *buf), *all = malloc((most * P + 1) * sizeof *all);
    int rc = buf && all ? 0 : ct_fail(err, "out of memory for the TP checkpoint");
    rc = dist_agree(grp, rc, "the TP checkpoint's buffers", err);
    size_t pos = 0;
    for (int i = 0; i < m->n_params && rc == 0; i++) {
        const qwen3_param *p = &m->params[i], *gp = qwen3_find_param(g, p->name);
        const qwen3_tp_cut cut = cut_of(t, p->name);
        if ((cut == QWEN3_TP_WHOLE && r != 0) || (!rest && !ep_expert(t, p->name))) continue;
        if (cut != QWEN3_TP_COLUMNS) {
            for (int k = 0; k < 3; k++)
                memcpy(buf + k * total + pos, src[k] + p->offset, p->numel * sizeof *buf);
            pos += p->numel;
            continue;
        }
        // Rows [lo, hi) of the global tensor: row i is every rank's row i, side by side.
        const size_t R = (size_t)gp->shape[0], C = (size_t)gp->shape[1], c = (size_t)p->shape[1];
        const size_t lo = R * r / P, hi = R * (r + 1) / P;
        for (int k = 0; k < 3 && rc == 0; k++) {
            rc = dist_allgather(grp, src[k] + p->offset, all, (int)(p->numel * sizeof(float)),
                                "the TP checkpoint's column slices", err);
            for (size_t row = lo; row < hi && rc == 0; row++)
                for (int q = 0; q < P; q++)
                    memcpy(buf + k * total + pos + (row - lo) * C + q * c,
                           all + q * p->numel + row * c, c * sizeof *buf);
        }
        pos += (hi - lo) * C;
    }
    if (rc == 0)
        rc = ckpt_write_shard(tmp, g, shard, S, x, n, buf, buf + total, buf + 2 * total, &info[0],
                              &info[1], err);
    free(buf);
    free(all);
    return rc;
}

// Shard q's local layout: this rank's, or under EP EP rank q / etp's experts.
static int layout_of(const trainer *t, int q, qwen3_config *lc, ct_error *err) {
    (void)err;
    if (t->ep > 1) lc->expert_lo = q / t->etp * lc->local_experts;
    return 0;
}

// The replicas of each slice agree bit for bit (over t->d; under FSDP, whose ranks hold
// different pieces, as FSDP's own save: not compared); the first replica's TP groups write
// (under FSDP, their local models assembled by their shard groups first): shard q is rank q of
// w->writers, TP rank q % tp of a TP group holding w->layout_of(q)'s local layout; world rank 0
// lists them in state.json and commits.
int strategy_tp_save_shards(trainer *t, const strategy_tp_writers *w, ct_error *err) {
    dist *grp = t->strat.tp.group, *writers = w->writers;
    const bool ep = t->ep > 1;
    const int P = grp->size, S = w->S;
    const int64_t step = t->state.step;
    grp->timeout_s = writers->timeout_s = t->world->timeout_s = t->d->timeout_s;
    if (fsdp_on(t)) t->strat.fsdp.shard.timeout_s = t->d->timeout_s;
    int rc = fsdp_on(t) ? 0
             : ep       ? strategy_ep_check_replicas(t, err)
                        : trainer_check_replicas(t, err);
    if (rc == 0 && is_root(t)) rc = ckpt_begin(t->ckpt_root, step, t->save_tag, err);
    if (dist_agree(t->world, rc, "starting the checkpoint", err) != 0) return -1;
    qwen3_model g, layout;
    if (qwen3_init_layout(&g, &t->setup.model, err) != 0) return -1; // the same on every rank
    trainer_shards sh;
    rc = trainer_shards_begin(t, &sh, S, err);
    // Rank 0 lists every shard's ranges, from its writer's local layout, made here. Under EP
    // only the first TP group's shards (q % per < P: of each stage under PP) hold the tensors
    // besides the experts.
    for (int q = 0; rc == 0 && is_root(t) && q < S; q++) {
        qwen3_config lc = t->model.cfg;
        if (w->layout_of(t, q, &lc, err) != 0 || qwen3_init_layout(&layout, &lc, err) != 0) {
            rc = -1;
            break;
        }
        sh.n_of[q] =
            tp_ranges(t, &g, &layout, q % P, P, true, !ep || q % w->per < P, &sh.of[q], err);
        qwen3_free(&layout);
        if (sh.n_of[q] < 0) rc = -1;
    }
    rc = dist_agree(t->world, rc, "the TP checkpoint's ranges", err);
    // The writers: rank 0 of t->d, or under EP the first EP block. They, or under FSDP the first
    // replica (t->d's ranks below the shard degree: its shard groups), assemble the local state.
    const bool write = ep ? t->erep_group.rank == 0 : t->d->rank == 0;
    const bool first = fsdp_on(t) ? t->d->rank < t->strat.fsdp.o.shard_degree : write;
    float *src[3] = {NULL, NULL, NULL};
    if (rc == 0 && first) rc = strategy_local_state(t, fsdp_on(t), src, err);
    const int q = writers->rank;
    const bool rest = !ep || q % w->per < P;
    ckpt_range *x = NULL;
    const int n =
        rc == 0 && write ? tp_ranges(t, &g, &t->model, grp->rank, P, true, rest, &x, err) : 0;
    if (n < 0) rc = -1;
    if (rc == 0 && write) rc = write_shard(t, &g, sh.tmp, q, S, rest, x, n, src, sh.mine, err);
    free(x);
    if (first) strategy_local_state_free(t, fsdp_on(t), src);
    rc = trainer_shards_end(t, &sh, rc, t->world, write ? writers : NULL, &g, w->note, err);
    qwen3_free(&g);
    return rc;
}

// TP's writers: the first replica's TP group, one shard per TP rank. Under EP the first EP block
// (world ranks [0, ep x etp): shard q is world rank q, TP rank q % tp, holding EP rank q / etp's
// experts; ranks below tp also write the rest), compared with their expert replicas.
static int save_checkpoint(trainer *t, ct_error *err) {
    const bool ep = t->ep > 1;
    const strategy_tp_writers w = {
        .S = ep ? t->ep * t->etp : t->strat.tp.group->size,
        .per = ep ? t->ep * t->etp : t->strat.tp.group->size,
        .writers = ep ? ep_block(t) : t->strat.tp.group,
        .layout_of = layout_of,
        .note = !ep           ? ", one per TP rank"
                : t->etp == 1 ? ", one per rank of the first EP group"
                              : ", one per rank of the first EP group and its TP peers"};
    return strategy_tp_save_shards(t, &w, err);
}

static void begin_step(trainer *t) {
    t->strat.tp.failed = false;
    t->strat.tp.dp->begin_step(t);
}

// Each tensor's elements among the gradients this rank's optimizer steps (the whole local
// model, or under FSDP its shard's pieces): fn(ctx, grads, count, its cut, whether an EP expert).
typedef void (*grad_range_fn)(trainer *t, float *g, size_t n, qwen3_tp_cut cut, bool expert,
                              void *ctx);

static void each_grad_range(trainer *t, grad_range_fn fn, void *ctx) {
    qwen3_model *m = &t->model;
    const fsdp *f = &t->strat.fsdp;
    for (int i = 0; i < m->n_params; i++) {
        const qwen3_param *p = &m->params[i];
        const qwen3_tp_cut cut = cut_of(t, p->name);
        const bool expert = ep_expert(t, p->name);
        if (!fsdp_on(t)) {
            fn(t, m->grad_mem + p->offset, p->numel, cut, expert, ctx);
            continue;
        }
        for (int u = 0; u < f->n_units; u++) {
            const fsdp_unit *x = &f->units[u];
            const size_t lo = p->offset > x->piece_lo ? p->offset : x->piece_lo;
            const size_t hi =
                p->offset + p->numel < x->piece_hi ? p->offset + p->numel : x->piece_hi;
            if (lo < hi)
                fn(t, f->shard_grads + x->at + (lo - x->piece_lo), hi - lo, cut, expert, ctx);
        }
    }
}

static void sum_whole(trainer *t, float *g, size_t n, qwen3_tp_cut cut, bool expert, void *ctx) {
    (void)ctx, (void)expert;
    if (cut == QWEN3_TP_WHOLE) tp_allreduce_of(t, g, n, TP_AR_WHOLE);
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

static void add_squares(trainer *t, float *g, size_t n, qwen3_tp_cut cut, bool expert,
                        void *ctx) {
    double *sq = ctx, x;
    t->model.ops->sum_squares(&x, g, n);
    sq[expert ? 2 : cut == QWEN3_TP_WHOLE ? 1 : 0] += x;
}

// Sharded tensors: this rank's squares summed over the group; replicated ones once; EP's
// experts summed over the EP group (with etp = tp, their TP slices then over the group too);
// under FSDP, then summed over the shard group (each rank its pieces). Under FSDP every rank of
// a replica's shard and TP groups holds its own piece of the experts (EP is carved out of them):
// summed as the TP-cut tensors.
static int grad_sq(trainer *t, double *sq, ct_error *err) {
    double part[3] = {0, 0, 0}; // sharded, whole, experts
    each_grad_range(t, add_squares, part);
    if (t->ep > 1 && !fsdp_on(t) &&
        dist_sum(&t->ep_group, part[2], &part[2], "the gradient norm", err) != 0)
        return -1;
    if (t->etp > 1 || fsdp_on(t)) part[0] += part[2], part[2] = 0;
    if (dist_sum(t->strat.tp.group, part[0], &part[0], "the gradient norm", err) != 0) return -1;
    *sq = part[0] + part[1] + part[2];
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


// ---------------------------------------------------------------------------------------------
// The final HF export (checkpoint.last_save_in_hf), streamed tensor by tensor: world rank 0
// writes the folder one process writes for the same weights (hf_save_folder_from, in its own
// tensor order); for each tensor it reaches, it names the tensor to its TP group, whose ranks
// all-gather their slices of it, and it assembles the global tensor. No rank holds more than one
// global tensor beside its slices. Only the first replica's TP group takes part.

typedef struct tp_export {
    trainer *t;
    const qwen3_model *g; // the global layout
    float *all, *full;    // the group's slices of it, and it assembled
    const float *local;   // this rank's weights (a host view)
} tp_export;

// Every rank of this TP group: global tensor gp's slices gathered and assembled into full (all:
// the group's slices).
static int assemble(trainer *t, const float *local, const qwen3_param *gp, float *all, float *full,
                    ct_error *err) {
    const qwen3_param *p = qwen3_find_param(&t->model, gp->name);
    dist *grp = t->strat.tp.group;
    const int P = grp->size;
    const qwen3_tp_cut cut = cut_of(t, gp->name);
    if (!p) return ct_fail(err, "TP export: %s is not in this rank's model", gp->name);
    if (dist_allgather(grp, local + p->offset, all, (int)(p->numel * sizeof(float)),
                       "the TP export", err) != 0)
        return -1;
    switch (cut) {
    case QWEN3_TP_EXPERT:
    case QWEN3_TP_WHOLE:
        memcpy(full, all, p->numel * sizeof *full);
        break;
    case QWEN3_TP_ROWS:
        memcpy(full, all, p->numel * P * sizeof *full);
        break;
    case QWEN3_TP_COLUMNS:
        for (int r = 0; r < P; r++)
            for (int64_t row = 0; row < p->shape[0]; row++)
                memcpy(full + row * gp->shape[1] + r * p->shape[1],
                       all + r * p->numel + row * p->shape[1], (size_t)p->shape[1] * sizeof *full);
        break;
    }
    return 0;
}

// Every rank of the TP group: global tensor gp assembled into full. Under EP (the exporting
// group: the first EP block) an expert comes whole from its owner (with etp = tp assembled by
// the owner's TP group, then sent from its TP rank 0), and the rest from the first TP group's
// slices while the other ranks wait.
int strategy_tp_gather(trainer *t, const float *local, const qwen3_param *gp, float *all,
                       float *full, ct_error *err) {
    if (cut_of(t, gp->name) == QWEN3_TP_EXPERT)
        return strategy_ep_fetch_expert(t, gp, local, full, err);
    if (ep_expert(t, gp->name)) {
        const int owner = strategy_ep_owner(t, gp->name);
        if (t->ep_group.rank == owner && assemble(t, local, gp, all, full, err) != 0) return -1;
        return dist_bcast(ep_block(t), full, gp->numel * sizeof(float), owner * t->tp,
                          "the EP export's expert", err);
    }
    if (t->ep > 1 && ep_block(t)->rank >= t->strat.tp.group->size) return 0;
    return assemble(t, local, gp, all, full, err);
}

static int fetch_tensor(void *ctx, int i, ct_error *err) {
    tp_export *x = ctx;
    return strategy_tp_gather(x->t, x->local, &x->g->params[i], x->all, x->full, err);
}

// The weights as one HF folder in dir (world rank 0 writes; every rank takes part).
static int export_hf(trainer *t, const char *dir, ct_dtype dtype, ct_error *err) {
    qwen3_model *m = &t->model, g;
    dist *grp = t->ep > 1 ? ep_block(t) : t->strat.tp.group;
    const bool first = t->ep > 1 ? t->erep_group.rank == 0 : t->d->rank == 0;
    // The local model: the weights themselves, or under FSDP assembled from the shard group's
    // pieces, a collective over t->d, before the other replicas leave (they hold the same).
    float *local = fsdp_on(t) ? malloc(m->num_params * sizeof *local + 1)
                              : qwen3_params_view(m, true, err);
    int rc = local ? 0 : ct_fail(err, "the TP export: out of memory for the local model");
    if (fsdp_on(t)) {
        rc = dist_agree(t->d, rc, "the TP export's local model", err);
        if (rc == 0) rc = strategy_fsdp_gather(t, t->strat.fsdp.shard_params, local, err);
    }
    if (rc != 0 || !first || qwen3_init_layout(&g, &t->setup.model, err) != 0) {
        if (local && fsdp_on(t)) free(local);
        else if (local) qwen3_params_view_release(m, local, false);
        return rc != 0 || !first ? rc : -1;
    }
    grp->timeout_s = t->strat.tp.group->timeout_s = t->d->timeout_s;
    size_t most = 0;
    for (int i = 0; i < g.n_params; i++) most = g.params[i].numel > most ? g.params[i].numel : most;
    tp_export x = {t, &g, malloc(most * sizeof(float)), malloc(most * sizeof(float)), local};
    rc = x.all && x.full ? 0 : ct_fail(err, "the TP export: out of memory");
    rc = dist_agree(grp, rc, "the TP export's buffers", err);
    strategy_export sx = {.grp = grp, .g = &g, .full = &x.full, .fetch = fetch_tensor, .ctx = &x};
    if (rc == 0) rc = strategy_export_stream(&sx, t, dir, dtype, "the TP export's end", err);
    if (fsdp_on(t)) free(local);
    else qwen3_params_view_release(m, local, false);
    free(x.all);
    free(x.full);
    qwen3_free(&g);
    return rc;
}

// The group's payload bytes (strategy_tp_state.bytes).
static int comm_bytes(const trainer *t, double n, char *buf, size_t size) {
    const double *b = t->strat.tp.bytes;
    return snprintf(buf, size,
                    "; TP all-gathers %.0f, reduce-scatters %.0f, loss all-reduces %.0f, "
                    "replicated gradients' all-reduces %.0f",
                    b[TP_AG] / n, b[TP_RS] / n, b[TP_AR] / n, b[TP_AR_WHOLE] / n);
}

const strategy_vt strategy_tp = {
    .describe = describe, .memory_note = " (TP shares)", .optimizer_sharded = false,
    .estimate = estimate, .setup = setup,
    .free = free_, .init_random = init_random, .load_sharded = load_sharded, .load_hf = load_hf,
    .weights_ready = weights_ready, .begin_step = begin_step, .begin_micro = begin_micro,
    .unit_ready = unit_ready, .grads_final = grads_final, .grad_sq = grad_sq, .shard = shard,
    .after_update = after_update, .after_eval = after_eval, .take_comm = take_comm,
    .load_checkpoint = load_checkpoint, .save_checkpoint = save_checkpoint,
    .model_in_shards = false, .comm_bytes = comm_bytes, .export_hf = export_hf,
    .export_from = "TP slices"};
