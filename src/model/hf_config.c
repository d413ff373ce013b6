// config.json <-> qwen3_config. HF configs carry many informational keys (token ids, dropout,
// transformers_version, ...); the model ignores those, but the config keeps the whole file so
// that a save writes them back. Keys that change the arithmetic are either read, or refused
// when they ask for something this model does not do (sliding windows, RoPE scaling, another
// activation). Qwen3ForCausalLM and Qwen3MoeForCausalLM share one reader; the MoE keys are read
// only for the latter.
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "io/atomic.h"
#include "io/json.h"
#include "model/qwen3_config.h"

// Which model a config.json describes: `architectures` and `model_type` must agree when both
// are present; either one alone decides; neither means a dense Qwen3.
typedef enum config_kind { KIND_UNSTATED, KIND_DENSE, KIND_MOE } config_kind;

// `architectures`, if present, must list Qwen3ForCausalLM or Qwen3MoeForCausalLM (the first
// one listed decides).
static int config_read_architectures(config_kind *kind, char *name, size_t cap, const cJSON *root,
                                     const char *path, ct_error *err) {
    *kind = KIND_UNSTATED;
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(root, "architectures");
    if (!a || cJSON_IsNull(a)) return 0;
    if (!cJSON_IsArray(a))
        return ct_fail(err, "%s: key \"architectures\": expected an array of strings, found %s",
                       path, json_type_name(a));
    const cJSON *it;
    const char *first = NULL;
    cJSON_ArrayForEach(it, a) {
        if (!cJSON_IsString(it))
            return ct_fail(err,
                           "%s: key \"architectures\": expected an array of strings, found an "
                           "element that is %s",
                           path, json_type_name(it));
        bool dense = strcmp(it->valuestring, "Qwen3ForCausalLM") == 0;
        if (dense || strcmp(it->valuestring, "Qwen3MoeForCausalLM") == 0) {
            *kind = dense ? KIND_DENSE : KIND_MOE;
            snprintf(name, cap, "%s", it->valuestring);
            return 0;
        }
        if (!first) first = it->valuestring;
    }
    return ct_fail(err,
                   "%s: key \"architectures\": expected \"Qwen3ForCausalLM\" or "
                   "\"Qwen3MoeForCausalLM\", found %s%s%s",
                   path, first ? "\"" : "an empty array", first ? first : "", first ? "\"" : "");
}

static int config_read_kind(config_kind *kind, const cJSON *root, const char *path, ct_error *err) {
    char arch[64] = "", type[64] = "";
    config_kind by_arch, by_type = KIND_UNSTATED;
    if (config_read_architectures(&by_arch, arch, sizeof arch, root, path, err) != 0) return -1;
    if (json_get_string(type, sizeof type, root, "model_type", false, path, err) != 0) return -1;
    if (strcmp(type, "qwen3") == 0)
        by_type = KIND_DENSE;
    else if (strcmp(type, "qwen3_moe") == 0)
        by_type = KIND_MOE;
    else if (type[0])
        return ct_fail(err,
                       "%s: key \"model_type\": unsupported model_type \"%s\" (expected "
                       "\"qwen3\" or \"qwen3_moe\")",
                       path, type);
    if (by_arch != KIND_UNSTATED && by_type != KIND_UNSTATED && by_arch != by_type)
        return ct_fail(err,
                       "%s: keys \"architectures\" and \"model_type\" disagree: \"%s\" expects "
                       "model_type \"%s\", found \"%s\"",
                       path, arch, by_arch == KIND_MOE ? "qwen3_moe" : "qwen3", type);
    *kind = by_arch != KIND_UNSTATED ? by_arch : by_type;
    return 0;
}

// Keys that would change the arithmetic in ways this model does not implement.
static int config_check_unsupported(const cJSON *root, const char *path, ct_error *err) {
    bool sliding = false;
    if (json_get_bool(&sliding, root, "use_sliding_window", false, path, err) != 0) return -1;
    if (sliding)
        return ct_fail(err,
                       "%s: key \"use_sliding_window\": sliding-window attention is not "
                       "supported (expected false, found true)",
                       path);
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(root, "layer_types"), *it;
    if (cJSON_IsArray(lt)) {
        int i = 0;
        cJSON_ArrayForEach(it, lt) {
            if (!cJSON_IsString(it) || strcmp(it->valuestring, "full_attention") != 0)
                return ct_fail(err,
                               "%s: key \"layer_types\": sliding-window attention is not "
                               "supported (expected \"full_attention\" for layer %d, found %s%s%s)",
                               path, i, cJSON_IsString(it) ? "\"" : "",
                               cJSON_IsString(it) ? it->valuestring : json_type_name(it),
                               cJSON_IsString(it) ? "\"" : "");
            i++;
        }
    }
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    if (rs && !cJSON_IsNull(rs))
        return ct_fail(err,
                       "%s: key \"rope_scaling\": rope_scaling is not supported (expected "
                       "null, found %s)",
                       path, json_type_name(rs));
    char act[32] = "silu";
    if (json_get_string(act, sizeof act, root, "hidden_act", false, path, err) != 0) return -1;
    if (strcmp(act, "silu") != 0)
        return ct_fail(err, "%s: key \"hidden_act\": expected \"silu\", found \"%s\"", path, act);
    return 0;
}

// rope_theta, either top-level (transformers 4.x) or inside rope_parameters (5.x).
static int config_read_rope(double *theta, const cJSON *root, const char *path, ct_error *err) {
    bool top = false;
    *theta = 10000.0;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "rope_theta");
    if (t && !cJSON_IsNull(t)) {
        if (json_get_double(theta, root, "rope_theta", false, path, err) != 0) return -1;
        top = true;
    }
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(root, "rope_parameters");
    if (!rp || cJSON_IsNull(rp)) return 0;
    if (!cJSON_IsObject(rp))
        return ct_fail(err, "%s: key \"rope_parameters\": expected an object, found %s", path,
                       json_type_name(rp));
    char type[32] = "default";
    if (json_get_string(type, sizeof type, rp, "rope_type", false, path, err) != 0)
        return ct_wrap(err, "key \"rope_parameters\"");
    if (strcmp(type, "default") != 0)
        return ct_fail(err,
                       "%s: key \"rope_parameters\": rope_scaling is not supported (expected "
                       "rope_type \"default\", found \"%s\")",
                       path, type);
    double inner = *theta;
    if (json_get_double(&inner, rp, "rope_theta", false, path, err) != 0)
        return ct_wrap(err, "key \"rope_parameters\"");
    if (top && inner != *theta)
        return ct_fail(err,
                       "%s: key \"rope_parameters\": rope_theta %.17g disagrees with the "
                       "top-level rope_theta %.17g",
                       path, inner, *theta);
    *theta = inner;
    return 0;
}

// Reads an int key into an int field; absent keys keep *out. Validation gives the precise
// message for bad values ("positive", "dividing ..."); here only the type and int range.
static int config_int(int *out, const cJSON *root, const char *key, bool required, const char *path,
                      ct_error *err) {
    int64_t v = *out;
    if (json_get_int(&v, root, key, required, INT64_MIN, INT64_MAX, path, err) != 0) return -1;
    if (v < INT_MIN || v > INT_MAX)
        return ct_fail(err, "%s: key \"%s\": expected a positive integer below 2^31, found %lld",
                       path, key, (long long)v);
    *out = (int)v;
    return 0;
}

// mlp_only_layers: an array of layer indices; null or absent is [] (as Qwen3MoeConfig makes it).
// The range and duplicates are qwen3_config_validate's to check.
static int config_read_mlp_only(qwen3_config *c, const cJSON *root, const char *path,
                                ct_error *err) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(root, "mlp_only_layers"), *it;
    c->n_mlp_only_layers = 0;
    if (!a || cJSON_IsNull(a)) return 0;
    if (!cJSON_IsArray(a))
        return ct_fail(err,
                       "%s: key \"mlp_only_layers\": expected an array of layer indices, found %s",
                       path, json_type_name(a));
    int n = cJSON_GetArraySize(a);
    if (n > QWEN3_MAX_MLP_ONLY)
        return ct_fail(err, "%s: key \"mlp_only_layers\": expected at most %d entries, found %d",
                       path, QWEN3_MAX_MLP_ONLY, n);
    cJSON_ArrayForEach(it, a) {
        double v = cJSON_IsNumber(it) ? it->valuedouble : 0.5;
        if (v != floor(v) || v < INT_MIN || v > INT_MAX) {
            if (cJSON_IsNumber(it))
                return ct_fail(err,
                               "%s: key \"mlp_only_layers\": expected integer layer indices, "
                               "found %g",
                               path, v);
            return ct_fail(err,
                           "%s: key \"mlp_only_layers\": expected integer layer indices, found "
                           "an element that is %s",
                           path, json_type_name(it));
        }
        c->mlp_only_layers[c->n_mlp_only_layers++] = (int)v;
    }
    return 0;
}

// The qwen3_moe keys; absent ones take transformers' Qwen3MoeConfig defaults.
static int config_read_moe(qwen3_config *c, const cJSON *root, const char *path, ct_error *err) {
    c->num_experts = 128;
    c->num_experts_per_tok = 8;
    c->moe_intermediate_size = 768;
    c->decoder_sparse_step = 1;
    c->norm_topk_prob = false;
    c->output_router_logits = false;
    c->router_aux_loss_coef = 0.001;
    if (config_int(&c->num_experts, root, "num_experts", false, path, err) ||
        config_int(&c->num_experts_per_tok, root, "num_experts_per_tok", false, path, err) ||
        config_int(&c->moe_intermediate_size, root, "moe_intermediate_size", false, path, err) ||
        config_int(&c->decoder_sparse_step, root, "decoder_sparse_step", false, path, err) ||
        json_get_bool(&c->norm_topk_prob, root, "norm_topk_prob", false, path, err) ||
        json_get_bool(&c->output_router_logits, root, "output_router_logits", false, path, err) ||
        json_get_double(&c->router_aux_loss_coef, root, "router_aux_loss_coef", false, path, err) ||
        config_read_mlp_only(c, root, path, err))
        return -1;
    // transformers 5 maps num_experts to num_local_experts (Qwen3MoeConfig.attribute_map), so
    // the configs it writes may use that name.
    const cJSON *local = cJSON_GetObjectItemCaseSensitive(root, "num_local_experts");
    if (local && !cJSON_IsNull(local)) {
        bool both = cJSON_GetObjectItemCaseSensitive(root, "num_experts") != NULL;
        int e = c->num_experts;
        if (config_int(&e, root, "num_local_experts", false, path, err) != 0) return -1;
        if (both && e != c->num_experts)
            return ct_fail(err,
                           "%s: keys \"num_experts\" and \"num_local_experts\" disagree: %d "
                           "vs %d",
                           path, c->num_experts, e);
        c->num_experts = e;
    }
    return 0;
}

// cJSON prints a double with 15 significant digits when that reads back within DBL_EPSILON of
// it, so a value passed through can move by an ulp. These print every number exactly: an
// integral one as an integer (as cJSON and json.dumps do for ints), any other with the fewest
// digits that read back as the same double, an infinity (JSON's 1e999 parses as one) as 1e999.
static void json_number_text(char out[32], double d) {
    if (isinf(d)) {
        snprintf(out, 32, "%s", d > 0 ? "1e999" : "-1e999");
    } else if (d == floor(d) && fabs(d) < 9007199254740992.0) {
        snprintf(out, 32, "%.0f", d);
    } else {
        for (int prec = 1; prec <= 17; prec++) {
            snprintf(out, 32, "%.*g", prec, d);
            if (strtod(out, NULL) == d) break;
        }
    }
}

// Turns every number under `item` into raw JSON text printed by json_number_text.
static bool json_exact_numbers(cJSON *item) {
    for (cJSON *it = item->child; it; it = it->next) {
        if (!cJSON_IsNumber(it)) {
            if (!json_exact_numbers(it)) return false;
            continue;
        }
        char text[32];
        json_number_text(text, it->valuedouble);
        size_t n = strlen(text) + 1;
        char *raw = cJSON_malloc(n);
        if (!raw) return false;
        memcpy(raw, text, n);
        it->type = (it->type & cJSON_StringIsConst) | cJSON_Raw;
        it->valuestring = raw;
    }
    return true;
}

// Room left in hf_source for the fields a save adds (a few hundred bytes, or a few KB for a
// long mlp_only_layers), so that a saved config.json always loads again.
#define HF_SOURCE_SLACK 4096

// The whole file, compact, for qwen3_config_save to write back.
static int config_keep_source(qwen3_config *c, cJSON *root, const char *path, ct_error *err) {
    char *text = json_exact_numbers(root) ? cJSON_PrintUnformatted(root) : NULL;
    if (!text) return ct_fail(err, "%s: out of memory keeping config.json", path);
    const size_t n = strlen(text), cap = sizeof c->hf_source - HF_SOURCE_SLACK;
    if (n < cap) memcpy(c->hf_source, text, n + 1);
    cJSON_free(text);
    if (n >= cap)
        return ct_fail(err,
                       "%s: expected at most %zu bytes of JSON (written compactly) to keep for "
                       "the export, found %zu",
                       path, cap - 1, n);
    return 0;
}

// The config in a parsed config.json; `path` names it in messages.
static int config_from_json(qwen3_config *c, cJSON *root, const char *path, ct_error *err) {
    int rc = -1;
    memset(c, 0, sizeof *c);
    if (!cJSON_IsObject(root)) {
        ct_fail(err, "%s: expected a JSON object at the top level, found %s", path,
                json_type_name(root));
        goto done;
    }
    config_kind kind = KIND_UNSTATED;
    if (config_read_kind(&kind, root, path, err) != 0 ||
        config_check_unsupported(root, path, err) != 0)
        goto done;
    bool moe = kind == KIND_MOE;
    if (config_int(&c->vocab_size, root, "vocab_size", true, path, err) ||
        config_int(&c->hidden_size, root, "hidden_size", true, path, err) ||
        config_int(&c->intermediate_size, root, "intermediate_size", true, path, err) ||
        config_int(&c->num_hidden_layers, root, "num_hidden_layers", true, path, err) ||
        config_int(&c->num_attention_heads, root, "num_attention_heads", true, path, err))
        goto done;
    // transformers' defaults for the optional sizes: an absent key takes the class default, an
    // explicit null the derived value (num_attention_heads, hidden_size / num_attention_heads),
    // as the modeling code does. Qwen3Config's defaults are num_key_value_heads 32 and head_dim
    // 128; Qwen3MoeConfig's are num_key_value_heads 4 and no head_dim at all, so the attention
    // falls back to hidden_size / num_attention_heads.
    bool nkv_absent = !cJSON_GetObjectItemCaseSensitive(root, "num_key_value_heads");
    bool hd_absent = !cJSON_GetObjectItemCaseSensitive(root, "head_dim");
    int nkv_default = moe ? 4 : 32;
    int hd_derived = c->num_attention_heads > 0 ? c->hidden_size / c->num_attention_heads : 0;
    c->num_key_value_heads = nkv_absent ? nkv_default : c->num_attention_heads;
    c->head_dim = hd_absent && !moe ? 128 : hd_derived;
    c->max_position_embeddings = 32768;
    if (config_int(&c->num_key_value_heads, root, "num_key_value_heads", false, path, err) ||
        config_int(&c->head_dim, root, "head_dim", false, path, err) ||
        config_int(&c->max_position_embeddings, root, "max_position_embeddings", false, path, err))
        goto done;
    double eps = 1e-6;
    if (json_get_double(&eps, root, "rms_norm_eps", false, path, err) != 0) goto done;
    c->rms_norm_eps = (float)eps;
    if (config_read_rope(&c->rope_theta, root, path, err) != 0) goto done;
    if (json_get_bool(&c->tie_word_embeddings, root, "tie_word_embeddings", false, path, err) ||
        json_get_bool(&c->attention_bias, root, "attention_bias", false, path, err))
        goto done;
    // Informational: "torch_dtype" (transformers 4.x) or "dtype" (5.x); never an error.
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(root, "torch_dtype");
    if (!cJSON_IsString(dt)) dt = cJSON_GetObjectItemCaseSensitive(root, "dtype");
    if (cJSON_IsString(dt)) snprintf(c->torch_dtype, sizeof c->torch_dtype, "%s", dt->valuestring);
    if (nkv_absent && c->num_attention_heads % c->num_key_value_heads != 0) {
        ct_fail(err,
                "%s: key \"num_key_value_heads\" is absent, and transformers' default (%d) does "
                "not divide num_attention_heads (%d): set it explicitly",
                path, nkv_default, c->num_attention_heads);
        goto done;
    }
    // A dense Qwen3 ignores the MoE keys, as Qwen3Config does: num_experts stays 0.
    if (moe && config_read_moe(c, root, path, err) != 0) goto done;
    // A qwen3_moe config without experts is a dense model (no layer is sparse): the MoE fields
    // stay unset, as a dense config's, and a save keeps the source's class and MoE keys.
    if (moe && c->num_experts == 0) {
        c->num_experts_per_tok = c->moe_intermediate_size = c->decoder_sparse_step = 0;
        c->n_mlp_only_layers = 0;
        memset(c->mlp_only_layers, 0, sizeof c->mlp_only_layers);
        c->norm_topk_prob = c->output_router_logits = false;
        c->router_aux_loss_coef = 0;
    }
    if (qwen3_config_validate(c, path, err) != 0 || config_keep_source(c, root, path, err) != 0)
        goto done;
    rc = 0;
done:
    cJSON_Delete(root);
    return rc;
}

int qwen3_config_load(qwen3_config *c, const char *path, ct_error *err) {
    cJSON *root;
    if (json_parse_file(&root, path, err) != 0) return -1;
    return config_from_json(c, root, path, err);
}

int qwen3_config_parse(qwen3_config *c, const char *text, size_t len, const char *path,
                       ct_error *err) {
    cJSON *root;
    if (json_parse(&root, text, len, path, err) != 0) return -1;
    return config_from_json(c, root, path, err);
}

// The shortest decimal that reads back as the same float, so 1e-6f is saved as 1e-06 rather
// than 9.9999999747524271e-07.
static double float_shortest(float f) {
    char buf[32];
    for (int prec = 1; prec <= 9; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, (double)f);
        if (strtof(buf, NULL) == f) break;
    }
    return strtod(buf, NULL);
}

static int item_name_cmp(const void *a, const void *b) {
    return strcmp((*(cJSON *const *)a)->string, (*(cJSON *const *)b)->string);
}

// Reorders an object's keys by name, as json.dumps(sort_keys=True) writes them.
static int object_sort_keys(cJSON *o) {
    int n = cJSON_GetArraySize(o);
    cJSON **items = malloc((size_t)(n > 0 ? n : 1) * sizeof *items);
    if (!items) return -1;
    for (int i = 0; i < n; i++) items[i] = cJSON_DetachItemFromArray(o, 0);
    qsort(items, (size_t)n, sizeof *items, item_name_cmp);
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(o, items[i]);
    free(items);
    return 0;
}

// Sets o[key] to v, replacing every copy the source had; v is consumed.
static void config_set(cJSON *o, const char *key, cJSON *v) {
    while (cJSON_GetObjectItemCaseSensitive(o, key))
        cJSON_DeleteItemFromObjectCaseSensitive(o, key);
    cJSON_AddItemToObject(o, key, v);
}

static bool config_has(const cJSON *o, const char *key) {
    return cJSON_GetObjectItemCaseSensitive(o, key) != NULL;
}

// The qwen3_moe keys of a Qwen3MoeForCausalLM config.json. num_experts goes under the name the
// source used (transformers 5 writes num_local_experts).
static void config_add_moe(cJSON *o, const qwen3_config *c) {
    config_set(o, "decoder_sparse_step", cJSON_CreateNumber(c->decoder_sparse_step));
    cJSON *only = cJSON_CreateArray();
    for (int i = 0; i < c->n_mlp_only_layers; i++)
        cJSON_AddItemToArray(only, cJSON_CreateNumber(c->mlp_only_layers[i]));
    config_set(o, "mlp_only_layers", only);
    config_set(o, "moe_intermediate_size", cJSON_CreateNumber(c->moe_intermediate_size));
    config_set(o, "norm_topk_prob", cJSON_CreateBool(c->norm_topk_prob));
    const bool local = config_has(o, "num_local_experts");
    if (local) config_set(o, "num_local_experts", cJSON_CreateNumber(c->num_experts));
    if (!local || config_has(o, "num_experts"))
        config_set(o, "num_experts", cJSON_CreateNumber(c->num_experts));
    config_set(o, "num_experts_per_tok", cJSON_CreateNumber(c->num_experts_per_tok));
    config_set(o, "output_router_logits", cJSON_CreateBool(c->output_router_logits));
    config_set(o, "router_aux_loss_coef", cJSON_CreateNumber(c->router_aux_loss_coef));
}

// rope_theta where the source had it: top level (transformers 4), inside rope_parameters
// (transformers 5), or both; top level when neither.
static void config_add_rope(cJSON *o, const qwen3_config *c) {
    cJSON *rp = cJSON_GetObjectItemCaseSensitive(o, "rope_parameters");
    const bool inner = cJSON_IsObject(rp) && config_has(rp, "rope_theta");
    if (inner) config_set(rp, "rope_theta", cJSON_CreateNumber(c->rope_theta));
    if (!inner || config_has(o, "rope_theta"))
        config_set(o, "rope_theta", cJSON_CreateNumber(c->rope_theta));
}

// The config.json object: the source's fields, then the model's over them.
static cJSON *config_to_json(const qwen3_config *c, const char *path, ct_error *err) {
    const bool moe = c->num_experts > 0, source = c->hf_source[0] != '\0';
    cJSON *o = source ? cJSON_Parse(c->hf_source) : cJSON_CreateObject();
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        ct_fail(err, "%s: %s", path,
                source ? "the config's hf_source is not a JSON object" : "out of memory");
        return NULL;
    }
    // The source's class when it is qwen3_moe without experts (a dense model all the same).
    config_kind kind = KIND_UNSTATED;
    if (source && config_read_kind(&kind, o, path, err) != 0) {
        cJSON_Delete(o);
        return NULL;
    }
    const bool moe_class = moe || kind == KIND_MOE;
    cJSON *arch = cJSON_CreateArray();
    cJSON_AddItemToArray(
        arch, cJSON_CreateString(moe_class ? "Qwen3MoeForCausalLM" : "Qwen3ForCausalLM"));
    config_set(o, "architectures", arch);
    config_set(o, "attention_bias", cJSON_CreateBool(c->attention_bias));
    config_set(o, "head_dim", cJSON_CreateNumber(c->head_dim));
    config_set(o, "hidden_size", cJSON_CreateNumber(c->hidden_size));
    config_set(o, "intermediate_size", cJSON_CreateNumber(c->intermediate_size));
    config_set(o, "max_position_embeddings", cJSON_CreateNumber(c->max_position_embeddings));
    config_set(o, "model_type", cJSON_CreateString(moe_class ? "qwen3_moe" : "qwen3"));
    config_set(o, "num_attention_heads", cJSON_CreateNumber(c->num_attention_heads));
    config_set(o, "num_hidden_layers", cJSON_CreateNumber(c->num_hidden_layers));
    config_set(o, "num_key_value_heads", cJSON_CreateNumber(c->num_key_value_heads));
    config_set(o, "rms_norm_eps", cJSON_CreateNumber(float_shortest(c->rms_norm_eps)));
    config_add_rope(o, c);
    config_set(o, "tie_word_embeddings", cJSON_CreateBool(c->tie_word_embeddings));
    config_set(o, "vocab_size", cJSON_CreateNumber(c->vocab_size));
    // The dtype under the source's key: "dtype" (transformers 5), "torch_dtype" (4.x), or both.
    const char *dtype = c->torch_dtype[0] ? c->torch_dtype : "float32";
    const bool new_key = config_has(o, "dtype");
    if (new_key) config_set(o, "dtype", cJSON_CreateString(dtype));
    if (!new_key || config_has(o, "torch_dtype"))
        config_set(o, "torch_dtype", cJSON_CreateString(dtype));
    if (moe) config_add_moe(o, c);
    if (source) return o;
    // No source (a flavor): the keys Qwen3Config writes, at its defaults, and Qwen3's token ids.
    cJSON_AddNumberToObject(o, "attention_dropout", 0.0);
    cJSON_AddStringToObject(o, "hidden_act", "silu");
    cJSON_AddNumberToObject(o, "initializer_range", 0.02);
    cJSON_AddNumberToObject(o, "max_window_layers", c->num_hidden_layers);
    cJSON_AddNullToObject(o, "rope_scaling");
    cJSON_AddNullToObject(o, "sliding_window");
    cJSON_AddBoolToObject(o, "use_cache", true);
    cJSON_AddBoolToObject(o, "use_sliding_window", false);
    if (c->vocab_size == QWEN3_VOCAB_SIZE) {
        cJSON_AddNumberToObject(o, "bos_token_id", QWEN3_BOS_TOKEN_ID);
        cJSON_AddNumberToObject(o, "eos_token_id", QWEN3_EOS_TOKEN_ID);
    }
    return o;
}

int qwen3_config_text(char **out, size_t *out_len, const qwen3_config *c, const char *path,
                      ct_error *err) {
    *out = NULL;
    if (qwen3_config_validate(c, path, err) != 0) return -1;
    cJSON *o = config_to_json(c, path, err);
    if (!o) return -1;
    // Keys sorted, as transformers writes them (json.dumps(sort_keys=True, indent=2)), one per
    // line with a two-space indent; arrays and objects stay on their line (equal as JSON).
    char *text = NULL;
    size_t len = 0;
    FILE *f =
        object_sort_keys(o) == 0 && json_exact_numbers(o) ? open_memstream(&text, &len) : NULL;
    bool ok = f != NULL;
    const cJSON *it;
    if (ok) fputs("{\n", f);
    cJSON_ArrayForEach(it, o) {
        // The key as a JSON string: a source's unknown keys may hold quotes or escapes.
        cJSON *name = ok ? cJSON_CreateString(it->string) : NULL;
        char *key = name ? cJSON_PrintUnformatted(name) : NULL;
        char *val = key ? cJSON_PrintUnformatted(it) : NULL;
        if (val) fprintf(f, "  %s: %s%s\n", key, val, it->next ? "," : "");
        ok = ok && val;
        cJSON_free(val);
        cJSON_free(key);
        cJSON_Delete(name);
    }
    if (f) {
        fputs("}\n", f);
        ok = ok && !ferror(f);
        ok = fclose(f) == 0 && ok;
    }
    cJSON_Delete(o);
    if (!ok) {
        free(text);
        return ct_fail(err, "%s: out of memory formatting config.json", path);
    }
    *out = text;
    *out_len = len;
    return 0;
}

int qwen3_config_save(const qwen3_config *c, const char *path, ct_error *err) {
    char *text;
    size_t len;
    if (qwen3_config_text(&text, &len, c, path, err) != 0) return -1;
    atomic_file af;
    int rc = atomic_open(&af, path, err);
    if (rc == 0) {
        if (atomic_write(&af, text, len, err) == 0)
            rc = atomic_commit(&af, err);
        else
            rc = -1, atomic_abort(&af);
    }
    free(text);
    return rc;
}
