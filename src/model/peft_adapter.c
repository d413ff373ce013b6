// PEFT's adapter folder (peft_adapter.h). The facts it follows are PEFT's own: LoraConfig's
// fields and defaults (peft/tuners/lora/config.py), save_pretrained's JSON (json.dumps with
// indent=2 and sort_keys=True, peft/config.py), and the weights' keys as save_pretrained writes
// them, the adapter name removed (get_peft_model_state_dict, peft/utils/save_and_load.py).
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/fs.h"
#include "core/utf8.h"
#include "io/atomic.h"
#include "io/json.h"
#include "model/qwen3_lora.h"
#include "model/peft_adapter.h"

// adapter_config.json is a few KB; anything near this is not one.
#define PEFT_CONFIG_MAX_BYTES (16u << 20)
// What PeftModel adds in front of the model's own names, and how a LoRA weight's key ends.
#define PEFT_PREFIX "base_model.model."

// --- adapter_config.json

// PEFT options that change what the adapter computes or which weights it holds. Each must be
// absent or empty (null, false, {}, [] or ""): anything else is a LoRA that ctitan would
// silently compute differently, so it is refused by name.
static const char *const unsupported_fields[] = {
    "use_dora",
    "use_qalora",
    "lora_bias",
    "modules_to_save",
    "rank_pattern",
    "alpha_pattern",
    "layers_to_transform",
    "layer_replication",
    "exclude_modules",
    "target_parameters",
    "trainable_token_indices",
    "alora_invocation_tokens",
    "use_bdlora",
    "arrow_config",
    "kasa_config",
    "velora_config",
    "monteclora_config",
};

static bool json_empty(const cJSON *v) {
    if (!v || cJSON_IsNull(v) || cJSON_IsFalse(v)) return true;
    if (cJSON_IsArray(v) || cJSON_IsObject(v)) return v->child == NULL;
    return cJSON_IsString(v) && v->valuestring[0] == '\0';
}

// The value as compact JSON, cut to fit a message.
static const char *json_brief(char *buf, size_t cap, const cJSON *v) {
    char *s = cJSON_PrintUnformatted(v);
    if (!s) return "?";
    if (strlen(s) >= cap && cap > 4)
        snprintf(buf, cap, "%.*s...", (int)(cap - 4), s);
    else
        snprintf(buf, cap, "%s", s);
    cJSON_free(s);
    return buf;
}

// A string field that must equal `want`; absent is PEFT's default (`dflt`, NULL: required).
static int expect_string(const cJSON *root, const char *key, const char *want, const char *dflt,
                         const char *why, const char *file, ct_error *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    char brief[96];
    if ((!v || cJSON_IsNull(v)) && dflt) return 0;
    if (!v) return ct_fail(err, "%s: key \"%s\": expected \"%s\", found nothing", file, key, want);
    if (!cJSON_IsString(v) || strcmp(v->valuestring, want) != 0)
        return ct_fail(err, "%s: key \"%s\": expected \"%s\"%s, found %s", file, key, want, why,
                       json_brief(brief, sizeof brief, v));
    return 0;
}

static int parse_targets(unsigned *targets, const cJSON *root, const char *file, ct_error *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "target_modules");
    char brief[96];
    if (!v || cJSON_IsNull(v))
        return ct_fail(err,
                       "%s: key \"target_modules\": absent (PEFT would pick modules by "
                       "architecture); expected a list of module names or \"all-linear\"",
                       file);
    if (cJSON_IsString(v)) {
        if (strcmp(v->valuestring, "all-linear") == 0) {
            *targets = LORA_ALL_LINEAR;
            return 0;
        }
        return ct_fail(err,
                       "%s: key \"target_modules\": the regular expression %s is not supported "
                       "(expected a list of module names or \"all-linear\")",
                       file, json_brief(brief, sizeof brief, v));
    }
    if (!cJSON_IsArray(v))
        return ct_fail(err,
                       "%s: key \"target_modules\": expected a list of module names or "
                       "\"all-linear\", found %s",
                       file, json_type_name(v));
    const char *names[64];
    int n = 0;
    for (const cJSON *x = v->child; x; x = x->next) {
        if (!cJSON_IsString(x))
            return ct_fail(err, "%s: key \"target_modules\": expected strings, found %s", file,
                           json_type_name(x));
        // PEFT reads "all-linear" only as the whole value: in a list it names no module.
        if (strcmp(x->valuestring, "all-linear") == 0)
            return ct_fail(err,
                           "%s: key \"target_modules\": \"all-linear\" inside a list names no "
                           "module (PEFT takes it only as the whole value)",
                           file);
        // (lora_parse_targets would refuse it too; here the name is quoted as JSON, with the key.)
        if (lora_module_of(x->valuestring) < 0)
            return ct_fail(err,
                           "%s: key \"target_modules\": unknown module %s (expected \"all-linear\" "
                           "or a list of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
                           "down_proj)",
                           file, json_brief(brief, sizeof brief, x));
        if (n == (int)(sizeof names / sizeof names[0]))
            return ct_fail(err, "%s: key \"target_modules\": more than %d names", file, n);
        names[n++] = x->valuestring;
    }
    return lora_parse_targets(names, n, targets, file, err);
}

int peft_config_parse(peft_config *pc, const char *text, size_t len, const char *file,
                      ct_error *err) {
    memset(pc, 0, sizeof *pc);
    cJSON *root;
    if (json_parse(&root, text, len, file, err) != 0) return -1;
    int rc = -1;
    char brief[96];
    int64_t r = 8;
    double alpha = 8, dropout = 0;
    bool b = false;
    if (!cJSON_IsObject(root)) {
        ct_fail(err, "%s: expected a JSON object, found %s", file, json_type_name(root));
        goto done;
    }
    if (expect_string(root, "peft_type", "LORA", NULL, "", file, err) != 0 ||
        expect_string(root, "task_type", "CAUSAL_LM", "CAUSAL_LM",
                      " (a causal LM's adapter; other tasks wrap the model differently)", file,
                      err) != 0 ||
        expect_string(root, "bias", "none", "none", " (ctitan's LoRA trains no biases)", file,
                      err) != 0)
        goto done;
    if (json_get_bool(&b, root, "fan_in_fan_out", false, file, err) != 0) goto done;
    if (b) {
        ct_fail(err,
                "%s: key \"fan_in_fan_out\": expected false (Qwen3's linear layers store "
                "(out, in)), found true",
                file);
        goto done;
    }
    for (size_t i = 0; i < sizeof unsupported_fields / sizeof unsupported_fields[0]; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, unsupported_fields[i]);
        if (json_empty(v)) continue;
        ct_fail(err,
                "%s: key \"%s\": %s is not supported (ctitan reads plain LoRA: expected it "
                "absent, null, false or empty)",
                file, unsupported_fields[i], json_brief(brief, sizeof brief, v));
        goto done;
    }
    if (json_get_int(&r, root, "r", false, 1, 65536, file, err) != 0 ||
        json_get_double(&alpha, root, "lora_alpha", false, file, err) != 0 ||
        json_get_double(&dropout, root, "lora_dropout", false, file, err) != 0 ||
        json_get_bool(&pc->lc.use_rslora, root, "use_rslora", false, file, err) != 0 ||
        parse_targets(&pc->lc.targets, root, file, err) != 0)
        goto done;
    pc->lc.rank = (int)r;
    pc->lc.alpha = (float)alpha;
    pc->lc.dropout = (float)dropout;
    if (lora_config_validate(&pc->lc, file, err) != 0) goto done;
    const cJSON *base = cJSON_GetObjectItemCaseSensitive(root, "base_model_name_or_path");
    if (base && !cJSON_IsNull(base)) {
        if (json_get_string(pc->base_model, sizeof pc->base_model, root, "base_model_name_or_path",
                            false, file, err) != 0)
            goto done;
        size_t n = strlen(pc->base_model);
        if (utf8_valid_prefix(pc->base_model, n) != n) {
            ct_fail(err, "%s: key \"base_model_name_or_path\": not valid UTF-8", file);
            goto done;
        }
    }
    rc = 0;
done:
    cJSON_Delete(root);
    return rc;
}

int peft_config_load(peft_config *pc, const char *dir, ct_error *err) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, PEFT_CONFIG_NAME);
    char *text = NULL;
    size_t len = 0;
    if (file_read_all(&text, &len, path, PEFT_CONFIG_MAX_BYTES, err) != 0) return -1;
    int rc = peft_config_parse(pc, text, len, path, err);
    free(text);
    return rc;
}

typedef struct out_text {
    json_buf b;
    bool oom;
} out_text;

static void put(out_text *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(out_text *o, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (o->oom || n < 0) {
        o->oom = true;
        return;
    }
    if (o->b.len + (size_t)n + 1 > o->b.cap) {
        size_t cap = (o->b.cap + (size_t)n + 1) * 2;
        char *p = realloc(o->b.p, cap);
        if (!p) {
            o->oom = true;
            return;
        }
        o->b.p = p, o->b.cap = cap;
    }
    va_start(ap, fmt);
    vsnprintf(o->b.p + o->b.len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    o->b.len += (size_t)n;
}

// The shortest decimal that reads back as the same float, as Python's repr would print the
// value PEFT holds; an integral value as an integer when `integer` (lora_alpha is an int field).
static void put_number(out_text *o, float x, bool integer) {
    if (integer && x == floorf(x) && fabsf(x) < 1e15f) {
        put(o, "%.0f", (double)x);
        return;
    }
    char s[48];
    for (int digits = 1; digits <= 9; digits++) {
        snprintf(s, sizeof s, "%.*g", digits, (double)x);
        if (strtof(s, NULL) == x) break;
    }
    put(o, "%s%s", s, strpbrk(s, ".eni") ? "" : ".0");
}

int peft_config_text(char **out, size_t *len, const peft_config *pc, ct_error *err) {
    // Names in sorted order (what PEFT's json.dumps(sort_keys=True) gives a list it wrote
    // from a set in any order).
    static const lora_module sorted_modules[LORA_N_MODULES] = {
        LORA_DOWN, LORA_GATE, LORA_K, LORA_O, LORA_Q, LORA_UP, LORA_V,
    };
    out_text o = {{0}, false};
    put(&o, "{\n  \"alpha_pattern\": {},\n  \"auto_mapping\": null,\n"
            "  \"base_model_name_or_path\": ");
    if (pc->base_model[0]) {
        if (json_quote(&o.b, pc->base_model, strlen(pc->base_model), JSON_SHORT | JSON_ASCII) != 0)
            o.oom = true;
    } else {
        put(&o, "null");
    }
    put(&o, ",\n  \"bias\": \"none\",\n  \"exclude_modules\": null,\n"
            "  \"fan_in_fan_out\": false,\n  \"inference_mode\": true,\n"
            "  \"init_lora_weights\": true,\n  \"layer_replication\": null,\n"
            "  \"layers_pattern\": null,\n  \"layers_to_transform\": null,\n"
            "  \"lora_alpha\": ");
    put_number(&o, pc->lc.alpha, true);
    put(&o, ",\n  \"lora_bias\": false,\n  \"lora_dropout\": ");
    put_number(&o, pc->lc.dropout, false);
    put(&o,
        ",\n  \"megatron_config\": null,\n  \"megatron_core\": \"megatron.core\",\n"
        "  \"modules_to_save\": null,\n  \"peft_type\": \"LORA\",\n  \"r\": %d,\n"
        "  \"rank_pattern\": {},\n  \"revision\": null,\n  \"target_modules\": [",
        pc->lc.rank);
    bool first = true;
    for (int i = 0; i < LORA_N_MODULES; i++) {
        if (!(pc->lc.targets & (1u << sorted_modules[i]))) continue;
        put(&o, "%s\n    \"%s\"", first ? "" : ",", lora_module_name(sorted_modules[i]));
        first = false;
    }
    put(&o,
        "%s],\n  \"task_type\": \"CAUSAL_LM\",\n  \"use_dora\": false,\n"
        "  \"use_rslora\": %s\n}",
        first ? "" : "\n  ", pc->lc.use_rslora ? "true" : "false");
    if (o.oom) {
        free(o.b.p);
        return ct_fail(err, "%s: out of memory", PEFT_CONFIG_NAME);
    }
    *out = o.b.p;
    *len = o.b.len;
    return 0;
}

// --- adapter_model.safetensors

const lora_tensor *peft_key_tensor(const lora_layout *L, const char *key, int *untargeted) {
    char canon[256];
    int ignored;
    if (!untargeted) untargeted = &ignored;
    *untargeted = -1;
    // PeftModel's keys, or the same without its prefix (transformers' adapter integration).
    if (strncmp(key, PEFT_PREFIX, strlen(PEFT_PREFIX)) == 0)
        snprintf(canon, sizeof canon, "%s", key);
    else if (snprintf(canon, sizeof canon, "%s%s", PEFT_PREFIX, key) >= (int)sizeof canon)
        return NULL;
    int layer, used = 0, expert = -1;
    if (sscanf(canon, PEFT_PREFIX "model.layers.%d.%n", &layer, &used) != 1 || used == 0)
        return NULL;
    const char *rest = canon + used;
    size_t n = strlen(rest);
    static const char suffix_a[] = ".lora_A.weight", suffix_b[] = ".lora_B.weight";
    const size_t ns = sizeof suffix_a - 1;
    if (n <= ns) return NULL;
    bool is_b = strcmp(rest + n - ns, suffix_b) == 0;
    if (!is_b && strcmp(rest + n - ns, suffix_a) != 0) return NULL;
    int e, eu = 0;
    if (sscanf(rest, "mlp.experts.%d.%n", &e, &eu) == 1 && eu > 0) expert = e;
    // The module: the component before the suffix.
    const char *end = rest + n - ns, *start = end;
    while (start > rest && start[-1] != '.') start--;
    char mod[32];
    if ((size_t)(end - start) >= sizeof mod) return NULL;
    memcpy(mod, start, (size_t)(end - start));
    mod[end - start] = '\0';
    int m = lora_module_of(mod);
    if (m < 0) return NULL;
    const lora_tensor *t = lora_layout_tensor(L, layer, (lora_module)m, expert, is_b);
    // The layout's own name spells the key exactly (no "layers.03", no stray components).
    if (t && strcmp(t->name, canon) == 0) return t;
    if (!(L->lc.targets & (1u << m))) *untargeted = m;
    return NULL;
}

// found[i]: the file's tensor for L->t[i], after every check.
static int match_tensors(const st_tensor **found, const lora_layout *L, const st_file *f,
                         const char *source, ct_error *err) {
    for (int i = 0; i < L->n; i++) found[i] = NULL;
    char want[64], got[160];
    for (int k = 0; k < f->n_tensors; k++) {
        const st_tensor *s = &f->tensors[k];
        int untargeted;
        const lora_tensor *t = peft_key_tensor(L, s->name, &untargeted);
        if (!t && untargeted >= 0)
            return ct_fail(err,
                           "%s: tensor \"%s\" adapts %s, which adapter_config.json's "
                           "target_modules does not name",
                           source, s->name, lora_module_name((lora_module)untargeted));
        if (!t)
            return ct_fail(err,
                           "%s: unexpected tensor \"%s\" (expected only the LoRA weights of the "
                           "model's layers: " PEFT_PREFIX "model.layers.{i}.<module>.lora_A.weight "
                           "and lora_B.weight)",
                           source, s->name);
        const st_tensor **slot = &found[t - L->t];
        if (*slot)
            return ct_fail(err, "%s: tensor \"%s\" is given twice (as \"%s\" and \"%s\")", source,
                           t->name, (*slot)->name, s->name);
        if (s->ndim == 2 && s->shape[0] != t->shape[0] && s->shape[1] == t->shape[1] && !t->is_b)
            return ct_fail(err,
                           "%s: tensor \"%s\" has rank %lld (shape %s), but adapter_config.json's "
                           "r is %d",
                           source, s->name, (long long)s->shape[0],
                           st_shape_str(got, sizeof got, s->shape, s->ndim), L->lc.rank);
        if (s->ndim == 2 && s->shape[1] != t->shape[1] && s->shape[0] == t->shape[0] && t->is_b)
            return ct_fail(err,
                           "%s: tensor \"%s\" has rank %lld (shape %s), but adapter_config.json's "
                           "r is %d",
                           source, s->name, (long long)s->shape[1],
                           st_shape_str(got, sizeof got, s->shape, s->ndim), L->lc.rank);
        if (s->ndim != 2 || s->shape[0] != t->shape[0] || s->shape[1] != t->shape[1])
            return ct_fail(err, "%s: tensor \"%s\": expected shape %s, found %s", source, s->name,
                           st_shape_str(want, sizeof want, t->shape, 2),
                           st_shape_str(got, sizeof got, s->shape, s->ndim));
        if (s->dtype != CT_F32 && s->dtype != CT_BF16 && s->dtype != CT_F16)
            return ct_fail(err, "%s: tensor \"%s\": dtype %s (expected F32, BF16 or F16)", source,
                           s->name, dtype_name(s->dtype));
        *slot = s;
    }
    int missing = 0, first = -1;
    for (int i = 0; i < L->n; i++)
        if (!found[i] && missing++ == 0) first = i;
    if (missing)
        return ct_fail(err,
                       "%s: tensor \"%s\" is missing%s (%d of the %d tensors the config's "
                       "target_modules and r call for are absent)",
                       source, L->t[first].name, missing > 1 ? " among others" : "", missing, L->n);
    return 0;
}

int peft_tensors_check(const lora_layout *L, const st_file *f, const char *source, ct_error *err) {
    const st_tensor **found = malloc(((size_t)L->n + 1) * sizeof *found);
    if (!found) return ct_fail(err, "%s: out of memory", source);
    int rc = match_tensors(found, L, f, source, err);
    free(found);
    return rc;
}

int peft_tensors_read(float *buf, const lora_layout *L, const st_file *f, const char *source,
                      ct_error *err) {
    const st_tensor **found = malloc(((size_t)L->n + 1) * sizeof *found);
    if (!found) return ct_fail(err, "%s: out of memory", source);
    int rc = match_tensors(found, L, f, source, err);
    // Straight from the mapping into the buffer, each tensor's pages let go once converted.
    for (int i = 0; i < L->n && rc == 0; i++) {
        const st_tensor *s = found[i];
        if (st_tensor_to_f32(buf + L->t[i].offset, s, err) != 0) rc = ct_wrap(err, "%s", source);
        if (f->map) fs_release_read(s->data, s->numel * dtype_size(s->dtype));
    }
    free(found);
    return rc;
}

int peft_tensors_write(const char *path, const lora_layout *L, const float *buf, ct_error *err) {
    st_entry *e = calloc((size_t)L->n + 1, sizeof *e);
    if (!e) return ct_fail(err, "%s: out of memory", path);
    for (int i = 0; i < L->n; i++) {
        e[i].name = L->t[i].name;
        e[i].data = buf + L->t[i].offset;
        e[i].ndim = 2;
        e[i].shape[0] = L->t[i].shape[0];
        e[i].shape[1] = L->t[i].shape[1];
    }
    int rc = st_write(path, e, L->n, CT_F32, err);
    free(e);
    return rc;
}

// --- the folder

int peft_adapter_load(peft_adapter *a, const char *dir, const qwen3_config *cfg, ct_error *err) {
    memset(a, 0, sizeof *a);
    char path[4200];
    struct stat sb;
    if (peft_config_load(&a->pc, dir, err) != 0) return -1;
    if (lora_layout_init(&a->L, cfg, &a->pc.lc, err) != 0) return ct_wrap(err, "%s", dir);
    snprintf(path, sizeof path, "%s/%s", dir, PEFT_WEIGHTS_NAME);
    if (stat(path, &sb) != 0) {
        char bin[4200];
        snprintf(bin, sizeof bin, "%s/%s", dir, PEFT_PICKLE_NAME);
        int rc = stat(bin, &sb) == 0
                     ? ct_fail(err,
                               "%s: only %s (a pickle) is there; ctitan reads %s: convert it "
                               "(safetensors.torch.save_file(torch.load(\"%s\"), \"%s\", "
                               "metadata={\"format\": \"pt\"}))",
                               dir, PEFT_PICKLE_NAME, PEFT_WEIGHTS_NAME, PEFT_PICKLE_NAME,
                               PEFT_WEIGHTS_NAME)
                     : ct_fail(err, "%s: not found (an adapter folder holds %s and %s)", path,
                               PEFT_CONFIG_NAME, PEFT_WEIGHTS_NAME);
        peft_adapter_free(a);
        return rc;
    }
    st_file f;
    if (st_open(&f, path, err) != 0) {
        peft_adapter_free(a);
        return -1;
    }
    a->buf = malloc(a->L.num * sizeof *a->buf + 1);
    int rc = a->buf ? peft_tensors_read(a->buf, &a->L, &f, path, err)
                    : ct_fail(err, "%s: out of memory for %zu floats", path, a->L.num);
    st_close(&f);
    if (rc != 0) peft_adapter_free(a);
    return rc;
}

void peft_adapter_free(peft_adapter *a) {
    free(a->buf);
    lora_layout_free(&a->L);
    memset(a, 0, sizeof *a);
}

int peft_adapter_save(const char *dir, const peft_config *pc, const lora_layout *L,
                      const float *buf, ct_error *err) {
    const lora_config *a = &pc->lc, *b = &L->lc;
    if (a->rank != b->rank || a->alpha != b->alpha || a->dropout != b->dropout ||
        a->targets != b->targets || a->use_rslora != b->use_rslora)
        return ct_fail(err, "%s: the adapter's configuration differs from its layout's", dir);
    char path[4200], *text = NULL;
    size_t len = 0;
    if (fs_mkdirs(dir, err) != 0) return -1;
    snprintf(path, sizeof path, "%s/%s", dir, PEFT_WEIGHTS_NAME);
    if (peft_tensors_write(path, L, buf, err) != 0) return -1;
    if (peft_config_text(&text, &len, pc, err) != 0) return -1;
    snprintf(path, sizeof path, "%s/%s", dir, PEFT_CONFIG_NAME);
    atomic_file af;
    int rc = atomic_open(&af, path, err);
    if (rc == 0 && atomic_write(&af, text, len, err) != 0) {
        atomic_abort(&af);
        rc = -1;
    } else if (rc == 0) {
        rc = atomic_commit(&af, err);
    }
    free(text);
    return rc;
}
