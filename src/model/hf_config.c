// config.json <-> qwen3_config. HF configs carry many informational keys (token ids, dropout,
// transformers_version, ...); those are ignored. Keys that change the arithmetic are either
// read, or refused when they ask for something this model does not do (sliding windows, RoPE
// scaling, another activation, MoE).
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "io/atomic.h"
#include "io/json.h"
#include "model/qwen3_config.h"

static const char *const moe_message = "is not supported yet (MoE arrives in a later release)";

// `architectures`, if present, must list Qwen3ForCausalLM.
static int config_check_architectures(const cJSON *root, const char *path, ct_error *err) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(root, "architectures");
    if (!a || cJSON_IsNull(a)) return 0;
    if (!cJSON_IsArray(a))
        return ct_fail(err, "%s: key \"architectures\": expected an array of strings, found %s",
                       path, json_type_name(a));
    const cJSON *it;
    const char *first = NULL;
    bool moe = false;
    cJSON_ArrayForEach(it, a) {
        if (!cJSON_IsString(it))
            return ct_fail(err,
                           "%s: key \"architectures\": expected an array of strings, found an "
                           "element that is %s",
                           path, json_type_name(it));
        if (strcmp(it->valuestring, "Qwen3ForCausalLM") == 0) return 0;
        if (strcmp(it->valuestring, "Qwen3MoeForCausalLM") == 0) moe = true;
        if (!first) first = it->valuestring;
    }
    if (moe)
        return ct_fail(err, "%s: key \"architectures\": Qwen3MoeForCausalLM %s", path, moe_message);
    return ct_fail(err, "%s: key \"architectures\": expected \"Qwen3ForCausalLM\", found %s%s%s",
                   path, first ? "\"" : "an empty array", first ? first : "", first ? "\"" : "");
}

static int config_check_model_type(const cJSON *root, const char *path, ct_error *err) {
    char type[64] = "";
    if (json_get_string(type, sizeof type, root, "model_type", false, path, err) != 0) return -1;
    if (!type[0] || strcmp(type, "qwen3") == 0) return 0;
    if (strcmp(type, "qwen3_moe") == 0)
        return ct_fail(err, "%s: key \"model_type\": \"qwen3_moe\" %s", path, moe_message);
    return ct_fail(err,
                   "%s: key \"model_type\": unsupported model_type \"%s\" (expected \"qwen3\")",
                   path, type);
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

int qwen3_config_load(qwen3_config *c, const char *path, ct_error *err) {
    cJSON *root;
    if (json_parse_file(&root, path, err) != 0) return -1;
    int rc = -1;
    memset(c, 0, sizeof *c);
    if (!cJSON_IsObject(root)) {
        ct_fail(err, "%s: expected a JSON object at the top level, found %s", path,
                json_type_name(root));
        goto done;
    }
    if (config_check_architectures(root, path, err) != 0 ||
        config_check_model_type(root, path, err) != 0 ||
        config_check_unsupported(root, path, err) != 0)
        goto done;
    if (config_int(&c->vocab_size, root, "vocab_size", true, path, err) ||
        config_int(&c->hidden_size, root, "hidden_size", true, path, err) ||
        config_int(&c->intermediate_size, root, "intermediate_size", true, path, err) ||
        config_int(&c->num_hidden_layers, root, "num_hidden_layers", true, path, err) ||
        config_int(&c->num_attention_heads, root, "num_attention_heads", true, path, err))
        goto done;
    // transformers' Qwen3Config defaults for the optional sizes: an absent key takes the class
    // default (num_key_value_heads 32, head_dim 128), an explicit null the derived value
    // (num_attention_heads, hidden_size / num_attention_heads), as the modeling code does.
    bool nkv_absent = !cJSON_GetObjectItemCaseSensitive(root, "num_key_value_heads");
    bool hd_absent = !cJSON_GetObjectItemCaseSensitive(root, "head_dim");
    c->num_key_value_heads = nkv_absent ? 32 : c->num_attention_heads;
    c->head_dim = hd_absent                    ? 128
                  : c->num_attention_heads > 0 ? c->hidden_size / c->num_attention_heads
                                               : 0;
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
                "%s: key \"num_key_value_heads\" is absent, and transformers' default (32) does "
                "not divide num_attention_heads (%d): set it explicitly",
                path, c->num_attention_heads);
        goto done;
    }
    rc = qwen3_config_validate(c, path, err);
done:
    cJSON_Delete(root);
    return rc;
}

int qwen3_config_validate(const qwen3_config *c, const char *source, ct_error *err) {
    const struct {
        const char *key;
        int value;
    } sizes[] = {
        {"vocab_size", c->vocab_size},
        {"hidden_size", c->hidden_size},
        {"intermediate_size", c->intermediate_size},
        {"num_hidden_layers", c->num_hidden_layers},
        {"num_attention_heads", c->num_attention_heads},
        {"max_position_embeddings", c->max_position_embeddings},
    };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        if (sizes[i].value <= 0)
            return ct_fail(err, "%s: key \"%s\": expected a positive integer, found %d", source,
                           sizes[i].key, sizes[i].value);
    }
    int nh = c->num_attention_heads, nkv = c->num_key_value_heads;
    if (nkv <= 0 || nh % nkv != 0)
        return ct_fail(err,
                       "%s: key \"num_key_value_heads\": expected a positive integer dividing "
                       "num_attention_heads (%d), found %d",
                       source, nh, nkv);
    if (c->head_dim <= 0 || c->head_dim % 2 != 0)
        return ct_fail(err,
                       "%s: key \"head_dim\": expected a positive even integer (RoPE rotates "
                       "pairs of dimensions), found %d",
                       source, c->head_dim);
    // The kernels index with int: every matrix dimension must fit.
    if ((int64_t)nh * c->head_dim > INT_MAX)
        return ct_fail(err,
                       "%s: key \"head_dim\": num_attention_heads (%d) x head_dim (%d) exceeds "
                       "%d",
                       source, nh, c->head_dim, INT_MAX);
    if (!(c->rms_norm_eps > 0) || !isfinite(c->rms_norm_eps))
        return ct_fail(err, "%s: key \"rms_norm_eps\": expected a positive number, found %g",
                       source, (double)c->rms_norm_eps);
    if (!(c->rope_theta > 0) || !isfinite(c->rope_theta))
        return ct_fail(err, "%s: key \"rope_theta\": expected a positive number, found %g", source,
                       c->rope_theta);
    return 0;
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

int qwen3_config_save(const qwen3_config *c, const char *path, ct_error *err) {
    if (qwen3_config_validate(c, path, err) != 0) return -1;
    // Keys sorted, as transformers writes them (json.dumps(sort_keys=True, indent=2)).
    cJSON *o = cJSON_CreateObject();
    cJSON *arch = cJSON_AddArrayToObject(o, "architectures");
    cJSON_AddItemToArray(arch, cJSON_CreateString("Qwen3ForCausalLM"));
    cJSON_AddBoolToObject(o, "attention_bias", c->attention_bias);
    cJSON_AddNumberToObject(o, "attention_dropout", 0.0);
    cJSON_AddNumberToObject(o, "head_dim", c->head_dim);
    cJSON_AddStringToObject(o, "hidden_act", "silu");
    cJSON_AddNumberToObject(o, "hidden_size", c->hidden_size);
    cJSON_AddNumberToObject(o, "initializer_range", 0.02);
    cJSON_AddNumberToObject(o, "intermediate_size", c->intermediate_size);
    cJSON_AddNumberToObject(o, "max_position_embeddings", c->max_position_embeddings);
    cJSON_AddNumberToObject(o, "max_window_layers", c->num_hidden_layers);
    cJSON_AddStringToObject(o, "model_type", "qwen3");
    cJSON_AddNumberToObject(o, "num_attention_heads", c->num_attention_heads);
    cJSON_AddNumberToObject(o, "num_hidden_layers", c->num_hidden_layers);
    cJSON_AddNumberToObject(o, "num_key_value_heads", c->num_key_value_heads);
    cJSON_AddNumberToObject(o, "rms_norm_eps", float_shortest(c->rms_norm_eps));
    cJSON_AddNullToObject(o, "rope_scaling");
    cJSON_AddNumberToObject(o, "rope_theta", c->rope_theta);
    cJSON_AddNullToObject(o, "sliding_window");
    cJSON_AddBoolToObject(o, "tie_word_embeddings", c->tie_word_embeddings);
    cJSON_AddStringToObject(o, "torch_dtype", c->torch_dtype[0] ? c->torch_dtype : "float32");
    cJSON_AddBoolToObject(o, "use_cache", true);
    cJSON_AddBoolToObject(o, "use_sliding_window", false);
    cJSON_AddNumberToObject(o, "vocab_size", c->vocab_size);
    // Two-space indent, one key per line, as json.dumps(indent=2) lays it out.
    size_t cap = 4096, len = 0;
    char *text = malloc(cap);
    const cJSON *it;
    if (text) len += (size_t)snprintf(text, cap, "{\n");
    cJSON_ArrayForEach(it, o) {
        char *val = cJSON_PrintUnformatted(it);
        if (!text || !val || len + strlen(it->string) + strlen(val) + 16 > cap) {
            cJSON_free(val);
            free(text);
            text = NULL;
            break;
        }
        len += (size_t)snprintf(text + len, cap - len, "  \"%s\": %s%s\n", it->string, val,
                                it->next ? "," : "");
        cJSON_free(val);
    }
    cJSON_Delete(o);
    if (!text) return ct_fail(err, "%s: out of memory formatting config.json", path);
    len += (size_t)snprintf(text + len, cap - len, "}\n");
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
