// The training config: one key table drives defaults, TOML and command-line loading, the
// effective-config dump, --help, hashing and suggestions. Cross-key checks are in
// config_validate.c.
#include "train/config.h"

#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "core/suggest.h"
#include "io/atomic.h"
#include "io/toml.h"
#include "train/config_internal.h"

#define FIELD(sec, name) offsetof(ct_config, sec.name), sizeof(((ct_config *)0)->sec.name)
#define KEY(sec, name, type, def, choices, hashed, help)                                           \
    { #sec, #name, type, FIELD(sec, name), def, choices, hashed, help }

// Sections in the order they are written; keys within a section likewise.
static const config_key config_table[] = {
    KEY(job, dump_folder, CONFIG_STR, "./outputs", NULL, false,
        "folder for everything the run writes: checkpoints, metrics.jsonl, config.toml"),
    KEY(job, description, CONFIG_STR, "", NULL, false, "free text describing the run"),

    KEY(model, backend, CONFIG_STR, "native", "native|hf", true,
        "where the architecture and weights come from: a built-in flavor, or an HF folder"),
    KEY(model, flavor, CONFIG_STR, "debugmodel", NULL, true,
        "native flavor: debugmodel, 0.6B, 1.7B, 4B, 8B, 14B, 32B; MoE: debugmodel_moe, "
        "30B-A3B, 235B-A22B"),
    KEY(model, hf_path, CONFIG_STR, "", NULL, true,
        "backend=hf: folder with config.json, *.safetensors and tokenizer.json"),
    KEY(model, tokenizer_path, CONFIG_STR, "", NULL, true,
        "folder with tokenizer.json (default: hf_path for backend=hf, else "
        "assets/qwen3-tokenizer)"),
    KEY(model, n_layers, CONFIG_INT, "0", NULL, true,
        "override the flavor's layer count (0: keep)"),
    KEY(model, dim, CONFIG_INT, "0", NULL, true, "override the flavor's hidden size (0: keep)"),
    KEY(model, n_heads, CONFIG_INT, "0", NULL, true, "override the flavor's query heads (0: keep)"),
    KEY(model, n_kv_heads, CONFIG_INT, "0", NULL, true,
        "override the flavor's key/value heads (0: keep)"),
    KEY(model, head_dim, CONFIG_INT, "0", NULL, true, "override the flavor's head_dim (0: keep)"),
    KEY(model, ffn_dim, CONFIG_INT, "0", NULL, true,
        "override the flavor's MLP intermediate size (0: keep)"),
    KEY(model, vocab_size, CONFIG_INT, "0", NULL, true,
        "override the flavor's vocabulary size (0: keep)"),
    KEY(model, max_seq_len, CONFIG_INT, "0", NULL, true,
        "override the flavor's max_position_embeddings (0: keep)"),
    KEY(model, tie_embeddings, CONFIG_TRISTATE, "auto", NULL, true,
        "true/false override the flavor's tie_word_embeddings; \"auto\" keeps it"),
    KEY(model, num_experts, CONFIG_INT, "0", NULL, true,
        "override a MoE flavor's routed experts per sparse layer (0: keep)"),
    KEY(model, num_experts_per_tok, CONFIG_INT, "0", NULL, true,
        "override a MoE flavor's experts per token, the router's top-k (0: keep)"),
    KEY(model, moe_intermediate_size, CONFIG_INT, "0", NULL, true,
        "override a MoE flavor's expert intermediate size (0: keep)"),
    KEY(model, moe_impl, CONFIG_STR, "grouped", "grouped|loop", false,
        "MoE expert kernel: grouped (tokens sorted by expert) or loop (the reference); not "
        "hashed: they differ only in fp32 rounding"),
    KEY(model, attn_backend, CONFIG_STR, "auto", "auto|sdpa|flash", false,
        "attention kernel: sdpa (the reference: materialised scores, batched GEMMs), flash "
        "(tiled, online softmax, O(seq_len) memory) or auto (flash: faster at every length "
        "measured)"),
    KEY(model, load_balance, CONFIG_STR, "hf", "hf|aux_free|none", true,
        "MoE load balancing: hf (HF's aux loss, times router_aux_loss_coef, added when "
        "output_router_logits is on), aux_free (torchtitan's expert bias, no aux loss) or none"),
    KEY(model, load_balance_coeff, CONFIG_FLOAT, "1e-3", NULL, true,
        "load_balance = aux_free: the expert-bias step per optimizer step (torchtitan's "
        "load_balance_coeff)"),
    KEY(model, router_aux_loss_coef, CONFIG_FLOAT, "-1", NULL, true,
        "MoE aux loss coefficient (-1: the model config's router_aux_loss_coef)"),
    KEY(model, output_router_logits, CONFIG_TRISTATE, "auto", NULL, true,
        "MoE: true adds the aux loss (load_balance = hf); \"auto\" keeps the model config's "
        "output_router_logits"),

    KEY(training, dataset_path, CONFIG_STR, "", NULL, true,
        "training data: a .txt, .jsonl (\"text\" field) or .npy file, or a folder of them"),
    KEY(training, local_batch_size, CONFIG_INT, "8", NULL, false,
        "sequences per worker per micro-step (not hashed: a resume may split the same global "
        "batch differently)"),
    KEY(training, global_batch_size, CONFIG_INT, "-1", NULL, true,
        "sequences per optimizer step over all workers; a multiple of local_batch_size * "
        "data-parallel degree gives gradient accumulation (-1: no accumulation)"),
    KEY(training, seq_len, CONFIG_INT, "2048", NULL, true, "tokens per sequence"),
    KEY(training, steps, CONFIG_INT, "10000", NULL, false, "optimizer steps to train"),
    KEY(training, max_norm, CONFIG_FLOAT, "1.0", NULL, true,
        "clip the global gradient norm to this (0: off)"),
    KEY(training, shuffle, CONFIG_BOOL, "true", NULL, true,
        "permute the windows of each epoch with a seeded RNG"),
    KEY(training, max_skipped_steps, CONFIG_INT, "3", NULL, false,
        "stop with an error after this many non-finite steps in a row"),
    KEY(training, allow_overcommit, CONFIG_BOOL, "false", NULL, false,
        "train even when the memory estimate exceeds the available memory"),
    KEY(training, loss_chunk_tokens, CONFIG_INT, "-1", NULL, false,
        "compute the loss head (logits, cross-entropy and their gradient) in chunks of this many "
        "tokens, so the (tokens x vocab) logits are never held at once; 0: whole; -1: auto "
        "(chunks of at most 256 MiB of logits, 64 MiB with activation checkpointing)"),
    KEY(training, mixed_precision_param, CONFIG_STR, "float32", "float32|bfloat16", true,
        "parameter dtype (float32 only on CPU)"),

    KEY(optimizer, name, CONFIG_STR, "AdamW", "AdamW", true, "optimizer"),
    KEY(optimizer, lr, CONFIG_FLOAT, "8e-4", NULL, true, "peak learning rate"),
    KEY(optimizer, beta1, CONFIG_FLOAT, "0.9", NULL, true, "AdamW beta1"),
    KEY(optimizer, beta2, CONFIG_FLOAT, "0.95", NULL, true, "AdamW beta2"),
    KEY(optimizer, eps, CONFIG_FLOAT, "1e-8", NULL, true, "AdamW epsilon"),
    KEY(optimizer, weight_decay, CONFIG_FLOAT, "0.1", NULL, true, "decoupled weight decay"),
    KEY(optimizer, decay_norms_and_embeddings, CONFIG_BOOL, "true", NULL, true,
        "true: every parameter decays (torchtitan); false: norms, biases and embeddings do "
        "not"),

    KEY(lr_scheduler, warmup_steps, CONFIG_INT, "200", NULL, true,
        "linear warmup steps: lr factor (step+1)/warmup_steps"),
    KEY(lr_scheduler, decay_ratio, CONFIG_FLOAT, "0.0", NULL, true,
        "fraction of the steps, at the end, over which the lr decays (0: no decay)"),
    KEY(lr_scheduler, decay_type, CONFIG_STR, "linear", "linear|sqrt|cosine", true,
        "shape of the decay"),
    KEY(lr_scheduler, min_lr_factor, CONFIG_FLOAT, "0.0", NULL, true,
        "the lr factor the decay ends at"),

    KEY(checkpoint, enable, CONFIG_BOOL, "true", NULL, false, "save checkpoints and resume"),
    KEY(checkpoint, folder, CONFIG_STR, "checkpoint", NULL, false,
        "checkpoint folder, relative to job.dump_folder"),
    KEY(checkpoint, interval, CONFIG_INT, "500", NULL, false, "save every this many steps"),
    KEY(checkpoint, keep_latest_k, CONFIG_INT, "10", NULL, false,
        "keep the newest k checkpoints (0: keep all)"),
    KEY(checkpoint, initial_load_path, CONFIG_STR, "", NULL, false,
        "start from this checkpoint (or HF folder) when the run has none of its own"),
    KEY(checkpoint, initial_load_in_hf, CONFIG_BOOL, "false", NULL, false,
        "initial_load_path is a Hugging Face folder"),
    KEY(checkpoint, last_save_in_hf, CONFIG_BOOL, "false", NULL, false,
        "the final save is a Hugging Face folder in export_dtype"),
    KEY(checkpoint, export_dtype, CONFIG_STR, "float32", "float32|bfloat16|float16", false,
        "dtype of the final Hugging Face save"),

    KEY(metrics, log_freq, CONFIG_INT, "10", NULL, false,
        "log a metrics line every this many steps"),
    KEY(metrics, peak_gflops, CONFIG_FLOAT, "0.0", NULL, false,
        "per-worker peak GFLOP/s for MFU (0: measure once at start)"),

    KEY(validation, enable, CONFIG_BOOL, "false", NULL, false, "report validation loss"),
    KEY(validation, dataset_path, CONFIG_STR, "", NULL, false,
        "validation data, in the forms training.dataset_path takes"),
    KEY(validation, freq, CONFIG_INT, "500", NULL, false, "validate every this many steps"),
    KEY(validation, steps, CONFIG_INT, "10", NULL, false,
        "batches per validation (-1: the whole split)"),

    KEY(debug, seed, CONFIG_INT64, "0", NULL, true, "seed for weight init and data shuffling"),
    KEY(debug, fault, CONFIG_STR, "none", "none|bad_token|nan|exit|hang|weights", false,
        "test only: inject a failure on debug.fault_rank at debug.fault_step (weights: move one "
        "weight by an ulp before that step's save, which the ranks' hash check must refuse)"),
    KEY(debug, fault_rank, CONFIG_INT, "0", NULL, false, "the rank debug.fault hits"),
    KEY(debug, fault_step, CONFIG_INT, "1", NULL, false, "the step (from 1) debug.fault hits"),
    KEY(debug, profile_ops, CONFIG_BOOL, "false", NULL, false,
        "time every op and print a table of ms per step and share of the step at the end (the "
        "first step, a warm-up, is left out)"),

    KEY(parallelism, data_parallel_shard_degree, CONFIG_INT, "-1", NULL, false,
        "ranks that shard the optimizer state, ZeRO-1 (-1: every rank not used by "
        "data_parallel_replicate_degree)"),
    KEY(parallelism, data_parallel_replicate_degree, CONFIG_INT, "1", NULL, false,
        "ranks that each hold the whole optimizer state, DDP (shard * replicate = ranks)"),
    KEY(parallelism, threads_per_rank, CONFIG_INT, "0", NULL, false,
        "OpenMP and BLAS threads per rank (0: OMP_NUM_THREADS if set, else the node's cores "
        "divided among its ranks)"),

    KEY(comm, init_timeout_seconds, CONFIG_FLOAT, "300", NULL, false,
        "deadline of each wait between ranks during start-up"),
    KEY(comm, train_timeout_seconds, CONFIG_FLOAT, "100", NULL, false,
        "deadline of each wait between ranks during a training step"),
    KEY(comm, checkpoint_timeout_seconds, CONFIG_FLOAT, "1800", NULL, false,
        "deadline of each wait between ranks around a checkpoint save or export"),
    KEY(comm, bucket_cap_mb, CONFIG_FLOAT, "25", NULL, false,
        "gradient bucket size in MiB (as DDP's bucket_cap_mb)"),
    KEY(comm, overlap, CONFIG_BOOL, "true", NULL, false,
        "start each bucket's reduction during the backward, as soon as its gradients are "
        "final"),

    KEY(activation_checkpoint, mode, CONFIG_STR, "none", "none|full|selective", false,
        "recompute layer forwards in the backward: none, full (every layer) or selective "
        "(every selective_ac_option-th layer); the results are bit-identical"),
    KEY(activation_checkpoint, selective_ac_option, CONFIG_STR, "2", NULL, false,
        "selective: checkpoint every k-th layer (torchtitan's integer option; \"op\" is not "
        "supported)"),

    KEY(override, imports, CONFIG_LIST, "", NULL, false,
        "plugins (shared libraries, include/ctitan/plugin.h) whose kernels replace built-in ops; "
        "each override is checked against the built-in op before it is used"),
    KEY(override, allow_mismatch, CONFIG_BOOL, "false", NULL, false,
        "use overrides that fail the parity check anyway (warns loudly)"),
};

#define N_KEYS ((int)(sizeof config_table / sizeof config_table[0]))
_Static_assert(sizeof config_table / sizeof config_table[0] <= CONFIG_MAX_KEYS,
               "raise CONFIG_MAX_KEYS");

const config_key *config_keys(int *n) {
    *n = N_KEYS;
    return config_table;
}

static void full_name(char *buf, size_t cap, const config_key *k) {
    snprintf(buf, cap, "%s.%s", k->section, k->key);
}

int config_key_index(const char *full, size_t len) {
    for (int i = 0; i < N_KEYS; i++) {
        const config_key *k = &config_table[i];
        size_t ls = strlen(k->section), lk = strlen(k->key);
        if (len == ls + 1 + lk && memcmp(full, k->section, ls) == 0 && full[ls] == '.' &&
            memcmp(full + ls + 1, k->key, lk) == 0)
            return i;
    }
    return -1;
}

const config_key *config_find_key(const char *full_name) {
    int i = config_key_index(full_name, strlen(full_name));
    return i < 0 ? NULL : &config_table[i];
}

static bool section_known(const char *s) {
    for (int i = 0; i < N_KEYS; i++)
        if (strcmp(config_table[i].section, s) == 0) return true;
    return false;
}

static void *field(ct_config *c, const config_key *k) {
    return (char *)c + k->offset;
}
static const void *cfield(const ct_config *c, const config_key *k) {
    return (const char *)c + k->offset;
}

// Is `s` one of the '|'-separated choices? Otherwise suggests the closest.
bool config_choice_ok(const config_key *k, const char *s, const char **suggestion) {
    *suggestion = NULL;
    if (!k->choices) return true;
    char buf[128];
    const char *names[8];
    int n = 0;
    snprintf(buf, sizeof buf, "%s", k->choices);
    for (char *save = NULL, *t = strtok_r(buf, "|", &save); t && n < 8;
         t = strtok_r(NULL, "|", &save)) {
        if (strcmp(t, s) == 0) return true;
        names[n++] = t;
    }
    const char *close = suggest_closest(s, names, n);
    // The buffer is local: hand back the matching choice inside k->choices instead.
    if (close) *suggestion = strstr(k->choices, close);
    return false;
}

// "one of \"a\", \"b\"" for messages.
void config_choices_text(char *out, size_t cap, const config_key *k) {
    size_t n = (size_t)snprintf(out, cap, "one of \"");
    for (const char *p = k->choices; *p && n + 4 < cap; p++) {
        if (*p == '|') {
            n += (size_t)snprintf(out + n, cap - n, "\", \"");
        } else {
            out[n++] = *p;
            out[n] = '\0';
        }
    }
    if (n + 2 < cap) snprintf(out + n, cap - n, "\"");
}

static void describe_value(char *out, size_t cap, const toml_value *v) {
    switch (v->type) {
    case TOML_STRING:
        snprintf(out, cap, "a string (\"%.80s\")", v->str);
        break;
    case TOML_INT:
        snprintf(out, cap, "an integer (%" PRId64 ")", v->i);
        break;
    case TOML_FLOAT:
        snprintf(out, cap, "a float (%g)", v->f);
        break;
    case TOML_BOOL:
        snprintf(out, cap, "a boolean (%s)", v->b ? "true" : "false");
        break;
    case TOML_ARRAY:
        snprintf(out, cap, "an array of %d values", v->n_items);
        break;
    }
}

static int type_fail(const config_key *k, const char *where, const char *expected,
                     const toml_value *v, ct_error *err) {
    char found[160];
    describe_value(found, sizeof found, v);
    return ct_fail(err, "%s: %s.%s: expected %s, found %s", where, k->section, k->key, expected,
                   found);
}

static int key_set(ct_config *c, const config_key *k, const toml_value *v, const char *where,
                   ct_error *err);

// A TOML array of strings for a CONFIG_LIST key: stored comma-joined.
static int list_set(ct_config *c, const config_key *k, const toml_value *v, const char *where,
                    ct_error *err) {
    char joined[8192] = "";
    size_t len = 0;
    for (int i = 0; i < v->n_items; i++) {
        const toml_value *item = &v->items[i];
        if (item->type != TOML_STRING) return type_fail(k, where, "an array of strings", item, err);
        if (strchr(item->str, ','))
            return ct_fail(err, "%s: %s.%s: item %d (\"%.80s\") contains a comma", where,
                           k->section, k->key, i, item->str);
        int n = snprintf(joined + len, sizeof joined - len, "%s%s", i ? "," : "", item->str);
        if (n < 0 || (size_t)n >= sizeof joined - len)
            return ct_fail(err, "%s: %s.%s: the list is too long", where, k->section, k->key);
        len += (size_t)n;
    }
    toml_value str = {.type = TOML_STRING, .str = joined};
    return key_set(c, k, &str, where, err);
}

// Stores a parsed value into its field, checking type, range, length and choices.
static int key_set(ct_config *c, const config_key *k, const toml_value *v, const char *where,
                   ct_error *err) {
    switch (k->type) {
    case CONFIG_LIST:
        if (v->type == TOML_ARRAY) return list_set(c, k, v, where, err);
        __attribute__((fallthrough)); // a string is the list already joined
    case CONFIG_STR: {
        if (v->type != TOML_STRING)
            return type_fail(
                k, where, k->type == CONFIG_LIST ? "a string or an array of strings" : "a string",
                v, err);
        size_t len = strlen(v->str);
        if (len >= k->size)
            return ct_fail(err, "%s: %s.%s: the value is %zu bytes long; at most %zu fit", where,
                           k->section, k->key, len, k->size - 1);
        const char *close;
        if (!config_choice_ok(k, v->str, &close)) {
            char choices[256];
            config_choices_text(choices, sizeof choices, k);
            if (close)
                return ct_fail(err, "%s: %s.%s: expected %s, found \"%s\" (did you mean \"%.*s\"?)",
                               where, k->section, k->key, choices, v->str, (int)strcspn(close, "|"),
                               close);
            return ct_fail(err, "%s: %s.%s: expected %s, found \"%s\"", where, k->section, k->key,
                           choices, v->str);
        }
        memset(field(c, k), 0, k->size);
        memcpy(field(c, k), v->str, len);
        return 0;
    }
    case CONFIG_INT:
        if (v->type != TOML_INT) return type_fail(k, where, "an integer", v, err);
        if (v->i < INT_MIN || v->i > INT_MAX)
            return ct_fail(err, "%s: %s.%s: %" PRId64 " does not fit in an int", where, k->section,
                           k->key, v->i);
        *(int *)field(c, k) = (int)v->i;
        return 0;
    case CONFIG_INT64:
        if (v->type != TOML_INT) return type_fail(k, where, "an integer", v, err);
        *(int64_t *)field(c, k) = v->i;
        return 0;
    case CONFIG_FLOAT:
        // An integer is a fine float (lr = 1, max_norm = 1), as torchtitan accepts.
        if (v->type == TOML_INT) {
            *(double *)field(c, k) = (double)v->i;
            return 0;
        }
        if (v->type != TOML_FLOAT) return type_fail(k, where, "a number", v, err);
        *(double *)field(c, k) = v->f;
        return 0;
    case CONFIG_BOOL:
        if (v->type != TOML_BOOL) return type_fail(k, where, "true or false", v, err);
        *(bool *)field(c, k) = v->b;
        return 0;
    case CONFIG_TRISTATE:
        if (v->type == TOML_BOOL) {
            *(int *)field(c, k) = v->b ? 1 : 0;
            return 0;
        }
        if (v->type == TOML_STRING) {
            const char *s = v->str;
            int t = strcmp(s, "true") == 0 ? 1 : strcmp(s, "false") == 0 ? 0 : -2;
            if (strcmp(s, "auto") == 0 || *s == '\0') t = -1;
            if (t != -2) {
                *(int *)field(c, k) = t;
                return 0;
            }
        }
        return type_fail(k, where, "true, false or \"auto\"", v, err);
    }
    return ct_fail(err, "%s: %s.%s: internal: unknown key type", where, k->section, k->key);
}

// A command-line (or default) value: strings are taken verbatim, the rest parsed as TOML.
static int key_set_text(ct_config *c, const config_key *k, const char *text, const char *where,
                        ct_error *err) {
    toml_value v = {0};
    bool verbatim =
        k->type == CONFIG_STR || k->type == CONFIG_LIST ||
        (k->type == CONFIG_TRISTATE && strcmp(text, "true") != 0 && strcmp(text, "false") != 0);
    if (verbatim) {
        if (toml_check_text(text, strlen(text), where, err) != 0) return -1;
        v.type = TOML_STRING;
        v.str = (char *)text;
        return key_set(c, k, &v, where, err);
    }
    if (k->type == CONFIG_BOOL && strcmp(text, "true") != 0 && strcmp(text, "false") != 0)
        return ct_fail(err, "%s: %s.%s: expected true or false, found '%s'", where, k->section,
                       k->key, text);
    if (toml_parse_value(&v, text, where, err) != 0) {
        // A word where a number belongs: say what the key takes, not what TOML could hold.
        // Numeric-looking text keeps TOML's reason (range, leading zeros, inf, ...).
        bool word = (text[0] >= 'a' && text[0] <= 'z') || (text[0] >= 'A' && text[0] <= 'Z');
        if (word && strcmp(text, "inf") != 0 && strcmp(text, "nan") != 0)
            return ct_fail(err, "%s: %s.%s: expected %s, found '%s'", where, k->section, k->key,
                           k->type == CONFIG_FLOAT ? "a number" : "an integer", text);
        return -1;
    }
    int rc = key_set(c, k, &v, where, err);
    toml_value_free(&v);
    return rc;
}

static void config_defaults_raw(ct_config *c) {
    memset(c, 0, sizeof *c);
    for (int i = 0; i < N_KEYS; i++) {
        // The table's defaults are tested to parse (tests/test_train_config.c).
        if (key_set_text(c, &config_table[i], config_table[i].def, "default", NULL) != 0) abort();
    }
}

// Defaults that depend on other keys.
static void config_resolve(ct_config *c) {
    ct_config_model *m = &c->model;
    if (m->tokenizer_path[0] == '\0') {
        const char *src = strcmp(m->backend, "hf") == 0 ? m->hf_path : "assets/qwen3-tokenizer";
        snprintf(m->tokenizer_path, sizeof m->tokenizer_path, "%s", src);
    }
}

void config_defaults(ct_config *c) {
    config_defaults_raw(c);
    config_resolve(c);
}

// "did you mean ...?" for an unknown key of a known section (or of none: section == "").
static void suggest_key(char *out, size_t cap, const char *section, const char *key, bool cli) {
    const char *names[N_KEYS];
    int n = 0;
    out[0] = '\0';
    for (int i = 0; i < N_KEYS; i++)
        if (strcmp(config_table[i].section, section) == 0) names[n++] = config_table[i].key;
    const char *close = n ? suggest_closest(key, names, n) : NULL;
    if (close) {
        if (cli)
            snprintf(out, cap, " (did you mean --%s.%s?)", section, close);
        else
            snprintf(out, cap, " (did you mean %s?)", close);
        return;
    }
    // The key may exist under another section ([training] seed is [debug] seed).
    for (int i = 0; i < N_KEYS; i++) {
        if (strcmp(config_table[i].key, key) == 0) {
            if (cli)
                snprintf(out, cap, " (did you mean --%s.%s?)", config_table[i].section, key);
            else
                snprintf(out, cap, " (it belongs in [%s])", config_table[i].section);
            return;
        }
    }
}

static int apply_toml(ct_config *c, const char *path, config_origins *o, ct_error *err) {
    toml_doc doc;
    if (toml_parse_file(&doc, path, err) != 0) return -1;
    int rc = 0;
    for (int i = 0; rc == 0 && i < doc.n_tables; i++) {
        const toml_table *t = &doc.tables[i];
        if (section_known(t->name)) continue;
        const char *names[N_KEYS];
        int n = 0;
        for (int j = 0; j < N_KEYS; j++)
            if (j == 0 || strcmp(config_table[j].section, config_table[j - 1].section) != 0)
                names[n++] = config_table[j].section;
        const char *close = suggest_closest(t->name, names, n);
        char hint[96] = "";
        if (close) snprintf(hint, sizeof hint, " (did you mean [%s]?)", close);
        rc = ct_fail(err, "%s:%d: unknown section [%s]%s", path, t->line, t->name, hint);
    }
    for (int i = 0; rc == 0 && i < doc.n_entries; i++) {
        const toml_entry *e = &doc.entries[i];
        char where[CONFIG_ORIGIN_MAX], hint[160];
        snprintf(where, sizeof where, "%s:%d", path, e->line);
        if (e->section[0] == '\0') {
            suggest_key(hint, sizeof hint, "", e->key, false);
            rc = ct_fail(err, "%s: key '%s' is outside any [section]%s", where, e->key, hint);
            break;
        }
        char full[256];
        snprintf(full, sizeof full, "%s.%s", e->section, e->key);
        int k = config_key_index(full, strlen(full));
        if (k < 0) {
            suggest_key(hint, sizeof hint, e->section, e->key, false);
            rc = ct_fail(err, "%s: unknown key '%s' in [%s]%s", where, e->key, e->section, hint);
            break;
        }
        rc = key_set(c, &config_table[k], &e->value, where, err);
        if (rc == 0) snprintf(o->where[k], sizeof o->where[k], "%s", where);
    }
    toml_free(&doc);
    return rc;
}

static int unknown_option(const char *name, size_t len, ct_error *err) {
    char key[128], hint[160] = "";
    snprintf(key, sizeof key, "%.*s", (int)(len < 127 ? len : 127), name);
    const char *dot = strchr(key, '.');
    if (dot) {
        char section[64];
        snprintf(section, sizeof section, "%.*s", (int)(dot - key), key);
        if (section_known(section)) suggest_key(hint, sizeof hint, section, dot + 1, true);
    } else {
        suggest_key(hint, sizeof hint, "", key, true);
    }
    if (!hint[0]) {
        const char *names[N_KEYS];
        char buf[N_KEYS][96];
        for (int i = 0; i < N_KEYS; i++) {
            full_name(buf[i], sizeof buf[i], &config_table[i]);
            names[i] = buf[i];
        }
        const char *close = suggest_closest(key, names, N_KEYS);
        if (close) snprintf(hint, sizeof hint, " (did you mean --%s?)", close);
    }
    return ct_fail(err, "command line: unknown option --%s%s", key,
                   hint[0] ? hint : " (see ctitan train --help)");
}

static bool is_bool_word(const char *s) {
    return strcmp(s, "true") == 0 || strcmp(s, "false") == 0;
}

// Finds `--config FILE` / `--config=FILE`. *index_out is its position (or -1).
static int find_config_arg(const char **path, int *index_out, int argc, char **argv,
                           ct_error *err) {
    *path = NULL;
    *index_out = -1;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *value = NULL;
        if (strcmp(a, "--config") == 0) {
            if (i + 1 >= argc || strncmp(argv[i + 1], "--", 2) == 0)
                return ct_fail(err, "command line: --config needs a file");
            value = argv[i + 1];
        } else if (strncmp(a, "--config=", 9) == 0) {
            value = a + 9;
        } else {
            continue;
        }
        if (*path) return ct_fail(err, "command line: --config given twice");
        *path = value;
        *index_out = i;
    }
    return 0;
}

static int apply_argv(ct_config *c, int argc, char **argv, int config_at, config_origins *o,
                      ct_error *err) {
    bool given[N_KEYS] = {false};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (i == config_at) {
            if (strcmp(a, "--config") == 0) i++;
            continue;
        }
        if (strncmp(a, "--", 2) != 0 || a[2] == '\0')
            return ct_fail(err,
                           "command line: unexpected argument '%s' (options are "
                           "--section.key=value or --section.key value)",
                           a);
        const char *name = a + 2, *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        int k = config_key_index(name, len);
        if (k < 0) return unknown_option(name, len, err);
        const config_key *key = &config_table[k];
        bool boolish = key->type == CONFIG_BOOL || key->type == CONFIG_TRISTATE;
        const char *value;
        if (eq) {
            value = eq + 1;
        } else if (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0 &&
                   (!boolish || is_bool_word(argv[i + 1]) || key->type == CONFIG_TRISTATE)) {
            value = argv[++i];
        } else if (boolish) {
            value = "true"; // a bare boolean flag: --training.allow_overcommit
        } else {
            return ct_fail(err, "command line: --%s.%s needs a value", key->section, key->key);
        }
        char where[CONFIG_ORIGIN_MAX];
        snprintf(where, sizeof where, "command line --%s.%s", key->section, key->key);
        if (given[k]) return ct_fail(err, "%s: given twice", where);
        given[k] = true;
        if (key_set_text(c, key, value, where, err) != 0) return -1;
        snprintf(o->where[k], sizeof o->where[k], "%s", where);
    }
    return 0;
}

int config_load(ct_config *c, const char *toml_path_or_NULL, int argc, char **argv, ct_error *err) {
    config_defaults_raw(c);
    const char *path = NULL;
    int config_at;
    if (find_config_arg(&path, &config_at, argc, argv, err) != 0) return -1;
    if (!path) path = toml_path_or_NULL;
    config_origins *o = calloc(1, sizeof *o);
    if (!o) return ct_fail(err, "out of memory");
    int rc = 0;
    if (path) rc = apply_toml(c, path, o, err);
    if (rc == 0) rc = apply_argv(c, argc, argv, config_at, o, err);
    if (rc == 0) {
        config_resolve(c);
        rc = config_check(c, o, err);
    }
    free(o);
    return rc;
}

// One key's value as TOML (strings quoted and escaped).
static void key_write(FILE *f, const ct_config *c, const config_key *k) {
    const void *p = cfield(c, k);
    char num[64];
    switch (k->type) {
    case CONFIG_STR:
    case CONFIG_LIST:
        toml_write_string(f, (const char *)p);
        break;
    case CONFIG_INT:
        fprintf(f, "%d", *(const int *)p);
        break;
    case CONFIG_INT64:
        fprintf(f, "%" PRId64, *(const int64_t *)p);
        break;
    case CONFIG_FLOAT:
        // A non-finite double only gets here from code, never from a file; write what reads
        // back as an error rather than something that reads back as a different value.
        if (toml_format_float(num, sizeof num, *(const double *)p) != 0)
            snprintf(num, sizeof num, "nan");
        fputs(num, f);
        break;
    case CONFIG_BOOL:
        fputs(*(const bool *)p ? "true" : "false", f);
        break;
    case CONFIG_TRISTATE: {
        int t = *(const int *)p;
        fputs(t < 0 ? "\"auto\"" : t ? "true" : "false", f);
        break;
    }
    }
}

int config_write_toml(const ct_config *c, FILE *f) {
    fputs("# ctitan training config (the effective values: defaults, file, command line)\n", f);
    for (int i = 0; i < N_KEYS; i++) {
        const config_key *k = &config_table[i];
        if (i == 0 || strcmp(k->section, config_table[i - 1].section) != 0)
            fprintf(f, "%s[%s]\n", i ? "\n" : "", k->section);
        fprintf(f, "%s = ", k->key);
        key_write(f, c, k);
        fputc('\n', f);
    }
    return ferror(f) ? -1 : 0;
}

int config_save(const ct_config *c, const char *path, ct_error *err) {
    atomic_file a;
    if (atomic_open(&a, path, err) != 0) return -1;
    if (config_write_toml(c, a.fp) != 0) {
        atomic_abort(&a);
        return ct_fail(err, "%s: write failed", path);
    }
    return atomic_commit(&a, err);
}

static uint64_t fnv1a(uint64_t h, const void *data, size_t n) {
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

uint64_t config_hash(const ct_config *c) {
    // Hash the text form, not the bytes of the struct: padding and layout then do not matter,
    // and the hash stays the same across builds that print the same values.
    uint64_t h = 0xcbf29ce484222325ull;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return 0;
    for (int i = 0; i < N_KEYS; i++) {
        const config_key *k = &config_table[i];
        if (!k->hashed) continue;
        fprintf(f, "%s.%s=", k->section, k->key);
        key_write(f, c, k);
        fputc('\n', f);
    }
    fclose(f);
    h = fnv1a(h, text, len);
    free(text);
    return h;
}

static const char *type_word(const config_key *k) {
    switch (k->type) {
    case CONFIG_STR:
        return k->choices ? "CHOICE" : "STR";
    case CONFIG_INT:
    case CONFIG_INT64:
        return "INT";
    case CONFIG_FLOAT:
        return "FLOAT";
    case CONFIG_BOOL:
        return "BOOL";
    case CONFIG_TRISTATE:
        return "BOOL|auto";
    case CONFIG_LIST:
        return "LIST";
    }
    return "?";
}

void config_print_help(FILE *f) {
    fputs("Every key can be set in the TOML file (under its [section]) or on the command line as\n"
          "--section.key=value or --section.key value; the command line wins. A boolean key\n"
          "alone (--training.allow_overcommit) means true.\n",
          f);
    for (int i = 0; i < N_KEYS; i++) {
        const config_key *k = &config_table[i];
        if (i == 0 || strcmp(k->section, config_table[i - 1].section) != 0)
            fprintf(f, "\n[%s]\n", k->section);
        char left[128];
        snprintf(left, sizeof left, "--%s.%s=%s", k->section, k->key, type_word(k));
        fprintf(f, "  %-46s %s", left, k->help);
        if (k->choices) {
            char choices[256];
            config_choices_text(choices, sizeof choices, k);
            fprintf(f, "; %s", choices);
        }
        if (k->type == CONFIG_STR || k->type == CONFIG_LIST)
            fprintf(f, " (default: \"%s\")\n", k->def);
        else
            fprintf(f, " (default: %s)\n", k->def);
    }
}
