// `ctitan export` and its helpers (src/checkpoint/checkpoint_export.c, src/cli/cmd_export.c):
//  1. shard sizes and dtypes parse as HF spells them; bad ones are errors;
//  2. the tokenizer folder is found in a run's config.toml (tokenizer_path, else hf_path for
//     backend "hf", else the default), with TOML strings' escapes and comments;
//  3. the export round trip through the binary: from a folder of checkpoints (the newest, a
//     corrupt newer one skipped with a warning) or one step folder; F32, BF16 and F16, sharded
//     with an index or not; the result loads with hf_load_folder with no missing or unexpected
//     keys, in the asked dtype, with the checkpoint's values rounded to it; tokenizer files
//     copied byte for byte;
//  4. the exported folder gives the same logits in the PyTorch reference (tests/ref/hf_logits.py)
//     as in C (max abs 1e-4, test_parity's bound), and F32 logits equal the original model's;
//  5. every CLI error exits 1 with one message naming the option or folder;
//  6. config.json keeps every field of the source's that the model did not change (token ids,
//     unknown keys, transformers 5's "dtype", rope_parameters and num_local_experts), through
//     hf_save_folder, the trainer's checkpoints and last_save_in_hf, and `ctitan export`; the
//     source's generation_config.json is copied; a flavor's export names Qwen3's token ids;
//  7. last_save_in_hf with checkpoint.enable = false writes hf/ and no checkpoint folder;
//  8. what fuzzing the parsers found (fuzz/fuzz_hf_config.c, fuzz/fuzz_ckpt_state.c): a
//     qwen3_moe config.json without experts saves as itself, and saving is a fixed point; a
//     state.json whose time_s JSON reads as infinity is refused.
//  9. the streamed export (ckpt_export_hf_streaming, what `ctitan export` runs) of a checkpoint
//     with model.safetensors or with model shards of interleaved ranges writes ckpt_export_hf's
//     files byte for byte (F32, BF16, one file or sharded, tied, untied, MoE without its
//     expert_bias); a corrupt model shard is refused naming the file;
// 10. hf_load_weights_ranges gives the slices of hf_load_weights (F32 and BF16 sources, one file
//     or sharded), the same report and the same errors.
#include <dirent.h>
#include <sys/wait.h>

#include "ckpt_util.h"
#include "core/fs.h"
#include "io/json.h"
#include "io/npy.h"
#include "model/flavors.h"
#include "model/hf_adapter.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_internal.h"

#define LOGITS_MAX_ABS 1e-4
#define B 2
#define T 5

static const char *tmp_dir, *bin, *py, *src_dir;

static void test_parse(void) {
    static const struct {
        const char *text;
        uint64_t want;
    } ok[] = {{"0", 0},
              {"1000", 1000},
              {"500MB", 500000000ull},
              {"5GB", 5000000000ull},
              {"5gb", 5000000000ull},
              {"2GiB", 2ull << 30},
              {"10KiB", 10240},
              {"3TB", 3000000000000ull},
              {"7B", 7}};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        uint64_t v = 1;
        ct_error err = {{0}};
        CHECK(ckpt_parse_size(&v, ok[i].text, &err) == 0 && v == ok[i].want, "size '%s': %llu: %s",
              ok[i].text, (unsigned long long)v, err.msg);
    }
    static const char *const bad[] = {
        "", "GB", "5XB", "-1", "5 GB", "1.5GB", "99999999999999999999", "20000000000TB"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint64_t v;
        ct_error err = {{0}};
        CHECK(ckpt_parse_size(&v, bad[i], &err) == -1 && strstr(err.msg, "size '"),
              "size '%s' accepted", bad[i]);
    }
    const struct {
        const char *name;
        ct_dtype dt;
    } dts[] = {{"float32", CT_F32}, {"bfloat16", CT_BF16}, {"float16", CT_F16}};
    for (int i = 0; i < 3; i++) {
        ct_dtype dt;
        ct_error err = {{0}};
        CHECK(ckpt_parse_dtype(&dt, dts[i].name, &err) == 0 && dt == dts[i].dt, "dtype %s",
              dts[i].name);
    }
    ct_dtype dt;
    ct_error err = {{0}};
    CHECK(ckpt_parse_dtype(&dt, "int8", &err) == -1 && strstr(err.msg, "bfloat16"),
          "dtype int8 accepted: %s", err.msg);
}

static void test_tokenizer_dir(void) {
    static const struct {
        const char *toml, *want;
    } cases[] = {
        {"[model]\ntokenizer_path = \"tok/dir\"\n", "tok/dir"},
        {"[job]\ntokenizer_path = \"no\"\n[model]\n  tokenizer_path='lit\\eral' # c\n",
         "lit\\eral"},
        {"[model]\ntokenizer_path = \"a\\\"b\\\\c\\u00e9\\t\"\n", "a\"b\\c\xc3\xa9\t"},
        {"[ model ]\nbackend = \"hf\"\nhf_path = \"/m/qwen\"\ntokenizer_path = \"\"\n", "/m/qwen"},
        {"[model]\nbackend = \"native\"\nhf_path = \"/m/qwen\"\n", "assets/qwen3-tokenizer"},
        {"# tokenizer_path = \"x\"\n[model]\n# tokenizer_path = \"y\"\nflavor = \"0.6B\"\n",
         "assets/qwen3-tokenizer"},
        {"[model]\ntokenizer_path_x = \"no\"\ntokenizer_path = 3\n", "assets/qwen3-tokenizer"},
        {"[model]\ntokenizer_path = \"unterminated\n", "assets/qwen3-tokenizer"},
        {"[model]\ntokenizer_path = \"bad \\q escape\"\n", "assets/qwen3-tokenizer"},
        {"", "assets/qwen3-tokenizer"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char out[256];
        ckpt_tokenizer_dir(out, sizeof out, cases[i].toml);
        CHECK(strcmp(out, cases[i].want) == 0, "case %zu: got '%s', want '%s'", i, out,
              cases[i].want);
    }
    char out[64];
    ckpt_tokenizer_dir(out, sizeof out, NULL);
    CHECK(strcmp(out, "assets/qwen3-tokenizer") == 0, "NULL config: '%s'", out);
}

// Runs the binary with `args` (a shell fragment); returns its exit code, output in out.
static int run_cli(char *out, size_t cap, const char *args) {
    char cmd[8192], log[4096];
    snprintf(log, sizeof log, "%s/cli.log", tmp_dir);
    snprintf(cmd, sizeof cmd, "'%s' %s >'%s' 2>&1", bin, args, log);
    int status = system(cmd);
    char *text = NULL;
    size_t len = 0;
    ct_error err;
    out[0] = '\0';
    if (file_read_all(&text, &len, log, 1 << 20, &err) == 0) {
        snprintf(out, cap, "%s", text);
        free(text);
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// A model a trainer could have produced: random init, then norms and biases moved off 1 and 0.
static bool trained_like(qwen3_model *m, const qwen3_config *c, uint64_t seed) {
    ct_error err = {{0}};
    if (qwen3_init(m, c, NULL, &err) != 0) {
        CHECK(0, "qwen3_init: %s", err.msg);
        return false;
    }
    qwen3_init_random(m, seed, NULL);
    for (int i = 0; i < m->n_params; i++) {
        const qwen3_param *p = &m->params[i];
        if (p->ndim != 1) continue;
        for (size_t k = 0; k < p->numel; k++)
            m->param_mem[p->offset + k] += 2.0f * tiny_value(k + 31 * (size_t)i, seed);
    }
    return true;
}

static int save_ckpt(const qwen3_model *m, const char *root, int64_t step, const char *toml) {
    float *mom = calloc(m->num_params, sizeof(float));
    train_state st = {.step = step, .opt_step = step};
    ct_error err = {{0}};
    int rc = mom ? ckpt_save(root, m, mom, mom, m->num_params, &st, toml, &err) : -1;
    CHECK(rc == 0, "save %s step %lld: %s", root, (long long)step, err.msg);
    free(mom);
    return rc;
}

// C logits of m on the test tokens: (B, T, V), malloc'd.
static float *c_logits(qwen3_model *m, const int32_t *tokens) {
    ct_error err = {{0}};
    if (qwen3_plan(m, B, T, &err) != 0) {
        CHECK(0, "plan: %s", err.msg);
        return NULL;
    }
    qwen3_forward(m, &(qwen3_batch){.inputs = tokens}, NULL);
    size_t n = (size_t)B * T * m->cfg.vocab_size;
    float *out = malloc(n * sizeof *out);
    if (out) memcpy(out, m->logits, n * sizeof *out);
    return out;
}

// Checks an exported folder against the checkpoint's model `want` (values rounded to dt).
static void check_export(const char *out, const qwen3_model *want, ct_dtype dt, bool sharded,
                         const char *tok_dir, const char *tokens_npy, const int32_t *tokens,
                         const char *what) {
    qwen3_model h;
    hf_load_report rep;
    ct_error err = {{0}};
    int rc = hf_load_folder(&h, &rep, out, NULL, &err);
    CHECK(rc == 0, "%s: hf_load_folder: %s", what, err.msg);
    if (rc != 0) {
        hf_report_free(&rep);
        return;
    }
    CHECK(rep.n_missing == 0 && rep.n_unexpected == 0 && rep.n_loaded == want->n_params,
          "%s: loaded %d, missing %d, unexpected %d", what, rep.n_loaded, rep.n_missing,
          rep.n_unexpected);
    CHECK(rep.source_dtype == dt && !rep.mixed_dtypes, "%s: dtype %s", what,
          dtype_name(rep.source_dtype));
    CHECK(sharded ? rep.n_files > 1 : rep.n_files == 1, "%s: %d files", what, rep.n_files);
    char path[4300], src[4300];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", out);
    CHECK(file_exists_at(path) == sharded, "%s: index %s", what, sharded ? "missing" : "present");
    const char *torch_dt = dt == CT_BF16 ? "bfloat16" : dt == CT_F16 ? "float16" : "float32";
    CHECK(strcmp(h.cfg.torch_dtype, torch_dt) == 0 &&
              h.cfg.tie_word_embeddings == want->cfg.tie_word_embeddings &&
              h.cfg.num_hidden_layers == want->cfg.num_hidden_layers,
          "%s: config.json (torch_dtype %s)", what, h.cfg.torch_dtype);
    size_t bad = 0;
    for (size_t i = 0; i < want->num_params && h.num_params == want->num_params; i++) {
        float w = check_round_as(want->param_mem[i], dt);
        bad += memcmp(&w, &h.param_mem[i], sizeof w) != 0;
    }
    CHECK(h.num_params == want->num_params && bad == 0, "%s: %zu values differ", what, bad);
    static const char *const tok_files[] = {"tokenizer.json", "tokenizer_config.json"};
    for (int i = 0; i < 2 && tok_dir; i++) {
        snprintf(path, sizeof path, "%s/%s", out, tok_files[i]);
        snprintf(src, sizeof src, "%s/%s", tok_dir, tok_files[i]);
        CHECK(check_files_equal(path, src), "%s: %s not copied", what, tok_files[i]);
    }

    // Same logits in PyTorch as in C on the exported weights.
    float *mine = c_logits(&h, tokens);
    char logits_path[4300], cmd[16384];
    snprintf(logits_path, sizeof logits_path, "%s/logits_%s.f32", tmp_dir, what);
    snprintf(cmd, sizeof cmd, "'%s' '%s/tests/ref/hf_logits.py' '%s' '%s' %d %d '%s'", py, src_dir,
             out, tokens_npy, B, T, logits_path);
    rc = system(cmd);
    CHECK(rc == 0, "%s: hf_logits.py failed (%d)", what, rc);
    size_t n = (size_t)B * T * want->cfg.vocab_size;
    char *ref = NULL;
    size_t len = 0;
    if (rc == 0 && mine && file_read_all(&ref, &len, logits_path, 1 << 26, &err) == 0) {
        CHECK(len == n * sizeof(float), "%s: reference logits: %zu bytes", what, len);
        if (len == n * sizeof(float)) {
            double d = check_max_abs(mine, (const float *)ref, n);
            CHECK(d <= LOGITS_MAX_ABS, "%s: C vs PyTorch logits max abs %g", what, d);
        }
    }
    free(ref);
    free(mine);
    qwen3_free(&h);
    hf_report_free(&rep);
}

static void test_export(void) {
    char root[4096], tok[4096], out[4300], step3[4300], npy[4300], toml[8192], args[16384];
    char log[8192];
    snprintf(root, sizeof root, "%s/run/checkpoint", tmp_dir);
    snprintf(tok, sizeof tok, "%s/tok", tmp_dir);
    snprintf(step3, sizeof step3, "%s/step-3", root);
    fs_mkdirs(tok, NULL);
    snprintf(out, sizeof out, "%s/tokenizer.json", tok);
    write_file_text(out, "{\"version\": \"1.0\", \"model\": {\"type\": \"BPE\"}}\n");
    snprintf(out, sizeof out, "%s/tokenizer_config.json", tok);
    write_file_text(out, "{\"eos_token\": \"<|endoftext|>\"}\n");
    snprintf(toml, sizeof toml, "[model]\nbackend = \"native\"\ntokenizer_path = \"%s\"\n", tok);

    qwen3_config c = tiny_config(false, true, 2, 64);
    qwen3_model m3, m6;
    if (!trained_like(&m3, &c, 3) || !trained_like(&m6, &c, 6)) return;
    if (save_ckpt(&m3, root, 3, toml) != 0 || save_ckpt(&m6, root, 6, toml) != 0) return;

    int32_t tokens[B * T];
    int64_t tokens64[B * T];
    for (int i = 0; i < B * T; i++) tokens[i] = (int32_t)((i * 37 + 11) % c.vocab_size);
    for (int i = 0; i < B * T; i++) tokens64[i] = tokens[i];
    snprintf(npy, sizeof npy, "%s/tokens.npy", tmp_dir);
    ct_error err = {{0}};
    CHECK(npy_write(npy, tokens64, B * T, "<i4", &err) == 0, "npy_write: %s", err.msg);

    // The folder of checkpoints: the newest one, F32, one file.
    snprintf(out, sizeof out, "%s/hf_f32", tmp_dir);
    snprintf(args, sizeof args, "export --checkpoint '%s' --output '%s'", root, out);
    int rc = run_cli(log, sizeof log, args);
    CHECK(rc == 0 && strstr(log, "exported step 6") && strstr(log, "tokenizer: 2 file(s)"),
          "export f32: rc %d: %s", rc, log);
    if (rc == 0) {
        check_export(out, &m6, CT_F32, false, tok, npy, tokens, "f32");
        // F32 weights are the checkpoint's, bit for bit: so are the C logits.
        qwen3_model h;
        hf_load_report rep;
        if (hf_load_folder(&h, &rep, out, NULL, &err) == 0) {
            float *a = c_logits(&h, tokens), *b = c_logits(&m6, tokens);
            size_t n = (size_t)B * T * c.vocab_size;
            CHECK(a && b && memcmp(a, b, n * sizeof(float)) == 0,
                  "f32 export changes the C logits");
            free(a);
            free(b);
            qwen3_free(&h);
        }
        hf_report_free(&rep);
    }

    // One step folder, BF16, sharded.
    snprintf(out, sizeof out, "%s/hf_bf16", tmp_dir);
    snprintf(args, sizeof args,
             "export --checkpoint '%s' --output '%s' --dtype bfloat16 --max-shard-size 4KB", step3,
             out);
    rc = run_cli(log, sizeof log, args);
    CHECK(rc == 0 && strstr(log, "exported step 3") && strstr(log, "sharded"),
          "export bf16: rc %d: %s", rc, log);
    if (rc == 0) check_export(out, &m3, CT_BF16, true, tok, npy, tokens, "bf16");

    // A tied model as F16, the tokenizer given on the command line; a corrupt newer checkpoint
    // is skipped with a warning.
    qwen3_config ct = tiny_config(true, false, 2, 64);
    qwen3_model t1, t2;
    char troot[4096], t2dir[4300];
    snprintf(troot, sizeof troot, "%s/tied", tmp_dir);
    if (trained_like(&t1, &ct, 11) && trained_like(&t2, &ct, 12) &&
        save_ckpt(&t1, troot, 1, "[model]\n") == 0 && save_ckpt(&t2, troot, 2, "[model]\n") == 0) {
        snprintf(t2dir, sizeof t2dir, "%s/step-2/model.safetensors", troot);
        flip_byte(t2dir, file_size_at(t2dir) - 1);
        snprintf(out, sizeof out, "%s/hf_f16", tmp_dir);
        snprintf(args, sizeof args,
                 "export --checkpoint '%s' --output '%s' --dtype float16 --tokenizer '%s'", troot,
                 out, tok);
        rc = run_cli(log, sizeof log, args);
        CHECK(rc == 0 && strstr(log, "exported step 1") &&
                  strstr(log, "ctitan: warning: skipping checkpoint") && strstr(log, "XXH64"),
              "export f16: rc %d: %s", rc, log);
        if (rc == 0) check_export(out, &t1, CT_F16, false, tok, npy, tokens, "f16_tied");
        qwen3_free(&t1);
        qwen3_free(&t2);
    }

    // No tokenizer where the config says: a warning, and the model is still exported.
    snprintf(out, sizeof out, "%s/hf_notok", tmp_dir);
    snprintf(args, sizeof args, "export --checkpoint '%s' --output '%s' --tokenizer '%s/none'",
             step3, out, tmp_dir);
    rc = run_cli(log, sizeof log, args);
    CHECK(rc == 0 && strstr(log, "ctitan: warning: no tokenizer.json in"),
          "export without tokenizer: rc %d: %s", rc, log);
    snprintf(args, sizeof args, "%s/tokenizer.json", out);
    CHECK(!file_exists_at(args), "a tokenizer.json appeared from nowhere");

    // Errors: exit 1, one message naming the problem.
    const struct {
        const char *args, *want;
    } errors[] = {
        {"export --output x", "export needs --checkpoint"},
        {"export --checkpoint x", "export needs --output"},
        {"export --checkpoint '%s' --output o --dtype int8", "--dtype: dtype 'int8'"},
        {"export --checkpoint '%s' --output o --max-shard-size 5XB", "--max-shard-size: size"},
        {"export --checkpoint '%s' --output '%s'", "is the checkpoint folder itself"},
        {"export --checkpoint '%s/nothing_here' --output o", "no such folder"},
        {"export --checkpoint '%s/tok' --output o", "holds no complete step-N"},
        {"export --checkpoint x --output o --dtyp bfloat16", "did you mean --dtype"},
    };
    for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++) {
        char a[8192];
        const char *arg1 = i == 6 || i == 5 ? tmp_dir : step3;
        snprintf(a, sizeof a, errors[i].args, arg1, step3);
        rc = run_cli(log, sizeof log, a);
        int n_err = 0;
        for (const char *q = log; (q = strstr(q, "ctitan: error: ")); q++) n_err++;
        CHECK(rc == 1 && n_err == 1 && strstr(log, errors[i].want),
              "error case %zu (%s): rc %d: %s", i, errors[i].args, rc, log);
    }
    rc = run_cli(log, sizeof log, "export --help");
    CHECK(rc == 0 && strstr(log, "--max-shard-size") && strstr(log, "default: 5GB"),
          "export --help: rc %d: %s", rc, log);
    qwen3_free(&m3);
    qwen3_free(&m6);
}

// ---- config.json fields (6, 7) ---------------------------------------------------------------

// A transformers 4.x Qwen3 config.json with what the model does not read: token ids (an eos
// list), defaults changed from Qwen3Config's, and unknown keys, one with escapes in its name.
static const char dense_source[] =
    "{\n  \"architectures\": [\"Qwen3ForCausalLM\"],\n  \"attention_bias\": true,\n"
    "  \"attention_dropout\": 0.25,\n  \"bos_token_id\": 1,\n  \"eos_token_id\": [2, 3],\n"
    "  \"pad_token_id\": null,\n  \"head_dim\": 6,\n  \"hidden_act\": \"silu\",\n"
    "  \"hidden_size\": 16,\n  \"initializer_range\": 0.03,\n  \"intermediate_size\": 24,\n"
    "  \"max_position_embeddings\": 64,\n  \"max_window_layers\": 1,\n"
    "  \"model_type\": \"qwen3\",\n  \"num_attention_heads\": 4,\n  \"num_hidden_layers\": 2,\n"
    "  \"num_key_value_heads\": 2,\n  \"rms_norm_eps\": 1e-06,\n  \"rope_scaling\": null,\n"
    "  \"rope_theta\": 1000000.0,\n  \"sliding_window\": 4096,\n"
    "  \"tie_word_embeddings\": false,\n  \"torch_dtype\": \"bfloat16\",\n"
    "  \"transformers_version\": \"4.51.0\",\n  \"use_cache\": false,\n"
    "  \"use_sliding_window\": false,\n  \"vocab_size\": 64,\n"
    "  \"x_custom\": {\"nested\": [1, 2.5, \"three\", {\"four\": null}], \"n\": -7},\n"
    "  \"say \\\"hi\\\" \\\\ caf\\u00e9\": \"\\u00e9\\n\\t\",\n"
    "  \"x_tiny\": 1.2345678901234567e-300,\n  \"x_ulp\": [1.0000000000000002, 0.1, 1e999]\n}\n";

// A transformers 5 Qwen3-MoE config.json: "dtype", rope_parameters, num_local_experts.
static const char moe_source[] =
    "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"model_type\": \"qwen3_moe\", "
    "\"dtype\": \"bfloat16\", \"rope_parameters\": {\"rope_theta\": 1000000.0, \"rope_type\": "
    "\"default\"}, \"num_local_experts\": 4, \"num_experts_per_tok\": 2, "
    "\"moe_intermediate_size\": 8, \"decoder_sparse_step\": 1, \"mlp_only_layers\": [0], "
    "\"norm_topk_prob\": true, \"output_router_logits\": false, \"router_aux_loss_coef\": 0.001, "
    "\"vocab_size\": 64, \"hidden_size\": 16, \"intermediate_size\": 24, \"head_dim\": 6, "
    "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
    "\"max_position_embeddings\": 64, \"tie_word_embeddings\": false, \"bos_token_id\": 151643, "
    "\"eos_token_id\": 151645, \"transformers_version\": \"5.0.0\", \"x_unknown\": [true]}";

static const char generation_config[] =
    "{\n  \"bos_token_id\": 1,\n  \"do_sample\": true,\n  \"eos_token_id\": [2, 3],\n"
    "  \"temperature\": 0.6,\n  \"top_k\": 20\n}\n";

// JSON values equal, numbers exactly (cJSON_Compare allows a relative DBL_EPSILON).
static bool json_same(const cJSON *a, const cJSON *b) {
    if (!a || !b || (a->type & 0xFF) != (b->type & 0xFF)) return false;
    if (cJSON_IsNumber(a)) return a->valuedouble == b->valuedouble;
    if (cJSON_IsString(a)) return strcmp(a->valuestring, b->valuestring) == 0;
    if (!cJSON_IsArray(a) && !cJSON_IsObject(a)) return true; // null, true, false
    if (cJSON_GetArraySize(a) != cJSON_GetArraySize(b)) return false;
    const cJSON *x = a->child, *y = b->child;
    for (; x && y; x = x->next, y = y->next) {
        const cJSON *other = cJSON_IsObject(a) ? cJSON_GetObjectItemCaseSensitive(b, x->string) : y;
        if (!json_same(x, other)) return false;
    }
    return true;
}

// out_dir/config.json has every field of `source` with an equal value (as JSON), except the
// dtype key(s), which must say `dtype`; it has none of the keys in `absent` (NULL-terminated).
static void check_config_kept(const char *out_dir, const char *source, const char *dtype,
                              const char *const *absent, const char *what) {
    char path[4300];
    snprintf(path, sizeof path, "%s/config.json", out_dir);
    cJSON *out = NULL, *src = cJSON_Parse(source);
    ct_error err = {{0}};
    if (!src || json_parse_file(&out, path, &err) != 0) {
        CHECK(0, "%s: %s", what, src ? err.msg : "the source does not parse");
        cJSON_Delete(src);
        return;
    }
    int lost = 0;
    char first[128] = "";
    const cJSON *it;
    cJSON_ArrayForEach(it, src) {
        const cJSON *o = cJSON_GetObjectItemCaseSensitive(out, it->string);
        const bool is_dtype = !strcmp(it->string, "torch_dtype") || !strcmp(it->string, "dtype");
        const bool kept =
            is_dtype ? cJSON_IsString(o) && !strcmp(o->valuestring, dtype) : json_same(it, o);
        if (!kept && !lost++) snprintf(first, sizeof first, "%s", it->string);
    }
    CHECK(lost == 0, "%s: %d field(s) of the source config.json lost or changed, first \"%s\"",
          what, lost, first);
    for (; absent && *absent; absent++)
        CHECK(!cJSON_GetObjectItemCaseSensitive(out, *absent), "%s: config.json has \"%s\"", what,
              *absent);
    cJSON_Delete(out);
    cJSON_Delete(src);
}

// The folder loads with no missing and no unexpected keys.
static void check_loads_clean(const char *dir, const char *what) {
    qwen3_model h;
    hf_load_report rep;
    ct_error err = {{0}};
    int rc = hf_load_folder(&h, &rep, dir, NULL, &err);
    CHECK(rc == 0 && rep.n_missing == 0 && rep.n_unexpected == 0,
          "%s: hf_load_folder: rc %d, missing %d, unexpected %d: %s", what, rc, rep.n_missing,
          rep.n_unexpected, err.msg);
    if (rc == 0) qwen3_free(&h);
    hf_report_free(&rep);
}

// An HF folder: `config_text` as its config.json, weights from a random model of that config.
static bool make_source(const char *dir, const char *config_text) {
    char path[4300];
    snprintf(path, sizeof path, "%s/config.json", dir);
    qwen3_config c;
    qwen3_model m;
    ct_error err = {{0}};
    int rc = fs_mkdirs(dir, &err) == 0 && write_file_text(path, config_text) ? 0 : -1;
    if (rc == 0) rc = qwen3_config_load(&c, path, &err);
    if (rc == 0 && trained_like(&m, &c, 21)) {
        rc = hf_save_folder(&m, dir, CT_BF16, 0, &err);
        qwen3_free(&m);
    }
    // The source is exactly the text, whatever the save wrote.
    rc = rc == 0 && write_file_text(path, config_text) ? 0 : -1;
    CHECK(rc == 0, "source folder %s: %s", dir, err.msg);
    return rc == 0;
}

// hf_load_folder + hf_save_folder: the library path.
static void test_config_kept_library(void) {
    char src[4096], out[4096];
    // A transformers 5 source gets none of transformers 4's keys.
    static const char *const moe_absent[] = {"torch_dtype",  "rope_theta",     "num_experts",
                                             "rope_scaling", "sliding_window", NULL};
    const struct {
        const char *name, *text, *const *absent;
    } cases[] = {{"dense", dense_source, NULL}, {"moe_tf5", moe_source, moe_absent}};
    for (int i = 0; i < 2; i++) {
        snprintf(src, sizeof src, "%s/src_%s", tmp_dir, cases[i].name);
        snprintf(out, sizeof out, "%s/out_%s", tmp_dir, cases[i].name);
        if (!make_source(src, cases[i].text)) continue;
        qwen3_model m;
        hf_load_report rep;
        ct_error err = {{0}};
        int rc = hf_load_folder(&m, &rep, src, NULL, &err);
        if (rc == 0) rc = hf_save_folder(&m, out, CT_F16, 0, &err);
        CHECK(rc == 0, "%s: %s", cases[i].name, err.msg);
        if (rc == 0) {
            check_config_kept(out, cases[i].text, "float16", cases[i].absent, cases[i].name);
            check_loads_clean(out, cases[i].name);
            qwen3_free(&m);
        }
        hf_report_free(&rep);
    }
}

static int train_cli(char *log, size_t cap, const char *hf, const char *tokens, const char *dump,
                     bool checkpoints) {
    char args[16384];
    snprintf(args, sizeof args,
             "train --model.backend hf --model.hf_path '%s' --training.dataset_path '%s' "
             "--training.steps 2 --training.seq_len 8 --training.local_batch_size 2 "
             "--metrics.log_freq 1 --metrics.peak_gflops 100 --job.dump_folder '%s' "
             "--checkpoint.enable %s --checkpoint.last_save_in_hf true "
             "--checkpoint.export_dtype float16",
             hf, tokens, dump, checkpoints ? "true" : "false");
    return run_cli(log, cap, args);
}

// The trainer (its checkpoint and last_save_in_hf) and `ctitan export` keep the fields too,
// and copy the source's generation_config.json; without checkpoints the export still runs.
static void test_config_kept_cli(void) {
    char src[4096], npy[4096], dump[4096], path[8400], out[4096], args[16384], log[8192];
    snprintf(src, sizeof src, "%s/src_cli", tmp_dir);
    snprintf(npy, sizeof npy, "%s/tokens64.npy", tmp_dir);
    if (!make_source(src, dense_source)) return;
    snprintf(path, sizeof path, "%s/generation_config.json", src);
    write_file_text(path, generation_config);
    int64_t tok[200];
    for (int i = 0; i < 200; i++) tok[i] = (i * 29 + 7) % 64;
    ct_error err = {{0}};
    CHECK(npy_write(npy, tok, 200, "<i4", &err) == 0, "npy_write: %s", err.msg);

    snprintf(dump, sizeof dump, "%s/run_kept", tmp_dir);
    int rc = train_cli(log, sizeof log, src, npy, dump, true);
    CHECK(rc == 0, "train: rc %d: %s", rc, log);
    snprintf(path, sizeof path, "%s/checkpoint/step-2", dump);
    check_config_kept(path, dense_source, "float32", NULL, "checkpoint");
    snprintf(path, sizeof path, "%s/hf", dump);
    check_config_kept(path, dense_source, "float16", NULL, "last_save_in_hf");
    check_loads_clean(path, "last_save_in_hf");
    char gen_src[4300], gen_out[8500];
    snprintf(gen_src, sizeof gen_src, "%s/generation_config.json", src);
    snprintf(gen_out, sizeof gen_out, "%s/generation_config.json", path);
    CHECK(check_files_equal(gen_out, gen_src), "last_save_in_hf: generation_config.json");

    snprintf(out, sizeof out, "%s/exported_kept", tmp_dir);
    snprintf(args, sizeof args,
             "export --checkpoint '%s/checkpoint' --output '%s' --dtype bfloat16", dump, out);
    rc = run_cli(log, sizeof log, args);
    CHECK(rc == 0, "export: rc %d: %s", rc, log);
    check_config_kept(out, dense_source, "bfloat16", NULL, "export");
    check_loads_clean(out, "export");
    snprintf(gen_out, sizeof gen_out, "%s/generation_config.json", out);
    CHECK(check_files_equal(gen_out, gen_src), "export: generation_config.json");

    // checkpoint.enable = false: the final export is not a checkpoint, so it still happens.
    snprintf(dump, sizeof dump, "%s/run_nockpt", tmp_dir);
    rc = train_cli(log, sizeof log, src, npy, dump, false);
    CHECK(rc == 0, "train without checkpoints, last_save_in_hf: rc %d: %s", rc, log);
    snprintf(path, sizeof path, "%s/hf", dump);
    check_config_kept(path, dense_source, "float16", NULL, "last_save_in_hf, no checkpoints");
    snprintf(path, sizeof path, "%s/checkpoint", dump);
    CHECK(!file_exists_at(path), "checkpoint.enable = false wrote %s", path);
}

// A flavor (no source config.json) with Qwen3's vocabulary exports Qwen3's token ids, through
// a checkpoint and `ctitan export` too; another vocabulary gets none.
static void test_config_flavor_ids(void) {
    qwen3_config c;
    ct_error err = {{0}};
    if (flavor_lookup(&c, "debugmodel", &err) != 0) {
        CHECK(0, "%s", err.msg);
        return;
    }
    // The flavor shrunk (model.* overrides) but for its vocabulary.
    c.num_hidden_layers = 1, c.hidden_size = 8, c.intermediate_size = 8;
    c.num_attention_heads = 2, c.num_key_value_heads = 1, c.head_dim = 4;
    qwen3_model m;
    if (!trained_like(&m, &c, 4)) return;
    char dir[4096], root[4096], args[16384], log[8192];
    snprintf(dir, sizeof dir, "%s/flavor_hf", tmp_dir);
    snprintf(root, sizeof root, "%s/flavor_ckpt", tmp_dir);
    static const char ids[] = "{\"bos_token_id\": 151643, \"eos_token_id\": 151645, "
                              "\"vocab_size\": 151936, \"model_type\": \"qwen3\"}";
    CHECK(hf_save_folder(&m, dir, CT_BF16, 0, &err) == 0, "flavor save: %s", err.msg);
    check_config_kept(dir, ids, "bfloat16", NULL, "flavor");
    check_loads_clean(dir, "flavor");
    if (save_ckpt(&m, root, 1, "[model]\n") == 0) {
        snprintf(dir, sizeof dir, "%s/flavor_exported", tmp_dir);
        snprintf(args, sizeof args, "export --checkpoint '%s' --output '%s'", root, dir);
        int rc = run_cli(log, sizeof log, args);
        CHECK(rc == 0, "flavor export: rc %d: %s", rc, log);
        check_config_kept(dir, ids, "float32", NULL, "flavor via checkpoint");
        check_loads_clean(dir, "flavor via checkpoint");
    }
    qwen3_free(&m);

    qwen3_config small = tiny_config(true, false, 1, 64);
    static const char *const no_ids[] = {"bos_token_id", "eos_token_id", NULL};
    if (trained_like(&m, &small, 5)) {
        snprintf(dir, sizeof dir, "%s/small_vocab_hf", tmp_dir);
        CHECK(hf_save_folder(&m, dir, CT_F32, 0, &err) == 0, "small save: %s", err.msg);
        check_config_kept(dir, "{\"vocab_size\": 64}", "float32", no_ids, "vocab 64");
        qwen3_free(&m);
    }
}

// ---- found by fuzzing (8) ------------------------------------------------------------------

// A qwen3_moe config with num_experts 0 is a dense model; it saves as its own class with its
// MoE keys, and saving what was saved gives the same bytes.
static void test_config_moe_without_experts(void) {
    static const char text[] =
        "{\"model_type\": \"qwen3_moe\", \"num_experts\": 0, \"num_experts_per_tok\": 2, "
        "\"mlp_only_layers\": [0], \"vocab_size\": 64, \"hidden_size\": 16, "
        "\"intermediate_size\": 24, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
        "\"num_key_value_heads\": 2}";
    static qwen3_config a, b;
    char *t1 = NULL, *t2 = NULL;
    size_t n1 = 0, n2 = 0;
    ct_error err = {{0}};
    int rc = qwen3_config_parse(&a, text, sizeof text - 1, "moe0.json", &err);
    if (rc == 0) rc = qwen3_config_text(&t1, &n1, &a, "moe0.json", &err);
    if (rc == 0) rc = qwen3_config_parse(&b, t1, n1, "moe0.json", &err);
    if (rc == 0) rc = qwen3_config_text(&t2, &n2, &b, "moe0.json", &err);
    CHECK(rc == 0, "qwen3_moe without experts: %s", err.msg);
    if (rc == 0) {
        CHECK(a.num_experts == 0 && qwen3_num_sparse_layers(&a) == 0 && a.n_mlp_only_layers == 0,
              "qwen3_moe without experts: %d experts, %d sparse layers", a.num_experts,
              qwen3_num_sparse_layers(&a));
        CHECK(strstr(t1, "\"model_type\": \"qwen3_moe\"") &&
                  strstr(t1, "\"architectures\": [\"Qwen3MoeForCausalLM\"]") &&
                  strstr(t1, "\"mlp_only_layers\": [0]"),
              "qwen3_moe without experts saved as another class:\n%s", t1);
        CHECK(n1 == n2 && memcmp(t1, t2, n1) == 0, "saving the saved config changes it:\n%s\n%s",
              t1, t2);
    }
    free(t1);
    free(t2);
}

// cJSON reads 1e999 as infinity: a state.json with that time_s is refused (a save would write
// 0 back, and the metrics' times would be infinite).
static void test_state_time_infinite(void) {
    qwen3_config c = tiny_config(true, false, 1, 32);
    qwen3_model m;
    char root[4096], path[4300];
    snprintf(root, sizeof root, "%s/state_inf", tmp_dir);
    if (!trained_like(&m, &c, 9) || save_ckpt(&m, root, 1, "[model]\n") != 0) return;
    snprintf(path, sizeof path, "%s/step-1/state.json", root);
    char *text = NULL;
    size_t len = 0;
    ct_error err = {{0}};
    train_state st;
    if (file_read_all(&text, &len, path, 1 << 20, &err) == 0) {
        char *t = strstr(text, "\"time_s\":");
        char *end = t ? strchr(t, ',') : NULL;
        if (end) {
            char edited[1 << 16];
            snprintf(edited, sizeof edited, "%.*s\"time_s\": 1e999%s", (int)(t - text), text, end);
            write_file_text(path, edited);
        }
        CHECK(end, "%s has no time_s", path);
        free(text);
    }
    snprintf(path, sizeof path, "%s/step-1", root);
    int rc = ckpt_verify(path, &m, &st, &err);
    CHECK(rc != 0 && strstr(err.msg, "time_s") && strstr(err.msg, "finite"),
          "state.json with time_s 1e999: rc %d, time_s %g: %s", rc, st.time_s, err.msg);
    qwen3_free(&m);
}

// ---- streamed export and HF loads of ranges (9, 10) ------------------------------------------

// Folders a and b hold the same files, byte for byte.
static bool same_folders(const char *a, const char *b, const char *what) {
    DIR *d = opendir(a);
    int n_a = 0, n_b = 0;
    bool ok = d != NULL;
    for (struct dirent *e; d && (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char pa[8192], pb[8192];
        snprintf(pa, sizeof pa, "%s/%s", a, e->d_name);
        snprintf(pb, sizeof pb, "%s/%s", b, e->d_name);
        n_a++;
        if (!check_files_equal(pa, pb)) {
            CHECK(0, "%s: %s differs", what, e->d_name);
            ok = false;
        }
    }
    if (d) closedir(d);
    d = opendir(b);
    for (struct dirent *e; d && (e = readdir(d));) n_b += e->d_name[0] != '.';
    if (d) closedir(d);
    CHECK(n_a == n_b && n_a > 0, "%s: %d files against %d", what, n_a, n_b);
    return ok && n_a == n_b;
}

// A tiny Qwen3-MoE: layer 0 dense, layer 1 with 4 experts (and their expert_bias buffer).
static qwen3_config moe_config(void) {
    qwen3_config c = tiny_config(false, false, 2, 40);
    c.num_experts = 4, c.num_experts_per_tok = 2, c.moe_intermediate_size = 6;
    c.decoder_sparse_step = 1, c.norm_topk_prob = true;
    c.n_mlp_only_layers = 1, c.mlp_only_layers[0] = 0;
    c.router_aux_loss_coef = 0.001;
    return c;
}

// Rank r of 3 holds every third block of 97 elements: interleaved pieces, as FSDP's units.
static int interleaved(ckpt_range *out, size_t n, int r) {
    int k = 0;
    for (size_t lo = 97 * (size_t)r; lo < n; lo += 3 * 97)
        out[k++] = (ckpt_range){lo, lo + 97 < n ? lo + 97 : n};
    return k;
}

// A checkpoint of m whose model is in 3 model shards of interleaved ranges.
static int save_sharded_model(const qwen3_model *m, const char *root, int64_t step) {
    enum { P = 3 };
    size_t n = m->num_params;
    int max = (int)(n / 97 / P + 2), counts[P];
    ckpt_range *ranges[P];
    ckpt_shard_info opt[P], mod[P];
    float *buf = malloc((n + 1) * sizeof *buf), *mom = calloc(n + 1, sizeof *mom);
    ct_error err = {{0}};
    char tmp[4200];
    train_state st = {.step = step, .opt_step = step};
    int rc = buf && mom ? ckpt_begin(root, step, 77, &err) : -1;
    if (rc == 0) rc = ckpt_tmp_path(tmp, sizeof tmp, root, step, 77, &err);
    for (int r = 0; r < P; r++) ranges[r] = malloc((size_t)max * sizeof **ranges);
    for (int r = 0; r < P && rc == 0; r++) {
        counts[r] = interleaved(ranges[r], n, r);
        size_t k = 0;
        for (int i = 0; i < counts[r]; i++)
            for (uint64_t j = ranges[r][i].lo; j < ranges[r][i].hi; j++) buf[k++] = m->param_mem[j];
        rc = ckpt_write_shard(tmp, m, r, P, ranges[r], counts[r], buf, mom, mom, &opt[r], &mod[r],
                              &err);
    }
    if (rc == 0)
        rc = ckpt_commit_ranges(root, 77, m, opt, mod, P, (const ckpt_range *const *)ranges, counts,
                                &st, "[model]\n", &err);
    CHECK(rc == 0, "sharded-model save in %s: %s", root, err.msg);
    for (int r = 0; r < P; r++) free(ranges[r]);
    free(buf);
    free(mom);
    return rc;
}

// ckpt_export_hf_streaming of a checkpoint (model.safetensors, or model shards) writes the files
// ckpt_export_hf writes from the model in memory, byte for byte: F32 and BF16, one file and
// sharded small, tied and untied, MoE (its expert_bias left out).
static void test_streaming_export(void) {
    char tok[4096], path[8192];
    snprintf(tok, sizeof tok, "%s/stream_tok", tmp_dir);
    fs_mkdirs(tok, NULL);
    snprintf(path, sizeof path, "%s/tokenizer.json", tok);
    write_file_text(path, "{\"model\": {\"type\": \"BPE\"}}\n");
    snprintf(path, sizeof path, "%s/generation_config.json", tok);
    write_file_text(path, "{\"eos_token_id\": 2}\n");
    const struct {
        const char *name;
        qwen3_config c;
    } models[] = {{"untied_bias", tiny_config(false, true, 2, 40)},
                  {"tied", tiny_config(true, false, 2, 40)},
                  {"moe", moe_config()}};
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        qwen3_model m;
        if (!tiny_model(&m, &models[i].c, 5 + i)) continue;
        char full[4096], sharded[4096], dirs[2][4300];
        snprintf(full, sizeof full, "%s/stream_%s_full", tmp_dir, models[i].name);
        snprintf(sharded, sizeof sharded, "%s/stream_%s_sharded", tmp_dir, models[i].name);
        snprintf(dirs[0], sizeof dirs[0], "%s/step-1", full);
        snprintf(dirs[1], sizeof dirs[1], "%s/step-2", sharded);
        if (save_ckpt(&m, full, 1, "[model]\n") != 0 || save_sharded_model(&m, sharded, 2) != 0) {
            qwen3_free(&m);
            continue;
        }
        const ct_dtype dts[2] = {CT_F32, CT_BF16};
        for (int d = 0; d < 2; d++) {
            for (int sh = 0; sh < 2; sh++) {
                uint64_t max_shard = sh ? 3000 : 0;
                char ref[4300], out[4300], what[160];
                ct_error err = {{0}};
                snprintf(ref, sizeof ref, "%s/stream_ref_%s_%d%d", tmp_dir, models[i].name, d, sh);
                int want = ckpt_export_hf(&m, ref, dts[d], max_shard, tok, &err);
                CHECK(want == 1, "%s: ckpt_export_hf: %d: %s", models[i].name, want, err.msg);
                for (int k = 0; k < 2; k++) {
                    snprintf(out, sizeof out, "%s/stream_%s_%d%d%d", tmp_dir, models[i].name, d, sh,
                             k);
                    snprintf(what, sizeof what, "%s %s%s from %s", models[i].name,
                             dtype_name(dts[d]), sh ? " sharded" : "",
                             k ? "model shards" : "model.safetensors");
                    int got = ckpt_export_hf_streaming(dirs[k], out, dts[d], max_shard, tok, &err);
                    CHECK(got == want, "%s: streaming export returned %d: %s", what, got, err.msg);
                    if (got == want) same_folders(ref, out, what);
                    if (sh) {
                        snprintf(path, sizeof path, "%s/model.safetensors.index.json", out);
                        CHECK(file_exists_at(path), "%s: not sharded", what);
                    }
                }
            }
        }
        // A corrupt model shard: the export refuses it, naming the file, and writes nothing.
        snprintf(path, sizeof path, "%s/model-00002-of-00003.safetensors", dirs[1]);
        flip_byte(path, file_size_at(path) - 3);
        char out[4300];
        snprintf(out, sizeof out, "%s/stream_%s_corrupt", tmp_dir, models[i].name);
        ct_error err = {{0}};
        CHECK(ckpt_export_hf_streaming(dirs[1], out, CT_F32, 0, tok, &err) == -1 &&
                  strstr(err.msg, "model-00002-of-00003.safetensors: XXH64") &&
                  !file_exists_at(out),
              "%s: corrupt shard exported: %s", models[i].name, err.msg);
        qwen3_free(&m);
    }
}

// hf_load_weights_ranges equals the slices of hf_load_weights, from F32 and BF16 folders, one
// file or sharded, with the same report; its errors are hf_load_weights'.
static void test_hf_load_ranges(void) {
    const qwen3_config cfgs[2] = {tiny_config(false, true, 2, 40), moe_config()};
    for (int ci = 0; ci < 2; ci++) {
        qwen3_model src;
        if (!tiny_model(&src, &cfgs[ci], 21 + (uint64_t)ci)) continue;
        size_t n = src.num_params;
        const qwen3_param *mid = &src.params[src.n_params / 2];
        // Across tensor boundaries, single elements, a whole tensor, the last element.
        const ckpt_range ranges[] = {
            {0, 1},
            {5, 700},
            {mid->offset - 3, mid->offset + 5},
            {mid->offset + mid->numel, mid->offset + mid->numel + 1},
            {mid->offset + mid->numel + 40, mid->offset + mid->numel + 340},
            {n - 2, n}};
        const int nr = sizeof ranges / sizeof ranges[0];
        size_t total = 0;
        for (int k = 0; k < nr; k++) total += ranges[k].hi - ranges[k].lo;
        for (int d = 0; d < 2; d++) {
            for (int sh = 0; sh < 2; sh++) {
                char dir[4300], what[96];
                ct_error err = {{0}};
                snprintf(dir, sizeof dir, "%s/hf_ranges_%d%d%d", tmp_dir, ci, d, sh);
                snprintf(what, sizeof what, "%s %s%s", ci ? "moe" : "dense", d ? "BF16" : "F32",
                         sh ? " sharded" : "");
                st_set set;
                qwen3_model full, layout;
                hf_load_report r1, r2;
                if (hf_save_folder(&src, dir, d ? CT_BF16 : CT_F32, sh ? 3000 : 0, &err) != 0 ||
                    st_set_open(&set, dir, &err) != 0) {
                    CHECK(0, "%s: %s", what, err.msg);
                    continue;
                }
                CHECK(!sh || set.n_files > 1, "%s: %d files", what, set.n_files);
                qwen3_init(&full, &cfgs[ci], NULL, &err);
                qwen3_init_layout(&layout, &cfgs[ci], &err);
                float *out = malloc(total * sizeof *out), *want = malloc(total * sizeof *want);
                int rc = hf_load_weights(&full, &r1, &set, dir, &err);
                CHECK(rc == 0, "%s: hf_load_weights: %s", what, err.msg);
                for (int k = 0, at = 0; k < nr; k++) {
                    memcpy(want + at, full.param_mem + ranges[k].lo,
                           (ranges[k].hi - ranges[k].lo) * sizeof(float));
                    at += (int)(ranges[k].hi - ranges[k].lo);
                }
                rc = hf_load_weights_ranges(&layout, &r2, &set, dir, ranges, nr, out, &err);
                CHECK(rc == 0 && memcmp(out, want, total * sizeof(float)) == 0,
                      "%s: ranges differ from the full load (rc %d: %s)", what, rc, err.msg);
                CHECK(r1.n_loaded == r2.n_loaded && r1.source_dtype == r2.source_dtype &&
                          r1.n_unexpected == r2.n_unexpected && r1.n_missing == r2.n_missing &&
                          r2.n_files == set.n_files,
                      "%s: reports differ", what);
                hf_report_free(&r1);
                hf_report_free(&r2);
                // The MoE expert_bias, a buffer the HF folder lacks, reads as 0 (the model's
                // value after qwen3_init), as in the full load.
                const qwen3_param *eb = qwen3_find_param(&layout, "model.layers.1.mlp.expert_bias");
                if (eb) {
                    const ckpt_range bias = {eb->offset - 1, eb->offset + eb->numel};
                    rc = hf_load_weights_ranges(&layout, &r2, &set, dir, &bias, 1, out, &err);
                    CHECK(rc == 0 &&
                              memcmp(out, full.param_mem + bias.lo,
                                     (bias.hi - bias.lo) * sizeof(float)) == 0 &&
                              out[1] == 0.0f && !signbit(out[1]),
                          "%s: expert_bias: rc %d: %s", what, rc, err.msg);
                    hf_report_free(&r2);
                }
                // The same errors: a 3-layer model misses layer 2, a 1-layer one finds extras.
                for (int layers = 1; layers <= 3; layers += 2) {
                    qwen3_config other = cfgs[ci];
                    other.num_hidden_layers = layers;
                    qwen3_model o, ol;
                    ct_error e1 = {{0}}, e2 = {{0}};
                    qwen3_init(&o, &other, NULL, &e1);
                    qwen3_init_layout(&ol, &other, &e2);
                    const ckpt_range one = {0, 10};
                    int a = hf_load_weights(&o, &r1, &set, dir, &e1);
                    int b = hf_load_weights_ranges(&ol, &r2, &set, dir, &one, 1, out, &e2);
                    CHECK(a == b && strcmp(e1.msg, e2.msg) == 0 &&
                              r1.n_unexpected == r2.n_unexpected && r1.n_missing == r2.n_missing,
                          "%s, %d layers: full %d (%s), ranges %d (%s)", what, layers, a, e1.msg, b,
                          e2.msg);
                    hf_report_free(&r1);
                    hf_report_free(&r2);
                    qwen3_free(&o);
                    qwen3_free(&ol);
                }
                free(out);
                free(want);
                qwen3_free(&full);
                qwen3_free(&layout);
                st_set_close(&set);
            }
        }
        qwen3_free(&src);
    }
}

int main(void) {
    tmp_dir = check_env("CTITAN_TMP");
    bin = check_env("CTITAN_BIN");
    py = check_env("CTITAN_PYTHON");
    src_dir = check_env("CTITAN_SOURCE_DIR");
    ckpt_rmtree(tmp_dir, NULL);
    fs_mkdirs(tmp_dir, NULL);
    test_parse();
    test_tokenizer_dir();
    test_export();
    test_config_kept_library();
    test_config_kept_cli();
    test_config_flavor_ids();
    test_config_moe_without_experts();
    test_state_time_infinite();
    test_streaming_export();
    test_hf_load_ranges();
    return check_summary();
}
