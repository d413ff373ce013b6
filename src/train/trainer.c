#include "train/trainer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/fs.h"
#include "core/sysmem.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "model/flavors.h"
#include "model/hf_adapter.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "optim/lr_schedule.h"
#include "train/checkpoint.h"
#include "train/metrics.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

// Everything one run holds. Buffers are allocated in trainer_setup; the step loop allocates
// nothing.
typedef struct trainer {
    const ct_config *cfg;
    FILE *log;
    qwen3_model model;
    adamw opt;
    adamw_hparams hp;
    lr_schedule_cfg sched;
    tokenizer *tok;
    token_stream train_data, val_data;
    data_loader train_loader, val_loader;
    bool has_val;
    int B, T, accum;           // micro-batch, sequence length, micro-batches per step
    int32_t *inputs, *targets; // (accum*B, T): the whole step's samples
    train_state state;
    char ckpt_root[4096];
    char *config_toml; // the effective config, saved in every checkpoint
    double flops_per_token, peak_gflops;
    metrics_log metrics;
} trainer;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void log_notes(trainer *t, ckpt_notes *notes) {
    for (int i = 0; i < notes->n; i++) fprintf(t->log, "checkpoint: %s\n", notes->msgs[i]);
    ckpt_notes_free(notes);
}

int train_model_config(qwen3_config *out, const ct_config *c, ct_error *err) {
    const ct_config_model *m = &c->model;
    if (strcmp(m->backend, "hf") == 0) {
        char path[CT_CONFIG_PATH_MAX + 16];
        snprintf(path, sizeof path, "%s/config.json", m->hf_path);
        return qwen3_config_load(out, path, err);
    }
    if (flavor_lookup(out, m->flavor, err) != 0) return -1;
    // model.* overrides make small runs of big shapes possible; 0 keeps the flavor's value.
    if (m->n_layers) out->num_hidden_layers = m->n_layers;
    if (m->dim) out->hidden_size = m->dim;
    if (m->n_heads) out->num_attention_heads = m->n_heads;
    if (m->n_kv_heads) out->num_key_value_heads = m->n_kv_heads;
    if (m->head_dim) out->head_dim = m->head_dim;
    if (m->ffn_dim) out->intermediate_size = m->ffn_dim;
    if (m->vocab_size) out->vocab_size = m->vocab_size;
    if (m->max_seq_len) out->max_position_embeddings = m->max_seq_len;
    if (m->tie_embeddings >= 0) out->tie_word_embeddings = m->tie_embeddings;
    char source[128];
    snprintf(source, sizeof source, "model.flavor \"%s\" with model.* overrides", m->flavor);
    return qwen3_config_validate(out, source, err);
}

// Pre-run validation: everything that can be refused is refused before any work. The memory
// estimate is printed in any case.
static int check_plan(trainer *t, const qwen3_config *mc, ct_error *err) {
    const ct_config *c = t->cfg;
    if (c->training.seq_len > mc->max_position_embeddings)
        return ct_fail(err, "training.seq_len %d exceeds the model's max_position_embeddings %d",
                       c->training.seq_len, mc->max_position_embeddings);
    qwen3_memory mem = qwen3_memory_plan(mc, t->B, t->T);
    double optim = 2.0 * (double)mem.params; // AdamW's two moments, fp32 like the params
    double batch = 2.0 * t->accum * t->B * (double)t->T * sizeof(int32_t);
    double total = (double)mem.params + mem.grads + optim + mem.activations + batch;
    uint64_t avail = sysmem_available_bytes();
    fprintf(t->log,
            "memory estimate: params %.3f GiB, grads %.3f GiB, optimizer %.3f GiB, activations "
            "%.3f GiB, total %.3f GiB (available %.1f GiB)\n",
            mem.params / GIB, mem.grads / GIB, optim / GIB, mem.activations / GIB, total / GIB,
            avail / GIB);
    if (avail && total > (double)avail && !c->training.allow_overcommit)
        return ct_fail(err,
                       "the run needs about %.2f GiB (params %.2f, grads %.2f, optimizer %.2f, "
                       "activations %.2f) but %.2f GiB is available; reduce "
                       "training.local_batch_size, training.seq_len or the model, or set "
                       "--training.allow_overcommit",
                       total / GIB, mem.params / GIB, mem.grads / GIB, optim / GIB,
                       mem.activations / GIB, avail / GIB);
    return 0;
}

static bool dataset_is_npy_only(const char *path) {
    size_t n = strlen(path);
    return n > 4 && strcmp(path + n - 4, ".npy") == 0;
}

// Data and its tokenizer. A .npy token stream needs no tokenizer.
static int setup_data(trainer *t, ct_error *err) {
    const ct_config *c = t->cfg;
    int32_t vocab = t->model.cfg.vocab_size;
    bool need_tok = !dataset_is_npy_only(c->training.dataset_path) ||
                    (c->validation.enable && !dataset_is_npy_only(c->validation.dataset_path));
    if (need_tok) {
        if (tok_load(&t->tok, c->model.tokenizer_path, err) != 0)
            return ct_wrap(err, "model.tokenizer_path");
        if (tok_vocab_size(t->tok) > vocab)
            return ct_fail(err,
                           "tokenizer %s has %d ids but the model's vocab_size is %d: token ids "
                           "would fall outside the embedding",
                           c->model.tokenizer_path, tok_vocab_size(t->tok), vocab);
    }
    if (stream_open(&t->train_data, c->training.dataset_path, t->tok, vocab, 0, err) != 0)
        return ct_wrap(err, "training.dataset_path");
    if (t->train_data.warning[0]) fprintf(t->log, "data: %s\n", t->train_data.warning);
    if (loader_init(&t->train_loader, &t->train_data, t->T, c->training.shuffle,
                    (uint64_t)c->debug.seed, err) != 0)
        return -1;
    fprintf(t->log, "data: %s: %zu tokens, %llu windows of %d+1 tokens, shuffle %s\n",
            c->training.dataset_path, t->train_data.n_tokens,
            (unsigned long long)t->train_loader.n_windows, t->T,
            c->training.shuffle ? "on" : "off");
    if (c->validation.enable) {
        if (stream_open(&t->val_data, c->validation.dataset_path, t->tok, vocab, 0, err) != 0)
            return ct_wrap(err, "validation.dataset_path");
        if (loader_init(&t->val_loader, &t->val_data, t->T, false, 0, err) != 0) return -1;
        t->has_val = true;
    }
    return 0;
}

// Weights: resume from the newest complete checkpoint, else initial_load_path, else the HF
// folder (backend=hf), else a seeded random init.
static int setup_weights(trainer *t, ct_error *err) {
    const ct_config *c = t->cfg;
    ckpt_notes notes = {0};
    char dir[4096];
    if (c->checkpoint.enable) {
        if (ckpt_clean_stale(t->ckpt_root, &notes, err) != 0) return -1;
        int found = ckpt_resume(dir, sizeof dir, &t->model, t->opt.m, t->opt.v, t->opt.n, &t->state,
                                NULL, t->ckpt_root, &notes, err);
        log_notes(t, &notes);
        if (found < 0) return -1;
        if (found) {
            if (t->state.config_hash != config_hash(c))
                return ct_fail(err,
                               "%s was written by a run with a different config (model, data, "
                               "optimizer or schedule keys changed); resume needs the same "
                               "config, or use a new job.dump_folder",
                               dir);
            t->opt.step = t->state.opt_step;
            fprintf(t->log, "resumed from %s at step %lld (sample %llu)\n", dir,
                    (long long)t->state.step, (unsigned long long)t->state.samples_seen);
            return 0;
        }
    }
    t->state.config_hash = config_hash(c);
    const char *from = c->checkpoint.initial_load_path[0]    ? c->checkpoint.initial_load_path
                       : strcmp(c->model.backend, "hf") == 0 ? c->model.hf_path
                                                             : NULL;
    if (!from) {
        qwen3_init_random(&t->model, (uint64_t)c->debug.seed);
        fprintf(t->log, "weights: random init, normal(0, 0.02), norms 1, seed %lld\n",
                (long long)c->debug.seed);
        return 0;
    }
    // A ctitan checkpoint folder's model.safetensors is HF-named too, so both load the same way.
    st_set set;
    hf_load_report rep = {0};
    if (st_set_open(&set, from, err) != 0) return -1;
    int rc = hf_load_weights(&t->model, &rep, &set, from, err);
    st_set_close(&set);
    if (rc == 0)
        fprintf(t->log, "weights: %s (%d tensors, %s, %d unexpected)\n", from, rep.n_loaded,
                dtype_name(rep.source_dtype), rep.n_unexpected);
    hf_report_free(&rep);
    return rc;
}

static int setup_optimizer(trainer *t, ct_error *err) {
    const ct_config *c = t->cfg;
    if (adamw_init(&t->opt, t->model.num_params, err) != 0) return -1;
    if (!c->optimizer.decay_norms_and_embeddings)
        for (int i = 0; i < t->model.n_params; i++) {
            const qwen3_param *p = &t->model.params[i];
            if (!adamw_param_decays(p->name, p->ndim) &&
                adamw_exclude_decay(&t->opt, p->offset, p->numel, err) != 0)
                return -1;
        }
    t->hp = (adamw_hparams){c->optimizer.beta1, c->optimizer.beta2, c->optimizer.eps,
                            c->optimizer.weight_decay};
    t->sched = (lr_schedule_cfg){c->optimizer.lr, c->lr_scheduler.warmup_steps,
                                 c->lr_scheduler.decay_ratio, LR_DECAY_LINEAR,
                                 c->lr_scheduler.min_lr_factor};
    return lr_decay_parse(&t->sched.decay_type, c->lr_scheduler.decay_type, err);
}

static int config_text(char **out, const ct_config *c, ct_error *err) {
    size_t len = 0;
    FILE *f = open_memstream(out, &len);
    if (!f || config_write_toml(c, f) != 0) {
        if (f) fclose(f);
        return ct_fail(err, "cannot format the effective config");
    }
    fclose(f);
    return 0;
}

static int trainer_setup(trainer *t, const ct_config *c, FILE *log, ct_error *err) {
    t->cfg = c;
    t->log = log;
    t->B = c->training.local_batch_size;
    t->T = c->training.seq_len;
    int global = c->training.global_batch_size > 0 ? c->training.global_batch_size : t->B;
    t->accum = global / t->B; // config_validate checked divisibility
    snprintf(t->ckpt_root, sizeof t->ckpt_root, "%s/%s", c->job.dump_folder, c->checkpoint.folder);

    qwen3_config mc;
    if (train_model_config(&mc, c, err) != 0 || check_plan(t, &mc, err) != 0) return -1;
    if (fs_mkdirs(c->job.dump_folder, err) != 0 || config_text(&t->config_toml, c, err) != 0)
        return -1;
    char path[4096];
    snprintf(path, sizeof path, "%s/config.toml", c->job.dump_folder);
    if (config_save(c, path, err) != 0) return -1;
    fprintf(log, "effective config (saved to %s):\n%s\n", path, t->config_toml);

    if (qwen3_init(&t->model, &mc, NULL, err) != 0 || qwen3_plan(&t->model, t->B, t->T, err) != 0)
        return -1;
    fprintf(log,
            "model: %s, %d layers, hidden %d, heads %d/%d kv, head_dim %d, ffn %d, vocab %d, "
            "%s, %zu parameters\n",
            strcmp(c->model.backend, "hf") == 0 ? c->model.hf_path : c->model.flavor,
            mc.num_hidden_layers, mc.hidden_size, mc.num_attention_heads, mc.num_key_value_heads,
            mc.head_dim, mc.intermediate_size, mc.vocab_size,
            mc.tie_word_embeddings ? "tied" : "untied", t->model.num_params);
    if (setup_optimizer(t, err) != 0 || setup_weights(t, err) != 0 || setup_data(t, err) != 0)
        return -1;

    size_t n = (size_t)t->accum * t->B * t->T;
    t->inputs = malloc(n * sizeof *t->inputs);
    t->targets = malloc(n * sizeof *t->targets);
    if (!t->inputs || !t->targets) return ct_fail(err, "out of memory for the batch buffers");
    t->flops_per_token = metrics_flops_per_token(&mc, t->T);
    t->peak_gflops =
        c->metrics.peak_gflops > 0 ? c->metrics.peak_gflops : metrics_sgemm_gflops(1024, 4);
    fprintf(log, "batch: %d x %d tokens, %d micro-batch(es) per step; peak %.1f GFLOP/s (%s)\n",
            t->B, t->T, t->accum, t->peak_gflops,
            c->metrics.peak_gflops > 0 ? "configured" : "measured sgemm");
    return metrics_open(&t->metrics, log, c->job.dump_folder, err);
}

static void trainer_free(trainer *t) {
    metrics_close(&t->metrics);
    free(t->inputs);
    free(t->targets);
    free(t->config_toml);
    loader_free(&t->train_loader);
    if (t->has_val) loader_free(&t->val_loader);
    stream_free(&t->train_data);
    stream_free(&t->val_data);
    if (t->tok) tok_free(t->tok);
    adamw_free(&t->opt);
    qwen3_free(&t->model);
}

// Reads the step's samples (all micro-batches) from the global sample index on.
static int64_t read_step_samples(trainer *t) {
    int n = t->accum * t->B;
    uint64_t g0 = t->state.samples_seen;
    if (loader_epoch(&t->train_loader, g0) != loader_epoch(&t->train_loader, g0 + n - 1) ||
        (g0 > 0 && loader_epoch(&t->train_loader, g0) != loader_epoch(&t->train_loader, g0 - 1)))
        fprintf(t->log, "data: epoch %llu begins\n",
                (unsigned long long)loader_epoch(&t->train_loader, g0 + n - 1));
    int64_t valid = 0;
    for (int i = 0; i < n; i++) {
        int32_t *tg = t->targets + (size_t)i * t->T;
        loader_sample(&t->train_loader, t->inputs + (size_t)i * t->T, tg, g0 + i);
        for (int j = 0; j < t->T; j++) valid += tg[j] != QWEN3_IGNORE_INDEX;
    }
    return valid;
}

// One optimizer step: the loss is the sum of token losses over every micro-batch divided by the
// step's count of valid targets, so accumulation gives the token-weighted mean.
static double train_step(trainer *t, double *grad_norm, double *lr, bool *skipped) {
    int64_t valid = read_step_samples(t);
    qwen3_zero_grad(&t->model);
    double loss_sum = 0;
    for (int a = 0; a < t->accum; a++) {
        size_t off = (size_t)a * t->B * t->T;
        loss_sum += qwen3_forward(&t->model, t->inputs + off, t->targets + off, NULL);
        qwen3_backward(&t->model, 1.0f / (float)valid);
    }
    double loss = loss_sum / (double)valid;
    *grad_norm = clip_grad_norm(t->model.grad_mem, t->model.num_params, t->cfg->training.max_norm);
    *lr = lr_at(&t->sched, t->state.step, t->cfg->training.steps);
    *skipped = !isfinite(loss) || !isfinite(*grad_norm);
    if (!*skipped) adamw_step(&t->opt, t->model.param_mem, t->model.grad_mem, &t->hp, *lr);
    t->state.samples_seen += (uint64_t)t->accum * t->B;
    t->state.step++;
    t->state.opt_step = t->opt.step;
    return loss;
}

static void validate(trainer *t) {
    const ct_config *c = t->cfg;
    uint64_t total = t->val_loader.n_windows;
    uint64_t batches =
        c->validation.steps > 0 ? (uint64_t)c->validation.steps : (total + t->B - 1) / t->B;
    double sum = 0;
    int64_t valid = 0;
    for (uint64_t b = 0; b < batches; b++) {
        for (int i = 0; i < t->B; i++)
            loader_sample(&t->val_loader, t->inputs + (size_t)i * t->T,
                          t->targets + (size_t)i * t->T, (b * t->B + i) % total);
        int64_t n = 0;
        sum += qwen3_forward(&t->model, t->inputs, t->targets, &n);
        valid += n;
    }
    double loss = sum / (double)valid;
    fprintf(t->log, "validation step %lld: loss %.4f  perplexity %.2f  (%llu batches)\n",
            (long long)t->state.step, loss, exp(loss), (unsigned long long)batches);
    fprintf(t->metrics.jsonl, "{\"step\":%lld,\"val_loss\":%.17g,\"val_perplexity\":%.17g}\n",
            (long long)t->state.step, loss, exp(loss));
    fflush(t->metrics.jsonl);
}

static int save_checkpoint(trainer *t, ct_error *err) {
    if (ckpt_save(t->ckpt_root, &t->model, t->opt.m, t->opt.v, t->opt.n, &t->state, t->config_toml,
                  err) != 0)
        return -1;
    ckpt_notes notes = {0};
    int rc = ckpt_prune(t->ckpt_root, t->cfg->checkpoint.keep_latest_k, t->state.step, &notes, err);
    log_notes(t, &notes);
    fprintf(t->log, "checkpoint: saved step %lld in %s/step-%lld\n", (long long)t->state.step,
            t->ckpt_root, (long long)t->state.step);
    return rc;
}

static int export_final(trainer *t, ct_error *err) {
    ct_dtype dtype;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/hf", t->cfg->job.dump_folder);
    if (ckpt_parse_dtype(&dtype, t->cfg->checkpoint.export_dtype, err) != 0) return -1;
    // 5 GB shards, as transformers' save_pretrained default.
    int copied =
        ckpt_export_hf(&t->model, dir, dtype, 5000000000ull, t->cfg->model.tokenizer_path, err);
    if (copied < 0) return -1;
    fprintf(t->log, "export: %s (%s%s)\n", dir, t->cfg->checkpoint.export_dtype,
            copied ? ", with tokenizer files" : ", no tokenizer files");
    return 0;
}

static int train_loop(trainer *t, const train_options *opt, ct_error *err) {
    const ct_config *c = t->cfg;
    double t_resume = now_s(), t_start = t_resume - t->state.time_s, t_log = t_resume;
    int64_t steps_since_log = 0, skipped_total = 0, start_step = t->state.step;
    while (t->state.step < c->training.steps) {
        double gnorm, lr;
        bool skipped;
        double loss = train_step(t, &gnorm, &lr, &skipped);
        steps_since_log++;
        if (skipped) {
            skipped_total++;
            t->state.skipped_in_row++;
            fprintf(t->log, "step %lld: non-finite %s; step skipped (%d in a row)\n",
                    (long long)t->state.step, isfinite(loss) ? "gradient norm" : "loss",
                    t->state.skipped_in_row);
            if (t->state.skipped_in_row > c->training.max_skipped_steps)
                return ct_fail(err,
                               "%d non-finite steps in a row (training.max_skipped_steps = %d): "
                               "stopping; the last checkpoint holds the last finite weights",
                               t->state.skipped_in_row, c->training.max_skipped_steps);
        } else {
            t->state.skipped_in_row = 0;
        }
        int64_t step = t->state.step;
        t->state.time_s = now_s() - t_start;
        if (step % c->metrics.log_freq == 0 || step == 1 || step == c->training.steps) {
            double dt = now_s() - t_log, tps = steps_since_log * t->accum * t->B * t->T / dt;
            double per_step = (now_s() - t_resume) / (double)(step - start_step);
            double gflops = tps * t->flops_per_token / 1e9;
            metrics_row r = {
                .step = step,
                .steps = c->training.steps,
                .loss = loss,
                .grad_norm = gnorm,
                .lr = lr,
                .tps = tps,
                .tflops = gflops / 1e3,
                .mfu = gflops / t->peak_gflops,
                .memory_peak_gib = sysmem_peak_rss_bytes() / GIB,
                .time_s = t->state.time_s,
                .eta_s = per_step * (double)(c->training.steps - step),
                .skipped = skipped_total,
            };
            metrics_write(&t->metrics, &r);
            t_log = now_s();
            steps_since_log = 0;
        }
        if (t->has_val && step % c->validation.freq == 0) validate(t);
        bool stop = opt->stop_flag && *opt->stop_flag;
        if (c->checkpoint.enable &&
            (step % c->checkpoint.interval == 0 || stop || step == c->training.steps)) {
            if (save_checkpoint(t, err) != 0) return -1;
        }
        if (stop) {
            fprintf(t->log, "stopped by signal at step %lld\n", (long long)step);
            return 0;
        }
    }
    if (c->checkpoint.last_save_in_hf && export_final(t, err) != 0) return -1;
    return 0;
}

int train_run(const ct_config *c, const train_options *opt, ct_error *err) {
    trainer t = {0};
    int rc = trainer_setup(&t, c, opt->log, err);
    if (rc == 0) rc = train_loop(&t, opt, err);
    if (rc == 0)
        fprintf(opt->log, "done: step %lld; outputs in %s (metrics.jsonl, config.toml%s)\n",
                (long long)t.state.step, c->job.dump_folder,
                c->checkpoint.enable ? ", checkpoint/" : "");
    trainer_free(&t);
    return rc;
}
