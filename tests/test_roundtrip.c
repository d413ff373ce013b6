// HF folder round trips through hf_save_folder / hf_load_folder:
//  1. every reference variant, saved in its own dtype and shard size, reproduces the folder
//     tests/ref/make_ref.py wrote (an independent Python writer) byte for byte;
//  2. two variants (untied F32, tied BF16) saved as F32, BF16 and F16, sharded and not, reload
//     bitwise equal to the originals after the same rounding; config.json survives; a tied
//     model writes no lm_head.weight;
//  3. Python (tests/ref/safetensors_ref.py) reads every saved folder back and finds the same
//     values;
//  4. saving over a folder of the other layout leaves nothing stale behind.
#include <stdint.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "check.h"
#include "io/json.h"
#include "model/hf_adapter.h"

static const char *ref_dir, *tmp_dir;
static char py_cmd[65536]; // one Python run checks every saved folder
static size_t py_len;

static bool file_exists(const char *dir, const char *name) {
    char p[8192];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return stat(p, &st) == 0;
}

static void check_config_equal(const qwen3_config *a, const qwen3_config *b, const char *what) {
    CHECK(a->vocab_size == b->vocab_size && a->hidden_size == b->hidden_size &&
              a->intermediate_size == b->intermediate_size &&
              a->num_hidden_layers == b->num_hidden_layers &&
              a->num_attention_heads == b->num_attention_heads &&
              a->num_key_value_heads == b->num_key_value_heads && a->head_dim == b->head_dim &&
              a->max_position_embeddings == b->max_position_embeddings &&
              a->rms_norm_eps == b->rms_norm_eps && a->rope_theta == b->rope_theta &&
              a->tie_word_embeddings == b->tie_word_embeddings &&
              a->attention_bias == b->attention_bias,
          "%s: config.json did not round trip", what);
}

// Saves `m` to tmp/name as dtype (sharded or not), reloads it and compares with the originals.
static void roundtrip_one(const qwen3_model *m, const char *orig_dir, const char *name, ct_dtype dt,
                          uint64_t shard) {
    char dir[4096];
    ct_error err = {{0}};
    snprintf(dir, sizeof dir, "%s/%s", tmp_dir, name);
    int rc = hf_save_folder(m, dir, dt, shard, &err);
    CHECK(rc == 0, "%s: save: %s", name, err.msg);
    if (rc != 0) return;
    CHECK(file_exists(dir, "model.safetensors") == !shard, "%s: model.safetensors %s", name,
          shard ? "present in a sharded save" : "missing");
    CHECK(file_exists(dir, "model.safetensors.index.json") == !!shard, "%s: index %s", name,
          shard ? "missing" : "present in a single-file save");

    qwen3_model m2;
    hf_load_report rep;
    rc = hf_load_folder(&m2, &rep, dir, NULL, &err);
    CHECK(rc == 0, "%s: reload: %s", name, err.msg);
    if (rc == 0) {
        CHECK(rep.n_missing == 0 && rep.n_unexpected == 0 && rep.n_loaded == m->n_params,
              "%s: loaded %d/%d missing %d unexpected %d", name, rep.n_loaded, m->n_params,
              rep.n_missing, rep.n_unexpected);
        CHECK(rep.source_dtype == dt && !rep.mixed_dtypes, "%s: source dtype %s", name,
              dtype_name(rep.source_dtype));
        CHECK(shard ? rep.n_files > 1 : rep.n_files == 1, "%s: %d files", name, rep.n_files);
        check_config_equal(&m->cfg, &m2.cfg, name);
        const char *want_dt = dt == CT_BF16 ? "bfloat16" : dt == CT_F16 ? "float16" : "float32";
        CHECK(strcmp(m2.cfg.torch_dtype, want_dt) == 0, "%s: torch_dtype \"%s\"", name,
              m2.cfg.torch_dtype);
        CHECK(m2.n_params == m->n_params && m2.num_params == m->num_params,
              "%s: parameter tables differ", name);
        size_t bad = 0;
        for (int i = 0; i < m->n_params && m2.n_params == m->n_params; i++) {
            const qwen3_param *p = &m->params[i];
            const qwen3_param *q = qwen3_find_param(&m2, p->name);
            if (!q || q->numel != p->numel) {
                bad++;
                continue;
            }
            for (size_t k = 0; k < p->numel; k++) {
                float want = check_round_as(m->param_mem[p->offset + k], dt);
                if (memcmp(&want, &m2.param_mem[q->offset + k], 4) != 0) bad++;
            }
        }
        CHECK(bad == 0, "%s: %zu values differ from the originals after %s rounding", name, bad,
              dtype_name(dt));
    }
    if (m->cfg.tie_word_embeddings) {
        st_set s;
        rc = st_set_open(&s, dir, &err);
        CHECK(rc == 0, "%s: %s", name, err.msg);
        if (rc == 0) {
            CHECK(st_set_find(&s, "lm_head.weight") == NULL,
                  "%s: tied model saved an lm_head.weight", name);
            st_set_close(&s);
        }
    }
    py_len += (size_t)snprintf(py_cmd + py_len, sizeof py_cmd - py_len,
                               " --check '%s' --compare '%s' '%s'", dir, dir, orig_dir);
    qwen3_free(&m2);
    hf_report_free(&rep);
}

// Saving a variant the way make_ref.py stored it must give the same bytes.
static void same_bytes_as_reference(const char *variant) {
    char path[4096], hf[4096], out[4096];
    ct_error err = {{0}};
    cJSON *meta = NULL;
    snprintf(path, sizeof path, "%s/%s/meta.json", ref_dir, variant);
    snprintf(hf, sizeof hf, "%s/%s/hf", ref_dir, variant);
    snprintf(out, sizeof out, "%s/same_%s", tmp_dir, variant);
    int64_t shard = 0;
    char dts[8] = "";
    ct_dtype dt = CT_F32;
    int rc = json_parse_file(&meta, path, &err);
    if (rc == 0)
        rc = json_get_int(&shard, meta, "max_shard_bytes", true, 0, INT64_MAX, path, &err) ||
             json_get_string(dts, sizeof dts, meta, "weights_dtype", true, path, &err) ||
             dtype_from_name(&dt, dts);
    CHECK(rc == 0, "%s: %s", variant, err.msg);
    const cJSON *files = meta ? cJSON_GetObjectItemCaseSensitive(meta, "weight_files") : NULL;
    qwen3_model m;
    hf_load_report rep;
    if (rc == 0) {
        rc = hf_load_folder(&m, &rep, hf, NULL, &err);
        CHECK(rc == 0, "%s: %s", variant, err.msg);
        hf_report_free(&rep);
    }
    if (rc == 0) {
        rc = hf_save_folder(&m, out, dt, (uint64_t)shard, &err);
        CHECK(rc == 0, "%s: save: %s", variant, err.msg);
        qwen3_free(&m);
    }
    if (rc != 0 || !cJSON_IsArray(files)) {
        cJSON_Delete(meta);
        return;
    }
    const cJSON *it;
    int n = 0;
    cJSON_ArrayForEach(it, files) {
        const char *f = cJSON_GetStringValue(it);
        char a[8192], b[8192];
        snprintf(a, sizeof a, "%s/%s", out, f ? f : "");
        snprintf(b, sizeof b, "%s/%s", hf, f ? f : "");
        CHECK(f && check_files_equal(a, b), "%s: %s differs from the reference writer's", variant,
              f ? f : "?");
        n++;
    }
    if (n > 1) {
        char a[8192], b[8192];
        snprintf(a, sizeof a, "%s/model.safetensors.index.json", out);
        snprintf(b, sizeof b, "%s/model.safetensors.index.json", hf);
        CHECK(check_files_equal(a, b), "%s: index differs from the reference writer's", variant);
        char extra[64];
        snprintf(extra, sizeof extra, "model-%05d-of-%05d.safetensors", n + 1, n + 1);
        CHECK(!file_exists(out, extra), "%s: more shards than the reference", variant);
    } else {
        CHECK(!file_exists(out, "model.safetensors.index.json"), "%s: unexpected index", variant);
    }
    cJSON_Delete(meta);
}

// A sharded save over a single-file folder (and back) must not leave the old layout behind,
// or a loader would find two answers.
static void overwrite_layout(const qwen3_model *m) {
    char dir[4096];
    ct_error err = {{0}};
    snprintf(dir, sizeof dir, "%s/overwrite", tmp_dir);
    const struct {
        ct_dtype dt;
        uint64_t shard;
    } steps[] = {{CT_F32, 0}, {CT_BF16, 2000}, {CT_F16, 0}, {CT_F32, 3000}, {CT_BF16, 1000}};
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        int rc = hf_save_folder(m, dir, steps[i].dt, steps[i].shard, &err);
        CHECK(rc == 0, "overwrite step %zu: %s", i, err.msg);
        qwen3_model m2;
        hf_load_report rep;
        rc = hf_load_folder(&m2, &rep, dir, NULL, &err);
        CHECK(rc == 0 && rep.source_dtype == steps[i].dt && !rep.mixed_dtypes &&
                  rep.n_unexpected == 0 && (steps[i].shard ? rep.n_files > 1 : rep.n_files == 1),
              "overwrite step %zu: rc %d dtype %s files %d: %s", i, rc,
              dtype_name(rep.source_dtype), rep.n_files, rc ? err.msg : "");
        CHECK(file_exists(dir, "model.safetensors") == !steps[i].shard,
              "overwrite step %zu: stale model.safetensors", i);
        qwen3_free(&m2);
        hf_report_free(&rep);
    }
}

// Saving what was loaded from our own save gives the same bytes again.
static void save_is_idempotent(const qwen3_model *m) {
    char a[4096], b[4096], fa[8192], fb[8192];
    ct_error err = {{0}};
    snprintf(a, sizeof a, "%s/idem_a", tmp_dir);
    snprintf(b, sizeof b, "%s/idem_b", tmp_dir);
    qwen3_model m2;
    hf_load_report rep;
    int rc = hf_save_folder(m, a, CT_BF16, 0, &err);
    if (rc == 0) rc = hf_load_folder(&m2, &rep, a, NULL, &err);
    if (rc == 0) {
        rc = hf_save_folder(&m2, b, CT_BF16, 0, &err);
        qwen3_free(&m2);
        hf_report_free(&rep);
    }
    CHECK(rc == 0, "idempotence: %s", err.msg);
    snprintf(fa, sizeof fa, "%s/model.safetensors", a);
    snprintf(fb, sizeof fb, "%s/model.safetensors", b);
    CHECK(rc == 0 && check_files_equal(fa, fb), "BF16 save -> load -> save changed the bytes");
    snprintf(fa, sizeof fa, "%s/config.json", a);
    snprintf(fb, sizeof fb, "%s/config.json", b);
    CHECK(rc == 0 && check_files_equal(fa, fb),
          "config.json save -> load -> save changed the bytes");
}

int main(void) {
    ref_dir = check_env("CTITAN_REF_DIR");
    tmp_dir = check_env("CTITAN_TMP");
    const char *py = check_env("CTITAN_PYTHON"), *src = check_env("CTITAN_SOURCE_DIR");
    ct_error err = {{0}};
    char path[4096];

    cJSON *index = NULL;
    snprintf(path, sizeof path, "%s/index.json", ref_dir);
    int rc = json_parse_file(&index, path, &err);
    CHECK(rc == 0, "reference data missing (did ref_generate run?): %s", err.msg);
    const cJSON *vs = rc == 0 ? cJSON_GetObjectItemCaseSensitive(index, "variants") : NULL, *it;
    CHECK(cJSON_IsArray(vs) && cJSON_GetArraySize(vs) > 0, "%s: no variants", path);
    if (cJSON_IsArray(vs)) {
        cJSON_ArrayForEach(it, vs) {
            if (cJSON_GetStringValue(it)) same_bytes_as_reference(cJSON_GetStringValue(it));
        }
    }
    cJSON_Delete(index);

    py_len =
        (size_t)snprintf(py_cmd, sizeof py_cmd, "'%s' '%s/tests/ref/safetensors_ref.py'", py, src);
    static const char *const variants[] = {"mha_untied_f32", "gqa2_hd16_tied_bias_bf16_sharded"};
    static const ct_dtype dts[] = {CT_F32, CT_BF16, CT_F16};
    for (int v = 0; v < 2; v++) {
        char hf[4096];
        snprintf(hf, sizeof hf, "%s/%s/hf", ref_dir, variants[v]);
        qwen3_model m;
        hf_load_report rep;
        rc = hf_load_folder(&m, &rep, hf, NULL, &err);
        CHECK(rc == 0, "%s: %s", variants[v], err.msg);
        hf_report_free(&rep);
        if (rc != 0) continue;
        for (int d = 0; d < 3; d++) {
            for (int sharded = 0; sharded < 2; sharded++) {
                char name[256];
                snprintf(name, sizeof name, "%s_%s_%s", variants[v], dtype_name(dts[d]),
                         sharded ? "sharded" : "single");
                roundtrip_one(&m, hf, name, dts[d], sharded ? 2500 : 0);
            }
        }
        if (v == 1) {
            overwrite_layout(&m);
            save_is_idempotent(&m);
        }
        qwen3_free(&m);
    }
    snprintf(py_cmd + py_len, sizeof py_cmd - py_len, " >&2");
    int status = system(py_cmd);
    CHECK(status == 0, "Python reader rejected a saved folder (status %d): %s", status, py_cmd);
    return check_summary();
}
