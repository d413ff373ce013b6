#include "train/run_setup.h"

#include <stdlib.h>
#include <string.h>

#include "core/sysmem.h"
#include "model/flavors.h"
#include "ops/ops_cpu.h"
#include "ops/ops_profile.h"
#include "plugin/trusted_ops.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

// The load-balancing loss keys are training choices, not architecture: they apply to either
// backend.
static void apply_aux_overrides(qwen3_config *out, const ct_config_model *m) {
    if (m->router_aux_loss_coef >= 0) out->router_aux_loss_coef = m->router_aux_loss_coef;
    if (m->output_router_logits >= 0) out->output_router_logits = m->output_router_logits;
}

int run_setup_model_config(qwen3_config *out, const ct_config *c, ct_error *err) {
    const ct_config_model *m = &c->model;
    if (strcmp(m->backend, "hf") == 0) {
        char path[CT_CONFIG_PATH_MAX + 16];
        snprintf(path, sizeof path, "%s/config.json", m->hf_path);
        if (qwen3_config_load(out, path, err) != 0) return -1;
        apply_aux_overrides(out, m);
        return 0;
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
    apply_aux_overrides(out, m);
    if (m->tie_embeddings >= 0) out->tie_word_embeddings = m->tie_embeddings;
    if (m->num_experts || m->num_experts_per_tok || m->moe_intermediate_size) {
        if (out->num_experts == 0)
            return ct_fail(err,
                           "model.num_experts, num_experts_per_tok and moe_intermediate_size "
                           "override a MoE flavor; \"%s\" is dense (MoE flavors: "
                           "debugmodel_moe, 30B-A3B, 235B-A22B)",
                           m->flavor);
        if (m->num_experts) out->num_experts = m->num_experts;
        if (m->num_experts_per_tok) out->num_experts_per_tok = m->num_experts_per_tok;
        if (m->moe_intermediate_size) out->moe_intermediate_size = m->moe_intermediate_size;
    }
    char source[128];
    snprintf(source, sizeof source, "model.flavor \"%s\" with model.* overrides", m->flavor);
    return qwen3_config_validate(out, source, err);
}

// The built-in table: model.moe_impl's expert kernel and model.attn_backend's attention
// ("auto" is flash).
static int choose_kernels(run_setup *s, const ct_config *c, ct_error *err) {
    if (ct_ops_with_moe_impl(&s->builtin, &ct_ops_cpu, c->model.moe_impl) != 0)
        return ct_fail(err, "model.moe_impl \"%s\": expected \"grouped\" or \"loop\"",
                       c->model.moe_impl);
    const char *attn = strcmp(c->model.attn_backend, "auto") == 0 ? "flash" : c->model.attn_backend;
    if (ct_ops_with_attention(&s->builtin, &s->builtin, attn) != 0)
        return ct_fail(err, "model.attn_backend \"%s\": expected \"sdpa\" or \"flash\"", attn);
    snprintf(s->moe_impl, sizeof s->moe_impl, "%s", c->model.moe_impl);
    snprintf(s->attn_backend, sizeof s->attn_backend, "%s", attn);
    s->ops = s->builtin;
    return 0;
}

// Load, check, then refuse or apply (or, check_only, keep the report). Every rank of a job
// checks its own plugins (ranks may sit on different CPUs) and the ranks agree on the outcome.
static int trust_plugins(run_setup *s, const ct_config *c, const run_setup_opts *o, ct_error *err) {
    const char *imports = c->override.imports;
    kernel_check_shape shape = kernel_check_shape_of(&s->model, s->T);
    int rc;
    if (o->check_only)
        rc = trusted_ops_check(&s->check, &s->overrides, imports, &s->builtin, &shape, o->log, err);
    else
        rc = trusted_ops_setup(&s->ops, &s->overrides, imports, c->override.allow_mismatch, &shape,
                               o->log, o->warn, err);
    if (o->d) rc = dist_agree(o->d, rc, "loading and checking the override kernels", err);
    return rc;
}

int run_setup_open(run_setup *s, const ct_config *c, const run_setup_opts *o, ct_error *err) {
    memset(s, 0, sizeof *s);
    s->B = c->training.local_batch_size;
    s->T = c->training.seq_len;
    s->allow_overcommit = c->training.allow_overcommit;
    if (strcmp(c->model.backend, "hf") == 0)
        snprintf(s->model_source, sizeof s->model_source, "%s/config.json", c->model.hf_path);
    else
        snprintf(s->model_source, sizeof s->model_source,
                 "model.flavor \"%s\" with model.* overrides", c->model.flavor);
    s->be = c->debug.guard_device_memory ? ct_backend_cpu_guarded() : ct_backend_cpu();
    if (choose_kernels(s, c, err) != 0 || run_setup_model_config(&s->model, c, err) != 0) return -1;
    // First thing after the config: the check forks, which must precede any OpenMP region.
    if (trust_plugins(s, c, o, err) != 0) {
        run_setup_close(s);
        return -1;
    }
    s->plugins_applied = !o->check_only && override_any(&s->overrides);
    if (c->debug.profile_ops && !o->check_only) {
        const ct_ops timed = s->ops;
        ops_profile_wrap(&s->ops, &timed);
    }
    s->mem_opts.ac_every = config_ac_every(c);
    s->mem_opts.ac_op = config_ac_op(c);
    s->mem_opts.loss_chunk = config_loss_chunk(c, s->model.vocab_size, s->B * s->T);
    s->mem_opts.block_causal = strcmp(c->model.attn_mask_type, "block_causal") == 0;
    // bf16 mixed precision: the linear layers on the table's bf16 kernels, unless a plugin
    // replaced matmul (the plugin ABI is fp32: its kernel then runs in fp32, as the log says);
    // the experts likewise, unless a plugin replaced them (they then run it in fp32).
    s->matmul_plugin = s->plugins_applied && s->overrides.ops[OVERRIDE_MATMUL].set;
    s->moe_plugin = s->plugins_applied && s->overrides.ops[OVERRIDE_MOE_EXPERTS].set;
    s->warn = o->warn;
    s->mem_opts.bf16 =
        strcmp(c->training.mixed_precision_param, "bfloat16") == 0 && !s->matmul_plugin;
    s->mem_opts.bf16_experts = s->mem_opts.bf16 && !s->moe_plugin;
    snprintf(s->precision, sizeof s->precision, "%s", c->training.mixed_precision_param);
    return 0;
}

void run_setup_close(run_setup *s) {
    kernel_check_free(&s->check);
    override_close(&s->overrides);
    // The backend's kernel state (its bf16 GEMMs' primitives) goes with the run that chose it;
    // the model bound to it was freed before.
    if (s->be) s->be->close(s->be);
}

const char *run_setup_attention(const run_setup *s) {
    return s->plugins_applied && s->overrides.ops[OVERRIDE_ATTENTION].set ? "from a plugin"
                                                                          : s->attn_backend;
}

// Whether this CPU computes bf16 products natively (AVX512-BF16 or AMX); oneDNN emulates them
// otherwise, correctly but slower than fp32.
static bool cpu_has_native_bf16(void) {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
    return __builtin_cpu_supports("avx512bf16") || __builtin_cpu_supports("amx-bf16");
#else
    return false;
#endif
}

// The precision: line of a bf16 run: what runs in bf16, and what a plugin keeps in fp32 (the
// plugin ABI is fp32; override_apply drops the table's bf16 variant of a replaced op).
static void log_bf16_precision(const run_setup *s, bool moe, FILE *f) {
    const ct_ops *o = &s->ops;
    const bool experts = moe && s->mem_opts.bf16_experts;
    fprintf(f,
            "precision: bf16 mixed precision: linear layers%s%s in bf16 (fp32 "
            "accumulation), activations saved in bf16%s%s; norms, softmax, the loss and the "
            "optimizer compute in fp32; fp32 weights, gradients and AdamW state",
            experts ? ", MoE experts" : "", o->attention_bf16_forward ? ", attention products" : "",
            o->swiglu_rows_bf16_forward ? ", SwiGLU rounded as torch's" : "",
            o->cross_entropy_bf16_forward ? ", bf16 logits" : "");
    static const char plugin[] = "the plugin's kernel is fp32 (the plugin ABI)";
    const struct {
        bool fp32;
        const char *what, *why;
    } kept[] = {{moe && !experts, "the MoE experts", plugin},
                {!o->attention_bf16_forward, "attention's products",
                 strcmp(run_setup_attention(s), "from a plugin") == 0
                     ? plugin
                     : "model.attn_backend sdpa has no bf16 kernel (flash has)"},
                {!o->swiglu_rows_bf16_forward, "SwiGLU", plugin},
                {!o->cross_entropy_bf16_forward, "the loss's logits", plugin}};
    for (size_t i = 0; i < sizeof kept / sizeof *kept; i++)
        if (kept[i].fp32) fprintf(f, "; %s in fp32: %s", kept[i].what, kept[i].why);
    fputc('\n', f);
}

void run_setup_log_kernels(const run_setup *s, FILE *f) {
    const bool moe = qwen3_num_sparse_layers(&s->model) > 0;
    fprintf(f, "kernels: attention %s%s%s\n", run_setup_attention(s), moe ? ", experts " : "",
            moe ? s->moe_impl : "");
    if (strcmp(s->precision, "bfloat16") == 0 && !s->mem_opts.bf16)
        fprintf(f, "precision: float32: the matmul plugin's kernel is fp32 (the plugin ABI), so "
                   "the linear layers run in fp32 around it\n");
    else if (strcmp(s->precision, "bfloat16") == 0)
        log_bf16_precision(s, moe, f);
    if (s->mem_opts.bf16 && cpu_matmul_bf16_emulated(&s->ops) && s->warn)
        fprintf(s->warn,
                "ctitan: warning: the bf16 matmuls are emulated on OpenBLAS sgemm over "
                "bf16-rounded values (%s): the same products as bf16 with fp32 "
                "accumulation, slower than float32\n",
                getenv("CTITAN_BF16_GEMM") ? "CTITAN_BF16_GEMM is set"
                                           : "oneDNN has no bf16 matmul on this CPU");
    else if (s->mem_opts.bf16 && !cpu_has_native_bf16() && s->warn)
        fprintf(s->warn, "ctitan: warning: this CPU has no native bf16 (AVX512-BF16 or AMX): the "
                         "bf16 matmuls are emulated, correct but slower than float32\n");
}

qwen3_memory run_setup_plan(const run_setup *s) {
    return qwen3_memory_plan_ops(&s->model, &s->ops, s->B, s->T, &s->mem_opts);
}

run_memory run_setup_memory(const run_setup *s, double optimizer_bytes, double batch_bytes,
                            int ranks_per_node) {
    run_memory m = {.model = run_setup_plan(s),
                    .optimizer = optimizer_bytes,
                    .batch = batch_bytes,
                    .ranks_per_node = ranks_per_node > 0 ? ranks_per_node : 1};
    m.total = (double)m.model.params + m.model.weights_bf16 + m.model.grads + m.optimizer +
              m.model.activations + m.batch;
    m.node = m.total * m.ranks_per_node;
    m.avail = sysmem_available_bytes();
    return m;
}

int run_setup_check_fit(const run_setup *s, const run_memory *m, const char *what,
                        bool overcommit_option, ct_error *err) {
    if (s->T > s->model.max_position_embeddings)
        return ct_fail(err, "training.seq_len %d exceeds max_position_embeddings %d of %s", s->T,
                       s->model.max_position_embeddings, s->model_source);
    if (m->avail && m->node > (double)m->avail && !s->allow_overcommit)
        return ct_fail(err,
                       "%s needs about %.2f GiB per node (%d rank(s) x params %.2f, grads %.2f, "
                       "optimizer %.2f, activations %.2f) but %.2f GiB is available; reduce "
                       "training.local_batch_size, training.seq_len or the model%s",
                       what, m->node / GIB, m->ranks_per_node, m->model.params / GIB,
                       m->model.grads / GIB, m->optimizer / GIB, m->model.activations / GIB,
                       m->avail / GIB,
                       overcommit_option ? ", or set --training.allow_overcommit" : "");
    return 0;
}

run_memory run_setup_memory_lora(const run_setup *s, double adapter_bytes, double optimizer_bytes,
                                 double batch_bytes, int ranks_per_node) {
    run_memory m = run_setup_memory(s, optimizer_bytes, batch_bytes, ranks_per_node);
    m.model.params = qwen3_forward_only_weight_bytes(&s->model, &s->mem_opts) + (size_t)adapter_bytes;
    m.model.grads = (size_t)adapter_bytes;
    m.model.weights_bf16 = 0;
    m.total = (double)m.model.params + m.model.grads + m.optimizer + m.model.activations + m.batch;
    m.node = m.total * m.ranks_per_node;
    return m;
}

run_memory run_setup_memory_forward_only(const run_setup *s, double batch_bytes) {
    const qwen3_memory_opts o = qwen3_forward_only_opts(&s->mem_opts);
    run_memory m = run_setup_memory(s, 0, batch_bytes, 1);
    m.model.activations = qwen3_memory_plan_ops(&s->model, &s->ops, s->B, s->T, &o).activations;
    m.model.params = qwen3_forward_only_weight_bytes(&s->model, &s->mem_opts);
    m.model.weights_bf16 = m.model.grads = 0;
    m.total = (double)m.model.params + m.model.activations + m.batch;
    m.node = m.total;
    return m;
}

int run_setup_check_generate_fit(const run_setup *s, int cache_len, ct_error *err) {
    const double weights = (double)qwen3_forward_only_weight_bytes(&s->model, &s->mem_opts);
    const double cache = (double)qwen3_gen_memory(&s->model, &s->ops, &s->mem_opts, cache_len);
    const uint64_t avail = sysmem_available_bytes();
    if (avail && weights + cache > (double)avail && !s->allow_overcommit)
        return ct_fail(err,
                       "generating from %s with a KV cache of %d positions needs about %.2f GiB "
                       "(weights %.2f, KV cache and buffers %.2f) but %.2f GiB is available; "
                       "lower --cache_len or --max_new_tokens, or set "
                       "--training.allow_overcommit",
                       s->model_source, cache_len, (weights + cache) / GIB, weights / GIB,
                       cache / GIB, avail / GIB);
    return 0;
}
