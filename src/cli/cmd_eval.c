// ctitan eval: the loss and perplexity of a model over a dataset, forward only, so a user can
// check a downloaded model (or a checkpoint) before training on it. It takes train's config
// (every key, and --config FILE) and runs what train's steps would: the same run setup (kernels,
// precision, plugins, backend), the same data pipeline (text, .jsonl, conversations with their
// assistant masks, .npy files and shard folders; shuffle and seed), the same windows per step
// (training.global_batch_size, in micro-batches of local_batch_size) and the same loss, so its
// first step prints the number `ctitan train`'s first step logs. The model holds no gradients.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "checkpoint/checkpoint.h"
#include "cli/cli.h"
#include "core/clock.h"
#include "core/dtype.h"
#include "core/sysmem.h"
#include "io/json.h"
#include "model/hf_adapter.h"
#include "model/moe_balance.h"
#include "model/peft_adapter.h"
#include "model/qwen3_lora.h"
#include "train/run_data.h"
#include "train/run_setup.h"

static const cli_option eval_options[] = {
    {"checkpoint", NULL, "a checkpoint folder (step-N), or a folder of them (the newest)", false},
    {"steps", "0", "evaluate this many steps of training.global_batch_size windows (0: all)",
     false},
    {"json", "false", "print one JSON object on stdout (the report goes to stderr)", true},
};
#define N_EVAL_OPTIONS ((int)(sizeof eval_options / sizeof *eval_options))

typedef struct eval_run {
    const cli_args *args;
    char ckpt_dir[4096]; // --checkpoint, resolved
    run_setup setup;
    bool setup_open;
    qwen3_model m;
    moe_balance balance;
    run_text text;
    token_stream data;
    data_loader loader;
    int32_t *inputs, *targets, *positions; // one micro-batch
} eval_run;

// --checkpoint DIR: the model is the checkpoint's, and its run's tokenizer the default.
static int eval_fix(ct_config *c, void *ctx, ct_error *err) {
    eval_run *r = ctx;
    const char *ck = cli_str(r->args, "checkpoint");
    return ck ? cli_use_checkpoint(c, r->ckpt_dir, sizeof r->ckpt_dir, ck, err) : 0;
}

// The weights train's first step would start from: a checkpoint, checkpoint.initial_load_path,
// the HF folder, or the flavor's seeded random init (torchtitan's).
static int load_weights(eval_run *r, const ct_config *c, FILE *out, ct_error *err) {
    qwen3_model *m = &r->m;
    if (r->ckpt_dir[0]) {
        train_state st;
        if (ckpt_load(r->ckpt_dir, m, NULL, NULL, 0, 0, &st, NULL, err) != 0)
            return ct_wrap(err, "--checkpoint %s", r->ckpt_dir);
        fprintf(out, "weights: %s (a checkpoint)\n", r->ckpt_dir);
        return 0;
    }
    const char *from = c->checkpoint.initial_load_path[0]    ? c->checkpoint.initial_load_path
                       : strcmp(c->model.backend, "hf") == 0 ? c->model.hf_path
                                                             : NULL;
    if (!from) {
        if (qwen3_init_random(m, (uint64_t)c->debug.seed, err) != 0) return -1;
        fprintf(out, "weights: random init (torchtitan's init_weights), seed %lld\n",
                (long long)c->debug.seed);
        return 0;
    }
    st_set set;
    hf_load_report rep = {0};
    int rc = st_set_open(&set, from, err);
    if (rc == 0) {
        rc = hf_load_weights(m, &rep, &set, from, err);
        st_set_close(&set);
    }
    if (rc == 0)
        fprintf(out, "weights: %s (%d tensors, %s)\n", from, rep.n_loaded,
                dtype_name(rep.source_dtype));
    hf_report_free(&rep);
    return rc != 0 ? ct_wrap(err, "%s", from) : 0;
}

// Setup, memory check, model, weights, data: everything before the first forward.
static int eval_open(eval_run *r, const ct_config *c, FILE *out, ct_error *err) {
    const int B = c->training.local_batch_size, T = c->training.seq_len;
    // Before anything runs an OpenMP region: the plugins' parity check forks.
    run_setup_opts so = {.log = out, .warn = stderr};
    if (run_setup_open(&r->setup, c, &so, err) != 0) return -1;
    r->setup_open = true;
    // The memory rule of inference: weights and the forward's buffers, no gradients.
    run_memory mem = run_setup_memory_forward_only(&r->setup, 3.0 * B * T * sizeof(int32_t));
    char what[4200];
    snprintf(what, sizeof what, "eval with batch %d x seq_len %d", B, T);
    if (run_setup_check_fit(&r->setup, &mem, what, true, err) != 0) return -1;
    qwen3_model *m = &r->m;
    // [lora] (lora.adapter_path): base + adapter as train holds them, the branch run beside each
    // frozen projection (W + s * B @ A is never formed); without an adapter folder, PEFT's init
    // (B zero: the base's loss).
    lora_config lc;
    if (c->lora.rank > 0 ? config_lora(&lc, c, err) != 0 ||
                               qwen3_init_lora(m, &r->setup.model, r->setup.be, &r->setup.ops,
                                               &r->setup.mem_opts, &lc, err) != 0
                         : qwen3_init_forward_only(m, &r->setup.model, r->setup.be,
                                                   &r->setup.ops, &r->setup.mem_opts, err) != 0)
        return -1;
    if (qwen3_plan(m, B, T, err) != 0 || load_weights(r, c, out, err) != 0) return -1;
    qwen3_refresh_bf16(m);
    if (m->lora) {
        if (qwen3_lora_init_random(m, (uint64_t)c->debug.seed, NULL, err) != 0 ||
            (c->lora.adapter_path[0] &&
             peft_adapter_apply(m, c->lora.adapter_path, NULL, err) != 0))
            return ct_wrap(err, "lora.adapter_path");
        fprintf(out, "lora: %s, rank %d, alpha %g (scaling %g%s), %s: %zu adapter parameters\n",
                c->lora.adapter_path[0] ? c->lora.adapter_path : "PEFT's init (B zero)", lc.rank,
                (double)lc.alpha, (double)lora_scale(&lc), lc.use_rslora ? ", rsLoRA" : "",
                c->lora.target_modules, m->lora->L.num);
    }
    // MoE: the balance component counts each forward's routing, for the aux loss train adds.
    if (moe_balance_init(&r->balance, m, 1, NULL, NULL, 0.0f, err) != 0) return -1;
    const char *path = c->training.dataset_path;
    if (run_text_open(&r->text, c, &path, 1, m->cfg.vocab_size, err) != 0) return -1;
    if (run_data_open(&r->data, &r->loader, &r->text, path, T, c->training.shuffle,
                      (uint64_t)c->debug.seed, err) != 0)
        return ct_wrap(err, "training.dataset_path");
    const size_t n = (size_t)B * T;
    r->inputs = malloc(n * sizeof *r->inputs);
    r->targets = malloc(n * sizeof *r->targets);
    if (run_data_block_causal(c)) r->positions = malloc(n * sizeof *r->positions);
    if (!r->inputs || !r->targets || (run_data_block_causal(c) && !r->positions))
        return ct_fail(err, "out of memory for the batch buffers");
    return 0;
}

static void eval_close(eval_run *r) {
    free(r->inputs);
    free(r->targets);
    free(r->positions);
    loader_free(&r->loader);
    stream_free(&r->data);
    run_text_free(&r->text);
    moe_balance_free(&r->balance);
    qwen3_free(&r->m);
    if (r->setup_open) run_setup_close(&r->setup);
}

typedef struct eval_totals {
    double ce_sum, valid, aux_sum;
    int64_t steps, windows;
    double *step_loss; // per step, as train logs it
    double seconds;
} eval_totals;

// Micro-batch a of step s: global samples s*G + a*B + i, as train's one rank reads them. Samples
// past `limit` (the last, partial step of a whole pass) are window 0 with every target ignored.
static int read_micro(eval_run *r, int B, int T, uint64_t first, uint64_t limit, ct_error *err) {
    for (int i = 0; i < B; i++) {
        const uint64_t g = first + (uint64_t)i;
        const size_t off = (size_t)i * T;
        if (loader_sample(&r->loader, r->inputs + off, r->targets + off,
                          r->positions ? r->positions + off : NULL, g < limit ? g : 0, err) != 0)
            return -1;
        if (g >= limit)
            for (int j = 0; j < T; j++) r->targets[off + j] = QWEN3_IGNORE_INDEX;
    }
    return 0;
}

static int eval_loop(eval_run *r, const ct_config *c, int64_t want_steps, eval_totals *tot,
                     FILE *out, ct_error *err) {
    const int B = c->training.local_batch_size, T = c->training.seq_len;
    const int G = c->training.global_batch_size > 0 ? c->training.global_batch_size : B;
    if (G % B != 0)
        return ct_fail(err,
                       "training.global_batch_size = %d is not a multiple of "
                       "training.local_batch_size = %d (eval runs on one process)",
                       G, B);
    const uint64_t W = r->loader.n_windows;
    const int64_t whole = (int64_t)((W + (uint64_t)G - 1) / (uint64_t)G);
    // A whole pass takes every window once (a last, partial step pads with ignored targets);
    // --steps N takes train's first N steps' windows, past the epoch's end as train would.
    const int64_t steps = want_steps > 0 ? want_steps : whole;
    const uint64_t limit = want_steps > 0 ? (uint64_t)steps * G : W;
    tot->step_loss = calloc((size_t)steps, sizeof *tot->step_loss);
    if (!tot->step_loss)
        return ct_fail(err, "out of memory for %lld step losses", (long long)steps);
    const qwen3_model *m = &r->m;
    const bool aux_in_loss = m->n_sparse > 0 && m->cfg.output_router_logits;
    fprintf(out,
            "eval: %lld step(s) of %d windows of %d+1 tokens from %s (%llu windows), shuffle %s\n",
            (long long)steps, G, T, c->training.dataset_path, (unsigned long long)W,
            c->training.shuffle ? "on" : "off");
    const double t0 = ct_now_s();
    for (int64_t s = 0; s < steps; s++) {
        double sum = 0, aux = 0;
        int64_t valid = 0;
        for (int a = 0; a < G / B; a++) {
            const uint64_t first = (uint64_t)s * G + (uint64_t)a * B;
            if (read_micro(r, B, T, first, limit, err) != 0) return -1;
            const qwen3_batch batch = {.inputs = r->inputs, .targets = r->targets,
                                       .positions = r->positions};
            if (qwen3_batch_check(&r->m, &batch, B, err) != 0)
                return ct_wrap(err, "%s, step %lld", c->training.dataset_path, (long long)s + 1);
            int64_t n = 0;
            sum +=
                qwen3_forward(&r->m,
                              &(qwen3_batch){.inputs = r->inputs, .targets = r->targets,
                                             .positions = r->positions, .checked = true},
                              &n);
            valid += n;
            if (moe_balance_forward_end(&r->balance, err) != 0) return -1;
            aux += moe_balance_aux(&r->balance);
        }
        aux /= G / B;
        // The step's loss as train computes it: the token-weighted mean over the step, plus
        // HF's aux term (its micro-batches' mean) when the aux is in the loss.
        tot->step_loss[s] = (valid ? sum / (double)valid : NAN) +
                            (aux_in_loss ? m->cfg.router_aux_loss_coef * aux : 0.0);
        tot->ce_sum += sum;
        tot->valid += (double)valid;
        tot->aux_sum += aux;
        tot->steps++;
        tot->windows +=
            (int64_t)((uint64_t)(s + 1) * G < limit ? (uint64_t)G : limit - (uint64_t)s * G);
        fprintf(out, "step %6lld/%lld  loss %8.4f  tokens %lld\n", (long long)s + 1,
                (long long)steps, tot->step_loss[s], (long long)valid);
    }
    tot->seconds = ct_now_s() - t0;
    return 0;
}

static void print_json(const eval_run *r, const eval_totals *tot, double loss) {
    cJSON *o = cJSON_CreateObject();
    // The losses exactly (train's metrics.jsonl writes %.17g too: the two compare bit for bit).
    cJSON_AddItemToObject(o, "loss", json_exact_number(loss));
    cJSON_AddNumberToObject(o, "perplexity", exp(loss));
    cJSON_AddNumberToObject(o, "tokens", tot->valid);
    cJSON_AddNumberToObject(o, "windows", (double)tot->windows);
    cJSON_AddNumberToObject(o, "steps", (double)tot->steps);
    cJSON *steps = cJSON_AddArrayToObject(o, "step_losses");
    for (int64_t s = 0; steps && s < tot->steps; s++)
        cJSON_AddItemToArray(steps, json_exact_number(tot->step_loss[s]));
    if (r->m.n_sparse) cJSON_AddNumberToObject(o, "aux", tot->aux_sum / (double)tot->steps);
    cJSON_AddStringToObject(o, "mixed_precision_param",
                            r->setup.mem_opts.bf16 ? "bfloat16" : "float32");
    cJSON_AddStringToObject(o, "attn_backend", r->setup.attn_backend);
    cJSON_AddNumberToObject(o, "seconds", tot->seconds);
    cJSON_AddNumberToObject(o, "peak_rss_mib", sysmem_peak_rss_bytes() / 1048576.0);
    char *text = cJSON_PrintUnformatted(o);
    printf("%s\n", text);
    cJSON_free(text);
    cJSON_Delete(o);
}

int cmd_eval(int argc, char **argv) {
    eval_run r = {0};
    const config_use use = {.command = "eval", .needs_data = true, .fix = eval_fix, .ctx = &r};
    if (cli_wants_help(argc, argv)) {
        cli_print_help(
            "ctitan eval [--config FILE] (--model.hf_path DIR | --checkpoint DIR | "
            "--model.flavor NAME) --training.dataset_path DATA [--steps N] [--json] "
            "[--section.key value ...]",
            "The loss and perplexity of a model over a dataset, forward only (no gradients).\n"
            "Takes every `ctitan train` key and runs what train's steps would: the same\n"
            "kernels, precision, attn_mask_type, data pipeline (text, .jsonl, conversations\n"
            "with their assistant masks, .npy, shard folders), shuffle, seed and windows per\n"
            "step (training.global_batch_size, in micro-batches of local_batch_size), so its\n"
            "first step's loss is the one `ctitan train` logs at step 1. --steps N evaluates\n"
            "N steps; 0 (the default) every window once. The loss and perplexity are the\n"
            "token-weighted mean cross-entropy over all evaluated targets.",
            eval_options, N_EVAL_OPTIONS);
        return 0;
    }
    ct_error err;
    cli_args args;
    ct_config cfg;
    int64_t steps = 0;
    r.args = &args;
    if (cli_parse_config(&args, &cfg, &use, eval_options, N_EVAL_OPTIONS, argc, argv, &err) != 0 ||
        cli_int(&steps, &args, "steps", &err) != 0)
        return cli_report(&err);
    if (steps < 0 || steps > INT32_MAX) {
        ct_fail(&err, "--steps %lld: expected 0 (every window) or a positive count",
                (long long)steps);
        return cli_report(&err);
    }
    const bool json = cli_flag(&args, "json");
    FILE *out = json ? stderr : stdout;
    eval_totals tot = {0};
    int rc = eval_open(&r, &cfg, out, &err);
    if (rc == 0) rc = eval_loop(&r, &cfg, steps, &tot, out, &err);
    if (rc == 0 && tot.valid == 0)
        rc = ct_fail(&err, "%s: no target to evaluate (every label is ignored)",
                     cfg.training.dataset_path);
    if (rc == 0) {
        const double loss = tot.ce_sum / tot.valid;
        fprintf(out,
                "eval: loss %.6f  perplexity %.4f  over %.0f tokens (%lld windows) in %.1f s\n",
                loss, exp(loss), tot.valid, (long long)tot.windows, tot.seconds);
        if (json) print_json(&r, &tot, loss);
    }
    free(tot.step_loss);
    eval_close(&r);
    return rc != 0 ? cli_report(&err) : 0;
}
