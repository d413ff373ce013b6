// What a torchtitan user's config holds beyond ctitan's own keys: torchtitan keys that have no
// effect here (accepted at their neutral value, refused otherwise with the nearest ctitan
// equivalent), the aliases whose meaning ctitan resolves into its own keys (model.name,
// model.hf_assets_path, training.dataset, [hf_transformers] model, last_save_model_only), and
// hints for key names users type that a spelling distance cannot find.
#include <ctype.h>
#include <string.h>
#include <sys/stat.h>

#include "train/config_internal.h"

// `neutral` is the value (as TOML writes it) at which the key changes nothing; NULL: any value
// (a folder name, a frequency of something that is off).
typedef struct inert_key {
    const char *section, *key, *neutral, *instead;
} inert_key;

static const inert_key INERT[] = {
    {"job", "print_config", NULL, NULL},
    {"job", "use_for_integration_test", NULL, NULL},
    {"profiling", "enable_profiling", "false",
     "--debug.profile_ops (a per-op time table) or perf record"},
    {"profiling", "save_traces_folder", NULL, NULL},
    {"profiling", "profile_freq", NULL, NULL},
    {"profiling", "enable_memory_snapshot", "false",
     "memory_peak_gib in metrics.jsonl and the memory plan in the log"},
    {"profiling", "save_memory_snapshot_folder", NULL, NULL},
    {"metrics", "enable_tensorboard", "false", "metrics.jsonl, and ctitan plot for the curve"},
    {"metrics", "save_tb_folder", NULL, NULL},
    {"metrics", "enable_wandb", "false", "metrics.jsonl"},
    {"metrics", "disable_color_printing", NULL, NULL},
    {"metrics", "enable_color_printing", NULL, NULL},
    {"training", "gc_freq", NULL, NULL},
    {"training", "deterministic", NULL, NULL},
    {"training", "enable_cpu_offload", "false",
     "activation_checkpoint.mode and training.loss_chunk_tokens to save memory"},
    {"parallelism", "enable_async_tensor_parallel", "false", NULL},
    {"checkpoint", "async_mode", "\"disabled\"",
     "checkpoints are written synchronously and atomically"},
    {"checkpoint", "load_step", "-1", "a job.dump_folder resumes from its newest checkpoint"},
    {"checkpoint", "enable_first_step_checkpoint", "false", NULL},
    {"compile", "enable", "false", "ctitan's kernels are compiled ahead of time"},
    {"compile", "components", NULL, NULL},
    {"quantize.linear.float8", "enable_fsdp_float8_all_gather", "false", NULL},
    {"quantize.linear.float8", "precompute_float8_dynamic_scale_for_fsdp", "false", NULL},
    {"quantize.linear.float8", "recipe_name", NULL, NULL},
    {"quantize.linear.float8", "filter_fqns", NULL, NULL},
    {"quantize.linear.float8", "emulate", NULL, NULL},
};
enum { N_INERT = sizeof INERT / sizeof INERT[0] };

// Keys under another name: [training.data] name is torchtitan's newer spelling of
// training.dataset.
static const struct {
    const char *from, *to;
} RENAMED[] = {
    {"training.data.name", "training.dataset"},
    {"validation.data.name", "validation.dataset"},
};

// Names users type for which the nearest spelling is the wrong key.
static const struct {
    const char *typed, *meant;
} HINTS[] = {
    {"training.dtype", "training.mixed_precision_param"},
    {"training.mixed_precision", "training.mixed_precision_param"},
    {"model.dtype", "training.mixed_precision_param"},
    {"training.batch_size", "training.local_batch_size"},
    {"training.lr", "optimizer.lr"},
    {"training.learning_rate", "optimizer.lr"},
    {"optimizer.learning_rate", "optimizer.lr"},
    {"training.weight_decay", "optimizer.weight_decay"},
    {"training.warmup_steps", "lr_scheduler.warmup_steps"},
    {"training.gradient_accumulation_steps", "training.global_batch_size"},
    {"model.tokenizer", "model.tokenizer_path"},
    {"model.path", "model.hf_path"},
    {"checkpoint.load_path", "checkpoint.initial_load_path"},
};

static const inert_key *inert_find(const char *section, const char *key) {
    for (int i = 0; i < N_INERT; i++)
        if (strcmp(INERT[i].section, section) == 0 && strcmp(INERT[i].key, key) == 0)
            return &INERT[i];
    return NULL;
}

bool config_compat_section_known(const char *section) {
    if (strcmp(section, "hf_transformers") == 0) return true;
    for (int i = 0; i < N_INERT; i++)
        if (strcmp(INERT[i].section, section) == 0) return true;
    for (size_t i = 0; i < sizeof RENAMED / sizeof RENAMED[0]; i++) {
        size_t n = strlen(section);
        if (strncmp(RENAMED[i].from, section, n) == 0 && RENAMED[i].from[n] == '.') return true;
    }
    return false;
}

const char *config_compat_renamed(const char *full) {
    for (size_t i = 0; i < sizeof RENAMED / sizeof RENAMED[0]; i++)
        if (strcmp(RENAMED[i].from, full) == 0) return RENAMED[i].to;
    return NULL;
}

const char *config_compat_hint(const char *full) {
    for (size_t i = 0; i < sizeof HINTS / sizeof HINTS[0]; i++)
        if (strcmp(HINTS[i].typed, full) == 0) return HINTS[i].meant;
    return NULL;
}

int config_compat_inert_names(const char **names, int cap, const char *section) {
    int n = 0;
    for (int i = 0; i < N_INERT && n < cap; i++)
        if (!section || strcmp(INERT[i].section, section) == 0) names[n++] = INERT[i].key;
    return n;
}

// A value as TOML writes it, for comparing with `neutral`; "[...]" for arrays (never neutral).
static void value_text(char *out, size_t cap, const toml_value *v) {
    switch (v->type) {
    case TOML_STRING:
        snprintf(out, cap, "\"%s\"", v->str);
        break;
    case TOML_INT:
        snprintf(out, cap, "%lld", (long long)v->i);
        break;
    case TOML_FLOAT:
        snprintf(out, cap, "%.17g", v->f);
        break;
    case TOML_BOOL:
        snprintf(out, cap, "%s", v->b ? "true" : "false");
        break;
    case TOML_ARRAY:
        snprintf(out, cap, "[...]");
        break;
    }
}

int config_compat_inert(const char *section, const char *key, const toml_value *v,
                        const char *where, config_notes *notes, ct_error *err) {
    const inert_key *k = inert_find(section, key);
    if (!k) return 0;
    char got[128];
    value_text(got, sizeof got, v);
    // "1" also matches 1.0, and a degree of -1 ("all ranks") only means "not used" for
    // degrees that are 1 anyway: keep the comparison textual and exact.
    if (k->neutral && strcmp(got, k->neutral) != 0) {
        ct_fail(err,
                "%s: %s.%s = %s is a torchtitan setting ctitan does not implement (only %s, "
                "which has no effect, is accepted)%s%s",
                where, section, key, got, k->neutral, k->instead ? "; nearest in ctitan: " : "",
                k->instead ? k->instead : "");
        return -1;
    }
    if (notes) {
        size_t len = strlen(notes->no_effect);
        snprintf(notes->no_effect + len, sizeof notes->no_effect - len, "%s%s.%s", len ? ", " : "",
                 section, key);
        notes->n_no_effect++;
    }
    return 1;
}

static bool is_dir(const char *path) {
    struct stat st;
    return path[0] && stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

// "Org/name" with no such folder here: a hub id.
static bool looks_like_hub_id(const char *s) {
    const char *slash = strchr(s, '/');
    if (!slash || slash == s || strchr(slash + 1, '/') || !slash[1]) return false;
    for (const char *p = s; *p; p++)
        if (!isalnum((unsigned char)*p) && !strchr("/-_.", *p)) return false;
    return true;
}

static bool user_set(const config_origins *o, const char *full) {
    int i = config_key_index(full, strlen(full));
    return i >= 0 && o->where[i][0];
}

static const char *origin(const config_origins *o, const char *full) {
    int i = config_key_index(full, strlen(full));
    return i >= 0 && o->where[i][0] ? o->where[i] : "config";
}

static void set_str(char *dst, size_t cap, const char *src) {
    snprintf(dst, cap, "%s", src);
}

// model.name and [hf_transformers] model.
static void resolve_model_name(ct_config *c, const config_origins *o, config_errors *errs) {
    ct_config_model *m = &c->model;
    ct_error e;
    if (strcmp(m->name, "qwen3") == 0 || strcmp(m->name, "qwen3_moe") == 0) return;
    if (strcmp(m->name, "transformers_modeling_backend") != 0) {
        ct_fail(&e,
                "%s: model.name = \"%s\": ctitan trains Qwen3 models (dense and MoE): \"qwen3\" "
                "with model.flavor, or \"transformers_modeling_backend\" with [hf_transformers] "
                "model = an HF Qwen3 folder",
                origin(o, "model.name"), m->name);
        config_errors_add(errs, &e);
        return;
    }
    const char *dir = c->hf_transformers.model;
    if (!dir[0]) {
        ct_fail(&e,
                "%s: model.name = \"transformers_modeling_backend\" needs [hf_transformers] "
                "model = the HF folder to train",
                origin(o, "model.name"));
    } else if (!is_dir(dir) && looks_like_hub_id(dir)) {
        ct_fail(&e,
                "%s: hf_transformers.model = \"%s\" is a hub id; ctitan downloads nothing: "
                "download it first (e.g. huggingface-cli download %s --local-dir DIR) and set "
                "hf_transformers.model = DIR",
                origin(o, "hf_transformers.model"), dir, dir);
    } else if (user_set(o, "model.backend") && strcmp(m->backend, "hf") != 0) {
        ct_fail(&e,
                "%s: model.backend = \"%s\" contradicts model.name = "
                "\"transformers_modeling_backend\" (which trains an HF folder: backend \"hf\")",
                origin(o, "model.backend"), m->backend);
    } else if (user_set(o, "model.hf_path") && strcmp(m->hf_path, dir) != 0) {
        ct_fail(&e, "%s: model.hf_path = \"%s\" contradicts hf_transformers.model = \"%s\"",
                origin(o, "model.hf_path"), m->hf_path, dir);
    } else {
        set_str(m->backend, sizeof m->backend, "hf");
        set_str(m->hf_path, sizeof m->hf_path, dir);
        return;
    }
    config_errors_add(errs, &e);
}

// training.dataset / validation.dataset: a name. Alone it cannot be honoured.
static void resolve_dataset(const char *section, const char *name, const char *path,
                            const config_origins *o, config_errors *errs) {
    if (!name[0] || path[0]) return;
    char full[64];
    snprintf(full, sizeof full, "%s.dataset", section);
    ct_error e;
    ct_fail(&e,
            "%s: %s.dataset = \"%s\" names a hub data set, and ctitan downloads nothing: set "
            "%s.dataset_path to a local .txt, .jsonl or .npy file or a folder of them",
            origin(o, full), section, name, section);
    config_errors_add(errs, &e);
}

void config_compat_resolve(ct_config *c, const config_origins *o, config_errors *errs) {
    resolve_model_name(c, o, errs);
    // model.hf_path alone names the model, as under generate: the HF folder's architecture and
    // weights. With a flavor or the backend given too the intent is the user's to state
    // (config_validate refuses native with a folder, and names both ways).
    if (user_set(o, "model.hf_path") && !user_set(o, "model.backend") &&
        !user_set(o, "model.flavor"))
        set_str(c->model.backend, sizeof c->model.backend, "hf");
    const char *assets = c->model.hf_assets_path;
    if (assets[0]) {
        if (!user_set(o, "model.tokenizer_path"))
            set_str(c->model.tokenizer_path, sizeof c->model.tokenizer_path, assets);
        if (c->checkpoint.initial_load_in_hf && !user_set(o, "checkpoint.initial_load_path"))
            set_str(c->checkpoint.initial_load_path, sizeof c->checkpoint.initial_load_path,
                    assets);
    }
    resolve_dataset("training", c->training.dataset, c->training.dataset_path, o, errs);
    if (c->validation.enable)
        resolve_dataset("validation", c->validation.dataset, c->validation.dataset_path, o, errs);
    if (c->checkpoint.last_save_model_only) c->checkpoint.last_save_in_hf = true;
}
