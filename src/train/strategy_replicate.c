// Replicate (DDP) and ZeRO-1: every rank holds the whole model; gradients are reduced in
// buckets (parallel/grad_sync.h) that start during the last micro-batch's backward, at the
// model's unit events. ZeRO-1 steps AdamW over this rank's 1/N of the buffer and all-gathers
// the updated weights. What is reduced, stepped and saved is the model's trained parameters
// (qwen3_trained): the model itself, or a LoRA model's adapter (its frozen base is neither
// reduced nor saved).
#include <stdlib.h>
#include <string.h>

#include "model/hf_adapter.h"
#include "optim/adamw.h"
#include "train/strategy.h"
#include "train/trainer_internal.h"

// ZeRO-1's table, or LoRA under FSDP's (its adapter under ZeRO-1); under PP the one inside each
// stage (strategy_pp.c sets it before its setup).
static bool zero1(const trainer *t) {
    return (t->pp > 1 ? t->strat.pp.dp : t->strat.vt)->optimizer_sharded;
}

// (Under PP, strategy_pp.c's describe words ZeRO-1 itself.)
static void describe(const trainer *t, char *buf, size_t size) {
    snprintf(buf, size, "%s",
             t->d->size == 1 ? "no data parallelism"
             : zero1(t)      ? "ZeRO-1: optimizer state sharded over all ranks"
                             : "replicated model and optimizer state (DDP)");
}

static int setup(trainer *t, ct_error *err) {
    if (qwen3_parallelize(&t->strat.plan, &t->model.cfg, &t->model, err) != 0) return -1;
    return strategy_replicate_setup_sync(t, err);
}

int strategy_replicate_setup_sync(trainer *t, ct_error *err) {
    const ct_config *c = t->cfg;
    qwen3_model *m = &t->model, *tm = qwen3_trained(m);
    strategy *st = &t->strat;
    // Buckets end at tensor boundaries of the trained buffer.
    size_t *starts = malloc(((size_t)tm->n_params + 1) * sizeof *starts);
    st->unit_lo = malloc(((size_t)qwen3_n_units(&m->cfg) + 1) * sizeof *st->unit_lo);
    if (!starts || !st->unit_lo) {
        free(starts);
        return ct_fail(err, "out of memory for the parameter table");
    }
    for (int i = 0; i < tm->n_params; i++) starts[i] = tm->params[i].offset;
    qwen3_trained_units(m, st->unit_lo);
    size_t bucket = (size_t)(c->comm.bucket_cap_mb * 1024 * 1024 / sizeof(float));
    int rc = grad_sync_init(&st->sync, t->d, zero1(t) ? GRAD_SYNC_SHARD : GRAD_SYNC_REPLICATE,
                            m->be, m->ops, tm->param_mem, tm->grad_mem, tm->num_params, starts,
                            tm->n_params, bucket,
                            strcmp(c->training.mixed_precision_reduce, "bfloat16") == 0, err);
    free(starts);
    if (rc != 0) return -1;
    size_t lo = st->sync.shard_lo, n = st->sync.shard_hi - lo;
    if (adamw_init_shard(&t->opt, m->be, tm->num_params, lo, n, err) != 0) return -1;
    // Buffers (the MoE expert bias) are not trained: no decay, and their gradient stays 0, so
    // AdamW leaves them alone. (A LoRA adapter's A and B are matrices: they decay.)
    for (int i = 0; i < tm->n_params; i++) {
        const qwen3_param *p = &tm->params[i];
        if (!trainer_param_decays(t, p) &&
            adamw_exclude_decay(&t->opt, p->offset, p->numel, err) != 0)
            return -1;
    }
    m->unit_hook = st->vt->unit_ready;
    m->unit_hook_ctx = t;
    fprintf(t->log, "comm: %d gradient bucket(s) of up to %.0f MiB, %s, in %s\n",
            st->sync.n_buckets, c->comm.bucket_cap_mb,
            c->comm.overlap ? "reduced during the backward" : "reduced after the backward",
            c->training.mixed_precision_reduce);
    return 0;
}

static void free_(trainer *t) {
    strategy_replicate_free_sync(t);
    qwen3_parallel_plan_free(&t->strat.plan);
}

void strategy_replicate_free_sync(trainer *t) {
    grad_sync_free(&t->strat.sync);
    free(t->strat.unit_lo);
    t->strat.unit_lo = NULL;
}

// The model's weights (a LoRA model's base; trainer_setup.c then draws its adapter).
static int init_random(trainer *t, uint64_t seed, ct_error *err) {
    return qwen3_init_random(&t->model, seed, err);
}

static int load_sharded(trainer *t, const char *dir, ct_error *err) {
    train_state ignored;
    return ckpt_load(dir, &t->model, NULL, NULL, 0, 0, &ignored, NULL, err);
}

static int load_hf(trainer *t, hf_load_report *rep, const st_set *set, const char *from,
                   ct_error *err) {
    return hf_load_weights(&t->model, rep, set, from, err);
}

static void weights_ready(trainer *t) {
    qwen3_refresh_bf16(&t->model);
}

static void begin_step(trainer *t) {
    qwen3_zero_grad(&t->model);
    grad_sync_begin(&t->strat.sync);
}

// Buckets start during the last micro-batch's backward, when gradients become final.
static void begin_micro(trainer *t, bool last) {
    t->strat.overlap = last && t->cfg->comm.overlap && t->d->size > 1;
}

// Once a unit's gradients are final, so is everything from its first element on.
static void unit_ready(void *ctx, int unit, int event) {
    trainer *t = ctx;
    if (event != QWEN3_UNIT_BACKWARD_DONE || !t->strat.overlap) return;
    // An error here resurfaces in grad_sync_finish, which waits on the same requests.
    ct_error ignored;
    grad_sync_ready(&t->strat.sync, t->strat.unit_lo[unit], &ignored);
}

static int grads_final(trainer *t, ct_error *err) {
    t->strat.overlap = false;
    return grad_sync_finish(&t->strat.sync, err);
}

// Each shard's sum of squares, added in rank order (the replicas hold the same sums).
static int grad_sq(trainer *t, double *sq, ct_error *err) {
    const grad_sync *s = &t->strat.sync;
    t->model.ops->sum_squares(sq, qwen3_trained(&t->model)->grad_mem + s->shard_lo,
                              s->shard_hi - s->shard_lo);
    return zero1(t) ? dist_sum(t->d, *sq, sq, "the gradient norm", err) : 0;
}

// When this rank updates every weight, the optimizer's pass refreshes the bf16 copy too.
// (A LoRA adapter has no bf16 copy: its kernels round it as they read it.)
static bool updates_all(trainer *t) {
    return t->strat.sync.shard_lo == 0 &&
           t->strat.sync.shard_hi == qwen3_trained(&t->model)->num_params;
}

static strategy_shard shard(trainer *t) {
    qwen3_model *tm = qwen3_trained(&t->model);
    return (strategy_shard){tm->param_mem, tm->grad_mem, updates_all(t) ? tm->param_bf16 : NULL};
}

static int after_update(trainer *t, ct_error *err) {
    if (grad_sync_gather_params(&t->strat.sync, err) != 0) return -1;
    if (!updates_all(t)) qwen3_refresh_bf16(&t->model);
    return 0;
}

static void after_eval(trainer *t) {
    (void)t;
}

static void take_comm(trainer *t, double *exposed, double *hidden) {
    (void)t;
    *exposed = *hidden = 0;
}

// Every rank holds the model: the weights and this rank's range of the moments, from a
// checkpoint of any rank count.
static int load_checkpoint(trainer *t, const char *dir, float *moments[2], ct_error *err) {
    return ckpt_load(dir, qwen3_trained(&t->model), moments[0], moments[1], t->opt.base, t->opt.n,
                     &t->state, NULL, err);
}

#define REPLICA_STRATEGY(note, sharded)                                                            \
    {                                                                                              \
        .describe = describe, .memory_note = note, .optimizer_sharded = sharded, .setup = setup,   \
        .free = free_, .init_random = init_random, .load_sharded = load_sharded,                   \
        .load_hf = load_hf, .weights_ready = weights_ready, .begin_step = begin_step,              \
        .begin_micro = begin_micro, .unit_ready = unit_ready, .grads_final = grads_final,          \
        .grad_sq = grad_sq, .shard = shard, .after_update = after_update,                          \
        .after_eval = after_eval, .take_comm = take_comm, .load_checkpoint = load_checkpoint,      \
        .save_checkpoint = trainer_save_replicated, .model_in_shards = false                       \
    }

const strategy_vt strategy_replicate = REPLICA_STRATEGY("", false);
const strategy_vt strategy_zero1 = REPLICA_STRATEGY(" (ZeRO-1 shard)", true);
