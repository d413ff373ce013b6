// Pipeline parallelism (torchtitan's pipeline_parallel_*): each rank holds its stages' layers
// only (a model of cfg.n_parts parts, named by global layer), runs its schedule's actions
// (pipeline_schedule.c) and passes each micro-batch's activations forward and their gradients
// back by point-to-point backend calls, every receive of the step posted at its start and every
// send non-blocking. The model keeps the activations of every micro-batch in flight: it has as
// many activation sets as the rank's actions ever hold forwards whose backward has not run
// (pp_schedule_in_flight: 1F1B min(m, S - s), GPipe m); a forward takes a free set, its backward
// reads that set and frees it, so nothing is recomputed. Under TP each set has its own TP
// buffers, under MoE its own routing statistics, whose sums over the sparse layers travel with
// the micro-batch (the whole model's come back with its gradients, for HF's aux), and under EP
// its own dispatched rows. The last stage's loss is the summed cross-entropy over the step's
// global valid-target count, so the gradients are one process's. DDP (strategy_replicate) runs
// over the stage's data-parallel ranks, or FSDP/HSDP (each stage's local model sharded over its
// dp_shard ranks, as torchtitan's mesh: pp outermost), or EP (strategy_ep, or beside FSDP
// strategy_ep_fsdp: the EP groups carved out of the stage's ranks, so each stage's MoE layers
// send their tokens to the experts' owners within the stage; its checkpoints and export gather
// the experts from them). EP with TP as without PP (strategy_tp over strategy_ep), its groups
// carved out of the stage's ranks: with etp 1 out of its dp x tp ranks, the routing statistics
// summed over them. Under FSDP a stage's gradients accumulate whole over its micro-batches and are
// reduce-scattered in the backward of its last one (FSDP2 under PyTorch's pipelining:
// set_requires_gradient_sync and set_reshard_after_backward only then), and "default" keeps the
// units gathered after the forward (torchtitan: no resharding after forward under PP). The gradient
// norm sums over the stages. Under CP a stage's ranks are its CP groups' too (FSDP over dp_shard x
// cp, the ring attention's hook on the model): each rank's boundary is its T / cp rows, passed to
// the same CP rank of the next stage, and its last stage's loss is its own tokens', so the sums
// over the pp group and then the stage's ranks (trainer_step) count each token once.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint/checkpoint.h"
#include "core/clock.h"
#include "model/moe_balance.h"
#include "model/qwen3_lora.h"
#include "train/strategy.h"
#include "train/trainer_internal.h"

#define PP_TAG 3000 // above the other point-to-point tags (ring attention's)

// ZeRO-1 over the stage's data-parallel ranks (data_parallel_shard_mode "zero1"; with TP or EP
// refused in trainer_setup.c): every rank holds the stage's local model (a LoRA model's adapter
// is what it trains), its optimizer state sharded.
static bool zero1(const trainer *t) {
    return t->shard_degree > 1 &&
           strcmp(t->cfg->parallelism.data_parallel_shard_mode, "zero1") == 0;
}

// The strategy inside each stage, known from the config alone: TP (itself over replicate, FSDP
// or EP), EP (beside FSDP, or with DDP for the rest: its groups are carved out of the stage's
// ranks), FSDP, ZeRO-1 or replicate.
static const strategy_vt *dp_of(const trainer *t) {
    const bool fsdp = t->shard_degree > 1 && !zero1(t);
    return t->tp > 1   ? &strategy_tp
           : t->ep > 1 ? (fsdp ? strategy_ep_fsdp() : &strategy_ep)
           : fsdp      ? &strategy_fsdp
           : zero1(t)  ? &strategy_zero1
                       : &strategy_replicate;
}

// FSDP directly inside the stage, alone or beside EP (its loads are ours to hand over).
static bool fsdp_on(const trainer *t) {
    return t->tp <= 1 && t->shard_degree > 1 && !zero1(t);
}

// FSDP inside the stage, directly or under TP: no rank holds its local model.
static bool sharded(const trainer *t) {
    return t->shard_degree > 1 && !zero1(t);
}

static void describe(const trainer *t, char *buf, size_t size) {
    char inner[320];
    if (zero1(t)) // (before the setup, which sets the inner table ZeRO-1's describe reads)
        snprintf(inner, sizeof inner, "ZeRO-1: optimizer state sharded");
    else
        dp_of(t)->describe(t, inner, sizeof inner);
    char cp[64] = "";
    if (t->cp > 1) snprintf(cp, sizeof cp, " (context parallel: %d per sequence)", t->cp);
    snprintf(buf, size, "pipeline parallel over %d stage groups (schedule %s), %s over each "
                        "stage's %d rank(s)%s",
             t->pp, t->cfg->parallelism.pipeline_parallel_schedule, inner, t->stage_group.size, cp);
}

// A stage boundary's floats for hidden size C: the residual stream's rows this rank holds, sent
// to the same rank of the next stage's group (the pp group: the same CP and TP rank). Under CP
// its two headtail chunks of each sequence (T / cp rows), under TP (sequence parallelism) its
// shard of those.
static size_t boundary_floats(const trainer *t, int C) {
    return (size_t)t->B * (t->T / t->cp) / t->tp * C;
}

static size_t rows_floats(const trainer *t) {
    return boundary_floats(t, t->model.cfg.hidden_size);
}

// The activation sets, one per micro-batch in flight (p->n_sets): the model's, the MoE
// statistics' and, under TP, each set's TP buffers (set 0's are TP's own). Under EP the inner
// setup made each set's dispatched rows.
static int make_sets(trainer *t, ct_error *err) {
    strategy_pp_state *p = &t->strat.pp;
    p->free_sets = calloc((size_t)p->n_sets, sizeof *p->free_sets);
    p->set_of = calloc((size_t)p->v * p->m, sizeof *p->set_of);
    if (!p->free_sets || !p->set_of) return ct_fail(err, "PP: out of memory");
    if (qwen3_plan_sets(&t->model, p->n_sets, err) != 0 ||
        moe_balance_sets(&t->moe, p->n_sets, err) != 0)
        return ct_wrap(err, "PP: %d activation sets", p->n_sets);
    if (t->tp <= 1 || p->n_sets <= 1) return 0;
    if (!(p->tps = calloc((size_t)p->n_sets, sizeof *p->tps)))
        return ct_fail(err, "PP: out of memory");
    for (int j = 1; j < p->n_sets; j++) {
        p->tps[j] = t->strat.tp.tp; // the group and its hooks; the buffers below are the set's
        if (strategy_tp_buffers(t, &p->tps[j], err) != 0) return -1;
    }
    return 0;
}

// Set j becomes the one the next forward fills and the next backward reads.
static void use_set(trainer *t, int j) {
    strategy_pp_state *p = &t->strat.pp;
    qwen3_use_set(&t->model, j);
    moe_balance_use_set(&t->moe, j);
    if (p->tps) t->model.tp = j ? &p->tps[j] : &t->strat.tp.tp;
    if (t->model.ep) t->strat.ep.ep.set = j;
}

static int setup(trainer *t, ct_error *err) {
    strategy_pp_state *p = &t->strat.pp;
    p->n_actions = 2 * p->m * p->v;
    p->actions = calloc((size_t)p->n_actions, sizeof *p->actions);
    const int n = p->v * p->m;
    p->in = calloc(4 * (size_t)n, sizeof *p->in);
    p->req = calloc(8 * (size_t)n, sizeof *p->req);
    p->sums_in = calloc(4 * (size_t)n, sizeof *p->sums_in);
    if (!p->actions || !p->in || !p->req || !p->sums_in) return ct_fail(err, "PP: out of memory");
    p->dout = p->in + n, p->out = p->in + 2 * n, p->din = p->in + 3 * n;
    p->sums_dout = p->sums_in + n, p->sums_out = p->sums_in + 2 * n;
    p->sums_din = p->sums_in + 3 * n;
    if (pp_schedule_actions(p->kind, p->group->size, p->group->rank, p->S, p->m, p->actions,
                            err) != 0)
        return -1;
    // The sets before the inner setup: under EP it keeps each set's dispatched rows.
    t->strat.ep.n_sets = p->n_sets = pp_schedule_in_flight(p->actions, p->n_actions);
    if ((p->dp = dp_of(t))->setup(t, err) != 0 || make_sets(t, err) != 0) return -1;
    ct_backend *be = t->model.be;
    for (int i = 0; i < 4 * n; i++)
        if (!(p->in[i] = be->alloc(be, rows_floats(t) * sizeof(float), "a stage's activations",
                                   err)))
            return -1;
    const int E = t->model.cfg.num_experts;
    p->n_sums = E > 0 ? (int)MOE_SUMS(E) : 0;
    if ((p->n_balance = qwen3_num_sparse_layers(&t->setup.model)) > 0) {
        p->balance = calloc((size_t)p->n_balance, sizeof *p->balance);
        p->balance_scratch =
            calloc((size_t)p->n_balance * p->group->size, sizeof *p->balance_scratch);
        if (!p->balance || !p->balance_scratch) return ct_fail(err, "PP: out of memory");
        t->n_moe_metric = p->n_balance;
        t->moe_metric = p->balance;
    }
    if (p->n_sums) {
        p->sums = calloc((size_t)p->n_sums, sizeof *p->sums);
        p->sums_scratch = calloc((size_t)p->n_sums * t->moe_ranks->size, sizeof *p->sums_scratch);
        if (!p->sums || !p->sums_scratch) return ct_fail(err, "PP: out of memory");
        for (int i = 0; i < 4 * n; i++)
            if (!(p->sums_in[i] = be->alloc(be, (size_t)p->n_sums * sizeof(double),
                                            "a stage's MoE statistics", err)))
                return -1;
    }
    fprintf(t->log, "pipeline: %d stages, %d per rank, %d micro-batches of %d per step; rank 0 "
                    "holds",
            p->S, p->v, p->m, t->B);
    for (int k = 0; k < p->v; k++) {
        const pp_stage *s = &p->stage[k * p->group->size + p->group->rank];
        fprintf(t->log, "%s stage %d (%slayers %d..%d%s)", k ? "," : "",
                k * p->group->size + p->group->rank, s->embed ? "embedding, " : "", s->lo,
                s->hi - 1, s->head ? ", norm and head" : "");
    }
    fprintf(t->log, " and keeps the activations of up to %d micro-batch(es) in flight\n",
            p->n_sets);
    return 0;
}

static void free_(trainer *t) {
    strategy_pp_state *p = &t->strat.pp;
    ct_backend *be = t->model.be;
    for (int i = 0; p->in && i < 4 * p->v * p->m; i++)
        if (p->in[i]) be->free(be, p->in[i]);
    for (int i = 0; p->sums_in && i < 4 * p->v * p->m; i++)
        if (p->sums_in[i]) be->free(be, p->sums_in[i]);
    free(p->in);
    free(p->sums_in);
    free(p->sums);
    free(p->sums_scratch);
    free(p->balance);
    free(p->balance_scratch);
    p->balance = p->balance_scratch = NULL;
    p->sums_in = NULL, p->sums = p->sums_scratch = NULL;
    free(p->req);
    free(p->actions);
    for (int j = 1; p->tps && j < p->n_sets; j++) strategy_tp_buffers_free(t, &p->tps[j]);
    if (p->tps) t->model.tp = &t->strat.tp.tp;
    free(p->tps);
    free(p->free_sets);
    free(p->set_of);
    p->in = NULL, p->req = NULL, p->actions = NULL, p->tps = NULL;
    p->free_sets = p->set_of = NULL;
    if (p->dp) p->dp->free(t);
}

int strategy_pp_local_config(const trainer *t, int r, qwen3_config *mc, ct_error *err) {
    const strategy_pp_state *p = &t->strat.pp;
    const int P = t->pp;
    mc->n_parts = p->v;
    int n = 0;
    for (int k = 0; k < p->v; k++) {
        const pp_stage *s = &p->stage[k * P + r];
        mc->part_lo[k] = s->lo;
        mc->part_n[k] = s->hi - s->lo;
        n += s->hi - s->lo;
    }
    if (n == 0) return ct_fail(err, "PP: rank %d holds no layer", r);
    mc->num_hidden_layers = n;
    mc->no_embed = r != 0;
    mc->no_head = r != P - 1;
    return 0;
}

// Pipeline rank r's local model held by EP rank e of its stage (without EP, r's).
static int local_config(const trainer *t, int r, int e, qwen3_config *mc, ct_error *err) {
    if (strategy_pp_local_config(t, r, mc, err) != 0) return -1;
    if (t->ep > 1) {
        mc->local_experts = mc->num_experts / t->ep;
        mc->expert_lo = e * mc->local_experts;
    }
    return 0;
}

// The one-process init's values: each tensor drawn from its global table's stream (under TP,
// TP's init: its slices of them).
static int init_random(trainer *t, uint64_t seed, ct_error *err) {
    if (t->tp > 1) return strategy_tp.init_random(t, seed, err);
    qwen3_model *m = &t->model, g;
    if (qwen3_init_layout(&g, &t->setup.model, err) != 0) return -1;
    size_t most = 0;
    for (int i = 0; i < m->n_params; i++) most = m->params[i].numel > most ? m->params[i].numel : most;
    float *x = malloc(most * sizeof *x + 1);
    int rc = x ? 0 : ct_fail(err, "random init: out of memory");
    for (int i = 0; i < m->n_params && rc == 0; i++) {
        const qwen3_param *p = &m->params[i], *gp = qwen3_find_param(&g, p->name);
        if (!gp) {
            rc = ct_fail(err, "PP init: %s is not in the model", p->name);
            break;
        }
        qwen3_init_tensor(&g, gp, x, seed);
        rc = qwen3_params_write(m, p->name, 0, p->numel, x, err);
    }
    free(x);
    qwen3_free(&g);
    if (rc == 0 && fsdp_on(t)) strategy_fsdp_take_all(t);
    return rc;
}

// Pipeline rank r's activation sets: the most micro-batches its schedule holds in flight.
static int sets_of(const trainer *t, int r, ct_error *err) {
    const strategy_pp_state *p = &t->strat.pp;
    pp_action *a = calloc(2 * (size_t)p->m * p->v, sizeof *a);
    if (!a) return ct_fail(err, "PP: out of memory");
    int n = pp_schedule_actions(p->kind, t->pp, r, p->S, p->m, a, err);
    if (n == 0) n = pp_schedule_in_flight(a, 2 * p->m * p->v);
    free(a);
    return n;
}

// The pipeline rank that needs the most: each rank's stages planned at the micro-batch size (under
// CP its T / cp rows of each sequence), its activations once per activation set (sets_of), with
// the schedule's stage buffers (4 v m boundaries: inputs, output gradients, outputs and input
// gradients) and AdamW over the stages, so every rank checks the fit against the same figure;
// under FSDP, FSDP's estimate of that rank's local model, plus its whole gradients (they
// accumulate unsharded over the stage's micro-batches). Under TP, TP's of the whole model (an
// over-estimate by up to the pp degree; its rows T / cp under CP), its activations times the
// most sets of any rank.
static int estimate(const trainer *t, run_memory *mem, ct_error *err) {
    const strategy_pp_state *p = &t->strat.pp;
    if (t->tp > 1) {
        int most = 1;
        for (int r = 0; r < t->pp; r++) {
            const int n = sets_of(t, r, err);
            if (n < 0) return -1;
            most = n > most ? n : most;
        }
        if (strategy_tp.estimate(t, mem, err) != 0) return -1;
        const double more = (double)(most - 1) * mem->model.activations;
        mem->model.activations += (size_t)more;
        mem->total += more;
        mem->node = mem->total * mem->ranks_per_node;
        return 0;
    }
    qwen3_config most = t->setup.model;
    run_memory best = *mem;
    int best_r = 0, best_sets = 1;
    size_t best_set = 0; // bytes of one activation set
    for (int r = 0; r < t->pp; r++) {
        qwen3_config lc = t->setup.model;
        const int sets = sets_of(t, r, err);
        if (sets < 0 || local_config(t, r, 0, &lc, err) != 0) return -1;
        run_memory m = *mem;
        m.model = qwen3_memory_plan_ops(&lc, &t->setup.ops, t->B, t->T / t->cp,
                                        &t->setup.mem_opts);
        const size_t one = m.model.activations;
        m.model.activations = (size_t)sets * one +
            4 * (size_t)p->v * p->m * boundary_floats(t, lc.hidden_size) * sizeof(float);
        m.optimizer = 2.0 * (double)m.model.params / (zero1(t) ? t->d->size : 1);
        m.total = (double)m.model.params + m.model.weights_bf16 + m.model.grads + m.optimizer +
                  m.model.activations + m.batch;
        m.node = m.total * m.ranks_per_node;
        if (r == 0 || m.total > best.total)
            best = m, most = lc, best_r = r, best_sets = sets, best_set = one;
    }
    *mem = best;
    fprintf(t->log,
            "memory, PP: pipeline rank %d needs the most: %d activation set(s) (its micro-batches "
            "in flight) of %.2f MiB%s\n",
            best_r, best_sets, best_set / (1024.0 * 1024.0),
            fsdp_on(t) ? ", and its stages' whole gradients (accumulated over the micro-batches)"
                       : "");
    if (!fsdp_on(t)) return 0;
    const double whole = (double)best.model.grads; // the local model's, before FSDP's shares
    if (strategy_fsdp_estimate_of(t, &most, mem, err) != 0) return -1;
    mem->model.grads += (size_t)whole;
    mem->total += whole;
    mem->node = mem->total * mem->ranks_per_node;
    return 0;
}

// The summed gradient's squares: the stage's (over its data-parallel ranks), summed over the
// stages in rank order.
static int grad_sq(trainer *t, double *sq, ct_error *err) {
    if (t->strat.pp.dp->grad_sq(t, sq, err) != 0) return -1;
    return dist_sum(t->strat.pp.group, *sq, sq, "the gradient norm over the stages", err);
}

static void begin_step(trainer *t) {
    t->strat.pp.dp->begin_step(t);
}
// `last`: the stage's last micro-batch (each local stage has its own). FSDP reduces only then.
static void begin_micro(trainer *t, bool last) {
    if (sharded(t)) t->strat.fsdp.no_sync = !last;
    t->strat.pp.dp->begin_micro(t, last);
}
static void unit_ready(void *ctx, int unit, int event) {
    ((trainer *)ctx)->strat.pp.dp->unit_ready(ctx, unit, event);
}
static int grads_final(trainer *t, ct_error *err) {
    return t->strat.pp.dp->grads_final(t, err);
}
static strategy_shard shard(trainer *t) {
    return t->strat.pp.dp->shard(t);
}
// Then, under MoE, every stage's load balance per sparse layer into p->balance (whole-model
// sparse index order): each rank its local layers' slots, summed over the pp group.
static int after_update(trainer *t, ct_error *err) {
    strategy_pp_state *p = &t->strat.pp;
    if (p->dp->after_update(t, err) != 0) return -1;
    if (!p->n_balance) return 0;
    memset(p->balance, 0, (size_t)p->n_balance * sizeof *p->balance);
    const qwen3_config *mc = &t->model.cfg, *g = &t->setup.model;
    const double *mine = moe_balance_metric(&t->moe);
    for (int l = 0, s = 0; l < mc->num_hidden_layers; l++) {
        if (!qwen3_layer_is_sparse(mc, l)) continue;
        int at = 0; // the global sparse index of the global layer id
        for (int j = 0; j < qwen3_layer_id(mc, l); j++) at += qwen3_layer_is_sparse(g, j);
        p->balance[at] = mine[s++];
    }
    return dist_sum_array(p->group, p->balance, p->n_balance, p->balance_scratch,
                          "the MoE load balance over the stages", err);
}
static void after_eval(trainer *t) {
    t->strat.pp.dp->after_eval(t);
}
// The stage's own waits (its sends and receives) count as exposed communication.
static void take_comm(trainer *t, double *exposed, double *hidden) {
    t->strat.pp.dp->take_comm(t, exposed, hidden);
    *exposed += t->strat.pp.group->comm_s;
    t->strat.pp.group->comm_s = 0;
}
static int load_hf(trainer *t, hf_load_report *rep, const st_set *set, const char *from,
                   ct_error *err) {
    return t->strat.pp.dp->load_hf(t, rep, set, from, err);
}
static void weights_ready(trainer *t) {
    t->strat.pp.dp->weights_ready(t);
}
// --- checkpoints: the one-process layout's ranges. Each pp rank holds its tensors whole, at
// their global ranges (its local buffer is exactly those ranges back to back, in order); under
// EP each EP rank of a stage its own experts. The first data-parallel index's pp ranks write one
// shard each, under EP every EP rank of the first replica (its experts; EP rank 0 also the rest),
// so any PP or EP degree (or one process) resumes it. Under TP, TP's checkpoint of each stage's
// local model: the first data-parallel index's pp x tp ranks write one shard each (TP's slices of
// their stages' tensors; under EP each stage's first EP block, its experts too), and a load
// reads each rank's slices by name, as TP alone.

// The ranks holding every tensor of the first replica between them: the stage's ranks [0, ep x
// etp) (EP's groups are consecutive data-parallel ranks, under TP with etp 1 consecutive ranks
// of the stage, with etp = tp those and their TP peers; without EP the first TP group, or rank
// 0).
static int block_of(const trainer *t) {
    return t->ep * t->etp;
}
static bool first_replica(const trainer *t) {
    return t->stage_group.rank < block_of(t);
}

// The stage's ranks hold the same weights where they should (FSDP's hold pieces).
static int check_replicas(trainer *t, ct_error *err) {
    return fsdp_on(t)   ? 0
           : t->ep > 1 ? strategy_ep_check_replicas(t, err)
                       : trainer_check_replicas(t, err);
}

// Under ZeRO-1: the local trained buffer's two moments whole, back to back in *out (host, 2 n
// floats), each rank's range gathered over the stage's ranks (every rank of t->d calls it).
static int stage_moments(trainer *t, float **out, ct_error *err) {
    const grad_sync *s = &t->strat.sync;
    const int P = t->d->size;
    const size_t n = qwen3_trained(&t->model)->num_params;
    size_t most = 0;
    for (int r = 0; r < P; r++)
        if (s->shard_start[r + 1] - s->shard_start[r] > most)
            most = s->shard_start[r + 1] - s->shard_start[r];
    float *all = malloc(((size_t)P + 1) * most * sizeof *all + 1);
    *out = malloc(2 * n * sizeof **out + 1);
    int rc = all && *out ? 0 : ct_fail(err, "out of memory for the stage's optimizer state");
    rc = dist_agree(t->d, rc, "the stage's optimizer state", err);
    ct_backend *be = t->opt.be;
    for (int k = 0; k < 2 && rc == 0; k++) {
        float *dev = k ? t->opt.v : t->opt.m, *mine = all + (size_t)P * most;
        float *host = be->view(be, dev, t->opt.n * sizeof(float), true, err);
        rc = host ? 0 : -1;
        if (host) memcpy(mine, host, t->opt.n * sizeof *mine);
        if (host) be->view_release(be, host, dev, t->opt.n * sizeof(float), false);
        rc = dist_agree(t->d, rc, "the stage's optimizer state", err);
        if (rc == 0)
            rc = dist_allgather(t->d, mine, all, (int)(most * sizeof *all),
                                "the stage's optimizer state", err);
        for (int r = 0; rc == 0 && r < P; r++)
            memcpy(*out + k * n + s->shard_start[r], all + (size_t)r * most,
                   (s->shard_start[r + 1] - s->shard_start[r]) * sizeof *all);
    }
    free(all);
    if (rc != 0) free(*out), *out = NULL;
    return rc;
}

// --- LoRA's checkpoints: a LoRA run's format (the whole adapter as model.safetensors, its AdamW
// state in one optimizer shard), so one process, or any PP or data-parallel layout, resumes it.
// Every pp group assembles the whole model's adapter and moments (each element one stage's, the
// others add zeros: exact; a few MB), world rank 0 writes them.

// The whole adapter: its layout, and its table with the weights (on the model's backend).
typedef struct pp_whole {
    lora_layout W;
    qwen3_model g;
    bool have_w, have_g;
} pp_whole;

static int whole_init(trainer *t, pp_whole *x, ct_error *err) {
    memset(x, 0, sizeof *x);
    if (lora_layout_init(&x->W, &t->setup.model, &t->model.lora->L.lc, err) != 0) return -1;
    x->have_w = true;
    if (qwen3_lora_table(&x->g, &x->W, &t->setup.model, &t->model, err) != 0) {
        qwen3_lora_table_free(&x->g);
        return -1;
    }
    x->have_g = true;
    return 0;
}

static void whole_free(pp_whole *x) {
    if (x->have_g) qwen3_lora_table_free(&x->g);
    if (x->have_w) lora_layout_free(&x->W);
}

// The whole adapter and its moments into w (host, 3 W.num floats: weights, exp_avg, exp_avg_sq),
// on every rank of this rank's pp group (every rank calls it: the stage's ranks gather ZeRO-1's
// moments).
static int whole_state(trainer *t, const pp_whole *x, float *w, ct_error *err) {
    const size_t N = x->W.num, n = t->model.lora->L.num;
    float *mom = NULL;
    int rc = qwen3_lora_read_whole(&t->model, &x->W, w, err);
    if (zero1(t)) {
        if (dist_agree(t->d, rc, "the PP checkpoint's adapter", err) != 0) rc = -1;
        else rc = stage_moments(t, &mom, err);
    } else if (rc == 0) { // the optimizer spans the adapter
        ct_backend *be = t->opt.be;
        if (!(mom = malloc(2 * n * sizeof *mom + 1)))
            rc = ct_fail(err, "out of memory for the PP checkpoint's moments");
        for (int k = 0; k < 2 && rc == 0; k++) {
            float *dev = k ? t->opt.v : t->opt.m;
            float *view = be->view(be, dev, n * sizeof(float), true, err);
            if (!view) {
                rc = -1;
                break;
            }
            memcpy(mom + k * n, view, n * sizeof *mom);
            be->view_release(be, view, dev, n * sizeof(float), false);
        }
    }
    for (int k = 0; k < 2 && rc == 0; k++)
        rc = qwen3_lora_to_whole(&t->model, &x->W, mom + k * n, w + (k + 1) * N, false, err);
    rc = dist_agree(t->strat.pp.group, rc, "the PP checkpoint's adapter", err);
    if (rc == 0) rc = strategy_pp_sum_stages(t, w, 3 * N, "the adapter over the stages", err);
    free(mom);
    return rc;
}

int strategy_pp_sum_stages(trainer *t, float *w, size_t n, const char *what, ct_error *err) {
    dist *grp = t->strat.pp.group;
    double *sum = calloc((1 + (size_t)grp->size) * n + 1, sizeof *sum); // the sum, its scratch
    int rc = sum ? 0 : ct_fail(err, "%s: out of memory for %zu floats", what, n);
    rc = dist_agree(grp, rc, what, err);
    for (size_t i = 0; rc == 0 && i < n; i++) sum[i] = w[i];
    if (rc == 0) rc = dist_sum_array(grp, sum, (int)n, sum + n, what, err);
    for (size_t i = 0; rc == 0 && i < n; i++) w[i] = (float)sum[i];
    free(sum);
    return rc;
}

static int save_lora(trainer *t, ct_error *err) {
    const int64_t step = t->state.step;
    t->strat.pp.group->timeout_s = t->world->timeout_s = t->d->timeout_s;
    int rc = trainer_check_replicas(t, err);
    if (rc == 0 && is_root(t)) rc = ckpt_begin(t->ckpt_root, step, t->save_tag, err);
    if (dist_agree(t->world, rc, "starting the checkpoint", err) != 0) return -1;
    pp_whole x;
    rc = whole_init(t, &x, err);
    const size_t N = x.W.num;
    float *w = rc == 0 ? calloc(3 * N + 1, sizeof *w) : NULL;
    if (rc == 0 && !w) rc = ct_fail(err, "out of memory for the PP checkpoint's adapter");
    if (dist_agree(t->world, rc, "the PP checkpoint's adapter", err) == 0) {
        rc = whole_state(t, &x, w, err);
    } else {
        rc = -1;
    }
    if (rc == 0 && is_root(t)) { // one process's files: one optimizer shard, the model
        char tmp[4200];
        ckpt_shard_info info = {0};
        t->model.be->write(t->model.be, x.g.param_mem, w, N * sizeof *w);
        rc = ckpt_tmp_path(tmp, sizeof tmp, t->ckpt_root, step, t->save_tag, err);
        if (rc == 0)
            rc = ckpt_write_optimizer_shard(tmp, 0, 1, 0, N, N, w + N, w + 2 * N, &info, err);
        if (rc == 0)
            rc = trainer_commit_replicated(t, &x.g, &info, 1,
                                           "the LoRA adapter assembled from the pipeline "
                                           "stages, 1 optimizer shard",
                                           err);
        if (rc != 0) ckpt_abandon(t->ckpt_root, step, t->save_tag);
    }
    free(w);
    whole_free(&x);
    return dist_agree(t->world, rc, "committing the checkpoint", err);
}

// A LoRA checkpoint (any layout's: they are all one process's format) into the stage's adapter
// and this rank's range of its moments.
static int load_lora(trainer *t, const char *dir, float *moments[2], ct_error *err) {
    pp_whole x;
    int rc = whole_init(t, &x, err);
    const size_t N = x.W.num, n = t->model.lora->L.num;
    float *w = rc == 0 ? calloc(3 * N + 1, sizeof *w) : NULL;
    float *loc = rc == 0 ? calloc(3 * n + 1, sizeof *loc) : NULL;
    if (rc == 0 && (!w || !loc)) rc = ct_fail(err, "out of memory for the PP checkpoint's adapter");
    train_state st;
    if (rc == 0)
        rc = ckpt_load(dir, &x.g, moments ? w + N : NULL, moments ? w + 2 * N : NULL, 0,
                       moments ? N : 0, moments ? &t->state : &st, NULL, err);
    if (rc == 0) t->model.be->read(t->model.be, w, x.g.param_mem, N * sizeof *w);
    for (int k = 0; k < 3 && rc == 0; k++)
        rc = qwen3_lora_to_whole(&t->model, &x.W, loc + k * n, w + k * N, true, err);
    if (rc == 0) qwen3_lora_write(&t->model, 0, n, loc);
    for (int k = 0; rc == 0 && moments && k < 2; k++)
        memcpy(moments[k], loc + (k + 1) * n + t->opt.base, t->opt.n * sizeof(float));
    free(w);
    free(loc);
    whole_free(&x);
    return rc;
}

// Under TP, shard q's writer's local model: pipeline rank q / block's stages (block: the first
// replica's ranks of a stage, tp, or under EP ep x etp), under EP with the experts of its EP
// rank (rank q % block of the stage: EP rank (q % block) / etp).
static int tp_layout_of(const trainer *t, int q, qwen3_config *lc, ct_error *err) {
    const int block = block_of(t);
    if (t->ep > 1) lc->expert_lo = q % block / t->etp * lc->local_experts;
    return strategy_pp_local_config(t, q / block, lc, err);
}

static int save_checkpoint(trainer *t, ct_error *err) {
    if (t->model.lora) return save_lora(t, err);
    if (t->tp > 1) {
        const strategy_tp_writers tw = {
            .S = t->pp * block_of(t),
            .per = block_of(t),
            .writers = &t->pp_writers,
            .layout_of = tp_layout_of,
            .note = t->ep <= 1 ? ", one per pipeline and TP rank"
                               : ", one per pipeline rank and rank of the stage's first EP block"};
        return strategy_tp_save_shards(t, &tw, err);
    }
    strategy_pp_state *p = &t->strat.pp;
    dist *grp = p->group, *w = t->world;
    const int P = grp->size, E = t->ep, S = P * E; // shard q E + e: pp rank q, EP rank e
    const int64_t step = t->state.step;
    grp->timeout_s = w->timeout_s = t->pp_writers.timeout_s = t->d->timeout_s;
    if (fsdp_on(t)) t->strat.fsdp.shard.timeout_s = t->d->timeout_s;
    if (E > 1) t->erep_group.timeout_s = t->d->timeout_s;
    int rc = check_replicas(t, err);
    if (rc == 0 && is_root(t)) rc = ckpt_begin(t->ckpt_root, step, t->save_tag, err);
    if (dist_agree(w, rc, "starting the checkpoint", err) != 0) return -1;
    qwen3_model g, layout;
    if (qwen3_init_layout(&g, &t->setup.model, err) != 0) return -1;
    trainer_shards sh;
    rc = trainer_shards_begin(t, &sh, S, err);
    // World rank 0 lists every shard's ranges: its ranks' local layouts, made here.
    for (int q = 0; rc == 0 && is_root(t) && q < S; q++) {
        qwen3_config lc = t->setup.model;
        if (local_config(t, q / E, q % E, &lc, err) != 0 ||
            qwen3_init_layout(&layout, &lc, err) != 0) {
            rc = -1;
            break;
        }
        sh.n_of[q] = trainer_named_ranges(&g, &layout, strategy_ep_saves(q % E), &sh.of[q], err);
        if (sh.n_of[q] < 0) rc = -1;
        qwen3_free(&layout);
    }
    rc = dist_agree(w, rc, "the PP checkpoint's ranges", err);
    // The writers (t->pp_writers, in shard order); under FSDP their local models assembled by
    // the stage's first shard group.
    const bool writes = first_replica(t);
    const bool first = t->d->rank < (fsdp_on(t) ? t->strat.fsdp.o.shard_degree : E);
    float *src[3] = {NULL, NULL, NULL}, *whole = NULL; // under ZeRO-1 the moments gathered
    if (zero1(t) && rc == 0) rc = stage_moments(t, &whole, err);
    if (rc == 0 && first && zero1(t)) {
        if ((src[0] = qwen3_params_view(&t->model, true, err)) == NULL) rc = -1;
        src[1] = whole, src[2] = whole ? whole + t->model.num_params : NULL;
    } else if (rc == 0 && first) {
        rc = strategy_local_state(t, fsdp_on(t), src, err);
    }
    if (rc == 0 && writes)
        rc = trainer_write_named_shard(t, &g, sh.tmp, src, strategy_ep_saves(t->d->rank),
                                       t->pp_writers.rank, S, sh.mine, err);
    if (first && zero1(t) && src[0]) qwen3_params_view_release(&t->model, src[0], false);
    else if (first && !zero1(t)) strategy_local_state_free(t, fsdp_on(t), src);
    free(whole);
    rc = trainer_shards_end(t, &sh, rc, w, writes ? &t->pp_writers : NULL, &g,
                            E > 1 ? ", one per pipeline rank and EP rank"
                                  : ", one per pipeline rank",
                            err);
    qwen3_free(&g);
    return rc;
}

// A checkpoint of any layout by tensor name: under FSDP into the full buffer and host moments
// spanning the local model, then this rank's pieces of them (under ZeRO-1 its range of the
// moments); under TP, TP's load (its slices); a LoRA run's, load_lora.
static int load_checkpoint(trainer *t, const char *dir, float *moments[2], ct_error *err) {
    if (t->model.lora) return load_lora(t, dir, moments, err);
    if (t->tp > 1) return strategy_tp.load_checkpoint(t, dir, moments, err);
    if (!fsdp_on(t) && !zero1(t)) return trainer_load_by_name(t, dir, moments, err);
    const size_t n = t->model.num_params;
    float *local[2] = {moments ? malloc(2 * n * sizeof(float) + 1) : NULL, NULL};
    if (moments && !local[0]) return ct_fail(err, "out of memory for the PP checkpoint's moments");
    if (local[0]) local[1] = local[0] + n;
    int rc = trainer_load_local_by_name(t, dir, moments ? local : NULL,
                                        moments ? &t->state : NULL, err);
    if (rc == 0 && fsdp_on(t)) {
        strategy_fsdp_take_all(t);
        for (int k = 0; moments && k < 2; k++) strategy_fsdp_pieces(t, local[k], moments[k]);
    }
    for (int k = 0; rc == 0 && zero1(t) && moments && k < 2; k++)
        memcpy(moments[k], local[k] + t->opt.base, t->opt.n * sizeof(float));
    free(local[0]);
    return rc;
}

// The weights alone (a LoRA run's base) from a checkpoint whose model is in shards.
static int load_sharded(trainer *t, const char *dir, ct_error *err) {
    if (t->tp > 1) return strategy_tp.load_sharded(t, dir, err);
    if (t->model.lora || zero1(t)) return trainer_load_model_by_name(t, dir, err);
    return load_checkpoint(t, dir, NULL, err);
}

// --- the schedule's runner

// Where a message for stage g's micro-batch i lands: its input (forward) or its output's
// gradient (backward).
static int tag_of(const strategy_pp_state *p, int g, int i, bool grad) {
    return PP_TAG + 2 * (g * p->m + i) + grad;
}
// The MoE sums that go with it: above every activation's tag.
static int sums_tag(const strategy_pp_state *p, int g, int i, bool grad) {
    return tag_of(p, g, i, grad) + 2 * p->S * p->m;
}

static int wait_one(trainer *t, ct_request **req, const char *what, int g, int i, ct_error *err) {
    char name[160];
    snprintf(name, sizeof name, "pipeline: %s of stage %d, micro-batch %d", what, g, i);
    return dist_wait_requests(t->strat.pp.group, t->model.be, req, 1, name, err);
}

// Every receive of the step, posted before its first action.
static int post_receives(trainer *t, ct_error *err) {
    strategy_pp_state *p = &t->strat.pp;
    ct_backend *be = t->model.be;
    const ct_comm c = dist_comm(p->group);
    const int P = p->group->size, n = (int)rows_floats(t);
    for (int k = 0; k < p->v; k++) {
        const int g = k * P + p->group->rank;
        for (int i = 0; i < p->m; i++) {
            const int at = k * p->m + i, V = p->v * p->m;
            if (g > 0 && be->comm_recv(be, &c, p->in[at], n, CT_COMM_F32, (g - 1) % P,
                                       tag_of(p, g, i, false), &p->req[at], err) != 0)
                return -1;
            if (g < p->S - 1 && be->comm_recv(be, &c, p->dout[at], n, CT_COMM_F32, (g + 1) % P,
                                              tag_of(p, g, i, true), &p->req[V + at], err) != 0)
                return -1;
            const int sb = p->n_sums * (int)sizeof(double);
            if (p->n_sums && g > 0 &&
                be->comm_recv(be, &c, p->sums_in[at], sb, CT_COMM_BYTE, (g - 1) % P,
                              sums_tag(p, g, i, false), &p->req[4 * V + at], err) != 0)
                return -1;
            if (p->n_sums && g < p->S - 1 &&
                be->comm_recv(be, &c, p->sums_dout[at], sb, CT_COMM_BYTE, (g + 1) % P,
                              sums_tag(p, g, i, true), &p->req[5 * V + at], err) != 0)
                return -1;
        }
    }
    return 0;
}

// A copy of src (the stage's output or input gradient) into buf, sent to stage g's rank.
static int send_rows(trainer *t, float *buf, const float *src, int g, int tag, ct_request **req,
                     ct_error *err) {
    strategy_pp_state *p = &t->strat.pp;
    ct_backend *be = t->model.be;
    const ct_comm c = dist_comm(p->group);
    const size_t n = rows_floats(t);
    be->copy(be, buf, src, n * sizeof(float));
    p->bytes += (double)n * sizeof(float);
    return be->comm_send(be, &c, buf, (int)n, CT_COMM_F32, g % p->group->size, tag, req, err);
}

// MoE, after stage g's forward of micro-batch i (at = k m + i): the sums so far (the previous
// stage's, received) plus this stage's layers', kept (the last stage) or sent on.
static int forward_sums(trainer *t, int g, int i, int at, ct_error *err) {
    strategy_pp_state *p = &t->strat.pp;
    ct_backend *be = t->model.be;
    const size_t bytes = (size_t)p->n_sums * sizeof(double);
    const int V = p->v * p->m;
    if (g == 0)
        memset(p->sums, 0, bytes);
    else if (wait_one(t, &p->req[4 * V + at], "the MoE statistics", g, i, err) != 0)
        return -1;
    else
        be->read(be, p->sums, p->sums_in[at], bytes);
    moe_balance_add_sums(&t->moe, p->sums);
    be->write(be, p->sums_out[at], p->sums, bytes);
    if (g == p->S - 1) return 0;
    const ct_comm c = dist_comm(p->group);
    return be->comm_send(be, &c, p->sums_out[at], (int)bytes, CT_COMM_BYTE, (g + 1) % p->group->size,
                         sums_tag(p, g + 1, i, false), &p->req[6 * V + at], err);
}

// MoE, before stage g's backward of micro-batch i: the whole model's sums over every rank into
// p->sums, which the backward's aux gradient reads: the last stage sums its over the ranks, the
// others receive them from the next stage.
static int whole_sums(trainer *t, int g, int i, int at, ct_error *err) {
    strategy_pp_state *p = &t->strat.pp;
    ct_backend *be = t->model.be;
    const size_t bytes = (size_t)p->n_sums * sizeof(double);
    const int V = p->v * p->m;
    if (g == p->S - 1) {
        be->read(be, p->sums, p->sums_out[at], bytes);
        if (dist_sum_array(t->moe_ranks, p->sums, p->n_sums, p->sums_scratch,
                           "the MoE statistics over the ranks", err) != 0)
            return -1;
    } else {
        if (wait_one(t, &p->req[5 * V + at], "the whole model's MoE statistics", g, i, err) != 0)
            return -1;
        be->read(be, p->sums, p->sums_dout[at], bytes);
    }
    t->moe.whole = p->sums;
    return 0;
}

// After the backward: the same sums to the previous stage.
static int backward_sums(trainer *t, int g, int i, int at, ct_error *err) {
    strategy_pp_state *p = &t->strat.pp;
    ct_backend *be = t->model.be;
    const size_t bytes = (size_t)p->n_sums * sizeof(double);
    const int V = p->v * p->m;
    t->moe.whole = NULL;
    if (g == 0) return 0;
    be->write(be, p->sums_din[at], p->sums, bytes);
    const ct_comm c = dist_comm(p->group);
    return be->comm_send(be, &c, p->sums_din[at], (int)bytes, CT_COMM_BYTE, (g - 1) % p->group->size,
                         sums_tag(p, g - 1, i, true), &p->req[7 * V + at], err);
}

// The schedule's order, one line per action ("F stage mb" / "B stage mb"), for the tests: the
// first step's, into $CTITAN_PP_TRACE.<world rank>.
static FILE *trace_open(const trainer *t) {
    const char *prefix = getenv("CTITAN_PP_TRACE");
    if (!prefix || !*prefix || t->state.step != 0) return NULL;
    char path[4200];
    snprintf(path, sizeof path, "%s.%d", prefix, t->world->rank);
    return fopen(path, "w");
}

// For bench/parallel.py's bubble figure: each step's schedule time (from the first action to
// the loss summed over the stages) and the part of it this rank waited on the pipeline's
// receives, sends and that sum, appended as "step run_s wait_s" to $CTITAN_PP_IDLE.<world rank>.
static void idle_note(const trainer *t, double t0, double wait0) {
    const char *prefix = getenv("CTITAN_PP_IDLE");
    if (!prefix || !*prefix) return;
    char path[4200];
    snprintf(path, sizeof path, "%s.%d", prefix, t->world->rank);
    FILE *f = fopen(path, "a");
    if (!f) return;
    fprintf(f, "%lld %.6f %.6f\n", (long long)t->state.step + 1, ct_now_s() - t0,
            t->strat.pp.group->comm_s - wait0);
    fclose(f);
}

// One step's micro-batches through the schedule: the loss sum over every stage's micro-batches
// (the last stage's, summed over the pp group) and the MoE aux sum.
static int run_micro(trainer *t, float scale, double *loss_sum, double *aux_sum, ct_error *err) {
    strategy_pp_state *p = &t->strat.pp;
    qwen3_model *m = &t->model;
    const int P = p->group->size, V = p->v * p->m;
    p->group->timeout_s = t->d->timeout_s;
    const double t0 = ct_now_s(), wait0 = p->group->comm_s;
    if (post_receives(t, err) != 0) return -1;
    FILE *trace = trace_open(t);
    int rc = 0;
    double loss = 0;
    p->n_free = p->n_sets;
    for (int j = 0; j < p->n_sets; j++) p->free_sets[j] = p->n_sets - 1 - j; // set 0 first
    for (int a = 0; a < p->n_actions && rc == 0; a++) {
        const pp_action *x = &p->actions[a];
        const int k = x->stage / P, i = x->mb, at = k * p->m + i, g = x->stage;
        const qwen3_batch mb = trainer_micro_batch(t, i);
        if (trace) fprintf(trace, "%c %d %d\n", x->backward ? 'B' : 'F', g, i);
        if (!x->backward) {
            if (g > 0 && (rc = wait_one(t, &p->req[at], "the input", g, i, err)) != 0) break;
            if (p->n_free == 0) { // pp_schedule_in_flight counted them: never
                rc = ct_fail(err, "PP: more micro-batches in flight than %d sets", p->n_sets);
                break;
            }
            use_set(t, p->set_of[at] = p->free_sets[--p->n_free]);
            const double l = qwen3_stage_forward(m, &mb, p->l0[k], p->l1[k], p->in[at], true, NULL);
            if (p->n_sums && (rc = forward_sums(t, g, i, at, err)) != 0) break;
            if (g == p->S - 1) loss += l;
            else
                rc = send_rows(t, p->out[at], qwen3_stage_output(m, p->l1[k]), g + 1,
                               tag_of(p, g + 1, i, false), &p->req[2 * V + at], err);
            continue;
        }
        // Buckets start in the backward that makes the stage's gradients final: its last.
        begin_micro(t, i == p->m - 1);
        use_set(t, p->set_of[at]); // the activations its forward kept
        if (g < p->S - 1 && (rc = wait_one(t, &p->req[V + at], "the output's gradient", g, i, err)))
            break;
        if (p->n_sums && (rc = whole_sums(t, g, i, at, err)) != 0) break;
        qwen3_stage_backward(m, p->l0[k], p->l1[k], p->dout[at], scale);
        p->free_sets[p->n_free++] = p->set_of[at];
        if ((rc = trainer_micro_status(t, err)) != 0) break;
        // HF's aux of the micro-batch, once: the last stage's, from the whole model's sums.
        if (p->n_sums && g == p->S - 1) *aux_sum += moe_balance_aux_of(m->cfg.num_experts, p->sums);
        if (p->n_sums && (rc = backward_sums(t, g, i, at, err)) != 0) break;
        if (g > 0)
            rc = send_rows(t, p->din[at], qwen3_stage_dinput(m), g - 1, tag_of(p, g - 1, i, true),
                           &p->req[3 * V + at], err);
    }
    if (trace) fclose(trace);
    use_set(t, 0);
    t->moe.whole = NULL;
    if (rc == 0)
        rc = dist_wait_requests(p->group, m->be, p->req + 2 * V, 2 * V, "pipeline: the sends", err);
    if (rc == 0 && p->n_sums)
        rc = dist_wait_requests(p->group, m->be, p->req + 6 * V, 2 * V,
                                "pipeline: the MoE statistics' sends", err);
    if (rc != 0) return -1;
    // The loss: the last stage's, on every stage's line.
    if (dist_sum(p->group, loss, loss_sum, "the step's loss over the stages", err) != 0 ||
        dist_sum(p->group, *aux_sum, aux_sum, "the MoE aux over the stages", err) != 0)
        return -1;
    idle_note(t, t0, wait0);
    return 0;
}

// Validation's batch (t->val_B sequences) forward through the stages, t->B sequences at a time,
// each stage waiting for its input: the last stage's loss sum and valid-target count, then
// broadcast over the pp group. Its messages are tagged above the training step's.
static int eval_forward(trainer *t, const qwen3_batch *b, double *loss, int64_t *n_valid,
                        ct_error *err) {
    strategy_pp_state *p = &t->strat.pp;
    qwen3_model *m = &t->model;
    ct_backend *be = m->be;
    const ct_comm c = dist_comm(p->group);
    const int P = p->group->size, n = (int)rows_floats(t), tag = PP_TAG + 4 * p->S * p->m;
    // A micro-batch's tokens in the batch's buffers (under CP its sequences' T / cp rows each).
    const size_t per = (size_t)t->B * (t->T / t->cp);
    double res[2] = {0, 0}; // the loss sum and the count, on the last stage
    p->group->timeout_s = t->d->timeout_s;
    for (int j = 0; j < t->val_B / t->B; j++) {
        const qwen3_batch mb = {.inputs = b->inputs + j * per, .targets = b->targets + j * per,
                                .positions = b->positions ? b->positions + j * per : NULL};
        for (int k = 0; k < p->v; k++) {
            const int g = k * P + p->group->rank;
            ct_request *req = NULL;
            if (g > 0 && (be->comm_recv(be, &c, p->in[0], n, CT_COMM_F32, (g - 1) % P, tag + g,
                                        &req, err) != 0 ||
                          wait_one(t, &req, "validation's input", g, j, err) != 0))
                return -1;
            int64_t count = 0;
            const double l =
                qwen3_stage_forward(m, &mb, p->l0[k], p->l1[k], p->in[0], false, &count);
            if (g == p->S - 1) {
                res[0] += l, res[1] += (double)count;
                continue;
            }
            be->copy(be, p->out[0], qwen3_stage_output(m, p->l1[k]), (size_t)n * sizeof(float));
            if (be->comm_send(be, &c, p->out[0], n, CT_COMM_F32, (g + 1) % P, tag + g + 1, &req,
                              err) != 0 ||
                wait_one(t, &req, "validation's output", g, j, err) != 0)
                return -1;
        }
    }
    if (dist_bcast(p->group, res, sizeof res, (p->S - 1) % P, "the validation loss over the "
                                                                 "stages", err) != 0)
        return -1;
    *loss = res[0];
    *n_valid = (int64_t)res[1];
    return 0;
}

// --- the export: the pp ranks of data-parallel index 0 pass each tensor to world rank 0. Under
// TP, those of TP rank 0 do; for each tensor the stage holding it assembles it over its TP group
// (strategy_tp_gather), whose other ranks follow their rank 0's tensor indices. Under EP the same
// over the first replica's EP group: an expert comes from the EP rank holding it
// (strategy_ep_fetch_expert); under EP x TP over its EP block (strategy_tp_gather: the rest from
// the first TP group).

typedef struct pp_export {
    trainer *t;
    const qwen3_model *g;
    float *buf, *local; // one tensor; this rank's weights (host)
    float *all;         // under TP: the group's slices of one tensor
} pp_export;

// The pp rank holding global tensor `name`.
static int owner_of(const trainer *t, const char *name) {
    const strategy_pp_state *p = &t->strat.pp;
    int l;
    if (sscanf(name, "model.layers.%d.", &l) == 1) {
        for (int s = 0; s < p->S; s++)
            if (l >= p->stage[s].lo && l < p->stage[s].hi) return s % p->group->size;
    }
    return strcmp(name, "model.embed_tokens.weight") == 0 ? 0 : (p->S - 1) % p->group->size;
}

int strategy_pp_lora_base_hash(trainer *t, uint64_t *h, ct_error *err) {
    qwen3_model g, *m = &t->model;
    if (qwen3_init_layout(&g, &t->setup.model, err) != 0) return -1;
    const int n = g.n_params, P = t->strat.pp.group->size;
    uint64_t *all = calloc((size_t)(P + 1) * n + 1, sizeof *all), *mine = all + (size_t)P * n;
    int rc = all ? 0 : ct_fail(err, "out of memory for the base's hashes");
    for (int i = 0; rc == 0 && i < m->n_params; i++) {
        const qwen3_param *gp = qwen3_find_param(&g, m->params[i].name);
        if (!gp)
            rc = ct_fail(err, "tensor %s is not in the global layout", m->params[i].name);
        else
            mine[gp - g.params] = qwen3_lora_tensor_hash(m, &m->params[i]);
    }
    rc = dist_agree(t->strat.pp.group, rc, "the LoRA base's identity", err);
    if (rc == 0)
        rc = dist_allgather(t->strat.pp.group, mine, all, (int)(n * sizeof *all),
                            "the LoRA base's identity", err);
    *h = QWEN3_LORA_HASH0;
    for (int i = 0; rc == 0 && i < n; i++)
        *h = qwen3_lora_hash_step(*h, all[(size_t)owner_of(t, g.params[i].name) * n + i], i);
    free(all);
    qwen3_free(&g);
    return rc;
}

// The stage's group whose rank 0 names each tensor to the others, which then help assemble it:
// the first replica's EP block (its EP group, with etp = tp and their TP peers), or TP's; NULL
// when the stage's ranks hold every tensor whole.
static dist *inner_group(trainer *t) {
    return t->ep > 1 ? ep_block(t) : t->tp > 1 ? t->strat.tp.group : NULL;
}

// Global tensor i into x->buf on this rank when its stage holds it (under TP or EP: every rank of
// the stage's inner group, after its rank 0 named it to them).
static int take_tensor(pp_export *x, int i, ct_error *err) {
    const qwen3_param *gp = &x->g->params[i];
    if (owner_of(x->t, gp->name) != x->t->strat.pp.group->rank) return 0;
    if (x->t->tp > 1) return strategy_tp_gather(x->t, x->local, gp, x->all, x->buf, err);
    if (x->t->ep > 1 && strategy_ep_is_expert(gp->name))
        return strategy_ep_fetch_expert(x->t, gp, x->local, x->buf, err);
    const qwen3_param *p = qwen3_find_param(&x->t->model, gp->name);
    if (!p) return ct_fail(err, "PP export: %s is not on its stage", gp->name);
    memcpy(x->buf, x->local + p->offset, gp->numel * sizeof(float));
    return 0;
}

// Under TP or EP: tensor i (-1: the end) named to the inner group by its rank 0.
static int name_to_inner(trainer *t, int *i, ct_error *err) {
    dist *in = inner_group(t);
    return in ? dist_bcast(in, i, sizeof *i, 0, "the PP export's next tensor", err) : 0;
}

// Tensor i of the global table into x->buf on every pp rank, from its owner.
static int fetch_tensor(void *ctx, int i, ct_error *err) {
    pp_export *x = ctx;
    const qwen3_param *gp = &x->g->params[i];
    if (name_to_inner(x->t, &i, err) != 0 || take_tensor(x, i, err) != 0) return -1;
    return dist_bcast(x->t->strat.pp.group, x->buf, gp->numel * sizeof(float),
                      owner_of(x->t, gp->name), "the PP export's tensor", err);
}

// A rank other than its inner group's rank 0: the tensors that rank names, to the end.
static int follow(pp_export *x, ct_error *err) {
    for (int i = 0;;) {
        if (name_to_inner(x->t, &i, err) != 0) return -1;
        if (i < 0) return 0;
        if (take_tensor(x, i, err) != 0) return -1;
    }
}

// The weights as one HF folder in dir (world rank 0 writes; the first replica's stages take
// part: their ranks of data-parallel index 0, under EP its EP groups).
static int export_hf(trainer *t, const char *dir, ct_dtype dtype, ct_error *err) {
    // The local model: a view, or under FSDP assembled by the stage's first shard group, a
    // collective over it, before the other data-parallel ranks leave (they hold the same).
    const bool sh = sharded(t);
    float *src[3] = {NULL, NULL, NULL};
    int rc = 0;
    if (!sh || t->d->rank < t->strat.fsdp.o.shard_degree) {
        if (sh) t->strat.fsdp.shard.timeout_s = t->d->timeout_s;
        rc = strategy_local_state(t, sh, src, err);
    }
    if (!first_replica(t)) {
        strategy_local_state_free(t, sh, src);
        return rc;
    }
    qwen3_model g = {0};
    // Under EP the ranks of EP rank e > 0 form pp groups of their own, which only follow.
    dist *grp = t->strat.pp.group, *in = inner_group(t);
    grp->timeout_s = t->d->timeout_s;
    if (in) in->timeout_s = t->d->timeout_s;
    const bool have_g = rc == 0 && qwen3_init_layout(&g, &t->setup.model, err) == 0;
    if (!have_g) rc = -1;
    size_t most = 0;
    for (int i = 0; rc == 0 && i < g.n_params; i++)
        most = g.params[i].numel > most ? g.params[i].numel : most;
    pp_export x = {t, &g, rc == 0 ? malloc(most * sizeof(float) + 1) : NULL, src[0],
                   rc == 0 && t->tp > 1 ? malloc(most * sizeof(float) + 1) : NULL};
    if (rc == 0 && (!x.buf || (t->tp > 1 && !x.all)))
        rc = ct_fail(err, "the PP export: out of memory");
    rc = dist_agree(grp, rc, "the PP export's buffers", err);
    if (in) rc = dist_agree(in, rc, "the PP export's buffers", err);
    strategy_export sx = {.grp = grp, .g = &g, .full = &x.buf, .fetch = fetch_tensor, .ctx = &x};
    if (rc == 0 && in && in->rank != 0) {
        rc = follow(&x, err);
    } else if (rc == 0) {
        rc = strategy_export_stream(&sx, t, dir, dtype, "the PP export's end", err);
        int end = -1; // the TP ranks that follow stop (after a failure too)
        ct_error ignored;
        if (name_to_inner(t, &end, &ignored) != 0 && rc >= 0) rc = -1, *err = ignored;
    }
    strategy_local_state_free(t, sh, src);
    free(x.buf);
    free(x.all);
    if (have_g) qwen3_free(&g);
    return rc;
}

// The inner strategy's bytes (TP's), then the activations and their gradients sent.
static int comm_bytes(const trainer *t, double n, char *buf, size_t size) {
    const strategy_vt *in = t->strat.pp.dp;
    const int at = in->comm_bytes ? in->comm_bytes(t, n, buf, size) : 0;
    if (at < 0 || (size_t)at >= size) return at;
    return at + snprintf(buf + at, size - at, "; pipeline activations and their gradients sent %.0f",
                         t->strat.pp.bytes / n);
}

const strategy_vt strategy_pp = {
    .describe = describe,
    .memory_note = "",
    .optimizer_sharded = false,
    .estimate = estimate,
    .setup = setup,
    .free = free_,
    .init_random = init_random,
    .load_sharded = load_sharded,
    .load_hf = load_hf,
    .weights_ready = weights_ready,
    .begin_step = begin_step,
    .begin_micro = begin_micro,
    .unit_ready = unit_ready,
    .grads_final = grads_final,
    .grad_sq = grad_sq,
    .shard = shard,
    .after_update = after_update,
    .eval_forward = eval_forward,
    .after_eval = after_eval,
    .take_comm = take_comm,
    .load_checkpoint = load_checkpoint,
    .save_checkpoint = save_checkpoint,
    .model_in_shards = false,
    .run_micro = run_micro,
    .comm_bytes = comm_bytes,
    .export_hf = export_hf,
    .export_from = "pipeline stages",
};
