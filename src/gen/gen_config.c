// generation_config.json's settings for generate (gen_config.h).
#include "gen/gen_config.h"

#include <math.h>
#include <string.h>
#include <unistd.h>

#include "io/json.h"

// Settings that change HF's generate and that ctitan does not do, at the value that switches
// each off (a null or absent key is off too).
static const struct {
    const char *key;
    double off;
} unsupported_numbers[] = {
    {"num_beams", 1},
    {"num_beam_groups", 1},
    {"penalty_alpha", 0},
    {"no_repeat_ngram_size", 0},
    {"encoder_repetition_penalty", 1},
    {"typical_p", 1},
    {"epsilon_cutoff", 0},
    {"eta_cutoff", 0},
    {"min_new_tokens", 0},
    {"min_length", 0},
    {"diversity_penalty", 0},
    {"guidance_scale", 1},
};
// ... and those where anything but null (or an empty list) is on.
static const char *const unsupported_lists[] = {"bad_words_ids",
                                                "suppress_tokens",
                                                "begin_suppress_tokens",
                                                "sequence_bias",
                                                "forced_bos_token_id",
                                                "forced_eos_token_id",
                                                "exponential_decay_length_penalty"};
_Static_assert(sizeof unsupported_numbers / sizeof *unsupported_numbers +
                       sizeof unsupported_lists / sizeof *unsupported_lists <=
                   GEN_MAX_UNSUPPORTED,
               "GEN_MAX_UNSUPPORTED");

// One stop id, checked before it converts (a double past int32 has no int32).
static int eos_add(int32_t *eos, int *n, const cJSON *it, const char *path, ct_error *err) {
    const double x = cJSON_IsNumber(it) ? it->valuedouble : NAN;
    if (!(x >= INT32_MIN && x <= INT32_MAX) || x != floor(x) || *n == GEN_MAX_EOS)
        return ct_fail(err, "%s: eos_token_id: expected 32-bit integers (at most %d)", path,
                       GEN_MAX_EOS);
    eos[(*n)++] = (int32_t)x;
    return 0;
}

int gen_eos_read(int32_t eos[GEN_MAX_EOS], int *n, const cJSON *root, const char *path,
                 ct_error *err) {
    *n = 0;
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(root, "eos_token_id");
    if (cJSON_IsNumber(e)) return eos_add(eos, n, e, path, err);
    if (cJSON_IsArray(e)) {
        for (const cJSON *it = e->child; it; it = it->next)
            if (eos_add(eos, n, it, path, err) != 0) return -1;
        return 0;
    }
    if (e && !cJSON_IsNull(e))
        return ct_fail(err, "%s: eos_token_id: expected an integer or a list, found %s", path,
                       json_type_name(e));
    return 0;
}

static void find_unsupported(gen_file_config *out, const cJSON *root) {
    for (size_t i = 0; i < sizeof unsupported_numbers / sizeof *unsupported_numbers; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, unsupported_numbers[i].key);
        if (cJSON_IsNumber(v) && v->valuedouble != unsupported_numbers[i].off) {
            out->unsupported[out->n_unsupported] = unsupported_numbers[i].key;
            out->unsupported_value[out->n_unsupported++] = v->valuedouble;
        }
    }
    for (size_t i = 0; i < sizeof unsupported_lists / sizeof *unsupported_lists; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, unsupported_lists[i]);
        if (v && !cJSON_IsNull(v) && !(cJSON_IsArray(v) && !v->child)) {
            out->unsupported[out->n_unsupported] = unsupported_lists[i];
            out->unsupported_value[out->n_unsupported++] = NAN;
        }
    }
}

static void empty(gen_file_config *out) {
    memset(out, 0, sizeof *out);
    out->temperature = out->top_k = out->top_p = out->min_p = out->repetition_penalty = NAN;
}

static int from_root(gen_file_config *out, const cJSON *root, const char *path, ct_error *err) {
    if (!cJSON_IsObject(root))
        return ct_fail(err, "%s: expected a JSON object, found %s", path, json_type_name(root));
    const struct {
        const char *key;
        double *to;
    } numbers[] = {{"temperature", &out->temperature},
                   {"top_k", &out->top_k},
                   {"top_p", &out->top_p},
                   {"min_p", &out->min_p},
                   {"repetition_penalty", &out->repetition_penalty}};
    for (size_t i = 0; i < sizeof numbers / sizeof *numbers; i++)
        if (json_get_double(numbers[i].to, root, numbers[i].key, false, path, err) != 0) return -1;
    if (json_get_bool(&out->do_sample, root, "do_sample", false, path, err) != 0 ||
        gen_eos_read(out->eos, &out->n_eos, root, path, err) != 0)
        return -1;
    find_unsupported(out, root);
    return 0;
}

int gen_config_parse(gen_file_config *out, const char *text, size_t len, const char *path,
                     ct_error *err) {
    empty(out);
    cJSON *root;
    if (json_parse(&root, text, len, path, err) != 0) return -1;
    const int rc = from_root(out, root, path, err);
    cJSON_Delete(root);
    return rc;
}

int gen_config_read(gen_file_config *out, bool *found, const char *path, ct_error *err) {
    empty(out);
    *found = access(path, F_OK) == 0;
    if (!*found) return 0;
    cJSON *root;
    if (json_parse_file(&root, path, err) != 0) return -1;
    const int rc = from_root(out, root, path, err);
    cJSON_Delete(root);
    return rc;
}
