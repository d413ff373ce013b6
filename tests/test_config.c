// config.json parsing and HF weight loading: every rule has a bad input that must fail with a
// message naming the file and the key (or tensor), plus the good inputs that must pass:
// defaults, real Qwen3-0.6B and Qwen3-30B-A3B configs, informational keys, transformers 5's
// rope_parameters. Also the flavors, HF's sparse-layer rule, and the adapter's MoE save order
// and buffers on a hand-made parameter table.
#include <stdint.h>
#include <unistd.h>

#include "check.h"
#include "io/json.h"
#include "model/flavors.h"
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
    expect_fail("moe_arch_dense_type",
                "{" BASE_KEYS_NKV ", \"architectures\": "
                "[\"Qwen3MoeForCausalLM\"], \"model_type\": \"qwen3\"}",
                "keys \"architectures\" and \"model_type\" disagree",
                "\"Qwen3MoeForCausalLM\" expects model_type \"qwen3_moe\", found \"qwen3\"");
    expect_fail("dense_arch_moe_type",
                "{" BASE_KEYS_NKV ", \"architectures\": "
                "[\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3_moe\"}",
                "keys \"architectures\" and \"model_type\" disagree",
                "\"Qwen3ForCausalLM\" expects model_type \"qwen3\", found \"qwen3_moe\"");
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
        // A transformers 5 source: its rope_parameters, dtype and unknown keys are kept, and
        // transformers 4's rope_scaling is not added.
        CHECK(strstr(text, "\"Qwen3ForCausalLM\"") && strstr(text, "\"qwen3\"") &&
                  strstr(text, "1e-05") && !strstr(text, "\"rope_scaling\"") &&
                  strstr(text, "\"rope_parameters\": {\"rope_type\":\"default\"") &&
                  strstr(text, "\"dtype\": \"float16\"") &&
                  strstr(text, "\"some_future_key\": [1,{}]"),
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

// ---- mixture of experts -------------------------------------------------------------------

// Qwen3-30B-A3B's config.json as published.
static const char *const qwen3_30b_a3b_json =
    "{\n  \"architectures\": [\"Qwen3MoeForCausalLM\"],\n  \"attention_bias\": false,\n"
    "  \"attention_dropout\": 0.0,\n  \"bos_token_id\": 151643,\n  \"decoder_sparse_step\": 1,\n"
    "  \"eos_token_id\": 151645,\n  \"head_dim\": 128,\n  \"hidden_act\": \"silu\",\n"
    "  \"hidden_size\": 2048,\n  \"initializer_range\": 0.02,\n  \"intermediate_size\": 6144,\n"
    "  \"max_position_embeddings\": 40960,\n  \"max_window_layers\": 48,\n"
    "  \"mlp_only_layers\": [],\n  \"model_type\": \"qwen3_moe\",\n"
    "  \"moe_intermediate_size\": 768,\n  \"norm_topk_prob\": true,\n"
    "  \"num_attention_heads\": 32,\n  \"num_experts\": 128,\n  \"num_experts_per_tok\": 8,\n"
    "  \"num_hidden_layers\": 48,\n  \"num_key_value_heads\": 4,\n"
    "  \"output_router_logits\": false,\n  \"rms_norm_eps\": 1e-06,\n  \"rope_scaling\": null,\n"
    "  \"rope_theta\": 1000000.0,\n  \"router_aux_loss_coef\": 0.001,\n"
    "  \"sliding_window\": null,\n  \"tie_word_embeddings\": false,\n"
    "  \"torch_dtype\": \"bfloat16\",\n  \"transformers_version\": \"4.51.0\",\n"
    "  \"use_cache\": true,\n  \"use_sliding_window\": false,\n  \"vocab_size\": 151936\n}\n";

// The required keys of a small MoE config; cases add to them.
#define MOE_KEYS BASE_KEYS_NKV ", \"model_type\": \"qwen3_moe\""

// Every field, by name, so a difference says which.
static bool config_equal(const qwen3_config *a, const qwen3_config *b, const char *what) {
    int diffs = 0;
#define SAME(f)                                                                                    \
    do {                                                                                           \
        if (a->f != b->f) {                                                                        \
            diffs++;                                                                               \
            fprintf(stderr, "%s: field " #f " differs\n", what);                                   \
        }                                                                                          \
    } while (0)
    SAME(vocab_size);
    SAME(hidden_size);
    SAME(intermediate_size);
    SAME(num_hidden_layers);
    SAME(num_attention_heads);
    SAME(num_key_value_heads);
    SAME(head_dim);
    SAME(max_position_embeddings);
    SAME(rms_norm_eps);
    SAME(rope_theta);
    SAME(tie_word_embeddings);
    SAME(attention_bias);
    SAME(num_experts);
    SAME(num_experts_per_tok);
    SAME(moe_intermediate_size);
    SAME(decoder_sparse_step);
    SAME(n_mlp_only_layers);
    SAME(norm_topk_prob);
    SAME(output_router_logits);
    SAME(router_aux_loss_coef);
#undef SAME
    for (int i = 0; i < a->n_mlp_only_layers && i < QWEN3_MAX_MLP_ONLY; i++)
        if (a->mlp_only_layers[i] != b->mlp_only_layers[i]) {
            diffs++;
            fprintf(stderr, "%s: mlp_only_layers[%d] differs\n", what, i);
        }
    if (strcmp(a->torch_dtype, b->torch_dtype) != 0) {
        diffs++;
        fprintf(stderr, "%s: torch_dtype differs\n", what);
    }
    return diffs == 0;
}

static void test_moe_configs(void) {
    char path[4096];
    qwen3_config c;
    ct_error err = {{0}};
    int rc = load_text(&c, &err, "qwen3_30b_a3b", qwen3_30b_a3b_json, path, sizeof path);
    CHECK(rc == 0, "qwen3_30b_a3b: %s", err.msg);
    CHECK(c.vocab_size == 151936 && c.hidden_size == 2048 && c.intermediate_size == 6144 &&
              c.num_hidden_layers == 48 && c.num_attention_heads == 32 &&
              c.num_key_value_heads == 4 && c.head_dim == 128 &&
              c.max_position_embeddings == 40960 && c.rms_norm_eps == 1e-6f &&
              c.rope_theta == 1e6 && !c.tie_word_embeddings && !c.attention_bias &&
              strcmp(c.torch_dtype, "bfloat16") == 0,
          "qwen3_30b_a3b: dense fields wrong");
    CHECK(c.num_experts == 128 && c.num_experts_per_tok == 8 && c.moe_intermediate_size == 768 &&
              c.norm_topk_prob && c.decoder_sparse_step == 1 && c.n_mlp_only_layers == 0 &&
              c.router_aux_loss_coef == 0.001 && !c.output_router_logits,
          "qwen3_30b_a3b: MoE fields wrong");
    CHECK(qwen3_num_sparse_layers(&c) == 48, "30B-A3B: every layer sparse, got %d",
          qwen3_num_sparse_layers(&c));
    const qwen3_config a30 = c;

    // The 30B-A3B flavor is that file, but trains with the aux loss on.
    qwen3_config f;
    CHECK(flavor_lookup(&f, "30B-A3B", &err) == 0, "flavor 30B-A3B: %s", err.msg);
    CHECK(f.output_router_logits && f.router_aux_loss_coef == 0.001,
          "MoE flavors turn output_router_logits on");
    f.output_router_logits = false;
    CHECK(config_equal(&f, &a30, "flavor 30B-A3B vs config.json"), "flavor 30B-A3B");

    // Absent keys take Qwen3MoeConfig's defaults, which differ from Qwen3Config's for
    // num_key_value_heads (4, not 32) and head_dim (hidden / heads, not 128).
    rc = load_text(&c, &err, "moe_defaults",
                   "{" BASE_KEYS ", \"architectures\": [\"Qwen3MoeForCausalLM\"]}", path,
                   sizeof path);
    CHECK(rc == 0 && c.num_experts == 128 && c.num_experts_per_tok == 8 &&
              c.moe_intermediate_size == 768 && c.decoder_sparse_step == 1 && !c.norm_topk_prob &&
              !c.output_router_logits && c.router_aux_loss_coef == 0.001 &&
              c.n_mlp_only_layers == 0 && c.num_key_value_heads == 4 && c.head_dim == 8 &&
              c.max_position_embeddings == 32768 && c.rope_theta == 10000.0,
          "MoE defaults: rc %d E %d K %d Fm %d step %d nkv %d hd %d (%s)", rc, c.num_experts,
          c.num_experts_per_tok, c.moe_intermediate_size, c.decoder_sparse_step,
          c.num_key_value_heads, c.head_dim, rc ? err.msg : "");
    rc = load_text(&c, &err, "moe_nulls",
                   "{" MOE_KEYS ", \"mlp_only_layers\": null, \"head_dim\": null, "
                   "\"num_experts\": 4, \"num_experts_per_tok\": 4}",
                   path, sizeof path);
    CHECK(rc == 0 && c.n_mlp_only_layers == 0 && c.head_dim == 8 && c.num_experts == 4,
          "MoE nulls: %s", rc ? err.msg : "fields");
    expect_fail("moe_absent_nkv",
                "{\"vocab_size\": 128, \"hidden_size\": 48, \"intermediate_size\": 64, "
                "\"num_hidden_layers\": 2, \"num_attention_heads\": 6, \"model_type\": "
                "\"qwen3_moe\"}",
                "transformers' default (4) does not divide num_attention_heads (6)", NULL);
    // transformers 5 may write num_experts as num_local_experts.
    rc = load_text(&c, &err, "moe_local_experts",
                   "{" MOE_KEYS ", \"num_local_experts\": 16, \"num_experts_per_tok\": 2}", path,
                   sizeof path);
    CHECK(rc == 0 && c.num_experts == 16, "num_local_experts: %s", rc ? err.msg : "value");
    expect_fail("moe_local_disagree",
                "{" MOE_KEYS ", \"num_experts\": 8, \"num_local_experts\": 16, "
                "\"num_experts_per_tok\": 2}",
                "keys \"num_experts\" and \"num_local_experts\" disagree", "8 vs 16");
    // A dense config ignores the MoE keys.
    rc = load_text(&c, &err, "dense_with_moe_keys",
                   "{" BASE_KEYS_NKV ", \"model_type\": \"qwen3\", \"num_experts\": 8, "
                   "\"mlp_only_layers\": \"whatever\"}",
                   path, sizeof path);
    CHECK(rc == 0 && c.num_experts == 0 && qwen3_num_sparse_layers(&c) == 0,
          "dense ignores MoE keys: %s", rc ? err.msg : "num_experts set");
    // num_experts 0 in a qwen3_moe config is HF's all-dense model.
    rc = load_text(&c, &err, "moe_zero_experts", "{" MOE_KEYS ", \"num_experts\": 0}", path,
                   sizeof path);
    CHECK(rc == 0 && c.num_experts == 0, "num_experts 0: %s", err.msg);

    // Every MoE validation error names the file and the key, expected vs found.
    expect_fail("moe_topk_zero", "{" MOE_KEYS ", \"num_experts\": 8, \"num_experts_per_tok\": 0}",
                "\"num_experts_per_tok\"", "expected an integer in [1, num_experts = 8], found 0");
    expect_fail("moe_topk_big", "{" MOE_KEYS ", \"num_experts\": 8, \"num_experts_per_tok\": 9}",
                "\"num_experts_per_tok\"", "found 9");
    expect_fail("moe_negative_experts", "{" MOE_KEYS ", \"num_experts\": -2}", "\"num_experts\"",
                "expected 0 (dense) or a positive integer, found -2");
    expect_fail("moe_ffn_zero", "{" MOE_KEYS ", \"moe_intermediate_size\": 0}",
                "\"moe_intermediate_size\"", "expected a positive integer, found 0");
    expect_fail("moe_step_zero", "{" MOE_KEYS ", \"decoder_sparse_step\": 0}",
                "\"decoder_sparse_step\"", "expected a positive integer, found 0");
    expect_fail("moe_only_range", "{" MOE_KEYS ", \"mlp_only_layers\": [0, 2]}",
                "\"mlp_only_layers\"", "in [0, num_hidden_layers = 2), found 2");
    expect_fail("moe_only_negative", "{" MOE_KEYS ", \"mlp_only_layers\": [-1]}",
                "\"mlp_only_layers\"", "found -1");
    expect_fail("moe_only_duplicate", "{" MOE_KEYS ", \"mlp_only_layers\": [1, 0, 1]}",
                "\"mlp_only_layers\"", "distinct layer indices, found 1 twice");
    expect_fail("moe_only_type", "{" MOE_KEYS ", \"mlp_only_layers\": 1}", "\"mlp_only_layers\"",
                "expected an array of layer indices, found a number");
    expect_fail("moe_only_element", "{" MOE_KEYS ", \"mlp_only_layers\": [\"1\"]}",
                "\"mlp_only_layers\"", "an element that is a string");
    expect_fail("moe_only_fraction", "{" MOE_KEYS ", \"mlp_only_layers\": [0.5]}",
                "\"mlp_only_layers\"", "found 0.5");
    char many[4096];
    int n = snprintf(many, sizeof many, "{" MOE_KEYS ", \"mlp_only_layers\": [");
    for (int i = 0; i <= QWEN3_MAX_MLP_ONLY; i++)
        n += snprintf(many + n, sizeof many - (size_t)n, "%s%d", i ? "," : "", i);
    snprintf(many + n, sizeof many - (size_t)n, "]}");
    expect_fail("moe_only_too_many", many, "\"mlp_only_layers\"", "at most 256 entries, found 257");
    expect_fail("moe_aux_negative", "{" MOE_KEYS ", \"router_aux_loss_coef\": -0.1}",
                "\"router_aux_loss_coef\"", "expected a finite number >= 0, found -0.1");
    expect_fail("moe_aux_type", "{" MOE_KEYS ", \"router_aux_loss_coef\": \"0.1\"}",
                "\"router_aux_loss_coef\"", NULL);
    expect_fail("moe_norm_type", "{" MOE_KEYS ", \"norm_topk_prob\": 1}", "\"norm_topk_prob\"",
                "true or false");
    expect_fail("moe_logits_type", "{" MOE_KEYS ", \"output_router_logits\": \"yes\"}",
                "\"output_router_logits\"", NULL);
    expect_fail("moe_int_overflow", "{" MOE_KEYS ", \"moe_intermediate_size\": 30000000}",
                "\"moe_intermediate_size\"", "3 x moe_intermediate_size (30000000) x hidden_size");
    // What JSON cannot spell, for configs built in code.
    qwen3_config v = a30;
    v.router_aux_loss_coef = INFINITY;
    rc = qwen3_config_validate(&v, "flavor x", &err);
    CHECK(rc == -1 && strstr(err.msg, "flavor x: key \"router_aux_loss_coef\""), "inf aux: %s",
          err.msg);
    v = a30;
    v.n_mlp_only_layers = QWEN3_MAX_MLP_ONLY + 1;
    rc = qwen3_config_validate(&v, "flavor x", &err);
    CHECK(rc == -1 && strstr(err.msg, "\"mlp_only_layers\": expected at most 256"),
          "too many mlp_only: %s", err.msg);

    // Save -> load is the identity, field by field, and writes what transformers reads as
    // Qwen3MoeForCausalLM, keys sorted.
    qwen3_config s = a30;
    s.decoder_sparse_step = 2;
    s.n_mlp_only_layers = 2;
    s.mlp_only_layers[0] = 47;
    s.mlp_only_layers[1] = 3;
    s.output_router_logits = true;
    s.router_aux_loss_coef = 0.02;
    s.norm_topk_prob = false;
    snprintf(path, sizeof path, "%s/saved_moe_config.json", tmp_dir);
    rc = qwen3_config_save(&s, path, &err);
    CHECK(rc == 0, "save MoE: %s", err.msg);
    qwen3_config back;
    rc = qwen3_config_load(&back, path, &err);
    CHECK(rc == 0 && config_equal(&s, &back, "MoE save/load"), "MoE save/load: %s",
          rc ? err.msg : "fields differ");
    char *text = NULL;
    size_t len;
    if (file_read_all(&text, &len, path, 1 << 20, &err) == 0) {
        CHECK(strstr(text, "\"architectures\": [\"Qwen3MoeForCausalLM\"],") &&
                  strstr(text, "\"model_type\": \"qwen3_moe\",") &&
                  strstr(text, "\"mlp_only_layers\": [47,3],") &&
                  strstr(text, "\"num_experts\": 128,") &&
                  strstr(text, "\"num_experts_per_tok\": 8,") &&
                  strstr(text, "\"moe_intermediate_size\": 768,") &&
                  strstr(text, "\"decoder_sparse_step\": 2,") &&
                  strstr(text, "\"norm_topk_prob\": false,") &&
                  strstr(text, "\"output_router_logits\": true,") &&
                  strstr(text, "\"router_aux_loss_coef\": 0.02,"),
              "saved MoE config.json:\n%s", text);
        // Keys in sorted order: each line's key after the previous one's.
        char prev[64] = "";
        bool sorted = true;
        int keys = 0;
        for (const char *l = strstr(text, "\n  \""); l; l = strstr(l + 1, "\n  \"")) {
            char key[64];
            if (sscanf(l, "\n  \"%63[^\"]\"", key) != 1) continue;
            sorted = sorted && strcmp(prev, key) < 0;
            snprintf(prev, sizeof prev, "%s", key);
            keys++;
        }
        // The released file's 34 keys, its token ids and transformers_version among them.
        CHECK(sorted && keys == 34 && strstr(text, "\"eos_token_id\": 151645,") &&
                  strstr(text, "\"transformers_version\": \"4.51.0\","),
              "MoE config.json keys: %d, sorted %d:\n%s", keys, sorted, text);
        free(text);
    }
    // An empty mlp_only_layers is written as [] (Qwen3MoeConfig reads null as [] too).
    rc = qwen3_config_save(&a30, path, &err);
    text = NULL;
    if (rc == 0 && file_read_all(&text, &len, path, 1 << 20, &err) == 0) {
        CHECK(strstr(text, "\"mlp_only_layers\": [],"), "empty mlp_only_layers:\n%s", text);
        free(text);
    }
    CHECK(rc == 0 && qwen3_config_load(&back, path, &err) == 0 &&
              config_equal(&a30, &back, "30B-A3B save/load"),
          "30B-A3B save/load: %s", err.msg);
}

// HF's rule: sparse iff not in mlp_only_layers, num_experts > 0, (i+1) % step == 0.
static void test_sparse_layers(void) {
    qwen3_config c = {.num_hidden_layers = 6, .num_experts = 4, .decoder_sparse_step = 2};
    c.n_mlp_only_layers = 1;
    c.mlp_only_layers[0] = 3;
    char got[64] = "";
    for (int i = 0; i < c.num_hidden_layers; i++)
        if (qwen3_layer_is_sparse(&c, i))
            snprintf(got + strlen(got), sizeof got - strlen(got), "%d ", i);
    CHECK(strcmp(got, "1 5 ") == 0 && qwen3_num_sparse_layers(&c) == 2,
          "step 2, mlp_only [3], L 6: sparse %s(want 1 5)", got);
    c.decoder_sparse_step = 1;
    c.n_mlp_only_layers = 0;
    CHECK(qwen3_num_sparse_layers(&c) == 6, "step 1: all sparse");
    c.decoder_sparse_step = 7;
    CHECK(qwen3_num_sparse_layers(&c) == 0, "step past the last layer: none sparse");
    c.decoder_sparse_step = 1;
    c.num_experts = 0;
    CHECK(qwen3_num_sparse_layers(&c) == 0 && !qwen3_layer_is_sparse(&c, 0), "dense: none");
}

// Every flavor validates; the MoE ones carry their experts; names are suggested.
static void test_flavors(void) {
    const char *const *names;
    int n = flavor_names(&names), moe = 0;
    ct_error err = {{0}};
    for (int i = 0; i < n; i++) {
        qwen3_config c;
        CHECK(flavor_lookup(&c, names[i], &err) == 0 &&
                  qwen3_config_validate(&c, names[i], &err) == 0,
              "flavor %s: %s", names[i], err.msg);
        if (c.num_experts > 0) {
            moe++;
            CHECK(c.norm_topk_prob && c.decoder_sparse_step == 1 && c.n_mlp_only_layers == 0 &&
                      c.output_router_logits && c.router_aux_loss_coef == 0.001 &&
                      qwen3_num_sparse_layers(&c) == c.num_hidden_layers,
                  "MoE flavor %s", names[i]);
        } else {
            CHECK(c.num_experts_per_tok == 0 && c.moe_intermediate_size == 0,
                  "dense flavor %s has no MoE fields", names[i]);
        }
    }
    CHECK(moe == 3, "3 MoE flavors, found %d", moe);
    qwen3_config c;
    CHECK(flavor_lookup(&c, "debugmodel_moe", &err) == 0 && c.hidden_size == 128 &&
              c.num_hidden_layers == 4 && c.num_attention_heads == 4 &&
              c.num_key_value_heads == 2 && c.head_dim == 64 && c.intermediate_size == 512 &&
              c.num_experts == 8 && c.num_experts_per_tok == 2 && c.moe_intermediate_size == 128 &&
              !c.tie_word_embeddings && c.vocab_size == 151936,
          "debugmodel_moe");
    CHECK(flavor_lookup(&c, "235B-A22B", &err) == 0 && c.hidden_size == 4096 &&
              c.intermediate_size == 12288 && c.moe_intermediate_size == 1536 &&
              c.num_hidden_layers == 94 && c.num_attention_heads == 64 &&
              c.num_key_value_heads == 4 && c.head_dim == 128 && c.num_experts == 128 &&
              c.num_experts_per_tok == 8 && !c.tie_word_embeddings &&
              c.max_position_embeddings == 40960 && c.rope_theta == 1e6,
          "235B-A22B");
    CHECK(flavor_lookup(&c, "30B-A3", &err) == -1 && strstr(err.msg, "did you mean \"30B-A3B\""),
          "suggestion: %s", err.msg);
}

// A hand-made MoE parameter table (the model code builds the real one): enough for the
// adapter, which knows tensors only by name, shape and offset.
#define FAKE_E 12
typedef struct fake_moe {
    qwen3_model m;
    qwen3_param params[256];
} fake_moe;

static void fake_add(fake_moe *f, const char *name, bool buffer) {
    qwen3_param *p = &f->params[f->m.n_params++];
    snprintf(p->name, sizeof p->name, "%.95s", name);
    p->ndim = 1;
    p->shape[0] = 2;
    p->numel = 2;
    p->offset = f->m.num_params;
    p->buffer = buffer;
    f->m.num_params += 2;
}

static int name_cmp(const void *a, const void *b) {
    return strcmp((const char *)a, (const char *)b);
}

// The table in plain name order - the order that puts experts.10 before experts.2, and the
// router after the attention - so that the save order is the adapter's doing.
static void fake_moe_init(fake_moe *f) {
    memset(f, 0, sizeof *f);
    f->m.cfg = (qwen3_config){.vocab_size = 8,
                              .hidden_size = 4,
                              .intermediate_size = 8,
                              .num_hidden_layers = 2,
                              .num_attention_heads = 2,
                              .num_key_value_heads = 1,
                              .head_dim = 2,
                              .max_position_embeddings = 16,
                              .rms_norm_eps = 1e-6f,
                              .rope_theta = 1e6,
                              .num_experts = FAKE_E,
                              .num_experts_per_tok = 2,
                              .moe_intermediate_size = 2,
                              .decoder_sparse_step = 1,
                              .router_aux_loss_coef = 0.001};
    static char names[256][96];
    int n = 0;
    const char *attn[] = {"self_attn.q_proj.weight", "self_attn.k_proj.weight",
                          "self_attn.v_proj.weight", "self_attn.o_proj.weight",
                          "self_attn.q_norm.weight", "self_attn.k_norm.weight",
                          "input_layernorm.weight",  "post_attention_layernorm.weight",
                          "mlp.gate.weight",         "mlp.expert_bias"};
    const char *proj[] = {"gate_proj", "up_proj", "down_proj"};
    snprintf(names[n++], 96, "model.embed_tokens.weight");
    for (int l = 0; l < 2; l++) {
        for (int k = 0; k < 10; k++) snprintf(names[n++], 96, "model.layers.%d.%s", l, attn[k]);
        for (int e = 0; e < FAKE_E; e++)
            for (int k = 0; k < 3; k++)
                snprintf(names[n++], 96, "model.layers.%d.mlp.experts.%d.%s.weight", l, e, proj[k]);
    }
    snprintf(names[n++], 96, "model.norm.weight");
    snprintf(names[n++], 96, "lm_head.weight");
    qsort(names, (size_t)n, sizeof names[0], name_cmp);
    for (int i = 0; i < n; i++) fake_add(f, names[i], strstr(names[i], "expert_bias") != NULL);
    f->m.params = f->params;
    f->m.be = ct_backend_cpu();
    f->m.param_mem = calloc(f->m.num_params, sizeof(float));
    for (size_t i = 0; i < f->m.num_params; i++) f->m.param_mem[i] = (float)i;
}

// save_pretrained's order for the fake model: per layer attention, the router, experts by
// number, (the buffer, in checkpoints), the norms. Returns the count.
static int fake_save_order(char want[][96], bool buffers) {
    int n = 0;
    const char *attn[] = {"q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm"};
    const char *proj[] = {"gate_proj", "up_proj", "down_proj"};
    snprintf(want[n++], 96, "model.embed_tokens.weight");
    for (int l = 0; l < 2; l++) {
        for (int k = 0; k < 6; k++)
            snprintf(want[n++], 96, "model.layers.%d.self_attn.%s.weight", l, attn[k]);
        snprintf(want[n++], 96, "model.layers.%d.mlp.gate.weight", l);
        for (int e = 0; e < FAKE_E; e++)
            for (int k = 0; k < 3; k++)
                snprintf(want[n++], 96, "model.layers.%d.mlp.experts.%d.%s.weight", l, e, proj[k]);
        if (buffers) snprintf(want[n++], 96, "model.layers.%d.mlp.expert_bias", l);
        snprintf(want[n++], 96, "model.layers.%d.input_layernorm.weight", l);
        snprintf(want[n++], 96, "model.layers.%d.post_attention_layernorm.weight", l);
    }
    snprintf(want[n++], 96, "model.norm.weight");
    snprintf(want[n++], 96, "lm_head.weight");
    return n;
}

// Within a file tensors lie in name order; the save order shows in the sharding. Saved one
// tensor per shard, each tensor's shard number is its place in the order.
static void check_shard_order(const char *dir, char want[][96], int n, const char *what) {
    char file[8192];
    ct_error err = {{0}};
    snprintf(file, sizeof file, "%s/model.safetensors.index.json", dir);
    cJSON *index = NULL;
    if (json_parse_file(&index, file, &err) != 0) {
        CHECK(0, "%s: %s", what, err.msg);
        return;
    }
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(index, "weight_map"), *it;
    const char *order[256] = {0};
    int count = 0, shard, shards;
    cJSON_ArrayForEach(it, map) {
        if (cJSON_IsString(it) &&
            sscanf(it->valuestring, "model-%d-of-%d.safetensors", &shard, &shards) == 2 &&
            shard >= 1 && shard <= 256)
            order[shard - 1] = it->string;
        count++;
    }
    int first_bad = -1;
    for (int i = 0; i < n && first_bad < 0; i++)
        if (!order[i] || strcmp(order[i], want[i]) != 0) first_bad = i;
    CHECK(count == n && first_bad < 0,
          "%s: %d tensors (want %d); first difference at %d: %s (want %s)", what, count, n,
          first_bad, first_bad >= 0 && order[first_bad] ? order[first_bad] : "-",
          first_bad >= 0 ? want[first_bad] : "-");
    cJSON_Delete(index);
}

// Loads `dir` into the fake model and checks the report and the second layer's buffer.
static void check_fake_load(qwen3_model *m, const char *dir, int n_loaded, const float *bias,
                            float b0, float b1, const char *what) {
    ct_error err = {{0}};
    st_set set;
    hf_load_report rep;
    if (st_set_open(&set, dir, &err) != 0) {
        CHECK(0, "%s: %s", what, err.msg);
        return;
    }
    m->param_mem[0] = 99; // embed, overwritten by the load
    int rc = hf_load_weights(m, &rep, &set, dir, &err);
    CHECK(rc == 0 && rep.n_missing == 0 && rep.n_unexpected == 0 && rep.n_loaded == n_loaded &&
              bias[0] == b0 && bias[1] == b1 && m->param_mem[0] == 0,
          "%s: rc %d missing %d unexpected %d loaded %d (want %d) bias %g %g (want %g %g): %s",
          what, rc, rep.n_missing, rep.n_unexpected, rep.n_loaded, n_loaded, (double)bias[0],
          (double)bias[1], (double)b0, (double)b1, rc ? err.msg : "");
    hf_report_free(&rep);
    st_set_close(&set);
}

static void test_moe_adapter(void) {
    fake_moe *f = calloc(1, sizeof *f);
    fake_moe_init(f);
    qwen3_model *m = &f->m;
    static char want[256][96];
    char dir[4096];
    ct_error err = {{0}};
    float *bias = NULL;
    for (int i = 0; i < m->n_params; i++)
        if (strcmp(m->params[i].name, "model.layers.1.mlp.expert_bias") == 0 && m->params[i].buffer)
            bias = m->param_mem + m->params[i].offset;
    CHECK(bias != NULL, "the fake table has a buffer");
    if (!bias) {
        free(m->param_mem);
        free(f);
        return;
    }

    // An HF export: save_pretrained's order, no buffers.
    int n = fake_save_order(want, false);
    snprintf(dir, sizeof dir, "%s/moe_hf", tmp_dir);
    int rc = hf_save_folder(m, dir, CT_F32, 1, &err);
    CHECK(rc == 0, "save fake MoE: %s", err.msg);
    if (rc == 0) check_shard_order(dir, want, n, "HF save order");
    // Loading it: the buffers are not missing and keep their values.
    bias[0] = 7, bias[1] = -7;
    if (rc == 0) check_fake_load(m, dir, n, bias, 7, -7, "HF load without buffers");

    // A checkpoint's model has the buffers, after each layer's experts; they load back, and
    // are not unexpected.
    int nb = fake_save_order(want, true);
    snprintf(dir, sizeof dir, "%s/moe_ckpt", tmp_dir);
    bias[0] = 0.25f, bias[1] = -0.5f;
    rc = hf_save_folder_with_buffers(m, dir, CT_F32, 1, &err);
    CHECK(rc == 0 && nb == m->n_params, "save fake MoE with buffers: %s", err.msg);
    if (rc == 0) check_shard_order(dir, want, nb, "checkpoint save order");
    bias[0] = bias[1] = 0;
    if (rc == 0) check_fake_load(m, dir, nb, bias, 0.25f, -0.5f, "load with buffers");

    // A missing expert is still missing.
    st_entry e[256];
    const char *gone = "model.layers.0.mlp.experts.10.down_proj.weight";
    int w = 0;
    for (int i = 0; i < m->n_params; i++) {
        const qwen3_param *p = &m->params[i];
        if (strcmp(p->name, gone) != 0)
            e[w++] = (st_entry){
                .name = p->name, .data = m->param_mem + p->offset, .ndim = 1, .shape = {2}};
    }
    snprintf(dir, sizeof dir, "%s/moe_missing", tmp_dir);
    st_set set;
    hf_load_report rep;
    rc = st_write_folder(dir, e, w, CT_F32, 0, &err);
    if (rc == 0 && st_set_open(&set, dir, &err) == 0) {
        rc = hf_load_weights(m, &rep, &set, dir, &err);
        CHECK(rc == -1 && rep.n_missing == 1 && strstr(err.msg, gone),
              "missing expert: rc %d missing %d: %s", rc, rep.n_missing, err.msg);
        hf_report_free(&rep);
        st_set_close(&set);
    }
    free(m->param_mem);
    free(f);
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
    test_moe_configs();
    test_sparse_layers();
    test_flavors();
    test_moe_adapter();
    test_bad_weights("mha_untied_f32", false);
    test_bad_weights("gqa2_bigvocab_tied_bf16", true);
    return check_summary();
}
