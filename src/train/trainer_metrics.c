// What a run reports besides its log lines: the validation loss, and a metrics row per
// logging step.
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/clock.h"
#include "core/sysmem.h"
#include "data/loader.h"
#include "model/moe_balance.h"
#include "train/metrics.h"
#include "train/peak.h"
#include "train/trainer_internal.h"

// Validation batches are dealt out to the ranks in turn (batch b on rank b mod N); the sums
// meet in rank order. validation.steps counts torchtitan's steps: each one a local batch on
// every data-parallel rank. Each window counts once: the batches stop when the windows run out
// (as torchtitan's finite validation loader does), and a last, partial batch fills its empty
// rows with window 0 whose targets are all ignored.
int trainer_validate(trainer *t, ct_error *err) {
    const ct_config *c = t->cfg;
    uint64_t total = t->val_loader.n_windows;
    const int B = t->val_B;
    // Under CP a batch is its CP group's, each rank forwarding its chunks of it.
    const uint64_t dp_rank = (uint64_t)(t->cp > 1 ? cp_dp_rank(t) : t->d->rank);
    const uint64_t dp_size = (uint64_t)(t->cp > 1 ? cp_dp_size(t) : t->d->size);
    uint64_t batches = (total + B - 1) / B;
    if (c->validation.steps > 0 && (uint64_t)c->validation.steps * dp_size < batches)
        batches = (uint64_t)c->validation.steps * dp_size;
    double sum = 0, valid = 0;
    // Under FSDP every forward gathers each unit over the shard group: every rank runs as many,
    // the last ones on batches whose targets are all ignored.
    const uint64_t rounds =
        t->strat.fsdp.n_units ? (batches + dp_size - 1) / dp_size * dp_size : batches;
    for (uint64_t b = dp_rank; b < rounds; b += dp_size) {
        for (int i = 0; i < B; i++) {
            uint64_t w = b < batches ? b * B + i : total;
            size_t off = (size_t)i * t->T;
            int32_t *targets = t->targets + off;
            if (loader_sample(&t->val_loader, t->inputs + off, targets,
                              t->positions ? t->positions + off : NULL, w < total ? w : 0,
                              err) != 0)
                return -1;
            if (w >= total)
                for (int j = 0; j < t->T; j++) targets[j] = QWEN3_IGNORE_INDEX;
        }
        if (t->cp > 1) {
            if (t->positions) cp_shard(t, t->positions, B);
            cp_shard(t, t->inputs, B);
            cp_shard(t, t->targets, B);
        }
        int64_t n = 0;
        // Checked by the forward: data it refuses gives a NaN loss, on every rank after the sum.
        const qwen3_batch batch = {.inputs = t->inputs, .targets = t->targets,
                                   .positions = t->positions};
        double l;
        if (!t->strat.vt->eval_forward)
            l = qwen3_forward(&t->model, &batch, &n);
        else if (t->strat.vt->eval_forward(t, &batch, &l, &n, err) != 0)
            return -1;
        sum += l;
        valid += (double)n;
    }
    t->strat.vt->after_eval(t);
    if (dist_sum(t->d, sum, &sum, "the validation loss", err) != 0 ||
        dist_sum(t->d, valid, &valid, "the validation token count", err) != 0)
        return -1;
    double loss = sum / valid;
    fprintf(t->log,
            "validation step %lld: loss %.4f  perplexity %.2f  (%llu batches of %d over %llu "
            "data-parallel rank(s))\n",
            (long long)t->state.step, loss, exp(loss), (unsigned long long)batches, B,
            (unsigned long long)dp_size);
    if (is_root(t)) {
        fprintf(t->metrics.jsonl, "{\"step\":%lld,\"val_loss\":%.17g,\"val_perplexity\":%.17g}\n",
                (long long)t->state.step, loss, exp(loss));
        fflush(t->metrics.jsonl);
    }
    return 0;
}

void trainer_log_metrics(trainer *t, const step_result *r, double t_resume, double *t_log,
                         int64_t *steps_since_log, double comm_since_log[2], int64_t start_step,
                         int64_t skipped_total) {
    const ct_config *c = t->cfg;
    int64_t step = t->state.step;
    double now = ct_now_s(), dt = now - *t_log;
    double tps_total = *steps_since_log * (double)t->global_batch * t->T / dt;
    // Per rank of the world, as torchtitan's per device: under TP and PP too (t->d is then the
    // data-parallel ranks of one TP rank or one stage), with the whole model's FLOPs a token.
    double tps = tps_total / t->world->size;
    double per_step = (now - t_resume) / (double)(step - start_step);
    double gflops = tps * t->flops_per_token / 1e9;
    // A step faster than the cached peak shows the peak was measured on a busy machine: measure
    // it again, once a run, and keep the larger (the root's rows are the ones logged).
    if (gflops > t->peak_gflops && c->metrics.peak_gflops <= 0 && !t->peak_rechecked &&
        is_root(t)) {
        t->peak_rechecked = true;
        char source[4200];
        const double old = t->peak_gflops,
                     now_peak = peak_gflops_recheck(omp_get_max_threads(), t->model.mem_opts.bf16,
                                                    source, sizeof source);
        if (now_peak > old) t->peak_gflops = now_peak;
        fprintf(t->log,
                "mfu: step %lld ran at %.1f GFLOP/s, above the peak of %.1f: measured again, "
                "%.1f (%s)%s\n",
                (long long)step, gflops, old, now_peak, source,
                gflops > t->peak_gflops ? "; MFU stays above 100%: the GEMMs ran faster in the "
                                          "step than in the measurement (metrics.peak_gflops "
                                          "sets the peak)"
                                        : "");
    }
    metrics_row row = {
        .step = step,
        .steps = c->training.steps,
        .loss = r->loss,
        .grad_norm = r->grad_norm,
        .lr = r->lr,
        .tps = tps,
        .tps_total = tps_total,
        .ranks = t->world->size,
        .comm_s = comm_since_log[0] / (double)*steps_since_log,
        .comm_share = comm_since_log[0] / dt,
        .comm_hidden_s = comm_since_log[1] / (double)*steps_since_log,
        .tflops = gflops / 1e3,
        .mfu = gflops / t->peak_gflops,
        .memory_peak_gib = sysmem_peak_rss_bytes() / GIB,
        .time_s = t->state.time_s,
        .eta_s = per_step * (double)(c->training.steps - step),
        .skipped = skipped_total,
        .ce = r->ce,
        .aux = r->aux,
        .n_moe_layers = t->n_moe_metric,
        .moe_load_max_over_mean = t->moe_metric,
    };
    // The plugins' own call counters, as proof that their kernels ran.
    char *calls = NULL;
    size_t calls_len = 0;
    FILE *f = override_any(&t->setup.overrides) ? open_memstream(&calls, &calls_len) : NULL;
    if (f) {
        override_calls_json(&t->setup.overrides, f);
        fclose(f);
        row.override_calls_json = calls;
    }
    if (is_root(t)) metrics_write(&t->metrics, &row);
    free(calls);
    *t_log = ct_now_s();
    *steps_since_log = 0;
    comm_since_log[0] = comm_since_log[1] = 0;
}

// At the end of a multi-rank run, rank 0's payload bytes per step of each collective kind (see
// the counters in strategy.h, fsdp.h, grad_sync.h): what bench/parallel.py sets beside its
// formula.
void trainer_log_comm_volume(trainer *t, int64_t steps) {
    if (t->world->size == 1 || steps <= 0 || !is_root(t)) return;
    const strategy_vt *vt = t->strat.vt;
    const double n = (double)steps;
    char buf[512] = "";
    size_t at = 0;
    if (vt->comm_bytes) at += (size_t)vt->comm_bytes(t, n, buf, sizeof buf); // TP's, PP's
    if (t->cp > 1 && at < sizeof buf)
        at += (size_t)snprintf(buf + at, sizeof buf - at,
                               "; CP ring attention (sent to the other CP ranks) %.0f",
                               t->cpx.bytes / n);
    if (t->ep > 1 && at < sizeof buf)
        at += (size_t)snprintf(buf + at, sizeof buf - at,
                               "; EP all-to-alls (sent to other ranks) %.0f",
                               t->strat.ep.bytes / n);
    // FSDP in use, alone or inside another strategy (set up: it has units); under LoRA, the
    // frozen base's gathers.
    const bool sharded = t->strat.fsdp.n_units > 0;
    if (sharded && at < sizeof buf) {
        const fsdp *f = &t->strat.fsdp;
        at += (size_t)snprintf(buf + at, sizeof buf - at,
                               "; FSDP gathers %.0f, reduce-scatters %.0f, replica all-reduces "
                               "%.0f",
                               f->gather_bytes / n, f->reduce_bytes / n, f->replica_bytes / n);
    }
    // DDP's and ZeRO-1's reductions (under LoRA x FSDP the adapter's); EP counts its own.
    const strategy_vt *dp = vt == &strategy_tp ? t->strat.tp.dp : vt;
    if ((!sharded || vt == strategy_lora_fsdp()) && t->d->size > 1 && at < sizeof buf &&
        dp != &strategy_ep) {
        snprintf(buf + at, sizeof buf - at, "; data-parallel gradient reductions %.0f",
                 t->strat.sync.bytes / n);
    }
    fprintf(t->log,
            "comm volume: bytes per step on rank 0 (each collective's whole buffer, over "
            "%lld steps)%s\n",
            (long long)steps, buf);
}
