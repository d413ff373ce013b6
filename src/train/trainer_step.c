// One optimizer step: the step's samples, the micro-batches' forward and backward, the
// strategy's reductions, the norm, the MoE balance, AdamW over this rank's shard.
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/loader.h"
#include "model/moe_balance.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "optim/lr_schedule.h"
#include "train/trainer_internal.h"

// debug.fault: a real failure of the kind a rank can meet, on one rank at one step, for the
// tests of failure handling. Returns true when `kind` hits this rank at `step` (from 1).
bool trainer_fault_at(const trainer *t, const char *kind, int64_t step) {
    const ct_config_debug *dbg = &t->cfg->debug;
    return strcmp(dbg->fault, kind) == 0 && dbg->fault_rank == (t->world ? t->world : t->d)->rank &&
           dbg->fault_step == step;
}

// The same, for the step about to run.
static bool fault_now(const trainer *t, const char *kind) {
    return trainer_fault_at(t, kind, t->state.step + 1);
}

// Reads this rank's samples of the step: the step covers global samples [g0, g0 + global) and
// rank r takes the r-th block of accum*B of them, in order. Checks the token ids and agrees
// with the other ranks on the outcome; *valid gets the step's count of valid targets over all
// ranks.
// Under CP the data-parallel rank's block is its CP group's: each of its ranks reads the same
// samples, counts their targets before sharding them (rank 0 of the group only, so that the sum
// counts each token once), and keeps its own two chunks of each.
static int read_step_samples(trainer *t, int64_t *valid, ct_error *err) {
    int n = t->accum * t->B;
    const int dp_rank = t->cp > 1 ? cp_dp_rank(t) : t->d->rank;
    uint64_t g0 = t->state.samples_seen, mine = g0 + (uint64_t)dp_rank * n;
    uint64_t last = g0 + t->global_batch - 1;
    if (loader_epoch(&t->train_loader, g0) != loader_epoch(&t->train_loader, last) ||
        (g0 > 0 && loader_epoch(&t->train_loader, g0) != loader_epoch(&t->train_loader, g0 - 1)))
        fprintf(t->log, "data: epoch %llu begins\n",
                (unsigned long long)loader_epoch(&t->train_loader, last));
    int64_t local = 0;
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        size_t off = (size_t)i * t->T;
        int32_t *tg = t->targets + off;
        rc = loader_sample(&t->train_loader, t->inputs + off, tg,
                           t->positions ? t->positions + off : NULL, mine + i, err);
        for (int j = 0; j < t->T; j++) local += tg[j] != QWEN3_IGNORE_INDEX;
    }
    if (t->cp > 1) {
        if (t->cpx.group.rank != 0) local = 0;
        if (t->positions) cp_shard(t, t->positions, n);
        cp_shard(t, t->inputs, n);
        cp_shard(t, t->targets, n);
    }
    if (fault_now(t, "bad_token")) t->inputs[t->T / t->cp / 2] = t->setup.model.vocab_size + 7;
    // The step's one check of its inputs (the forwards below trust it: qwen3_batch.checked).
    const qwen3_batch step = {.inputs = t->inputs, .targets = t->targets, .positions = t->positions};
    if (rc == 0) rc = qwen3_batch_check(&t->model, &step, n, err);
    if (rc != 0)
        ct_wrap(err, "training data, step %lld, samples %llu..%llu", (long long)t->state.step + 1,
                (unsigned long long)mine, (unsigned long long)(mine + n - 1));
    if (dist_agree(t->d, rc, "the step's data check", err) != 0) return -1;
    double total;
    if (dist_sum(t->d, (double)local, &total, "the step's token count", err) != 0) return -1;
    *valid = (int64_t)total;
    return 0;
}

// MoE, before the optimizer step: each sparse layer's load balance for the metrics and, with
// load_balance = aux_free, the expert-bias update from the step's token counts (summed over
// ranks, so every rank moves its biases alike).
static void moe_before_optimizer(trainer *t, bool skipped) {
    moe_balance_end_step(&t->moe, t->aux_free && !skipped, (float)t->cfg->model.load_balance_coeff);
}

qwen3_batch trainer_micro_batch(const trainer *t, int a) {
    size_t off = (size_t)a * t->B * (t->T / t->cp); // the model's rows (under CP its shard)
    // Its rows are the step's global samples mine + a*B.. (read_step_samples): LoRA's dropout
    // masks follow them, whatever the ranks and micro-batches.
    const uint64_t sample0 = t->state.samples_seen +
                             (uint64_t)t->d->rank * (uint64_t)(t->accum * t->B) +
                             (uint64_t)a * (uint64_t)t->B;
    return (qwen3_batch){.inputs = t->inputs + off,
                         .targets = t->targets + off,
                         .positions = t->positions ? t->positions + off : NULL,
                         .checked = true,
                         .sampled = true,
                         .sample0 = sample0};
}

// One optimizer step: the loss is the sum of token losses over every micro-batch of every rank
// divided by the step's count of valid targets, so ranks and accumulation give the global
// token-weighted mean; summing the ranks' gradients gives its gradient.
int trainer_micro_status(trainer *t, ct_error *err) {
    // An expert-parallel exchange that failed in this pass comes first: the balance sum after it
    // then timed out for the same reason.
    if (t->ep > 1 && t->strat.ep.failed) {
        *err = t->strat.ep.err;
        return -1;
    }
    return moe_balance_status(&t->moe, err);
}

int trainer_step(trainer *t, step_result *r, ct_error *err) {
    t->d->comm_s = 0;
    int64_t valid;
    if (read_step_samples(t, &valid, err) != 0) return -1;
    if (fault_now(t, "exit")) _exit(3);
    if (fault_now(t, "hang"))
        for (;;) pause();
    qwen3_model *m = &t->model;
    const strategy_vt *vt = t->strat.vt;
    vt->begin_step(t);
    if (t->cp > 1) cp_begin_step(t);
    double loss_sum = 0, aux_sum = 0;
    // A strategy may run the step's micro-batches itself (pipeline parallelism's schedule).
    if (vt->run_micro && vt->run_micro(t, fault_now(t, "nan") ? NAN : valid ? 1.0f / (float)valid : 0.0f,
                                       &loss_sum, &aux_sum, err) != 0)
        return -1;
    for (int a = 0; !vt->run_micro && a < t->accum; a++) {
        bool last = a == t->accum - 1;
        vt->begin_micro(t, last);
        // debug.fault nan: this rank's gradients go NaN, as after an overflow in its backward.
        // A step whose samples train no token (conversations without assistant tokens in
        // them) computes no gradient; it is skipped below.
        const float scale = last && fault_now(t, "nan") ? NAN : valid ? 1.0f / (float)valid : 0.0f;
        const qwen3_batch micro = trainer_micro_batch(t, a);
        loss_sum += qwen3_forward_train(m, &micro, scale, NULL);
        qwen3_backward(m, scale);
        // MoE: the backward had the balance component sum the micro-batch's routing statistics
        // over the ranks, so its aux is the global micro-batch's (HF computes the aux per
        // forward, over the batch it sees): ranks and micro-batches combine as one process with
        // the same micro-batches would.
        if (trainer_micro_status(t, err) != 0) return -1;
        aux_sum += moe_balance_aux(&t->moe);
    }
    double sq;
    if ((t->cp > 1 && cp_status(t, err) != 0) || vt->grads_final(t, err) != 0 ||
        dist_sum(t->d, loss_sum, &loss_sum, "the step's loss", err) != 0 ||
        vt->grad_sq(t, &sq, err) != 0)
        return -1;
    r->ce = loss_sum / (double)valid;
    r->aux = aux_sum / t->accum;
    r->loss = r->ce + (t->aux_in_loss ? m->cfg.router_aux_loss_coef * r->aux : 0.0);
    r->grad_norm = sqrt(sq);
    r->lr = lr_at(&t->sched, t->state.step, t->cfg->training.steps);
    r->no_tokens = valid == 0;
    r->skipped = r->no_tokens || !isfinite(r->loss) || !isfinite(r->grad_norm);
    if (m->n_sparse) moe_before_optimizer(t, r->skipped);
    if (!r->skipped) {
        // Clipping folded into the update: one pass over the shard instead of two. The bf16
        // weight copy (mixed precision) is refreshed once per step, not per micro-batch: in the
        // same pass when this rank updates every weight, else after the gather.
        const float clip = clip_coefficient(r->grad_norm, t->cfg->training.max_norm);
        const strategy_shard sh = vt->shard(t);
        adamw_step_scaled(&t->opt, m->ops, sh.params, sh.bf16, sh.grads, &t->hp, r->lr, clip);
        if (vt->after_update(t, err) != 0) return -1;
    }
    t->state.samples_seen += (uint64_t)t->global_batch;
    t->state.step++;
    t->state.opt_step = t->opt.step;
    double exposed;
    vt->take_comm(t, &exposed, &r->comm_hidden_s);
    r->comm_s = t->d->comm_s + exposed + (t->cp > 1 ? cp_take_comm(t) : 0.0);
    return 0;
}
