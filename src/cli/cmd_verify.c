// ctitan verify: one forward and backward pass of an HF Qwen3 folder on a token stream, so a
// user can compare the first-step loss and gradient norm with PyTorch / transformers. For a MoE
// folder the loss is HF's: cross-entropy, plus router_aux_loss_coef * aux when
// output_router_logits is on; both parts are printed. With --json the results also name each
// parameter's gradient norm and summarise the logits, so a difference from HF's own numbers can
// be traced to one tensor.
// The model config, kernels, plugin trust and memory check are train's (train/run_setup.c), and
// so are its keys (verify_keys, from train's table) and its batch (train's loader), so verify
// computes what a training run's first step with the same options would.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "cli/cli.h"
#include "core/clock.h"
#include "core/dtype.h"
#include "core/sysmem.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "io/json.h"
#include "model/hf_adapter.h"
#include "model/moe_balance.h"
#include "text/tokenizer.h"
#include "train/run_setup.h"

// verify's own options; the config keys it takes are verify_keys (train/config.c's table).
static const cli_option verify_options[] = {
    {"json", "false",
     "print the results as exactly one JSON object on stdout (the readable report goes to "
     "stderr): also each parameter's gradient norm by HF name and the sum and sum of squares "
     "of all logits",
     true},
    {"logits", "0", "with --json: also the first K logits of sample 0 at positions 0 and T-1",
     false},
};

static const char *const verify_keys[] = {
    "model.hf_path",
    "training.dataset_path",
    "training.seq_len",
    "training.local_batch_size",
    "model.moe_impl",
    "model.attn_backend",
    "model.attn_mask_type",
    "model.tokenizer_path",
    "model.router_aux_loss_coef",
    "model.output_router_logits",
    "override.imports",
    "override.allow_mismatch",
    "training.mixed_precision_param",
    "training.allow_overcommit",
    "debug.guard_device_memory",
};
static const char *const verify_required[] = {"model.hf_path", "training.dataset_path"};

// What verify fixes: an HF folder, the whole-batch loss head and no activation checkpointing
// (verify summarises all the logits after the forward).
static int verify_fix(ct_config *c, void *ctx, ct_error *err) {
    (void)ctx, (void)err;
    snprintf(c->model.backend, sizeof c->model.backend, "hf");
    c->training.loss_chunk_tokens = 0;
    snprintf(c->activation_checkpoint.mode, sizeof c->activation_checkpoint.mode, "none");
    return 0;
}

static const config_use verify_use = {
    .command = "verify",
    CONFIG_USE_KEYS(verify_keys),
    CONFIG_USE_REQUIRED(verify_required),
    .fix = verify_fix,
};

static double sum_squares(const float *x, size_t n) {
    double sum = 0;
    for (size_t i = 0; i < n; i++) sum += (double)x[i] * x[i];
    return sum;
}

// Each trained tensor's gradient L2 norm by HF name (a tied embedding once, as its one entry),
// from a host view of the gradients.
static cJSON *grad_norms_json(const qwen3_model *m, const float *grads) {
    cJSON *o = cJSON_CreateObject();
    for (int i = 0; i < m->n_params; i++) {
        const qwen3_param *p = &m->params[i];
        if (!p->buffer)
            cJSON_AddNumberToObject(o, p->name, sqrt(sum_squares(grads + p->offset, p->numel)));
    }
    return o;
}

// The logits after the forward, before the backward overwrites them with their gradient: the
// sum and sum of squares of all of them and the first k of sample 0 at positions 0 and T-1.
typedef struct logits_summary {
    double sum, sq_sum;
    int k;
    float *first, *last; // k each
} logits_summary;

static int logits_summarise(logits_summary *s, const qwen3_model *m, int k, ct_error *err) {
    const size_t V = (size_t)m->cfg.vocab_size, n = (size_t)m->B * m->T * V;
    s->k = k < (int)V ? k : (int)V;
    // bf16 mixed precision's logits are bf16: widened into a host copy.
    const size_t bytes = n * (m->logits_bf16 ? sizeof(uint16_t) : sizeof(float));
    void *raw = m->be->view(m->be, m->logits, bytes, true, err);
    if (!raw) return -1;
    float *logits = m->logits_bf16 ? malloc(n * sizeof *logits) : raw;
    if (!logits) {
        m->be->view_release(m->be, raw, m->logits, bytes, false);
        return ct_fail(err, "out of memory for %zu logits", n);
    }
    for (size_t i = 0; m->logits_bf16 && i < n; i++) logits[i] = bf16_to_f32(((uint16_t *)raw)[i]);
    s->sum = 0;
    for (size_t i = 0; i < n; i++) s->sum += logits[i];
    s->sq_sum = sum_squares(logits, n);
    s->first = malloc((size_t)(s->k ? s->k : 1) * sizeof *s->first);
    s->last = malloc((size_t)(s->k ? s->k : 1) * sizeof *s->last);
    int rc = s->first && s->last ? 0 : ct_fail(err, "out of memory for %d logits", 2 * s->k);
    if (rc == 0) {
        memcpy(s->first, logits, (size_t)s->k * sizeof *s->first);
        memcpy(s->last, logits + (size_t)(m->T - 1) * V, (size_t)s->k * sizeof *s->last);
    }
    if (logits != raw) free(logits);
    m->be->view_release(m->be, raw, m->logits, bytes, false);
    return rc;
}

static void print_key_report(FILE *out, const hf_load_report *r) {
    fprintf(out, "keys: loaded %d, missing %d, unexpected %d\n", r->n_loaded, r->n_missing,
            r->n_unexpected);
    for (int i = 0; i < r->n_missing; i++) fprintf(out, "  missing: %s\n", r->missing[i]);
    for (int i = 0; i < r->n_unexpected; i++) fprintf(out, "  unexpected: %s\n", r->unexpected[i]);
}

static cJSON *string_array(char **items, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateString(items[i]));
    return a;
}

// The plugins' call counters as a JSON object (override_calls_json's text, parsed).
static cJSON *calls_json(const override_set *s) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return cJSON_CreateNull();
    override_calls_json(s, f);
    fclose(f);
    cJSON *o = cJSON_Parse(text);
    free(text);
    return o ? o : cJSON_CreateNull();
}

typedef struct verify_result {
    double loss, ce, aux, grad_norm, forward_s, backward_s;
    int64_t n_valid;
    logits_summary logits;
    cJSON *grad_norms; // by HF name
} verify_result;

// The first B windows of T+1 tokens, as train's loader reads them without shuffle. With
// positions (model.attn_mask_type block_causal) also each token's position in its document and
// no target across a document boundary, as train packs documents; documents end at the
// tokenizer's <|endoftext|>, so the tokenizer (model.tokenizer_path) is read then.
static int read_batch(int32_t **inputs, int32_t **targets, int32_t **positions, const ct_config *c,
                      int vocab_size, ct_error *err) {
    const int B = c->training.local_batch_size, T = c->training.seq_len;
    const char *path = c->training.dataset_path;
    const size_t need = (size_t)B * (T + 1), n = (size_t)B * T;
    tokenizer *tok = NULL;
    token_stream s = {0};
    data_loader l = {0};
    int rc = -1;
    if (positions && tok_load(&tok, c->model.tokenizer_path, err) != 0) {
        ct_wrap(err, "the tokenizer (model.tokenizer_path), for block_causal's documents");
        goto done;
    }
    if (stream_open(&s, path, tok, vocab_size, 0, err) != 0) goto done;
    if (s.n_tokens < need) {
        ct_fail(err, "%s: has %llu tokens, but batch %d x (seq_len %d + 1) needs %zu", path,
                (unsigned long long)s.n_tokens, B, T, need);
        goto done;
    }
    *inputs = malloc(n * sizeof **inputs);
    *targets = malloc(n * sizeof **targets);
    if (positions) *positions = malloc(n * sizeof **positions);
    if (!*inputs || !*targets || (positions && !*positions)) {
        ct_fail(err, "out of memory for %zu tokens", need);
        goto done;
    }
    if (loader_init(&l, &s, T, false, 0, err) != 0) goto done;
    for (int b = 0; b < B; b++) // sample b = tokens [b*(T+1), (b+1)*(T+1))
        if (loader_sample(&l, *inputs + (size_t)b * T, *targets + (size_t)b * T,
                          positions ? *positions + (size_t)b * T : NULL, (uint64_t)b, err) != 0)
            goto done;
    rc = 0;
done:
    loader_free(&l);
    stream_free(&s);
    tok_free(tok);
    return rc;
}

static int verify_run(verify_result *res, qwen3_model *m, hf_load_report *rep, run_setup *setup,
                      run_memory *mem, const ct_config *run_cfg, int k_logits, FILE *out,
                      ct_error *err) {
    const char *dir = run_cfg->model.hf_path, *data_path = run_cfg->training.dataset_path;
    const int B = run_cfg->training.local_batch_size, T = run_cfg->training.seq_len;
    // Before anything runs an OpenMP region: the parity check forks.
    run_setup_opts so = {.log = out, .warn = stderr};
    if (run_setup_open(setup, run_cfg, &so, err) != 0) return -1;
    const qwen3_config cfg = setup->model;
    char what[4200];
    snprintf(what, sizeof what, "%s with batch %d x seq_len %d", dir, B, T);
    *mem = run_setup_memory(setup, 0, 0, 1);
    if (run_setup_check_fit(setup, mem, what, true, err) != 0) return -1;

    int32_t *inputs = NULL, *targets = NULL, *positions = NULL;
    int rc = -1;
    moe_balance balance = {0};
    if (read_batch(&inputs, &targets, setup->mem_opts.block_causal ? &positions : NULL, run_cfg,
                   cfg.vocab_size, err) != 0)
        goto done;

    st_set set;
    if (st_set_open(&set, dir, err) != 0) goto done;
    rc = qwen3_init_on(m, &cfg, setup->be, &setup->ops, err);
    if (rc == 0) m->mem_opts = setup->mem_opts;
    if (rc == 0) rc = hf_load_weights(m, rep, &set, dir, err);
    st_set_close(&set);
    if (rc == 0) rc = qwen3_plan(m, B, T, err);
    if (rc == 0) qwen3_refresh_bf16(m);
    // MoE: the balance component counts the forward's routing and gives the backward the aux
    // loss's gradient when the aux is in the loss.
    const bool aux_in_loss = m->n_sparse > 0 && cfg.output_router_logits;
    if (rc == 0)
        rc = moe_balance_init(&balance, m, 1, NULL, NULL,
                              aux_in_loss ? (float)cfg.router_aux_loss_coef : 0.0f, err);
    if (rc != 0) goto done;

    double t0 = ct_now_s();
    // positions: block_causal only
    qwen3_batch batch = {.inputs = inputs, .targets = targets, .positions = positions};
    if ((rc = qwen3_batch_check(m, &batch, B, err)) != 0) goto done;
    batch.checked = true; // the forward need not check again
    double loss_sum = qwen3_forward(m, &batch, &res->n_valid);
    double t1 = ct_now_s();
    if (res->n_valid == 0) {
        rc = ct_fail(err, "%s: no valid targets in the batch", data_path);
        goto done;
    }
    if ((rc = logits_summarise(&res->logits, m, k_logits, err)) != 0) goto done;
    res->ce = loss_sum / (double)res->n_valid;
    double t2 = ct_now_s();
    qwen3_zero_grad(m);
    qwen3_backward(m, 1.0f / (float)res->n_valid);
    res->forward_s = t1 - t0;
    res->backward_s = ct_now_s() - t2;
    res->aux = moe_balance_aux(&balance); // of the statistics the backward reduced
    res->loss = res->ce + (aux_in_loss ? cfg.router_aux_loss_coef * res->aux : 0.0);
    // The gradients through a host view (the gradients themselves on the plain CPU backend).
    const size_t bytes = m->num_params * sizeof(float);
    const float *grads = m->be->view(m->be, m->grad_mem, bytes, true, err);
    if (!grads) {
        rc = -1;
        goto done;
    }
    res->grad_norm = sqrt(sum_squares(grads, m->num_params));
    res->grad_norms = grad_norms_json(m, grads);
    m->be->view_release(m->be, (float *)grads, m->grad_mem, bytes, false);
    rc = 0;
done:
    moe_balance_free(&balance);
    free(inputs);
    free(targets);
    free(positions);
    return rc;
}

static void verify_free(qwen3_model *m, hf_load_report *rep, run_setup *setup, verify_result *res) {
    qwen3_free(m);
    hf_report_free(rep);
    run_setup_close(setup);
    free(res->logits.first);
    free(res->logits.last);
    cJSON_Delete(res->grad_norms);
}

int cmd_verify(int argc, char **argv) {
    const int n_opts = sizeof verify_options / sizeof verify_options[0];
    if (cli_wants_help(argc, argv)) {
        cli_print_help_keys("ctitan verify --model.hf_path DIR --training.dataset_path TOKENS.npy "
                            "[--training.seq_len T] [--training.local_batch_size B] [--json]",
                            "Loads an HF Qwen3 folder, takes the first B windows of T+1 tokens "
                            "(input: first T,\nlabels: last T) and runs one forward and backward "
                            "pass in fp32\nwith the kernels train uses (model.attn_backend, "
                            "model.moe_impl). Prints the kernels,\nthe loss, the global gradient "
                            "L2 norm, the parameter count, key report, source dtype\nand peak "
                            "memory. The model.*, training.*, override.* and debug.* keys are "
                            "train's.",
                            verify_options, n_opts, &verify_use);
        return 0;
    }
    ct_error err;
    cli_args args;
    ct_config cfg;
    int64_t k_logits;
    if (cli_parse_config(&args, &cfg, &verify_use, verify_options, n_opts, argc, argv, &err) != 0 ||
        cli_int(&k_logits, &args, "logits", &err) != 0)
        return cli_report(&err);
    const int B = cfg.training.local_batch_size, T = cfg.training.seq_len;
    const char *dir = cfg.model.hf_path, *data = cfg.training.dataset_path;
    if (B > 1 << 20 || T > 1 << 24) {
        ct_fail(&err,
                "training.local_batch_size (%d) and training.seq_len (%d) must be at most %d "
                "and %d",
                B, T, 1 << 20, 1 << 24);
        return cli_report(&err);
    }
    if (k_logits < 0 || k_logits > 1 << 24) {
        ct_fail(&err, "--logits (%lld) must be between 0 and %d", (long long)k_logits, 1 << 24);
        return cli_report(&err);
    }

    // With --json, stdout holds exactly the one JSON object; the readable report goes to stderr.
    FILE *out = cli_flag(&args, "json") ? stderr : stdout;
    qwen3_model m = {0};
    hf_load_report rep = {0};
    verify_result res = {0};
    run_setup setup = {0};
    run_memory mem = {0};
    int rc = verify_run(&res, &m, &rep, &setup, &mem, &cfg, (int)k_logits, out, &err);
    if (rep.n_loaded || rep.n_missing || rep.n_unexpected) print_key_report(out, &rep);
    if (rc != 0) {
        verify_free(&m, &rep, &setup, &res);
        return cli_report(&err);
    }
    double peak_mib = sysmem_peak_rss_bytes() / 1048576.0;
    double plan_mib = (mem.model.params + mem.model.grads + mem.model.activations) / 1048576.0;
    fprintf(out, "model: %s: %d layers, hidden %d, heads %d/%d kv, head_dim %d, vocab %d, %s\n",
            dir, m.cfg.num_hidden_layers, m.cfg.hidden_size, m.cfg.num_attention_heads,
            m.cfg.num_key_value_heads, m.cfg.head_dim, m.cfg.vocab_size,
            m.cfg.tie_word_embeddings ? "tied embeddings" : "untied embeddings");
    run_setup_log_kernels(&setup, out);
    fprintf(out, "source dtype: %s%s (%d file(s)); computed in %s\n", dtype_name(rep.source_dtype),
            rep.mixed_dtypes ? " (mixed)" : "", rep.n_files,
            !setup.mem_opts.bf16 ? "fp32"
            : m.n_sparse && setup.mem_opts.bf16_experts
                ? "bf16 mixed precision (linear layers and MoE experts in bf16, the rest fp32)"
                : "bf16 mixed precision (linear layers in bf16, the rest fp32)");
    const size_t n_hf = qwen3_num_hf_parameters(&m);
    if (n_hf == m.num_params)
        fprintf(out, "params: %zu\n", n_hf);
    else
        fprintf(out, "params: %zu (and %zu values of the expert bias, a buffer HF does not have)\n",
                n_hf, m.num_params - n_hf);
    fprintf(out, "batch: %lld x %lld tokens from %s, %lld valid targets\n", (long long)B,
            (long long)T, data, (long long)res.n_valid);
    const bool moe = m.n_sparse > 0;
    if (moe) {
        fprintf(out, "moe: %d of %d layers sparse, %d experts, top-%d, expert kernel %s\n",
                m.n_sparse, m.cfg.num_hidden_layers, m.cfg.num_experts, m.cfg.num_experts_per_tok,
                setup.moe_impl);
        fprintf(out, "ce: %.6f\naux: %.6f (%s)\n", res.ce, res.aux,
                m.cfg.output_router_logits ? "in the loss: output_router_logits is on"
                                           : "not in the loss: output_router_logits is off");
    }
    fprintf(out, "loss: %.6f\ngrad_norm: %.6f\n", res.loss, res.grad_norm);
    fprintf(out, "time: forward %.1f ms, backward %.1f ms\n", res.forward_s * 1e3,
            res.backward_s * 1e3);
    fprintf(out, "memory: peak RSS %.1f MiB (planned model buffers %.1f MiB)\n", peak_mib,
            plan_mib);
    override_report_calls(&setup.overrides, out);
    if (cli_flag(&args, "json")) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddItemToObject(o, "loss", json_exact_number(res.loss)); // eval's, bit for bit
        cJSON_AddStringToObject(o, "attn_backend", setup.attn_backend);
        cJSON_AddStringToObject(o, "mixed_precision_param",
                                setup.mem_opts.bf16 ? "bfloat16" : "float32");
        if (moe) {
            cJSON_AddNumberToObject(o, "ce", res.ce);
            cJSON_AddNumberToObject(o, "aux", res.aux);
        }
        cJSON_AddItemToObject(o, "grad_norm", json_exact_number(res.grad_norm));
        cJSON_AddItemToObject(o, "grad_norm_by_parameter", res.grad_norms);
        res.grad_norms = NULL;
        cJSON_AddNumberToObject(o, "logits_sum", res.logits.sum);
        cJSON_AddNumberToObject(o, "logits_sq_sum", res.logits.sq_sum);
        if (res.logits.k) {
            cJSON_AddItemToObject(o, "logits_sample0_pos0",
                                  cJSON_CreateFloatArray(res.logits.first, res.logits.k));
            cJSON_AddItemToObject(o, "logits_sample0_last",
                                  cJSON_CreateFloatArray(res.logits.last, res.logits.k));
        }
        cJSON_AddNumberToObject(o, "num_params", (double)n_hf);
        cJSON_AddNumberToObject(o, "n_valid", (double)res.n_valid);
        cJSON_AddNumberToObject(o, "loaded", rep.n_loaded);
        cJSON_AddItemToObject(o, "missing", string_array(rep.missing, rep.n_missing));
        cJSON_AddItemToObject(o, "unexpected", string_array(rep.unexpected, rep.n_unexpected));
        cJSON_AddStringToObject(o, "source_dtype", dtype_name(rep.source_dtype));
        cJSON_AddNumberToObject(o, "peak_rss_mib", peak_mib);
        cJSON_AddNumberToObject(o, "forward_ms", res.forward_s * 1e3);
        cJSON_AddNumberToObject(o, "backward_ms", res.backward_s * 1e3);
        if (override_any(&setup.overrides))
            cJSON_AddItemToObject(o, "override_calls", calls_json(&setup.overrides));
        char *text = cJSON_PrintUnformatted(o);
        printf("%s\n", text);
        cJSON_free(text);
        cJSON_Delete(o);
    }
    verify_free(&m, &rep, &setup, &res);
    return 0;
}
