// The training config: defaults, TOML + command-line precedence, every error class (naming
// FILE:LINE or the option, and the key, with suggestions), cross-key checks, the write -> load
// round trip, the hash (every key pinned as hashed or not), the MoE keys, and every shipped
// configs/*.toml.
#include <dirent.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "config_test.h"
#include "train/config.h"

// config_load with a NULL-terminated argv.
static int load(ct_config *c, const char *toml, ct_error *err, ...) {
    va_list ap;
    va_start(ap, err);
    int rc = load_va(c, NULL, toml, err, ap);
    va_end(ap);
    return rc;
}

// Loads and expects failure with every fragment in the message.
static void expect_fail(const char *what, const char *toml, char **argv, int argc, ...) {
    ct_config c;
    ct_error err = {{0}};
    if (config_load(&c, toml, argc, argv, &err) == 0) {
        CHECK(0, "%s: loaded, expected an error", what);
        return;
    }
    va_list ap;
    va_start(ap, argc);
    for (const char *frag; (frag = va_arg(ap, const char *));)
        CHECK(strstr(err.msg, frag) != NULL, "%s: message lacks '%s': %s", what, frag, err.msg);
    va_end(ap);
}

#define ARGV(...) (char *[]){__VA_ARGS__}, (int)(sizeof((char *[]){__VA_ARGS__}) / sizeof(char *))
#define NOARGS NULL, 0

static const char *base_toml =
    "[training]\ndataset_path = \"data.txt\"\nsteps = 1000\n"; // the one key with no default

static void test_defaults(void) {
    ct_config c;
    config_defaults(&c);
    CHECK(strcmp(c.job.dump_folder, "./outputs") == 0, "job.dump_folder");
    CHECK(strcmp(c.model.backend, "native") == 0 && strcmp(c.model.flavor, "debugmodel") == 0,
          "model backend/flavor");
    CHECK(strcmp(c.model.tokenizer_path, "assets/qwen3-tokenizer") == 0,
          "native tokenizer_path: %s", c.model.tokenizer_path);
    CHECK(c.model.n_layers == 0 && c.model.vocab_size == 0 && c.model.tie_embeddings == -1,
          "no overrides");
    CHECK(c.training.local_batch_size == 8 && c.training.global_batch_size == -1 &&
              c.training.seq_len == 2048 && c.training.steps == 10000 &&
              c.training.max_norm == 1.0 && c.training.shuffle &&
              c.training.max_skipped_steps == 3 && !c.training.allow_overcommit &&
              strcmp(c.training.mixed_precision_param, "float32") == 0,
          "training defaults");
    CHECK(strcmp(c.optimizer.name, "AdamW") == 0 && c.optimizer.lr == 8e-4 &&
              c.optimizer.beta1 == 0.9 && c.optimizer.beta2 == 0.95 && c.optimizer.eps == 1e-8 &&
              c.optimizer.weight_decay == 0.1 && c.optimizer.decay_norms_and_embeddings,
          "optimizer defaults (torchtitan's)");
    CHECK(c.lr_scheduler.warmup_steps == 200 && isnan(c.lr_scheduler.decay_ratio) &&
              strcmp(c.lr_scheduler.decay_type, "linear") == 0 &&
              c.lr_scheduler.min_lr_factor == 0.0,
          "lr_scheduler defaults");
    CHECK(c.checkpoint.enable && strcmp(c.checkpoint.folder, "checkpoint") == 0 &&
              c.checkpoint.interval == 500 && c.checkpoint.keep_latest_k == 10 &&
              !c.checkpoint.initial_load_path[0] && !c.checkpoint.initial_load_in_hf &&
              !c.checkpoint.last_save_in_hf && strcmp(c.checkpoint.export_dtype, "float32") == 0,
          "checkpoint defaults");
    CHECK(c.metrics.log_freq == 10 && c.metrics.peak_gflops == 0.0, "metrics defaults");
    CHECK(!c.validation.enable && c.validation.freq == 500 && c.validation.steps == 10,
          "validation defaults");
    CHECK(c.debug.seed == 0 && c.parallelism.data_parallel_shard_degree == -1 &&
              c.parallelism.data_parallel_replicate_degree == 1 && c.comm.overlap &&
              c.comm.train_timeout_seconds == 100 && strcmp(c.debug.fault, "none") == 0,
          "debug/parallelism/comm");
    ct_error err = {{0}};
    CHECK(config_validate(&c, &err) == -1 &&
              strcmp(err.msg, "config: training.dataset_path is not set: point it at a .txt, "
                              ".jsonl or .npy file, or a folder of them") == 0,
          "defaults lack a dataset: %s", err.msg);
    ct_config d;
    CHECK(load(&d, NULL, &err, "--training.dataset_path=x", NULL) == 0, "load: %s", err.msg);
    snprintf(c.training.dataset_path, sizeof c.training.dataset_path, "x");
    CHECK(memcmp(&c, &d, sizeof c) == 0, "config_load with no file equals config_defaults");
    int n;
    const config_key *keys = config_keys(&n);
    CHECK(n >= 50 && keys[0].section && strcmp(keys[0].section, "job") == 0, "key table (%d)", n);
    CHECK(config_find_key("training.steps") &&
              config_find_key("training.steps")->type == CONFIG_INT,
          "find training.steps");
    CHECK(config_find_key("training") == NULL && config_find_key("training.step") == NULL,
          "find misses");
}

static void test_precedence(void) {
    const char *path = write_file("p.toml", "# precedence\n"
                                            "[training]\n"
                                            "dataset_path = \"corpus\"\n"
                                            "steps = 1000\n"
                                            "seq_len = 64\n"
                                            "max_norm = 2      # an integer is fine for a float\n"
                                            "[model]\n"
                                            "backend = \"hf\"\n"
                                            "hf_path = 'models/q'\n");
    ct_config c;
    ct_error err = {{0}};
    CHECK(load(&c, NULL, &err, "--config", path, "--training.steps=50", "--training.seq_len", "32",
               "--lr_scheduler.warmup_steps=0", "--model.backend=native",
               "--model.hf_path=", "--model.tie_embeddings", "false", "--optimizer.lr", "1e-3",
               "--training.allow_overcommit", "--training.shuffle", "false", "--debug.seed=7",
               "--job.description", "a b \"c\"", NULL) == 0,
          "load: %s", err.msg);
    CHECK(c.training.steps == 50 && c.training.seq_len == 32, "command line beats the file");
    CHECK(strcmp(c.training.dataset_path, "corpus") == 0 && c.training.max_norm == 2.0,
          "file beats defaults");
    CHECK(c.model.tie_embeddings == 0 && c.optimizer.lr == 1e-3 && c.training.allow_overcommit &&
              !c.training.shuffle && c.debug.seed == 7,
          "overrides applied");
    CHECK(strcmp(c.job.description, "a b \"c\"") == 0, "strings verbatim: %s", c.job.description);
    CHECK(strcmp(c.model.tokenizer_path, "assets/qwen3-tokenizer") == 0,
          "tokenizer resolved after overrides: %s", c.model.tokenizer_path);

    // --config anywhere; it wins over the path argument.
    const char *other = write_file("o.toml", "[training]\ndataset_path = 'other'\n");
    CHECK(load(&c, other, &err, "--training.steps=300", "--config=", NULL) == -1,
          "--config= with an empty path fails");
    CHECK(load(&c, other, &err, "--training.steps=300", NULL) == 0 &&
              strcmp(c.training.dataset_path, "other") == 0,
          "path argument: %s", err.msg);
    CHECK(load(&c, other, &err, "--config", path, NULL) == 0 &&
              strcmp(c.training.dataset_path, "corpus") == 0 &&
              strcmp(c.model.tokenizer_path, "models/q") == 0,
          "--config wins; backend=hf tokenizer defaults to hf_path: %s", err.msg);
    const char *tri_bool = write_file("trib.toml", "[training]\ndataset_path = 'd'\n"
                                                   "[model]\ntie_embeddings = true\n");
    CHECK(load(&c, tri_bool, &err, NULL) == 0 && c.model.tie_embeddings == 1,
          "tristate from a TOML bool: %s", err.msg);

    const char *tri = write_file("tri.toml", "[training]\ndataset_path = 'd'\n"
                                             "[model]\ntie_embeddings = \"auto\"\n");
    CHECK(load(&c, tri, &err, NULL) == 0 && c.model.tie_embeddings == -1, "tristate auto");
    CHECK(load(&c, tri, &err, "--model.tie_embeddings", "true", NULL) == 0 &&
              c.model.tie_embeddings == 1,
          "tristate on the command line");
    CHECK(load(&c, tri, &err, "--model.tie_embeddings", NULL) == 0 && c.model.tie_embeddings == 1,
          "tristate bare flag");
    CHECK(load(&c, tri, &err, "--model.tokenizer_path=/tok", "--model.backend=native", NULL) == 0 &&
              strcmp(c.model.tokenizer_path, "/tok") == 0,
          "explicit tokenizer_path kept");
    CHECK(load(&c, tri, &err, "--training.global_batch_size", "-16", NULL) == -1 &&
              strstr(err.msg, "command line --training.global_batch_size: "
                              "training.global_batch_size = -16"),
          "a negative value after a space is a value: %s", err.msg);
}

static void test_file_errors(void) {
    const char *p;
    char want[1200];
#define FILE_FAIL(name, text, line, ...)                                                           \
    do {                                                                                           \
        p = write_file(name, text);                                                                \
        snprintf(want, sizeof want, "%s:%d: ", p, line);                                           \
        expect_fail(name, p, NOARGS, want, __VA_ARGS__, NULL);                                     \
    } while (0)
    FILE_FAIL("sec.toml", "[training]\ndataset_path = 'd'\n\n[trainig]\nsteps = 1\n", 4,
              "unknown section [trainig] (did you mean [training]?)");
    FILE_FAIL("sec2.toml", "[profilers]\n", 1, "unknown section [profilers]");
    FILE_FAIL("key.toml", "[training]\ndataset_path = 'd'\nstpes = 5\n", 3,
              "unknown key 'stpes' in [training] (did you mean steps?)");
    FILE_FAIL("key2.toml", "[training]\nseed = 5\n", 2,
              "unknown key 'seed' in [training] (it belongs in [debug])");
    FILE_FAIL("root.toml", "steps = 5\n", 1, "key 'steps' is outside any [section]",
              "(it belongs in [training])");
    FILE_FAIL("type1.toml", "[training]\nsteps = \"100\"\n", 2,
              "training.steps: expected an integer, found a string (\"100\")");
    FILE_FAIL("type2.toml", "[training]\nsteps = 1.5\n", 2,
              "training.steps: expected an integer, found a float (1.5)");
    FILE_FAIL("type3.toml", "[optimizer]\nlr = true\n", 2,
              "optimizer.lr: expected a number, found a boolean (true)");
    FILE_FAIL("type4.toml", "[training]\nshuffle = 1\n", 2,
              "training.shuffle: expected true or false, found an integer (1)");
    FILE_FAIL("type5.toml", "[job]\ndump_folder = ['a']\n", 2,
              "job.dump_folder: expected a string, found an array of 1 values");
    FILE_FAIL("type6.toml", "[model]\ntie_embeddings = 'yes'\n", 2,
              "model.tie_embeddings: expected true, false or \"auto\"");
    FILE_FAIL("choice.toml", "[model]\nbackend = \"hff\"\n", 2,
              "model.backend: expected one of \"native\", \"hf\", found \"hff\" (did you mean "
              "\"hf\"?)");
    FILE_FAIL("choice2.toml", "[lr_scheduler]\ndecay_type = 'cos'\n", 2,
              "expected one of \"linear\", \"sqrt\", \"cosine\", found \"cos\"");
    FILE_FAIL("range.toml", "[training]\nsteps = 3000000000\n", 2,
              "training.steps: 3000000000 does not fit in an int");
    char longv[1200] = "[model]\nflavor = '";
    memset(longv + strlen(longv), 'x', 100);
    strcat(longv, "'\n");
    FILE_FAIL("long.toml", longv, 2, "model.flavor: the value is 100 bytes long; at most 63 fit");
    FILE_FAIL("syntax.toml", "[training]\nsteps = 10 20\n", 2, "expected end of line");
    FILE_FAIL("dup.toml", "[training]\nsteps = 1\nsteps = 2\n", 3, "defined twice");
    FILE_FAIL("utf8.toml", "[job]\ndescription = '\xfe'\n", 2, "invalid UTF-8 at byte 21");
    expect_fail("missing file", "/nonexistent/cfg.toml", NOARGS, "/nonexistent/cfg.toml", NULL);
#undef FILE_FAIL
}

static void test_cli_errors(void) {
    const char *base = write_file("base.toml", base_toml);
    expect_fail("unknown option", base, ARGV("--training.stpes=5"),
                "command line: unknown option --training.stpes (did you mean --training.steps?)",
                NULL);
    expect_fail("no section", base, ARGV("--steps", "5"),
                "unknown option --steps (did you mean --training.steps?)", NULL);
    expect_fail("bad section", base, ARGV("--trainig.steps=5"),
                "unknown option --trainig.steps (did you mean --training.steps?)", NULL);
    expect_fail("wrong section", base, ARGV("--training.seed=5"),
                "unknown option --training.seed (did you mean --debug.seed?)", NULL);
    expect_fail("nothing close", base, ARGV("--zzzzzzzz=1"),
                "unknown option --zzzzzzzz (see ctitan train --help)", NULL);
    expect_fail("type", base, ARGV("--training.steps=abc"),
                "command line --training.steps: training.steps: expected an integer, found "
                "'abc'",
                NULL);
    expect_fail("number syntax", base, ARGV("--training.steps=007"),
                "command line --training.steps: expected a number, found '007' (leading zeros",
                NULL);
    expect_fail("word for float", base, ARGV("--optimizer.lr=fast"),
                "command line --optimizer.lr: optimizer.lr: expected a number, found 'fast'", NULL);
    expect_fail("float for int", base, ARGV("--training.steps", "2.5"),
                "command line --training.steps: training.steps: expected an integer, found a "
                "float (2.5)",
                NULL);
    expect_fail("inf", base, ARGV("--optimizer.lr=inf"), "command line --optimizer.lr",
                "inf and nan are not allowed", NULL);
    expect_fail("bool", base, ARGV("--training.shuffle=yes"), "command line --training.shuffle",
                "found 'yes'", NULL);
    expect_fail("choice", base, ARGV("--checkpoint.export_dtype=bf16"),
                "command line --checkpoint.export_dtype: checkpoint.export_dtype: expected one "
                "of \"float32\", \"bfloat16\", \"float16\", found \"bf16\"",
                NULL);
    expect_fail("missing value", base, ARGV("--training.steps"),
                "command line: --training.steps needs a value", NULL);
    expect_fail("value is an option", base, ARGV("--training.steps", "--debug.seed=1"),
                "--training.steps needs a value", NULL);
    expect_fail("positional", base, ARGV("extra"), "command line: unexpected argument 'extra'",
                NULL);
    expect_fail("twice", base, ARGV("--training.steps=1", "--training.steps=2"),
                "command line --training.steps: given twice", NULL);
    expect_fail("config twice", NULL, ARGV("--config", (char *)base, "--config=x"),
                "--config given twice", NULL);
    expect_fail("config without file", NULL, ARGV("--config"), "--config needs a file", NULL);
    expect_fail("invalid UTF-8", base, ARGV("--job.description=a\xff"),
                "command line --job.description: invalid UTF-8 at byte 1", NULL);
}

static void test_checks(void) {
    char want[1200];
    const char *p = write_file("gbs.toml", "[training]\n"
                                           "dataset_path = 'd'\n"
                                           "local_batch_size = 4\n"
                                           "global_batch_size = 6\n");
    snprintf(want, sizeof want,
             "%s:4: training.global_batch_size = 6 is not a multiple of "
             "training.local_batch_size (4)",
             p);
    expect_fail("global batch", p, NOARGS, want, NULL);
    ct_config c;
    ct_error err = {{0}};
    CHECK(load(&c, p, &err, "--training.global_batch_size=8", NULL) == 0, "8 = 2 x 4: %s", err.msg);
    expect_fail(
        "global batch x dp", p,
        ARGV("--training.global_batch_size=8", "--parallelism.data_parallel_shard_degree=3"),
        "command line --training.global_batch_size: training.global_batch_size = 8 is "
        "not a multiple",
        "= 12", NULL);
    p = write_file("ok.toml", "[training]\ndataset_path = 'd'\nlocal_batch_size = 4\n");
    // torchtitan clamps a warmup or decay longer than the run (with a warning, at train time):
    // such configs load.
    CHECK(load(&c, p, &err, "--training.steps=100", NULL) == 0, "warmup > steps: %s", err.msg);
    CHECK(load(&c, p, &err, "--training.steps=100", "--lr_scheduler.warmup_steps=90",
               "--lr_scheduler.decay_ratio=0.2", NULL) == 0,
          "warmup + decay > steps: %s", err.msg);
    CHECK(load(&c, p, &err, "--lr_scheduler.decay_ratio=0.2", "--lr_scheduler.decay_ratio=none",
               NULL) != 0,
          "a key given twice is still refused");
    CHECK(load(&c, p, &err, "--lr_scheduler.decay_ratio=none", NULL) == 0 &&
              isnan(c.lr_scheduler.decay_ratio),
          "none unsets decay_ratio: %s", err.msg);
    expect_fail("decay_ratio range", p, ARGV("--lr_scheduler.decay_ratio=1.5"),
                "lr_scheduler.decay_ratio = 1.5; expected a value in [0, 1]", NULL);
    CHECK(load(&c, p, &err, "--training.steps=100", "--lr_scheduler.warmup_steps=80",
               "--lr_scheduler.decay_ratio=0.2", NULL) == 0,
          "warmup + decay == steps is fine: %s", err.msg);
    expect_fail("hf without path", p, ARGV("--model.backend=hf"),
                "command line --model.backend: model.backend = \"hf\" needs model.hf_path", NULL);
    expect_fail("hf override", p,
                ARGV("--model.backend=hf", "--model.hf_path=/m", "--model.n_layers=2"),
                "command line --model.n_layers: model.n_layers = 2 overrides a native flavor's "
                "architecture; with model.backend = \"hf\" the architecture comes from "
                "/m/config.json",
                NULL);
    // model.hf_path alone selects the HF backend (and its tokenizer); with the backend or a
    // flavor given as well, a native backend beside a folder is refused.
    CHECK(load(&c, p, &err, "--model.hf_path=/m", NULL) == 0 &&
              strcmp(c.model.backend, "hf") == 0 && strcmp(c.model.tokenizer_path, "/m") == 0,
          "hf_path alone selects backend hf: %s (%s)", err.msg, c.model.backend);
    expect_fail("native with hf_path", p, ARGV("--model.hf_path=/m", "--model.backend=native"),
                "command line --model.hf_path: model.hf_path is set but model.backend = "
                "\"native\"",
                "set model.backend = \"hf\" for that folder's model (--model.backend hf)", NULL);
    expect_fail("flavor with hf_path", p, ARGV("--model.hf_path=/m", "--model.flavor=0.6B"),
                "model.hf_path is set but so is model.flavor = \"0.6B\", a native flavor: set "
                "model.backend = \"hf\"",
                NULL);
    expect_fail("negative override", p, ARGV("--model.dim=-4"), "model.dim = -4", NULL);
    expect_fail("empty flavor", p, ARGV("--model.flavor="), "model.flavor is empty", NULL);
    expect_fail("decay ratio", p, ARGV("--lr_scheduler.decay_ratio=1.5"),
                "lr_scheduler.decay_ratio = 1.5; expected a value in [0, 1]", NULL);
    expect_fail("min lr", p, ARGV("--lr_scheduler.min_lr_factor=-0.1"),
                "lr_scheduler.min_lr_factor = -0.1", NULL);
    expect_fail("beta1", p, ARGV("--optimizer.beta1=1"), "optimizer.beta1 = 1; expected", NULL);
    expect_fail("lr", p, ARGV("--optimizer.lr=-1e-3"), "optimizer.lr = -0.001", NULL);
    expect_fail("steps", p, ARGV("--training.steps=0"), "training.steps = 0; expected at least 1",
                NULL);
    expect_fail("seq_len", p, ARGV("--training.seq_len=0"), "training.seq_len = 0", NULL);
    expect_fail("max_norm", p, ARGV("--training.max_norm=-1"), "training.max_norm = -1", NULL);
    {
        ct_config bf;
        ct_error e = {{0}};
        char *argv[] = {"--training.mixed_precision_param=bfloat16"};
        CHECK(config_load(&bf, p, 1, argv, &e) == 0 &&
                  strcmp(bf.training.mixed_precision_param, "bfloat16") == 0,
              "bf16 mixed precision accepted: %s", e.msg);
    }
    expect_fail("fp16 params", p, ARGV("--training.mixed_precision_param=float16"),
                "training.mixed_precision_param", NULL);
    expect_fail("initial hf", p, ARGV("--checkpoint.initial_load_in_hf"),
                "command line --checkpoint.initial_load_in_hf: checkpoint.initial_load_in_hf = "
                "true needs checkpoint.initial_load_path",
                NULL);
    expect_fail("interval", p, ARGV("--checkpoint.interval=0"), "checkpoint.interval = 0", NULL);
    expect_fail("keep", p, ARGV("--checkpoint.keep_latest_k=-1"), "checkpoint.keep_latest_k = -1",
                NULL);
    expect_fail("log_freq", p, ARGV("--metrics.log_freq=0"), "metrics.log_freq = 0", NULL);
    expect_fail("validation path", p, ARGV("--validation.enable"),
                "validation.enable = true needs validation.dataset_path", NULL);
    expect_fail("validation steps", p, ARGV("--validation.steps=0"), "validation.steps = 0", NULL);
    CHECK(load(&c, p, &err, "--validation.steps=-1", NULL) == 0, "validation.steps = -1: %s",
          err.msg);
    expect_fail("seed", p, ARGV("--debug.seed=-1"), "debug.seed = -1", NULL);
    expect_fail("dp", p, ARGV("--parallelism.data_parallel_shard_degree=0"),
                "parallelism.data_parallel_shard_degree = 0", NULL);
    expect_fail("replicate", p, ARGV("--parallelism.data_parallel_replicate_degree=0"),
                "parallelism.data_parallel_replicate_degree = 0; expected at least 1", NULL);
    expect_fail("hsdp", p,
                ARGV("--parallelism.data_parallel_replicate_degree=2",
                     "--parallelism.data_parallel_shard_degree=2",
                     "--parallelism.data_parallel_shard_mode=zero1"),
                "HSDP (both) is data_parallel_shard_mode = \"fsdp\"", NULL);
    expect_fail("reshard", p, ARGV("--parallelism.fsdp_reshard_after_forward=sometimes"),
                "fsdp_reshard_after_forward", NULL);
    expect_fail("threads", p, ARGV("--parallelism.threads_per_rank=-1"),
                "parallelism.threads_per_rank = -1", NULL);
    expect_fail("timeout", p, ARGV("--comm.train_timeout_seconds=0"),
                "comm.train_timeout_seconds = 0; expected a positive number", NULL);
    expect_fail("bucket", p, ARGV("--comm.bucket_cap_mb=-1"), "comm.bucket_cap_mb = -1", NULL);
    expect_fail("fault", p, ARGV("--debug.fault=segfault"), "debug.fault", NULL);
    expect_fail("fault step", p, ARGV("--debug.fault_step=0"), "debug.fault_step = 0", NULL);
    expect_fail("dump folder", p, ARGV("--job.dump_folder="), "job.dump_folder is empty", NULL);
    const char *f = write_file("lr.toml", "[training]\ndataset_path = 'd'\n\n[optimizer]\n"
                                          "lr = -1.0\n");
    snprintf(want, sizeof want, "%s:5: optimizer.lr = -1; expected 0 or more", f);
    expect_fail("location of a file value", f, NOARGS, want, NULL);

    // Programmatic configs get the same checks, without locations.
    config_defaults(&c);
    snprintf(c.training.dataset_path, sizeof c.training.dataset_path, "d");
    CHECK(config_validate(&c, &err) == 0, "valid: %s", err.msg);
    snprintf(c.lr_scheduler.decay_type, sizeof c.lr_scheduler.decay_type, "cosin");
    CHECK(config_validate(&c, &err) == -1 &&
              strcmp(err.msg, "config: lr_scheduler.decay_type = \"cosin\"; expected one of "
                              "\"linear\", \"sqrt\", \"cosine\"") == 0,
          "choices re-checked: %s", err.msg);
    snprintf(c.lr_scheduler.decay_type, sizeof c.lr_scheduler.decay_type, "cosine");
    c.optimizer.lr = NAN;
    CHECK(config_validate(&c, &err) == -1 && strstr(err.msg, "optimizer.lr is not a finite"),
          "nan: %s", err.msg);
}

// The automatic loss chunk: whole up to 256 MiB of logits (64 MiB with activation
// checkpointing), else the fewest equal chunks under the cap; an explicit size is kept.
static void test_loss_chunk(void) {
    ct_config c;
    config_defaults(&c);
    const int V = 151936; // 256 MiB of logits is 441.7 rows, 64 MiB 110.4
    snprintf(c.activation_checkpoint.selective_ac_option,
             sizeof c.activation_checkpoint.selective_ac_option, "2");
    struct {
        const char *ac;
        int chunk_key, tokens, want;
    } cases[] = {{"none", -1, 441, 0},        {"none", -1, 442, 221}, {"none", -1, 4096, 410},
                 {"full", -1, 110, 0},        {"full", -1, 111, 56},  {"full", -1, 4096, 108},
                 {"full", -1, 512, 103},      {"none", 0, 4096, 0},   {"full", 17, 4096, 17},
                 {"selective", -1, 4096, 108}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(c.activation_checkpoint.mode, sizeof c.activation_checkpoint.mode, "%s",
                 cases[i].ac);
        c.training.loss_chunk_tokens = cases[i].chunk_key;
        const int got = config_loss_chunk(&c, V, cases[i].tokens);
        CHECK(got == cases[i].want, "loss chunk, AC %s, key %d, %d tokens: %d, expected %d",
              cases[i].ac, cases[i].chunk_key, cases[i].tokens, got, cases[i].want);
    }
}

// Writes `c`, loads the text back, and compares the structs byte for byte.
static void check_round_trip(const ct_config *c, const char *what) {
    char path[1024];
    snprintf(path, sizeof path, "%s/rt.toml", tmp_dir);
    ct_error err = {{0}};
    CHECK(config_save(c, path, &err) == 0, "%s: save: %s", what, err.msg);
    ct_config back;
    int rc = load(&back, path, &err, NULL);
    CHECK(rc == 0, "%s: reload: %s", what, err.msg);
    CHECK(rc == 0 && memcmp(c, &back, sizeof back) == 0, "%s: reload differs", what);
    CHECK(rc == 0 && config_hash(c) == config_hash(&back), "%s: hash differs", what);
}

static void test_round_trip(void) {
    ct_config c;
    ct_error err = {{0}};
    const char *p =
        write_file("many.toml", "[job]\ndump_folder = \"runs/a \\\"b\\\" \\\\c\"\n"
                                "description = \"tab\\there, caf\\u00e9 \\U0001F600\"\n"
                                "[model]\nflavor = \"0.6B\"\nn_layers = 2\ndim = 64\n"
                                "tie_embeddings = false\n"
                                "[training]\ndataset_path = 'C:\\data'\nlocal_batch_size = 3\n"
                                "global_batch_size = 12\nseq_len = 17\nsteps = 1_000\n"
                                "max_norm = 0.1\nshuffle = false\n"
                                "[optimizer]\nlr = 3.3333333333333335e-4\nbeta2 = 0.999\n"
                                "eps = 1e-300\nweight_decay = 0\n"
                                "decay_norms_and_embeddings = false\n"
                                "[lr_scheduler]\nwarmup_steps = 7\ndecay_ratio = 0.3\n"
                                "decay_type = 'sqrt'\nmin_lr_factor = 0.125\n"
                                "[checkpoint]\nenable = true\ninterval = 3\nkeep_latest_k = 0\n"
                                "initial_load_path = '/hf/x'\ninitial_load_in_hf = true\n"
                                "last_save_in_hf = true\nexport_dtype = 'float16'\n"
                                "[metrics]\nlog_freq = 1\npeak_gflops = 123.456\n"
                                "[validation]\nenable = true\ndataset_path = 'v.jsonl'\n"
                                "freq = 5\nsteps = -1\n"
                                "[debug]\nseed = 9007199254740993\n"
                                "[parallelism]\ndata_parallel_shard_degree = 2\n");
    CHECK(load(&c, p, &err, NULL) == 0, "load many: %s", err.msg);
    CHECK(strcmp(c.job.dump_folder, "runs/a \"b\" \\c") == 0 && c.model.n_layers == 2 &&
              c.model.tie_embeddings == 0 && c.training.steps == 1000 &&
              c.debug.seed == 9007199254740993LL && c.optimizer.eps == 1e-300,
          "values as written");
    check_round_trip(&c, "non-default config");
    config_defaults(&c);
    snprintf(c.training.dataset_path, sizeof c.training.dataset_path, "d");
    check_round_trip(&c, "defaults");

    // Every key is written, under its section.
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    CHECK(config_write_toml(&c, f) == 0, "write");
    fclose(f);
    int n, missing = 0;
    const config_key *keys = config_keys(&n);
    for (int i = 0; i < n; i++) {
        char sec[96], line[128];
        snprintf(sec, sizeof sec, "\n[%s]\n", keys[i].section);
        // An unset optional key is written commented out ("# decay_ratio = unset").
        bool unset = config_key_optional(&keys[i]) &&
                     isnan(*(const double *)((const char *)&c + keys[i].offset));
        snprintf(line, sizeof line, "\n%s%s = ", unset ? "# " : "", keys[i].key);
        const char *s = strstr(text, sec);
        if (!s || !strstr(s, line)) missing++;
    }
    CHECK(missing == 0, "%d keys missing from the written config", missing);
    CHECK(strstr(text, "\ntie_embeddings = \"auto\"\n") && strstr(text, "\nlr = 0.0008\n"),
          "readable forms:\n%s", text);
    free(text);
}

static void test_hash(void) {
    ct_config a, b;
    config_defaults(&a);
    b = a;
    uint64_t h = config_hash(&a);
    CHECK(h == config_hash(&b) && h != 0, "equal configs hash equal");
    b.training.steps = 5, b.metrics.log_freq = 1, b.checkpoint.interval = 1;
    snprintf(b.job.dump_folder, sizeof b.job.dump_folder, "elsewhere");
    b.training.allow_overcommit = true, b.validation.enable = true;
    CHECK(config_hash(&b) == h, "steps, logging, checkpointing and paths of outputs do not count");
    b = a, b.optimizer.lr = 8.000000000000001e-4;
    CHECK(config_hash(&b) != h, "lr counts (to the last bit)");
    b = a, b.debug.seed = 1;
    CHECK(config_hash(&b) != h, "seed counts");
    b = a, b.training.shuffle = false;
    CHECK(config_hash(&b) != h, "shuffle counts");
    b = a, b.model.n_layers = 1;
    CHECK(config_hash(&b) != h, "model counts");
    b = a, b.lr_scheduler.warmup_steps = 1;
    CHECK(config_hash(&b) != h, "schedule counts");
    b = a, snprintf(b.training.dataset_path, sizeof b.training.dataset_path, "x");
    CHECK(config_hash(&b) != h, "dataset counts");
}

// Every key of the table, pinned: is it part of config_hash, the identity a resume checks? A
// key that changes the numbers of a resumed run is hashed: the model, the data and its order,
// the optimizer, the schedule, the global batch, the seed. Not hashed: where outputs go, logging,
// checkpointing, validation, deadlines, and choices that change nothing or only fp32 rounding
// (kernels, plugins, thread and rank layouts, gradient buckets, activation checkpointing, the
// loss chunking), so a run may resume with other ones. A new key must be added here.
static const struct {
    const char *name;
    bool hashed;
} hash_pinned[] = {
    {"job.dump_folder", false},
    {"job.description", false},
    // torchtitan's aliases are not hashed: they resolve into hashed keys (model.name into
    // backend and hf_path, hf_assets_path into tokenizer_path), and training.dataset is a name.
    {"model.name", false},
    {"model.hf_assets_path", false},
    {"model.backend", true},
    {"model.flavor", true},
    {"model.hf_path", true},
    {"model.tokenizer_path", true}, // the token ids of the data
    {"model.n_layers", true},
    {"model.dim", true},
    {"model.n_heads", true},
    {"model.n_kv_heads", true},
    {"model.head_dim", true},
    {"model.ffn_dim", true},
    {"model.vocab_size", true},
    {"model.max_seq_len", true}, // RoPE's tables are built for it
    {"model.tie_embeddings", true},
    {"model.num_experts", true},
    {"model.num_experts_per_tok", true},
    {"model.moe_intermediate_size", true},
    {"model.moe_impl", false},     // fp32 rounding only
    {"model.attn_backend", false}, // fp32 rounding only
    {"model.attn_mask_type", true}, // what each token sees, and its targets
    {"model.load_balance", true},
    {"model.load_balance_coeff", true},
    {"model.router_aux_loss_coef", true},
    {"model.output_router_logits", true},
    {"hf_transformers.model", false}, // resolves into model.hf_path
    {"training.dataset", false},
    {"training.dataset_path", true},
    {"training.train_on", true}, // which targets are trained
    {"training.local_batch_size", false}, // the global batch is what counts (resolved in trainer.c)
    {"training.global_batch_size", true},
    {"training.seq_len", true},
    // Not hashed so that a run can be extended; with lr_scheduler.decay_ratio > 0 the decay
    // phase then moves, as in torchtitan, whose schedule is rebuilt from training.steps.
    {"training.steps", false},
    {"training.max_norm", true},
    {"training.shuffle", true},
    {"training.max_skipped_steps", false}, // skipped steps change nothing; this only stops
    {"training.allow_overcommit", false},
    {"training.loss_chunk_tokens", false}, // fp32 rounding only (1e-6, test_memory_opts)
    {"training.mixed_precision_param", true},
    {"training.mixed_precision_reduce", true},
    {"optimizer.name", true},
    {"optimizer.lr", true},
    {"optimizer.beta1", true},
    {"optimizer.beta2", true},
    {"optimizer.eps", true},
    {"optimizer.weight_decay", true},
    {"optimizer.decay_norms_and_embeddings", true},
    {"lr_scheduler.warmup_steps", true},
    {"lr_scheduler.decay_ratio", true},
    {"lr_scheduler.decay_type", true},
    {"lr_scheduler.min_lr_factor", true},
    {"checkpoint.enable", false},
    {"checkpoint.folder", false},
    {"checkpoint.interval", false},
    {"checkpoint.keep_latest_k", false},
    {"checkpoint.initial_load_path", false}, // a resume loads its own checkpoint instead
    {"checkpoint.initial_load_in_hf", false},
    {"checkpoint.last_save_in_hf", false},
    {"checkpoint.last_save_model_only", false},
    {"checkpoint.export_dtype", false},
    {"metrics.log_freq", false},
    {"metrics.peak_gflops", false},
    {"validation.enable", false},
    {"validation.dataset", false},
    {"validation.dataset_path", false},
    {"validation.freq", false},
    {"validation.steps", false},
    {"debug.seed", true},
    {"debug.fault", false}, // failure-handling tests only
    {"debug.fault_rank", false},
    {"debug.fault_step", false},
    {"debug.profile_ops", false},
    {"debug.guard_device_memory", false},              // bit-identical (tests/guard.sh)
    {"parallelism.data_parallel_shard_degree", false}, // any layout resumes any checkpoint
    {"parallelism.data_parallel_replicate_degree", false},
    {"parallelism.tensor_parallel_degree", false},
    {"parallelism.context_parallel_degree", false}, // a CP checkpoint resumes at any degree
    {"parallelism.context_parallel_rotate_method", false}, // bit-identical (tests/cp.sh)
    {"parallelism.expert_parallel_degree", false},
    {"parallelism.expert_tensor_parallel_degree", false},
    {"parallelism.pipeline_parallel_degree", false}, // the same gradients (tests/pp.sh)
    {"parallelism.pipeline_parallel_schedule", false},
    {"parallelism.pipeline_parallel_microbatch_size", false},
    {"parallelism.pipeline_parallel_layers_per_stage", false},
    {"parallelism.pipeline_parallel_first_stage_less_layers", false},
    {"parallelism.pipeline_parallel_last_stage_less_layers", false},
    {"parallelism.module_fqns_per_model_part", false},
    {"parallelism.data_parallel_shard_mode", false},
    {"parallelism.fsdp_reshard_after_forward", false}, // bit-identical (tests/fsdp.sh)
    {"parallelism.threads_per_rank", false},           // BLAS rounding only
    {"comm.init_timeout_seconds", false},
    {"comm.train_timeout_seconds", false},
    {"comm.checkpoint_timeout_seconds", false},
    {"comm.bucket_cap_mb", false}, // bit-identical (tok_mpi)
    {"comm.overlap", false},
    {"activation_checkpoint.mode", false}, // bit-identical (test_memory_opts)
    {"activation_checkpoint.selective_ac_option", false},
    {"lora.rank", true},
    {"lora.alpha", true},
    {"lora.dropout", true},
    {"lora.target_modules", true},
    {"lora.use_rslora", true},
    {"lora.adapter_path", false}, // a starting point, as checkpoint.initial_load_path
    {"override.imports", false}, // fp32 rounding only (architecture.md)
    {"override.allow_mismatch", false},
};

// Sets k's field in c to another value of its type: the next double up (the hash must see the
// last bit), the next integer, the other boolean, another choice or string.
static void change_value(ct_config *c, const config_key *k) {
    char *p = (char *)c + k->offset;
    switch (k->type) {
    case CONFIG_STR:
    case CONFIG_LIST: {
        // Another of the key's choices (the first that differs), else any other string.
        char choice[64] = "";
        snprintf(choice, sizeof choice, "%s", strcmp(p, "x") != 0 ? "x" : "y");
        for (const char *q = k->choices; q && *q;
             q += q[strcspn(q, "|")] ? strcspn(q, "|") + 1 : strlen(q)) {
            size_t n = strcspn(q, "|");
            if (strlen(p) != n || strncmp(p, q, n) != 0) {
                snprintf(choice, sizeof choice, "%.*s", (int)n, q);
                break;
            }
        }
        snprintf(p, k->size, "%s", choice);
        break;
    }
    case CONFIG_INT:
        *(int *)p += 1;
        break;
    case CONFIG_INT64:
        *(int64_t *)p += 1;
        break;
    case CONFIG_FLOAT: // an unset optional float (NAN) gets a value
        *(double *)p = isnan(*(double *)p) ? 0.5 : nextafter(*(double *)p, INFINITY);
        break;
    case CONFIG_BOOL:
        *(bool *)p = !*(bool *)p;
        break;
    case CONFIG_TRISTATE:
        *(int *)p = *(int *)p == 1 ? 0 : 1;
        break;
    }
}

static void test_hash_every_key(void) {
    int n;
    const config_key *keys = config_keys(&n);
    const int n_pinned = (int)(sizeof hash_pinned / sizeof hash_pinned[0]);
    CHECK(n == n_pinned, "the table has %d keys, hash_pinned lists %d", n, n_pinned);
    ct_config base;
    config_defaults(&base);
    const uint64_t h = config_hash(&base);
    for (int i = 0; i < n; i++) {
        char name[160];
        snprintf(name, sizeof name, "%s.%s", keys[i].section, keys[i].key);
        int found = -1, times = 0;
        for (int j = 0; j < n_pinned; j++)
            if (strcmp(hash_pinned[j].name, name) == 0) found = j, times++;
        CHECK(times == 1, "%s: listed %d times in hash_pinned, expected once", name, times);
        if (found < 0) continue;
        const bool want = hash_pinned[found].hashed;
        CHECK(keys[i].hashed == want, "%s: the table says %s, expected %s", name,
              keys[i].hashed ? "hashed" : "not hashed", want ? "hashed" : "not hashed");
        ct_config c = base;
        change_value(&c, &keys[i]);
        CHECK(memcmp(&c, &base, sizeof c) != 0, "%s: the test could not change the value", name);
        const bool changed = config_hash(&c) != h;
        CHECK(changed == want, "%s: changing it %s config_hash, expected %s", name,
              changed ? "changes" : "does not change", want ? "a change" : "none");
    }
}

// The MoE keys of [model]: defaults, values, each one's errors, and which count in the hash.
static void test_moe_keys(void) {
    ct_config c;
    ct_error err = {{0}};
    config_defaults(&c);
    const ct_config_model *m = &c.model;
    CHECK(m->num_experts == 0 && m->num_experts_per_tok == 0 && m->moe_intermediate_size == 0 &&
              strcmp(m->moe_impl, "grouped") == 0 && strcmp(m->load_balance, "hf") == 0 &&
              m->load_balance_coeff == 1e-3 && m->router_aux_loss_coef == -1 &&
              m->output_router_logits == -1,
          "MoE defaults");
    const char *p = write_file("moe.toml", "[training]\ndataset_path = 'd'\n"
                                           "[model]\nflavor = 'debugmodel_moe'\n"
                                           "num_experts = 4\nnum_experts_per_tok = 1\n"
                                           "moe_intermediate_size = 32\nmoe_impl = 'loop'\n"
                                           "load_balance = 'aux_free'\n"
                                           "load_balance_coeff = 0.01\n"
                                           "router_aux_loss_coef = 0\n"
                                           "output_router_logits = false\n");
    CHECK(load(&c, p, &err, NULL) == 0, "moe.toml: %s", err.msg);
    CHECK(m->num_experts == 4 && m->num_experts_per_tok == 1 && m->moe_intermediate_size == 32 &&
              strcmp(m->moe_impl, "loop") == 0 && strcmp(m->load_balance, "aux_free") == 0 &&
              m->load_balance_coeff == 0.01 && m->router_aux_loss_coef == 0 &&
              m->output_router_logits == 0,
          "MoE values from the file");
    CHECK(load(&c, p, &err, "--model.output_router_logits", "--model.load_balance=none",
               "--model.router_aux_loss_coef=-1", NULL) == 0 &&
              m->output_router_logits == 1 && strcmp(m->load_balance, "none") == 0 &&
              m->router_aux_loss_coef == -1,
          "MoE values from the command line: %s", err.msg);
    // The load-balancing keys are training choices, allowed with an HF folder too.
    CHECK(load(&c, NULL, &err, "--training.dataset_path=d", "--model.backend=hf",
               "--model.hf_path=/m", "--model.router_aux_loss_coef=0.01",
               "--model.output_router_logits=true", "--model.load_balance=hf",
               "--model.moe_impl=loop", NULL) == 0,
          "MoE training keys with backend = hf: %s", err.msg);
    check_round_trip(&c, "MoE keys");

    const char *b = write_file("moe_base.toml", base_toml);
    expect_fail("moe_impl choice", b, ARGV("--model.moe_impl=grouped_mm"),
                "command line --model.moe_impl: model.moe_impl: expected one of \"grouped\", "
                "\"loop\", found \"grouped_mm\" (did you mean \"grouped\"?)",
                NULL);
    expect_fail("load_balance choice", b, ARGV("--model.load_balance=auxfree"),
                "model.load_balance: expected one of \"hf\", \"aux_free\", \"none\", found "
                "\"auxfree\" (did you mean \"aux_free\"?)",
                NULL);
    expect_fail("load_balance_coeff zero", b, ARGV("--model.load_balance_coeff=0"),
                "command line --model.load_balance_coeff: model.load_balance_coeff = 0; expected "
                "a positive number",
                NULL);
    expect_fail("load_balance_coeff negative", b, ARGV("--model.load_balance_coeff=-1e-3"),
                "model.load_balance_coeff = -0.001", NULL);
    expect_fail("load_balance_coeff nan", b, ARGV("--model.load_balance_coeff=nan"),
                "command line --model.load_balance_coeff", NULL);
    expect_fail("router_aux_loss_coef", b, ARGV("--model.router_aux_loss_coef=-0.5"),
                "command line --model.router_aux_loss_coef: model.router_aux_loss_coef = -0.5; "
                "expected -1 (the model config's) or a number >= 0",
                NULL);
    expect_fail("router_aux_loss_coef type", b, ARGV("--model.router_aux_loss_coef=off"),
                "model.router_aux_loss_coef: expected a number, found 'off'", NULL);
    expect_fail("output_router_logits", b, ARGV("--model.output_router_logits=yes"),
                "model.output_router_logits: expected true, false or \"auto\"", NULL);
    expect_fail("num_experts negative", b, ARGV("--model.num_experts=-8"),
                "command line --model.num_experts: model.num_experts = -8; expected a positive "
                "size, or 0 to keep the flavor's",
                NULL);
    expect_fail("num_experts_per_tok negative", b, ARGV("--model.num_experts_per_tok=-1"),
                "model.num_experts_per_tok = -1", NULL);
    expect_fail("moe_intermediate_size negative", b, ARGV("--model.moe_intermediate_size=-1"),
                "model.moe_intermediate_size = -1", NULL);
    expect_fail("num_experts type", b, ARGV("--model.num_experts=1.5"),
                "model.num_experts: expected an integer, found a float (1.5)", NULL);
    expect_fail("num_experts with hf", b,
                ARGV("--model.backend=hf", "--model.hf_path=/m", "--model.num_experts=8"),
                "model.num_experts = 8 overrides a native flavor's architecture; with "
                "model.backend = \"hf\" the architecture comes from /m/config.json",
                NULL);
    const char *f = write_file("moe_lb.toml", "[training]\ndataset_path = 'd'\n[model]\n"
                                              "load_balance_coeff = 0.0\n");
    char want[1200];
    snprintf(want, sizeof want, "%s:4: model.load_balance_coeff = 0", f);
    expect_fail("MoE error location", f, NOARGS, want, NULL);

    // The hash: the kernel choice does not count, the rest does.
    ct_config a, d;
    config_defaults(&a);
    uint64_t h = config_hash(&a);
    d = a, snprintf(d.model.moe_impl, sizeof d.model.moe_impl, "loop");
    CHECK(config_hash(&d) == h, "moe_impl does not count");
    d = a, d.model.num_experts = 4;
    CHECK(config_hash(&d) != h, "num_experts counts");
    d = a, d.model.num_experts_per_tok = 1;
    CHECK(config_hash(&d) != h, "num_experts_per_tok counts");
    d = a, d.model.moe_intermediate_size = 8;
    CHECK(config_hash(&d) != h, "moe_intermediate_size counts");
    d = a, snprintf(d.model.load_balance, sizeof d.model.load_balance, "none");
    CHECK(config_hash(&d) != h, "load_balance counts");
    d = a, d.model.load_balance_coeff = 2e-3;
    CHECK(config_hash(&d) != h, "load_balance_coeff counts");
    d = a, d.model.router_aux_loss_coef = 0.001;
    CHECK(config_hash(&d) != h, "router_aux_loss_coef counts");
    d = a, d.model.output_router_logits = 1;
    CHECK(config_hash(&d) != h, "output_router_logits counts");
}

// override.imports, the one list key: a comma-separated string, or a TOML array of strings.
static void test_override_keys(void) {
    ct_config c;
    ct_error err = {{0}};
    config_defaults(&c);
    CHECK(c.override.imports[0] == '\0' && !c.override.allow_mismatch, "override defaults");
    const char *p = write_file("override.toml", "[training]\ndataset_path = 'd'\n"
                                                "[override]\nimports = ['./a.so', 'b.so']\n"
                                                "allow_mismatch = true\n");
    CHECK(load(&c, p, &err, NULL) == 0 && strcmp(c.override.imports, "./a.so,b.so") == 0 &&
              c.override.allow_mismatch,
          "[override] from the file: %s (%s)", c.override.imports, err.msg);
    check_round_trip(&c, "override keys");
    CHECK(load(&c, p, &err, "--override.imports=x.so,y.so", NULL) == 0 &&
              strcmp(c.override.imports, "x.so,y.so") == 0,
          "--override.imports wins: %s", err.msg);
    uint64_t h = config_hash(&c);
    CHECK(load(&c, p, &err, "--override.imports=", NULL) == 0 && config_hash(&c) == h,
          "override.imports changes rounding, not the run: not hashed");
    expect_fail("imports of numbers", write_file("o1.toml", "[override]\nimports = [1, 2]\n"),
                NOARGS, "o1.toml", "override.imports", "expected an array of strings",
                "an integer (1)", NULL);
    expect_fail("imports item with a comma",
                write_file("o2.toml", "[override]\nimports = ['a.so,b.so']\n"), NOARGS, "o2.toml",
                "override.imports", "item 0", "contains a comma", NULL);
    expect_fail("imports a number", write_file("o3.toml", "[override]\nimports = 3\n"), NOARGS,
                "o3.toml", "override.imports", "expected a string or an array of strings", NULL);
    expect_fail("override typo", write_file("o4.toml", "[override]\nimport = 'a.so'\n"), NOARGS,
                "o4.toml", "unknown key 'import' in [override]", "did you mean imports", NULL);
}

static void test_help(void) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    config_print_help(f);
    fclose(f);
    int n, missing = 0;
    const config_key *keys = config_keys(&n);
    for (int i = 0; i < n; i++) {
        char opt[128];
        snprintf(opt, sizeof opt, "--%s.%s=", keys[i].section, keys[i].key);
        if (!strstr(text, opt)) missing++;
    }
    CHECK(missing == 0, "%d keys missing from --help", missing);
    CHECK(strstr(text, "--optimizer.lr=FLOAT") && strstr(text, "(default: 8e-4)") &&
              strstr(text, "one of \"native\", \"hf\"") &&
              strstr(text, "--model.load_balance=CHOICE") &&
              strstr(text, "one of \"hf\", \"aux_free\", \"none\" (default: \"hf\")") &&
              strstr(text, "--model.output_router_logits=BOOL|auto"),
          "help details");
    free(text);
}

static void test_shipped(const char *src) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/configs", src);
    DIR *d = opendir(dir);
    CHECK(d != NULL, "opendir %s", dir);
    if (!d) return;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        size_t len = strlen(e->d_name);
        if (len < 5 || strcmp(e->d_name + len - 5, ".toml") != 0) continue;
        char path[2048];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        ct_config c;
        ct_error err = {{0}};
        CHECK(load(&c, path, &err, NULL) == 0, "%s: %s", e->d_name, err.msg);
        n++;
    }
    closedir(d);
    CHECK(n >= 4, "found %d shipped configs", n);

    ct_config c;
    ct_error err = {{0}};
    char path[2048];
    snprintf(path, sizeof path, "%s/debugmodel.toml", dir);
    CHECK(load(&c, path, &err, NULL) == 0, "debugmodel: %s", err.msg);
    CHECK(strcmp(c.model.backend, "native") == 0 && strcmp(c.model.flavor, "debugmodel") == 0 &&
              strcmp(c.training.dataset_path, "assets/corpus/nlp-corpus.jsonl") == 0 &&
              c.training.local_batch_size == 2 && c.training.seq_len == 128 &&
              c.training.steps == 300 && c.optimizer.lr == 2e-3 &&
              c.lr_scheduler.warmup_steps == 20 && c.lr_scheduler.decay_ratio == 0.2 &&
              strcmp(c.lr_scheduler.decay_type, "cosine") == 0 && c.checkpoint.interval == 100 &&
              c.checkpoint.keep_latest_k == 2 && c.checkpoint.last_save_in_hf &&
              strcmp(c.checkpoint.export_dtype, "bfloat16") == 0 && c.metrics.log_freq == 10 &&
              strcmp(c.job.dump_folder, "./runs/debugmodel") == 0,
          "the demo recipe");
    // The recipes differ only where they mean to: 4B native vs 4B from an HF folder.
    ct_config native, hf;
    snprintf(path, sizeof path, "%s/qwen3_4b.toml", dir);
    CHECK(load(&native, path, &err, NULL) == 0, "4b: %s", err.msg);
    snprintf(path, sizeof path, "%s/hf_qwen3_4b.toml", dir);
    CHECK(load(&hf, path, &err, "--model.hf_path=/models/Qwen3-4B", NULL) == 0, "hf 4b: %s",
          err.msg);
    CHECK(strcmp(native.model.flavor, "4B") == 0 && strcmp(hf.model.backend, "hf") == 0 &&
              strcmp(hf.model.tokenizer_path, "/models/Qwen3-4B") == 0,
          "model sections");
    CHECK(native.training.seq_len == hf.training.seq_len &&
              native.training.steps == hf.training.steps &&
              native.checkpoint.interval == hf.checkpoint.interval,
          "same structure");
}

int main(void) {
    tmp_dir = check_env("CTITAN_TMP");
    test_defaults();
    test_precedence();
    test_file_errors();
    test_cli_errors();
    test_checks();
    test_loss_chunk();
    test_round_trip();
    test_hash();
    test_hash_every_key();
    test_moe_keys();
    test_override_keys();
    test_help();
    test_shipped(check_env("CTITAN_SOURCE_DIR"));
    return check_summary();
}
