// Cross-key checks of a training config that need no model. Each failure names the keys and
// their values, and starts with where the first user-set one came from (FILE:LINE or the
// command-line option), so a user knows which line to edit.
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/lora.h"
#include "train/pipeline_schedule.h"
#include "train/config_internal.h"

typedef struct vctx {
    const config_origins *o;
    ct_error *err;
} vctx;

static const char *origin_of(const vctx *v, const char *key) {
    if (!key || !v->o) return NULL;
    int i = config_key_index(key, strlen(key));
    return i >= 0 && v->o->where[i][0] ? v->o->where[i] : NULL;
}

static int vfail(const vctx *v, const char *k1, const char *k2, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int vfail(const vctx *v, const char *k1, const char *k2, const char *fmt, ...) {
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const char *where = origin_of(v, k1);
    if (!where) where = origin_of(v, k2);
    return ct_fail(v->err, "%s: %s", where ? where : "config", msg);
}

#define NEED(cond, k1, k2, ...)                                                                    \
    do {                                                                                           \
        if (!(cond)) return vfail(&v, k1, k2, __VA_ARGS__);                                        \
    } while (0)

// What every key allows on its own: choices and finite floats.
static int check_keys(const ct_config *c, const vctx *vp) {
    vctx v = *vp;
    int n;
    const config_key *keys = config_keys(&n);
    for (int i = 0; i < n; i++) {
        const config_key *k = &keys[i];
        const char *p = (const char *)c + k->offset;
        char full[160];
        snprintf(full, sizeof full, "%s.%s", k->section, k->key);
        if (k->type == CONFIG_STR && k->choices) {
            const char *close;
            char choices[256];
            config_choices_text(choices, sizeof choices, k);
            NEED(config_choice_ok(k, p, &close), full, NULL, "%s = \"%s\"; expected %s", full, p,
                 choices);
        }
        if (k->type == CONFIG_FLOAT && !(config_key_optional(k) && isnan(*(const double *)p)))
            NEED(isfinite(*(const double *)p), full, NULL, "%s is not a finite number", full);
        if (k->type == CONFIG_TRISTATE) {
            int t = *(const int *)p;
            NEED(t >= -1 && t <= 1, full, NULL, "%s = %d; expected -1 (auto), 0 or 1", full, t);
        }
    }
    return 0;
}

static int check_model(const ct_config_model *m, const vctx *vp) {
    vctx v = *vp;
    const struct {
        const char *key;
        int value;
    } overrides[] = {
        {"model.n_layers", m->n_layers},
        {"model.dim", m->dim},
        {"model.n_heads", m->n_heads},
        {"model.n_kv_heads", m->n_kv_heads},
        {"model.head_dim", m->head_dim},
        {"model.ffn_dim", m->ffn_dim},
        {"model.vocab_size", m->vocab_size},
        {"model.max_seq_len", m->max_seq_len},
        {"model.num_experts", m->num_experts},
        {"model.num_experts_per_tok", m->num_experts_per_tok},
        {"model.moe_intermediate_size", m->moe_intermediate_size},
    };
    bool hf = strcmp(m->backend, "hf") == 0;
    if (hf) {
        NEED(m->hf_path[0], "model.backend", "model.hf_path",
             "model.backend = \"hf\" needs model.hf_path (a folder with config.json and "
             "*.safetensors)");
        for (size_t i = 0; i < sizeof overrides / sizeof overrides[0]; i++)
            NEED(overrides[i].value == 0, overrides[i].key, "model.backend",
                 "%s = %d overrides a native flavor's architecture; with model.backend = \"hf\" "
                 "the architecture comes from %s/config.json",
                 overrides[i].key, overrides[i].value, m->hf_path);
        NEED(m->tie_embeddings == -1, "model.tie_embeddings", "model.backend",
             "model.tie_embeddings overrides a native flavor's architecture; with model.backend "
             "= \"hf\" it comes from %s/config.json",
             m->hf_path);
    } else {
        NEED(m->flavor[0], "model.flavor", NULL, "model.flavor is empty; name a native flavor");
        // model.hf_path alone would have chosen "hf" (config_compat.c): a flavor named beside it
        // is the ambiguity to name.
        char why[160];
        if (origin_of(&v, "model.flavor") && !origin_of(&v, "model.backend"))
            snprintf(why, sizeof why, "so is model.flavor = \"%s\", a native flavor", m->flavor);
        else
            snprintf(why, sizeof why, "model.backend = \"native\"");
        NEED(!m->hf_path[0], "model.hf_path", "model.backend",
             "model.hf_path is set but %s: set model.backend = \"hf\" for that folder's model "
             "(--model.backend hf), or checkpoint.initial_load_path with "
             "checkpoint.initial_load_in_hf = true to start the flavor from it",
             why);
        for (size_t i = 0; i < sizeof overrides / sizeof overrides[0]; i++)
            NEED(overrides[i].value >= 0, overrides[i].key, NULL,
                 "%s = %d; expected a positive size, or 0 to keep the flavor's", overrides[i].key,
                 overrides[i].value);
    }
    NEED(m->tokenizer_path[0], "model.tokenizer_path", NULL, "model.tokenizer_path is empty");
    // The load-balancing keys are training choices: they apply to either backend.
    NEED(m->load_balance_coeff > 0, "model.load_balance_coeff", NULL,
         "model.load_balance_coeff = %g; expected a positive number", m->load_balance_coeff);
    NEED(m->router_aux_loss_coef == -1 || m->router_aux_loss_coef >= 0,
         "model.router_aux_loss_coef", NULL,
         "model.router_aux_loss_coef = %g; expected -1 (the model config's) or a number >= 0",
         m->router_aux_loss_coef);
    return 0;
}

bool config_ac_op(const ct_config *c) {
    const ct_config_activation_checkpoint *ac = &c->activation_checkpoint;
    return strcmp(ac->mode, "selective") == 0 && strcmp(ac->selective_ac_option, "op") == 0;
}

int config_ac_every(const ct_config *c) {
    const ct_config_activation_checkpoint *ac = &c->activation_checkpoint;
    if (strcmp(ac->mode, "full") == 0) return 1;
    if (strcmp(ac->mode, "selective") != 0 || config_ac_op(c)) return 0;
    char *end;
    long k = strtol(ac->selective_ac_option, &end, 10);
    return *end == '\0' && end != ac->selective_ac_option && k >= 1 && k <= 1000000 ? (int)k : -1;
}

int config_loss_chunk(const ct_config *c, int vocab_size, int tokens) {
    const int k = c->training.loss_chunk_tokens;
    if (k >= 0) return k;
    const double logits = (double)tokens * vocab_size * sizeof(float);
    const double cap = (config_ac_every(c) > 0 || config_ac_op(c) ? 64.0 : 256.0) * (1 << 20);
    if (logits <= cap) return 0;
    const int chunks = (int)ceil(logits / cap);
    return (tokens + chunks - 1) / chunks;
}

static int check_training(const ct_config *c, bool needs_data, const vctx *vp) {
    vctx v = *vp;
    const ct_config_training *t = &c->training;
    int dp = c->parallelism.data_parallel_shard_degree;
    NEED(config_ac_every(c) >= 0, "activation_checkpoint.selective_ac_option", NULL,
         "activation_checkpoint.selective_ac_option = \"%s\"; expected \"op\" (keep the GEMM "
         "and attention outputs, recompute the elementwise ops) or a layer frequency k >= 1 "
         "(every k-th layer is checkpointed)",
         c->activation_checkpoint.selective_ac_option);
    NEED(t->loss_chunk_tokens >= -1, "training.loss_chunk_tokens", NULL,
         "training.loss_chunk_tokens = %d; expected -1 (auto), 0 (whole) or a token count",
         t->loss_chunk_tokens);
    NEED(!needs_data || t->dataset_path[0], "training.dataset_path", NULL,
         "training.dataset_path is not set: point it at a .txt, .jsonl or .npy file, or a "
         "folder of them");
    NEED(t->local_batch_size >= 1, "training.local_batch_size", NULL,
         "training.local_batch_size = %d; expected at least 1", t->local_batch_size);
    NEED(t->seq_len >= 1, "training.seq_len", NULL, "training.seq_len = %d; expected at least 1",
         t->seq_len);
    NEED(t->steps >= 1, "training.steps", NULL, "training.steps = %d; expected at least 1",
         t->steps);
    NEED(dp == -1 || dp >= 1, "parallelism.data_parallel_shard_degree", NULL,
         "parallelism.data_parallel_shard_degree = %d; expected -1 (all ranks) or at least 1", dp);
    int rep = c->parallelism.data_parallel_replicate_degree;
    NEED(rep >= 1, "parallelism.data_parallel_replicate_degree", NULL,
         "parallelism.data_parallel_replicate_degree = %d; expected at least 1", rep);
    NEED(rep == 1 || dp == 1 || dp == -1 ||
             strcmp(c->parallelism.data_parallel_shard_mode, "fsdp") == 0,
         "parallelism.data_parallel_replicate_degree", "parallelism.data_parallel_shard_mode",
         "parallelism.data_parallel_replicate_degree = %d with data_parallel_shard_degree = %d "
         "under data_parallel_shard_mode = \"zero1\": ZeRO-1 shards the optimizer over all "
         "ranks or replicates it on all; HSDP (both) is data_parallel_shard_mode = \"fsdp\"",
         rep, dp);
    NEED(c->parallelism.tensor_parallel_degree >= 1, "parallelism.tensor_parallel_degree", NULL,
         "parallelism.tensor_parallel_degree = %d; expected at least 1",
         c->parallelism.tensor_parallel_degree);
    NEED(c->parallelism.context_parallel_degree >= 1, "parallelism.context_parallel_degree", NULL,
         "parallelism.context_parallel_degree = %d; expected at least 1",
         c->parallelism.context_parallel_degree);
    NEED(c->parallelism.expert_parallel_degree >= 1, "parallelism.expert_parallel_degree", NULL,
         "parallelism.expert_parallel_degree = %d; expected at least 1",
         c->parallelism.expert_parallel_degree);
    NEED(c->parallelism.expert_tensor_parallel_degree == 1 ||
             c->parallelism.expert_tensor_parallel_degree ==
                 c->parallelism.tensor_parallel_degree,
         "parallelism.expert_tensor_parallel_degree", NULL,
         "parallelism.expert_tensor_parallel_degree = %d; expected 1 or "
         "tensor_parallel_degree (%d)",
         c->parallelism.expert_tensor_parallel_degree, c->parallelism.tensor_parallel_degree);
    const ct_config_parallelism *pl = &c->parallelism;
    NEED(pl->pipeline_parallel_degree >= 1, "parallelism.pipeline_parallel_degree", NULL,
         "parallelism.pipeline_parallel_degree = %d; expected at least 1",
         pl->pipeline_parallel_degree);
    pp_schedule_kind kind;
    ct_error why;
    NEED(pp_schedule_parse(pl->pipeline_parallel_schedule, &kind, &why) == 0,
         "parallelism.pipeline_parallel_schedule", NULL, "%s", why.msg);
    NEED(pl->pipeline_parallel_microbatch_size >= 1, "parallelism.pipeline_parallel_microbatch_size",
         NULL, "parallelism.pipeline_parallel_microbatch_size = %d; expected at least 1",
         pl->pipeline_parallel_microbatch_size);
    NEED(pl->pipeline_parallel_layers_per_stage >= 0,
         "parallelism.pipeline_parallel_layers_per_stage", NULL,
         "parallelism.pipeline_parallel_layers_per_stage = %d; expected 0 (the stages' count "
         "decides) or more",
         pl->pipeline_parallel_layers_per_stage);
    NEED(pl->pipeline_parallel_first_stage_less_layers >= 0 &&
             pl->pipeline_parallel_last_stage_less_layers >= 0,
         "parallelism.pipeline_parallel_first_stage_less_layers",
         "parallelism.pipeline_parallel_last_stage_less_layers",
         "parallelism.pipeline_parallel_first_stage_less_layers = %d, last_stage_less_layers = "
         "%d; expected 0 or more",
         pl->pipeline_parallel_first_stage_less_layers,
         pl->pipeline_parallel_last_stage_less_layers);
    NEED(c->parallelism.threads_per_rank >= 0, "parallelism.threads_per_rank", NULL,
         "parallelism.threads_per_rank = %d; expected 0 (automatic) or more",
         c->parallelism.threads_per_rank);
    if (rep > 1) dp = rep; // the data-parallel degree when it is known from the config
    int g = t->global_batch_size;
    NEED(g == -1 || g >= 1, "training.global_batch_size", NULL,
         "training.global_batch_size = %d; expected -1 (local_batch_size * data-parallel "
         "degree) or at least 1",
         g);
    if (g > 0 && dp > 0) {
        int64_t unit = (int64_t)t->local_batch_size * dp;
        NEED(g % unit == 0, "training.global_batch_size", "training.local_batch_size",
             "training.global_batch_size = %d is not a multiple of training.local_batch_size "
             "(%d) * the data-parallel degree (%d) = %lld",
             g, t->local_batch_size, dp, (long long)unit);
    } else if (g > 0) { // the degree is the rank count, checked when the ranks are known
        NEED(g % t->local_batch_size == 0, "training.global_batch_size",
             "training.local_batch_size",
             "training.global_batch_size = %d is not a multiple of training.local_batch_size "
             "(%d)",
             g, t->local_batch_size);
    }
    NEED(t->max_norm >= 0, "training.max_norm", NULL,
         "training.max_norm = %g; expected 0 (off) or a positive norm", t->max_norm);
    NEED(t->max_skipped_steps >= 0, "training.max_skipped_steps", NULL,
         "training.max_skipped_steps = %d; expected 0 or more", t->max_skipped_steps);
    return 0;
}

static int check_optim(const ct_config *c, const vctx *vp) {
    vctx v = *vp;
    const ct_config_optimizer *o = &c->optimizer;
    const ct_config_lr_scheduler *s = &c->lr_scheduler;
    // The ranges torch.optim.AdamW accepts.
    NEED(o->lr >= 0, "optimizer.lr", NULL, "optimizer.lr = %g; expected 0 or more", o->lr);
    NEED(o->eps >= 0, "optimizer.eps", NULL, "optimizer.eps = %g; expected 0 or more", o->eps);
    NEED(o->beta1 >= 0 && o->beta1 < 1, "optimizer.beta1", NULL,
         "optimizer.beta1 = %g; expected a value in [0, 1)", o->beta1);
    NEED(o->beta2 >= 0 && o->beta2 < 1, "optimizer.beta2", NULL,
         "optimizer.beta2 = %g; expected a value in [0, 1)", o->beta2);
    NEED(o->weight_decay >= 0, "optimizer.weight_decay", NULL,
         "optimizer.weight_decay = %g; expected 0 or more", o->weight_decay);
    NEED(s->warmup_steps >= 0, "lr_scheduler.warmup_steps", NULL,
         "lr_scheduler.warmup_steps = %d; expected 0 or more", s->warmup_steps);
    NEED(isnan(s->decay_ratio) || (s->decay_ratio >= 0 && s->decay_ratio <= 1),
         "lr_scheduler.decay_ratio", NULL,
         "lr_scheduler.decay_ratio = %g; expected a value in [0, 1]", s->decay_ratio);
    NEED(s->min_lr_factor >= 0 && s->min_lr_factor <= 1, "lr_scheduler.min_lr_factor", NULL,
         "lr_scheduler.min_lr_factor = %g; expected a value in [0, 1]", s->min_lr_factor);
    // A warmup or decay longer than the run is clamped with a warning (lr_phases_of), as
    // torchtitan's build_lr_schedulers does.
    return 0;
}

static int check_rest(const ct_config *c, const vctx *vp) {
    vctx v = *vp;
    const ct_config_checkpoint *k = &c->checkpoint;
    const ct_config_validation *val = &c->validation;
    NEED(c->job.dump_folder[0], "job.dump_folder", NULL,
         "job.dump_folder is empty: the run needs a folder for its outputs");
    NEED(k->folder[0], "checkpoint.folder", NULL, "checkpoint.folder is empty");
    NEED(k->interval >= 1, "checkpoint.interval", NULL,
         "checkpoint.interval = %d; expected at least 1", k->interval);
    NEED(k->keep_latest_k >= 0, "checkpoint.keep_latest_k", NULL,
         "checkpoint.keep_latest_k = %d; expected 0 (keep all) or more", k->keep_latest_k);
    NEED(!k->initial_load_in_hf || k->initial_load_path[0], "checkpoint.initial_load_in_hf",
         "checkpoint.initial_load_path",
         "checkpoint.initial_load_in_hf = true needs checkpoint.initial_load_path (the HF folder)");
    // last_save_in_hf is an export at the end, not a checkpoint: it needs no checkpoint.enable.
    NEED(c->metrics.log_freq >= 1, "metrics.log_freq", NULL,
         "metrics.log_freq = %d; expected at least 1", c->metrics.log_freq);
    NEED(c->metrics.peak_gflops >= 0, "metrics.peak_gflops", NULL,
         "metrics.peak_gflops = %g; expected 0 (measure) or a positive peak",
         c->metrics.peak_gflops);
    NEED(val->freq >= 1, "validation.freq", NULL, "validation.freq = %d; expected at least 1",
         val->freq);
    NEED(val->steps == -1 || val->steps >= 1, "validation.steps", NULL,
         "validation.steps = %d; expected -1 (the whole split) or at least 1", val->steps);
    NEED(!val->enable || val->dataset_path[0], "validation.enable", "validation.dataset_path",
         "validation.enable = true needs validation.dataset_path");
    NEED(c->debug.seed >= 0, "debug.seed", NULL, "debug.seed = %lld; expected 0 or more",
         (long long)c->debug.seed);
    NEED(c->debug.fault_rank >= 0, "debug.fault_rank", NULL,
         "debug.fault_rank = %d; expected 0 or more", c->debug.fault_rank);
    NEED(c->debug.fault_step >= 1, "debug.fault_step", NULL,
         "debug.fault_step = %d; expected 1 or more", c->debug.fault_step);
    const ct_config_comm *cm = &c->comm;
    const struct {
        const char *key;
        double value;
    } positive[] = {{"comm.init_timeout_seconds", cm->init_timeout_seconds},
                    {"comm.train_timeout_seconds", cm->train_timeout_seconds},
                    {"comm.checkpoint_timeout_seconds", cm->checkpoint_timeout_seconds},
                    {"comm.bucket_cap_mb", cm->bucket_cap_mb}};
    for (size_t i = 0; i < sizeof positive / sizeof positive[0]; i++)
        NEED(positive[i].value > 0, positive[i].key, NULL, "%s = %g; expected a positive number",
             positive[i].key, positive[i].value);
    return 0;
}

// [lora]: on when rank > 0; its values as PEFT takes them (model/lora.h).
static int check_lora(const ct_config *c, const vctx *vp) {
    vctx v = *vp;
    const ct_config_lora *l = &c->lora;
    NEED(l->rank >= 0, "lora.rank", NULL, "lora.rank = %d; expected 0 (no LoRA) or more", l->rank);
    if (l->rank == 0) return 0;
    lora_config lc;
    if (config_lora(&lc, c, v.err) != 0) {
        const char *where = origin_of(&v, "lora.target_modules");
        if (where) return ct_wrap(v.err, "%s", where);
        return -1;
    }
    NEED(c->parallelism.tensor_parallel_degree <= 1, "lora.rank",
         "parallelism.tensor_parallel_degree",
         "lora.rank = %d with parallelism.tensor_parallel_degree = %d: LoRA under tensor "
         "parallelism is not supported yet",
         l->rank, c->parallelism.tensor_parallel_degree);
    return 0;
}

int config_lora(lora_config *lc, const ct_config *c, ct_error *err) {
    const ct_config_lora *l = &c->lora;
    memset(lc, 0, sizeof *lc);
    lc->rank = l->rank, lc->alpha = (float)l->alpha, lc->dropout = (float)l->dropout;
    lc->use_rslora = l->use_rslora;
    char list[sizeof l->target_modules];
    const char *names[64];
    int n = 0;
    snprintf(list, sizeof list, "%s", l->target_modules);
    for (char *save = NULL, *tok = strtok_r(list, ", ", &save); tok && n < 64;
         tok = strtok_r(NULL, ", ", &save))
        names[n++] = tok;
    if (lora_parse_targets(names, n, &lc->targets, "lora", err) != 0) return -1;
    return lora_config_validate(lc, "lora", err);
}

// Each group stops at its first problem (later checks in a group may rely on earlier ones);
// the groups' problems are reported together.
int config_check(const ct_config *c, const config_origins *o, bool needs_data, ct_error *err) {
    config_errors errs = {0};
    ct_error e;
    vctx v = {o, &e};
    if (check_keys(c, &v) != 0) config_errors_add(&errs, &e);
    if (check_model(&c->model, &v) != 0) config_errors_add(&errs, &e);
    if (check_training(c, needs_data, &v) != 0) config_errors_add(&errs, &e);
    if (check_optim(c, &v) != 0) config_errors_add(&errs, &e);
    if (check_rest(c, &v) != 0) config_errors_add(&errs, &e);
    if (check_lora(c, &v) != 0) config_errors_add(&errs, &e);
    return config_errors_report(&errs, err);
}

int config_validate(const ct_config *c, ct_error *err) {
    return config_check(c, NULL, true, err);
}
