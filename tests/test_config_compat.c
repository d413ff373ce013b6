// A torchtitan user's config: the TOML files of tests/torchtitan/ (every section and key of
// torchtitan's qwen3_0.6b.toml, qwen3_moe_debug.toml and the Transformers-backend
// debug_model.toml) load with their inert keys noted; inert keys at another value, aliases and
// their contradictions, hub ids, every problem of a file reported at once, --config NAME,
// --job.config_file, and the suggestions a torchtitan user needs.
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "config_test.h"
#include "train/config.h"

static const char *src_dir;

// config_load_noted with a NULL-terminated argv.
static int load(ct_config *c, config_notes *n, const char *toml, ct_error *err, ...) {
    va_list ap;
    va_start(ap, err);
    int rc = load_va(c, n, toml, err, ap);
    va_end(ap);
    return rc;
}

static int count_lines(const char *s) {
    int n = 1;
    for (; *s; s++) n += *s == '\n';
    return n;
}

static void test_torchtitan_files(void) {
    ct_config c;
    config_notes n;
    ct_error err;
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/torchtitan/qwen3_0.6b.toml", src_dir);
    int rc = load(&c, &n, path, &err, "--training.dataset_path", "d.txt", NULL);
    CHECK(rc == 0, "qwen3_0.6b.toml: %s", err.msg);
    CHECK(rc != 0 || (strcmp(c.model.flavor, "0.6B") == 0 &&
                      strcmp(c.model.tokenizer_path, "./assets/hf/Qwen3-0.6B") == 0 &&
                      strcmp(c.training.dataset, "c4") == 0 && c.training.steps == 10 &&
                      isnan(c.lr_scheduler.decay_ratio) && !c.checkpoint.last_save_in_hf),
          "qwen3_0.6b.toml values");
    // profiling x3, metrics x2, checkpoint.async_mode, compile x2, float8 x3
    // (tensor_parallel_degree and context_parallel_degree are ctitan keys now)
    CHECK(n.n_no_effect == 11 && strstr(n.no_effect, "quantize.linear.float8.filter_fqns") &&
              strstr(n.no_effect, "compile.enable"),
          "noted %d: %s", n.n_no_effect, n.no_effect);

    snprintf(path, sizeof path, "%s/tests/torchtitan/qwen3_moe_debug.toml", src_dir);
    rc = load(&c, &n, path, &err, "--training.dataset_path", "d.txt", NULL);
    CHECK(rc == 0, "qwen3_moe_debug.toml: %s", err.msg);
    CHECK(rc != 0 || strcmp(c.training.dataset, "c4") == 0, "[training.data] name is the dataset");

    snprintf(path, sizeof path, "%s/tests/torchtitan/transformers_debug_model.toml", src_dir);
    rc = load(&c, &n, path, &err, NULL);
    CHECK(rc != 0 && count_lines(err.msg) == 1 &&
              strstr(err.msg, "transformers_debug_model.toml:") &&
              strstr(err.msg, "\"Qwen/Qwen3-4B-Instruct-2507\" is a hub id") &&
              strstr(err.msg, "download it first"),
          "hub id: %s", err.msg);
    rc = load(&c, &n, path, &err, "--hf_transformers.model", tmp_dir, NULL);
    CHECK(rc == 0 && strcmp(c.model.backend, "hf") == 0 && strcmp(c.model.hf_path, tmp_dir) == 0,
          "transformers_modeling_backend on a folder is backend hf: %s", err.msg);
}

static void test_inert_keys(void) {
    ct_config c;
    config_notes n;
    ct_error err;
    const char *p = write_file("tp.toml", "[training]\ndataset_path = 'd'\n"
                                          "[metrics]\nenable_wandb = true\n");
    CHECK(load(&c, &n, p, &err, NULL) != 0 && strstr(err.msg, "tp.toml:4:") &&
              strstr(err.msg, "metrics.enable_wandb = true is a torchtitan setting") &&
              strstr(err.msg, "only false, which has no effect") &&
              strstr(err.msg, "nearest in ctitan: metrics.jsonl"),
          "non-neutral inert key: %s", err.msg);
    CHECK(load(&c, &n, p, &err, "--metrics.enable_wandb", "false", NULL) != 0,
          "the file's line is still an error when the command line repeats it neutrally");
    CHECK(load(&c, &n, NULL, &err, "--training.dataset_path", "d", "--compile.enable", "false",
               "--checkpoint.async_mode", "disabled", "--profiling.save_traces_folder", "x",
               NULL) == 0 &&
              n.n_no_effect == 3,
          "inert keys on the command line: %s / %d", err.msg, n.n_no_effect);
    CHECK(load(&c, &n, NULL, &err, "--training.dataset_path", "d", "--compile.enable", NULL) != 0 &&
              strstr(err.msg, "compile.enable = true"),
          "a bare inert flag means true, which is refused: %s", err.msg);
    // FSDP's key is ctitan's own now (it was an inert one): any of its values loads.
    CHECK(load(&c, &n, NULL, &err, "--training.dataset_path", "d",
               "--parallelism.fsdp_reshard_after_forward", "always", NULL) == 0 &&
              strcmp(c.parallelism.fsdp_reshard_after_forward, "always") == 0,
          "reshard always: %s", err.msg);
}

static void test_all_problems_at_once(void) {
    ct_config c;
    ct_error err;
    const char *p = write_file("many.toml", "[training]\ndataset_path = 'd'\nstpes = 3\n"
                                            "seq_len = 'long'\n[optimiser]\nlr = 1\n"
                                            "[compile]\nenable = true\n");
    int rc = load(&c, NULL, p, &err, "--model.nmae", "x", "--training.local_batch_size", "2",
                  "--training.warmup", "3", NULL);
    CHECK(rc != 0 && count_lines(err.msg) == 6, "6 problems, one line each:\n%s", err.msg);
    const char *want[] = {"many.toml:3: unknown key 'stpes' in [training] (did you mean steps?)",
                          "many.toml:4: training.seq_len: expected an integer",
                          "many.toml:5: unknown section [optimiser] (did you mean [optimizer]?)",
                          "many.toml:8: compile.enable = true is a torchtitan setting",
                          "unknown option --model.nmae (did you mean --model.name?)",
                          "unknown option --training.warmup (did you mean "
                          "--lr_scheduler.warmup_steps?)"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        CHECK(strstr(err.msg, want[i]), "lacks '%s':\n%s", want[i], err.msg);
}

static void test_aliases(void) {
    ct_config c;
    ct_error err;
    const char *p = write_file("assets.toml", "[model]\nhf_assets_path = '/hf/Qwen3-0.6B'\n"
                                              "[training]\ndataset_path = 'd'\n"
                                              "[checkpoint]\ninitial_load_in_hf = true\n");
    CHECK(load(&c, NULL, p, &err, NULL) == 0 &&
              strcmp(c.model.tokenizer_path, "/hf/Qwen3-0.6B") == 0 &&
              strcmp(c.checkpoint.initial_load_path, "/hf/Qwen3-0.6B") == 0,
          "hf_assets_path: tokenizer and initial load: %s", err.msg);
    CHECK(load(&c, NULL, p, &err, "--model.tokenizer_path", "/tok", NULL) == 0 &&
              strcmp(c.model.tokenizer_path, "/tok") == 0 &&
              strcmp(c.checkpoint.initial_load_path, "/hf/Qwen3-0.6B") == 0,
          "an explicit tokenizer_path wins: %s", err.msg);
    CHECK(load(&c, NULL, NULL, &err, "--training.dataset", "c4", NULL) != 0 &&
              strstr(err.msg, "training.dataset = \"c4\" names a hub data set") &&
              strstr(err.msg, "training.dataset_path"),
          "a dataset name alone: %s", err.msg);
    CHECK(load(&c, NULL, NULL, &err, "--training.dataset_path", "d", "--model.name", "llama3",
               NULL) != 0 &&
              strstr(err.msg, "model.name = \"llama3\": ctitan trains Qwen3"),
          "another model: %s", err.msg);
    CHECK(load(&c, NULL, NULL, &err, "--training.dataset_path", "d", "--model.name",
               "transformers_modeling_backend", "--hf_transformers.model", tmp_dir,
               "--model.backend", "native", NULL) != 0 &&
              strstr(err.msg, "contradicts"),
          "contradiction: %s", err.msg);
    CHECK(load(&c, NULL, NULL, &err, "--training.dataset_path", "d",
               "--checkpoint.last_save_model_only", "true", NULL) == 0 &&
              c.checkpoint.last_save_in_hf,
          "last_save_model_only is the final HF export: %s", err.msg);
    // The effective config reads back equal: resolved keys are written, the aliases beside them.
    char *text = NULL;
    size_t len = 0;
    load(&c, NULL, p, &err, NULL);
    FILE *f = open_memstream(&text, &len);
    config_write_toml(&c, f);
    fclose(f);
    const char *q = write_file("written.toml", text);
    ct_config back;
    CHECK(load(&back, NULL, q, &err, NULL) == 0 && memcmp(&back, &c, sizeof c) == 0,
          "aliases round trip: %s", err.msg);
    free(text);
}

static void test_config_by_name(void) {
    ct_config c;
    ct_error err;
    char cwd[1024];
    CHECK(getcwd(cwd, sizeof cwd) != NULL, "getcwd");
    CHECK(chdir(src_dir) == 0, "chdir");
    CHECK(load(&c, NULL, NULL, &err, "--config", "debugmodel", NULL) == 0 &&
              strcmp(c.model.flavor, "debugmodel") == 0,
          "--config debugmodel finds configs/debugmodel.toml: %s", err.msg);
    CHECK(load(&c, NULL, NULL, &err, "--job.config_file=configs/debugmodel.toml", NULL) == 0,
          "--job.config_file: %s", err.msg);
    CHECK(load(&c, NULL, NULL, &err, "--config", "no_such_recipe", NULL) != 0 &&
              strstr(err.msg, "no recipe configs/no_such_recipe.toml"),
          "unknown recipe: %s", err.msg);
    CHECK(chdir(cwd) == 0, "chdir back");
}

static void test_suggestions(void) {
    ct_config c;
    ct_error err;
    struct {
        const char *option, *want;
    } cases[] = {
        {"--training.dtype", "(did you mean --training.mixed_precision_param?)"},
        {"--model.nam", "(did you mean --model.name?)"},
        {"--optimizer.nam", "(did you mean --optimizer.name?)"},
        {"--profiling.enable_profilng", "(did you mean --profiling.enable_profiling?)"},
        {"--training.batch_size", "(did you mean --training.local_batch_size?)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = load(&c, NULL, NULL, &err, cases[i].option, "1", NULL);
        CHECK(rc != 0 && strstr(err.msg, cases[i].want), "%s: %s", cases[i].option, err.msg);
    }
    const char *p = write_file("dtype.toml", "[training]\ndtype = 'bfloat16'\n");
    CHECK(load(&c, NULL, p, &err, NULL) != 0 &&
              strstr(err.msg, "unknown key 'dtype' in [training] (did you mean "
                              "mixed_precision_param?)"),
          "in a file: %s", err.msg);
}

int main(void) {
    tmp_dir = check_env("CTITAN_TMP");
    src_dir = check_env("CTITAN_SOURCE_DIR");
    test_torchtitan_files();
    test_inert_keys();
    test_all_problems_at_once();
    test_aliases();
    test_config_by_name();
    test_suggestions();
    return check_summary();
}
