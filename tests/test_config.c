// config.json parsing and HF weight loading: every rule has a bad input that must fail with a
// message naming the file and the key (or tensor), plus the good inputs that must pass:
// defaults, a real Qwen3-0.6B config, informational keys, transformers 5's rope_parameters.
#include <stdint.h>
#include <unistd.h>

#include "check.h"
#include "io/json.h"
#include "model/hf_adapter.h"

static const char *tmp_dir, *ref_dir;

// The required keys of a valid config; cases add to them (or spell out their own text).
#define BASE_KEYS                                                                                  \
    "\"vocab_size\": 128, \"hidden_size\": 32, \"intermediate_size\": 64, "                        \
    "\"num_hidden_layers\": 2, \"num_attention_heads\": 4"
// BASE_KEYS leaves num_key_value_heads out, whose absent default (32) does not divide 4 heads.
#define BASE_KEYS_NKV BASE_KEYS ", \"num_key_value_heads\": 2"

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        exit(2);
    }
    fputs(text, f);
    fclose(f);
}

static int load_text(qwen3_config *c, ct_error *err, const char *name, const char *text, char *path,
                     size_t cap) {
    snprintf(path, cap, "%s/%s.json", tmp_dir, name);
    write_text(path, text);
    return qwen3_config_load(c, path, err);
}

// The load must fail and the message must contain the path and every fragment given.
static void expect_fail(const char *name, const char *text, const char *frag1, const char *frag2) {
    char path[4096];
    qwen3_config c;
    ct_error err = {{0}};
    int rc = load_text(&c, &err, name, text, path, sizeof path);
    CHECK(rc == -1, "%s: expected failure, got rc %d", name, rc);
    CHECK(strstr(err.msg, path) != NULL, "%s: message does not name the file: %s", name, err.msg);
    CHECK(!frag1 || strstr(err.msg, frag1), "%s: message lacks '%s': %s", name, frag1, err.msg);
    CHECK(!frag2 || strstr(err.msg, frag2), "%s: message lacks '%s': %s", name, frag2, err.msg);
    printf("%-22s %s\n", name, err.msg);
}

static void test_bad_configs(void) {
    expect_fail("malformed", "{\"vocab_size\": 128,, \"hidden_size\": 32}", "invalid JSON at byte",
                "line 1");
    expect_fail("truncated", "{\"vocab_size\": 128", "invalid JSON", NULL);
    expect_fail("not_object", "[1, 2, 3]", "JSON object", "an array");
    expect_fail("wrong_type", "{" BASE_KEYS ", \"num_key_value_heads\": \"2\"}",
                "\"num_key_value_heads\"", "a string");
    expect_fail("fractional",
                "{\"vocab_size\": 128, \"hidden_size\": 32.5, "
                "\"intermediate_size\": 64, \"num_hidden_layers\": 2, "
                "\"num_attention_heads\": 4}",
                "\"hidden_size\"", "32.5");
    expect_fail("bool_as_int", "{" BASE_KEYS_NKV ", \"tie_word_embeddings\": 1}",
                "\"tie_word_embeddings\"", "true or false");
    expect_fail("missing_required",
                "{\"vocab_size\": 128, \"hidden_size\": 32, \"num_hidden_layers\": 2, "
                "\"num_attention_heads\": 4}",
                "\"intermediate_size\"", "missing");
    expect_fail("null_required",
                "{\"vocab_size\": null, \"hidden_size\": 32, "
                "\"intermediate_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 4}",
                "\"vocab_size\"", "missing");
    expect_fail("zero_vocab",
                "{\"vocab_size\": 0, \"hidden_size\": 32, \"intermediate_size\": 64, "
                "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 4}",
                "\"vocab_size\"", "expected a positive integer, found 0");
    expect_fail("negative_layers",
                "{\"vocab_size\": 8, \"hidden_size\": 32, "
                "\"intermediate_size\": 64, \"num_hidden_layers\": -2, \"num_attention_heads\": 4, "
                "\"num_key_value_heads\": 4}",
                "\"num_hidden_layers\"", "found -2");
    expect_fail("huge_int",
                "{\"vocab_size\": 1e12, \"hidden_size\": 32, "
                "\"intermediate_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 4}",
                "\"vocab_size\"", NULL);
    expect_fail("nh_nkv",
                "{\"vocab_size\": 128, \"hidden_size\": 32, \"intermediate_size\": 64, "
                "\"num_hidden_layers\": 2, \"num_attention_heads\": 16, "
                "\"num_key_value_heads\": 5, \"head_dim\": 8}",
                "key \"num_key_value_heads\": expected a positive integer dividing "
                "num_attention_heads (16), found 5",
                NULL);
    expect_fail("nkv_zero", "{" BASE_KEYS ", \"num_key_value_heads\": 0}",
                "\"num_key_value_heads\"", "found 0");
    expect_fail("odd_head_dim", "{" BASE_KEYS_NKV ", \"head_dim\": 7}", "\"head_dim\"", "found 7");
    expect_fail("odd_derived_head_dim",
                "{\"vocab_size\": 128, \"hidden_size\": 36, \"intermediate_size\": 64, "
                "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 4, "
                "\"head_dim\": null}",
                "\"head_dim\"", "found 9");
    expect_fail("rope_scaling",
                "{" BASE_KEYS_NKV ", \"rope_scaling\": {\"type\": \"yarn\", "
                "\"factor\": 4.0}}",
                "\"rope_scaling\"", "not supported");
    expect_fail("rope_parameters_yarn",
                "{" BASE_KEYS_NKV ", \"rope_parameters\": {\"rope_type\": "
                "\"yarn\", \"factor\": 4.0, \"rope_theta\": 10000}}",
                "\"rope_parameters\"", "not supported");
    expect_fail("rope_theta_conflict",
                "{" BASE_KEYS_NKV ", \"rope_theta\": 10000, "
                "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 1000000}}",
                "\"rope_parameters\"", "disagrees");
    expect_fail("sliding_window",
                "{" BASE_KEYS_NKV ", \"use_sliding_window\": true, "
                "\"sliding_window\": 4096}",
                "\"use_sliding_window\"", "sliding-window attention is not supported");
    expect_fail("layer_types_sliding",
                "{" BASE_KEYS_NKV ", \"layer_types\": [\"full_attention\", "
                "\"sliding_attention\"]}",
                "\"layer_types\"", "layer 1");
    expect_fail("moe_architecture",
                "{" BASE_KEYS_NKV ", \"architectures\": "
                "[\"Qwen3MoeForCausalLM\"], \"model_type\": \"qwen3_moe\"}",
                "\"architectures\"", "not supported yet (MoE arrives in a later release)");
    expect_fail("moe_model_type", "{" BASE_KEYS_NKV ", \"model_type\": \"qwen3_moe\"}",
                "\"model_type\"", "not supported yet (MoE arrives in a later release)");
    expect_fail("llama_model_type", "{" BASE_KEYS_NKV ", \"model_type\": \"llama\"}",
                "\"model_type\"", "unsupported model_type \"llama\"");
    expect_fail("llama_architecture",
                "{" BASE_KEYS_NKV ", \"architectures\": "
                "[\"LlamaForCausalLM\"]}",
                "\"architectures\"", "LlamaForCausalLM");
    expect_fail("architectures_type",
                "{" BASE_KEYS_NKV ", \"architectures\": \"Qwen3ForCausalLM\"}", "\"architectures\"",
                "array");
    expect_fail("gelu", "{" BASE_KEYS_NKV ", \"hidden_act\": \"gelu\"}", "\"hidden_act\"", "gelu");
    expect_fail("eps_zero", "{" BASE_KEYS_NKV ", \"rms_norm_eps\": 0}", "\"rms_norm_eps\"", NULL);
    expect_fail("theta_negative", "{" BASE_KEYS_NKV ", \"rope_theta\": -1}", "\"rope_theta\"",
                NULL);
    expect_fail("max_pos_zero", "{" BASE_KEYS_NKV ", \"max_position_embeddings\": 0}",
                "\"max_position_embeddings\"", NULL);

    // A file that does not exist.
    char path[4096];
    qwen3_config c;
    ct_error err = {{0}};
    snprintf(path, sizeof path, "%s/no_such_dir/config.json", tmp_dir);
    CHECK(qwen3_config_load(&c, path, &err) == -1 && strstr(err.msg, path), "missing file: %s",
          err.msg);
}

static void test_good_configs(void) {
    char path[4096];
    qwen3_config c;
    ct_error err = {{0}};
    // Only the required keys: everything else takes HF's default.
    int rc = load_text(&c, &err, "minimal",
                       "{\"vocab_size\": 128, \"hidden_size\": 32, \"intermediate_size\": 64, "
                       "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
                       "\"num_key_value_heads\": null, \"head_dim\": null}",
                       path, sizeof path);
    CHECK(rc == 0, "minimal: %s", err.msg);
    CHECK(c.num_key_value_heads == 4 && c.head_dim == 8 && c.rms_norm_eps == 1e-6f &&
              c.rope_theta == 10000.0 && c.max_position_embeddings == 32768 &&
              !c.tie_word_embeddings && !c.attention_bias,
          "minimal: defaults nkv %d hd %d eps %g theta %g maxpos %d tied %d bias %d",
          c.num_key_value_heads, c.head_dim, (double)c.rms_norm_eps, c.rope_theta,
          c.max_position_embeddings, c.tie_word_embeddings, c.attention_bias);

    // Absent sizes take transformers' class defaults: 32 kv heads, head_dim 128.
    rc = load_text(&c, &err, "absent_sizes",
                   "{\"vocab_size\": 128, \"hidden_size\": 32, \"intermediate_size\": 64, "
                   "\"num_hidden_layers\": 2, \"num_attention_heads\": 64}",
                   path, sizeof path);
    CHECK(rc == 0 && c.num_key_value_heads == 32 && c.head_dim == 128,
          "absent sizes: rc %d nkv %d hd %d (%s)", rc, c.num_key_value_heads, c.head_dim, err.msg);
    expect_fail("absent_nkv_not_dividing",
                "{\"vocab_size\": 128, \"hidden_size\": 32, \"intermediate_size\": 64, "
                "\"num_hidden_layers\": 2, \"num_attention_heads\": 4}",
                "\"num_key_value_heads\" is absent", "set it explicitly");

    // Qwen3-0.6B's config.json as published (informational keys and nulls included).
    rc =
        load_text(&c, &err, "qwen3_0.6b",
                  "{\n  \"architectures\": [\"Qwen3ForCausalLM\"],\n  \"attention_bias\": false,\n"
                  "  \"attention_dropout\": 0.0,\n  \"bos_token_id\": 151643,\n"
                  "  \"eos_token_id\": 151645,\n  \"head_dim\": 128,\n  \"hidden_act\": \"silu\",\n"
                  "  \"hidden_size\": 1024,\n  \"initializer_range\": 0.02,\n"
                  "  \"intermediate_size\": 3072,\n  \"max_position_embeddings\": 40960,\n"
                  "  \"max_window_layers\": 28,\n  \"model_type\": \"qwen3\",\n"
                  "  \"num_attention_heads\": 16,\n  \"num_hidden_layers\": 28,\n"
                  "  \"num_key_value_heads\": 8,\n  \"rms_norm_eps\": 1e-06,\n"
                  "  \"rope_scaling\": null,\n  \"rope_theta\": 1000000,\n"
                  "  \"sliding_window\": null,\n  \"tie_word_embeddings\": true,\n"
                  "  \"torch_dtype\": \"bfloat16\",\n  \"transformers_version\": \"4.51.0\",\n"
                  "  \"use_cache\": true,\n  \"use_sliding_window\": false,\n"
                  "  \"vocab_size\": 151936\n}\n",
                  path, sizeof path);
    CHECK(rc == 0, "qwen3_0.6b: %s", err.msg);
    CHECK(c.vocab_size == 151936 && c.hidden_size == 1024 && c.intermediate_size == 3072 &&
              c.num_hidden_layers == 28 && c.num_attention_heads == 16 &&
              c.num_key_value_heads == 8 && c.head_dim == 128 &&
              c.max_position_embeddings == 40960 && c.rms_norm_eps == 1e-6f &&
              c.rope_theta == 1e6 && c.tie_word_embeddings && !c.attention_bias &&
              strcmp(c.torch_dtype, "bfloat16") == 0,
          "qwen3_0.6b: fields wrong");

    // transformers 5 writes rope_parameters and "dtype" instead of rope_theta / torch_dtype.
    rc = load_text(&c, &err, "transformers5",
                   "{" BASE_KEYS_NKV ", \"rope_parameters\": {\"rope_type\": \"default\", "
                   "\"rope_theta\": 500000.0}, \"dtype\": \"float16\", \"layer_types\": "
                   "[\"full_attention\", \"full_attention\"], \"some_future_key\": [1, {}]}",
                   path, sizeof path);
    CHECK(rc == 0 && c.rope_theta == 500000.0 && strcmp(c.torch_dtype, "float16") == 0,
          "transformers5: rc %d theta %g dtype %s %s", rc, c.rope_theta, c.torch_dtype,
          rc ? err.msg : "");

    // Save and load again: every field survives, including a non-default eps.
    qwen3_config a = c;
    a.rms_norm_eps = 1e-5f;
    a.attention_bias = true;
    a.tie_word_embeddings = true;
    a.num_key_value_heads = 2;
    a.head_dim = 6;
    snprintf(path, sizeof path, "%s/saved_config.json", tmp_dir);
    rc = qwen3_config_save(&a, path, &err);
    CHECK(rc == 0, "save: %s", err.msg);
    qwen3_config b;
    rc = qwen3_config_load(&b, path, &err);
    CHECK(rc == 0 && b.rms_norm_eps == a.rms_norm_eps && b.attention_bias &&
              b.tie_word_embeddings && b.num_key_value_heads == 2 && b.head_dim == 6 &&
              b.rope_theta == a.rope_theta && b.vocab_size == a.vocab_size &&
              strcmp(b.torch_dtype, a.torch_dtype) == 0,
          "save/load round trip: %s", rc ? err.msg : "fields differ");
    char *text = NULL;
    size_t len;
    if (file_read_all(&text, &len, path, 1 << 20, &err) == 0) {
        CHECK(strstr(text, "\"Qwen3ForCausalLM\"") && strstr(text, "\"qwen3\"") &&
                  strstr(text, "1e-05") && strstr(text, "\"rope_scaling\""),
              "saved config.json lacks what transformers needs:\n%s", text);
        free(text);
    }
    // Saving refuses an invalid config rather than writing it.
    a.num_key_value_heads = 5;
    rc = qwen3_config_save(&a, path, &err);
    CHECK(rc == -1 && strstr(err.msg, "\"num_key_value_heads\""), "save invalid: %s", err.msg);

    // qwen3_config_validate names its source for configs that come from elsewhere.
    qwen3_config v = b;
    v.head_dim = 0;
    rc = qwen3_config_validate(&v, "flavor debug", &err);
    CHECK(rc == -1 && strstr(err.msg, "flavor debug") && strstr(err.msg, "\"head_dim\""),
          "validate: %s", err.msg);
}

// ---- weights ------------------------------------------------------------------------------

// Writes model `m`'s tensors to `dir` (plus config.json), with one tensor left out (`drop`),
// one reshaped (`reshape`: its dims swapped), and optional extra entries.
static int write_altered(const qwen3_model *m, const char *dir, const char *drop,
                         const char *reshape, const st_entry *extra, int n_extra, ct_error *err) {
    st_entry *e = calloc((size_t)m->n_params + (size_t)n_extra + 1, sizeof *e);
    int n = 0;
    for (int i = 0; i < m->n_params; i++) {
        const qwen3_param *p = &m->params[i];
        if (drop && strcmp(p->name, drop) == 0) continue;
        e[n].name = p->name;
        e[n].data = m->param_mem + p->offset;
        e[n].ndim = p->ndim;
        for (int d = 0; d < p->ndim; d++) e[n].shape[d] = p->shape[d];
        if (reshape && strcmp(p->name, reshape) == 0 && p->ndim == 2) {
            e[n].shape[0] = p->shape[1];
            e[n].shape[1] = p->shape[0];
        }
        n++;
    }
    for (int i = 0; i < n_extra; i++) e[n++] = extra[i];
    char cfg[4096];
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    int rc = st_write_folder(dir, e, n, CT_F32, 0, err);
    if (rc == 0) rc = qwen3_config_save(&m->cfg, cfg, err);
    free(e);
    return rc;
}

static int load_dir(hf_load_report *rep, const char *dir, ct_error *err) {
    qwen3_model m;
    int rc = hf_load_folder(&m, rep, dir, NULL, err);
    if (rc == 0) qwen3_free(&m);
    return rc;
}

static void test_bad_weights(const char *variant, bool tied) {
    char hf[4096], dir[4096];
    ct_error err = {{0}};
    qwen3_model m;
    hf_load_report rep;
    snprintf(hf, sizeof hf, "%s/%s/hf", ref_dir, variant);
    int rc = hf_load_folder(&m, &rep, hf, NULL, &err);
    CHECK(rc == 0, "%s: %s", variant, err.msg);
    hf_report_free(&rep);
    if (rc != 0) return;

    // A missing tensor is fatal and listed.
    const char *gone = "model.layers.1.mlp.up_proj.weight";
    snprintf(dir, sizeof dir, "%s/%s_missing", tmp_dir, variant);
    rc = write_altered(&m, dir, gone, NULL, NULL, 0, &err);
    CHECK(rc == 0, "%s", err.msg);
    rc = load_dir(&rep, dir, &err);
    CHECK(rc == -1 && rep.n_missing == 1 && rep.missing && strcmp(rep.missing[0], gone) == 0 &&
              strstr(err.msg, gone) && strstr(err.msg, "missing") && strstr(err.msg, dir),
          "%s missing tensor: rc %d n_missing %d: %s", variant, rc, rep.n_missing, err.msg);
    printf("%-22s %s\n", "missing_tensor", err.msg);
    hf_report_free(&rep);

    // A transposed gate_proj (F, C), never square here: the error names it with both shapes.
    const char *bad = "model.layers.0.mlp.gate_proj.weight";
    const qwen3_param *q = qwen3_find_param(&m, bad);
    snprintf(dir, sizeof dir, "%s/%s_shape", tmp_dir, variant);
    rc = write_altered(&m, dir, NULL, bad, NULL, 0, &err);
    CHECK(rc == 0, "%s", err.msg);
    rc = load_dir(&rep, dir, &err);
    char want[128];
    snprintf(want, sizeof want, "expected shape [%lld, %lld], found [%lld, %lld]",
             (long long)q->shape[0], (long long)q->shape[1], (long long)q->shape[1],
             (long long)q->shape[0]);
    CHECK(rc == -1 && strstr(err.msg, bad) && strstr(err.msg, want) && strstr(err.msg, dir),
          "%s wrong shape: rc %d: %s (wanted '%s')", variant, rc, err.msg, want);
    printf("%-22s %s\n", "wrong_shape", err.msg);
    hf_report_free(&rep);

    // lm_head: missing is fatal when untied; present when tied is only unexpected.
    static const float zeros[4096];
    st_entry extra[2] = {{.name = "model.layers.0.self_attn.rotary_emb.inv_freq",
                          .data = zeros,
                          .ndim = 1,
                          .shape = {m.cfg.head_dim / 2}},
                         {.name = "lm_head.weight",
                          .data = m.w.embed,
                          .ndim = 2,
                          .shape = {m.cfg.vocab_size, m.cfg.hidden_size}}};
    snprintf(dir, sizeof dir, "%s/%s_lm_head", tmp_dir, variant);
    if (tied) {
        rc = write_altered(&m, dir, NULL, NULL, extra, 2, &err);
        CHECK(rc == 0, "%s", err.msg);
        rc = load_dir(&rep, dir, &err);
        CHECK(rc == 0 && rep.n_missing == 0 && rep.n_unexpected == 2 &&
                  strcmp(rep.unexpected[0], "lm_head.weight") == 0 &&
                  strcmp(rep.unexpected[1], extra[0].name) == 0,
              "%s tied + lm_head on disk: rc %d unexpected %d: %s", variant, rc, rep.n_unexpected,
              rc ? err.msg : "");
    } else {
        rc = write_altered(&m, dir, "lm_head.weight", NULL, extra, 1, &err);
        CHECK(rc == 0, "%s", err.msg);
        rc = load_dir(&rep, dir, &err);
        CHECK(rc == -1 && rep.n_missing == 1 && strstr(err.msg, "lm_head.weight") &&
                  rep.n_unexpected == 1 && strcmp(rep.unexpected[0], extra[0].name) == 0,
              "%s untied without lm_head: rc %d missing %d unexpected %d: %s", variant, rc,
              rep.n_missing, rep.n_unexpected, err.msg);
    }
    hf_report_free(&rep);

    // A tensor of a dtype that is not a float: the error names tensor and dtype. Written by
    // hand, since our writer only writes floats.
    snprintf(dir, sizeof dir, "%s/%s_int.safetensors", tmp_dir, variant);
    char header[256];
    int C = m.cfg.hidden_size;
    int hl = snprintf(header, sizeof header,
                      "{\"model.norm.weight\":{\"dtype\":\"I32\",\"shape\":[%d],"
                      "\"data_offsets\":[0,%d]}}",
                      C, 4 * C);
    while (hl % 8) header[hl++] = ' '; // keep the data 8-byte aligned; the dtype is the fault
    FILE *f = fopen(dir, "wb");
    uint64_t n8 = (uint64_t)hl;
    fwrite(&n8, 8, 1, f);
    fwrite(header, 1, (size_t)hl, f);
    fwrite(zeros, 4, (size_t)C, f);
    fclose(f);
    st_set s;
    rc = st_set_open(&s, dir, &err);
    CHECK(rc == 0, "%s", err.msg);
    if (rc == 0) {
        rc = hf_load_weights(&m, &rep, &s, dir, &err);
        CHECK(rc == -1 && strstr(err.msg, "model.norm.weight") && strstr(err.msg, "I32") &&
                  strstr(err.msg, dir),
              "I32 tensor: rc %d: %s", rc, err.msg);
        printf("%-22s %s\n", "int_dtype", err.msg);
        hf_report_free(&rep);
        st_set_close(&s);
    }

    // A folder without config.json names the file it looked for.
    snprintf(dir, sizeof dir, "%s/%s_noconfig", tmp_dir, variant);
    rc = write_altered(&m, dir, NULL, NULL, NULL, 0, &err);
    char cfg[8192];
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    unlink(cfg);
    rc = load_dir(&rep, dir, &err);
    CHECK(rc == -1 && strstr(err.msg, cfg), "no config.json: %s", err.msg);
    hf_report_free(&rep);
    qwen3_free(&m);
}

int main(void) {
    tmp_dir = check_env("CTITAN_TMP");
    ref_dir = check_env("CTITAN_REF_DIR");
    test_bad_configs();
    test_good_configs();
    test_bad_weights("mha_untied_f32", false);
    test_bad_weights("gqa2_bigvocab_tied_bf16", true);
    return check_summary();
}
