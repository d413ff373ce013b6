// `ctitan export` and its helpers (src/train/checkpoint_export.c, src/cli/cmd_export.c):
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
//  5. every CLI error exits 1 with one message naming the option or folder.
#include <sys/wait.h>

#include "ckpt_util.h"
#include "core/fs.h"
#include "io/json.h"
#include "io/npy.h"
#include "model/hf_adapter.h"
#include "train/checkpoint.h"
#include "train/checkpoint_internal.h"

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
    qwen3_init_random(m, seed);
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
    qwen3_forward(m, tokens, NULL, NULL);
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
    return check_summary();
}
