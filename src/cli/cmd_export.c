// ctitan export: a training checkpoint as a Hugging Face folder that transformers loads.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "io/json.h"
#include "model/hf_adapter.h"
#include "model/lora_merge.h"
#include "model/peft_adapter.h"
#include "checkpoint/checkpoint.h"

static const cli_option export_options[] = {
    {"checkpoint", NULL,
     "a checkpoint folder (step-N), or a folder of them (the newest complete one is used)", false},
    {"output", NULL, "the Hugging Face folder to write (created if needed)", false},
    {"dtype", "float32", "weights dtype: float32, bfloat16 or float16", false},
    {"max-shard-size", "5GB",
     "shard the weights above this size, as HF (500MB, 5GB, 2GiB; 0 = one file)", false},
    {"tokenizer", NULL,
     "folder with tokenizer.json to copy (default: the run's model.tokenizer_path; with "
     "--merge, the base folder)",
     false},
    {"merge", "false",
     "write the base HF folder --model.hf_path with the PEFT LoRA adapter --lora.adapter_path "
     "merged in (W + s * B @ A), instead of a checkpoint",
     true},
    {"lora.adapter_path", NULL,
     "with --merge: the PEFT adapter folder (adapter_config.json, adapter_model.safetensors)",
     false},
};

// Train's key, from its table: under it the whole model is loaded into the guarded CPU backend
// and saved from there, instead of streamed tensor by tensor from the files.
// model.hf_path: --merge's base folder.
static const char *const export_keys[] = {"debug.guard_device_memory", "model.hf_path"};
// --merge reads an HF folder: model.backend "hf", as generate and verify fix it.
static int export_fix(ct_config *c, void *ctx, ct_error *err) {
    (void)err;
    if (ctx && cli_flag(ctx, "merge")) snprintf(c->model.backend, sizeof c->model.backend, "hf");
    return 0;
}
static const config_use export_use = {
    .command = "export", CONFIG_USE_KEYS(export_keys), .fix = export_fix};

static bool same_folder(const char *a, const char *b) {
    struct stat x, y;
    return stat(a, &x) == 0 && stat(b, &y) == 0 && x.st_dev == y.st_dev && x.st_ino == y.st_ino;
}

// --merge: the base HF folder with the adapter merged in, streamed tensor by tensor from the
// base's mapped files (the adapter alone is held in memory).
static int export_merged(const cli_args *args, const ct_config *c, ct_dtype dtype, uint64_t shard,
                         ct_error *err) {
    const char *base = c->model.hf_path, *adapter = cli_str(args, "lora.adapter_path"),
               *out = cli_str(args, "output");
    if (cli_str(args, "checkpoint"))
        return ct_fail(err, "--merge reads the base model from --model.hf_path HFDIR, not "
                            "--checkpoint");
    if (!base[0]) return ct_fail(err, "export --merge needs --model.hf_path HFDIR (the base)");
    if (!adapter) return ct_fail(err, "export --merge needs --lora.adapter_path DIR");
    if (same_folder(base, out) || same_folder(adapter, out))
        return ct_fail(err, "--output %s is an input folder; choose another folder", out);
    lora_merge_src src;
    if (lora_merge_open(&src, base, adapter, err) != 0) return -1;
    const char *tok = cli_str(args, "tokenizer") ? cli_str(args, "tokenizer") : base;
    int n_tok = ckpt_export_hf_from(&src.m, out, dtype, shard, tok, lora_merge_read, &src, err);
    if (n_tok >= 0) {
        const lora_config *lc = &src.ad.L.lc;
        printf("merged %s (r %d, alpha %g, scale %g%s; %d tensors changed; trained on %s) into "
               "%s (%zu parameters), written to %s as %s\n",
               adapter, lc->rank, (double)lc->alpha, (double)src.scale,
               lc->use_rslora ? ", rsLoRA" : "", src.n_merged,
               src.ad.pc.base_model[0] ? src.ad.pc.base_model : "an unnamed base", base,
               src.m.num_params, out, cli_str(args, "dtype"));
        if (n_tok == 0)
            fprintf(stderr,
                    "ctitan: warning: no tokenizer.json in %s: the export has no tokenizer "
                    "files (pass --tokenizer DIR)\n",
                    tok);
    }
    lora_merge_close(&src);
    return n_tok < 0 ? -1 : 0;
}

// A LoRA run's checkpoint holds the adapter (PEFT's keys) and no base: its export is the PEFT
// adapter folder the run's final export writes, from the run's config.toml ([lora], the base's
// name) and the checkpoint's config.json (the geometry).
static int export_adapter(const char *dir, const char *out, const train_state *st,
                          ct_error *err) {
    char path[4200];
    ct_config *c = malloc(sizeof *c);
    if (!c) return ct_fail(err, "out of memory");
    // The run's keys as it resolved them; its adapter_path (the folder it started from) is not
    // read again.
    char *argv[] = {"--lora.adapter_path="};
    const config_use use = {.command = "export"};
    snprintf(path, sizeof path, "%s/config.toml", dir);
    peft_adapter a = {0};
    st_file f;
    bool opened = false;
    qwen3_config cfg;
    int rc = config_load_use(c, NULL, &use, path, 1, argv, err);
    if (rc == 0 && c->lora.rank <= 0)
        rc = ct_fail(err, "%s: lora.rank = %d, but state.json names a LoRA run's base", path,
                     c->lora.rank);
    if (rc == 0) rc = config_lora(&a.pc.lc, c, err);
    if (rc == 0) config_lora_base_name(a.pc.base_model, sizeof a.pc.base_model, c);
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (rc == 0) rc = qwen3_config_load(&cfg, path, err);
    if (rc == 0) rc = lora_layout_init(&a.L, &cfg, &a.pc.lc, err);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (rc == 0) rc = st_open(&f, path, err), opened = rc == 0;
    if (rc == 0 && !(a.buf = malloc(a.L.num * sizeof *a.buf + 1)))
        rc = ct_fail(err, "%s: out of memory for %zu floats", path, a.L.num);
    if (rc == 0) rc = peft_tensors_read(a.buf, &a.L, &f, path, err);
    if (rc == 0) rc = peft_adapter_save(out, &a.pc, &a.L, a.buf, err);
    if (rc == 0)
        printf("exported step %lld of %s (a LoRA adapter, %zu parameters) to %s: %s and %s, base "
               "%s\n",
               (long long)st->step, dir, a.L.num, out, PEFT_CONFIG_NAME, PEFT_WEIGHTS_NAME,
               a.pc.base_model);
    if (opened) st_close(&f);
    peft_adapter_free(&a);
    free(c);
    return rc;
}

static int export_run(const cli_args *args, const ct_config *c, ct_error *err) {
    const char *given = cli_str(args, "checkpoint"), *out = cli_str(args, "output");
    if (!out) return ct_fail(err, "export needs --output HFDIR");
    ct_dtype dtype;
    uint64_t shard;
    if (ckpt_parse_dtype(&dtype, cli_str(args, "dtype"), err) != 0) return ct_wrap(err, "--dtype");
    if (ckpt_parse_size(&shard, cli_str(args, "max-shard-size"), err) != 0)
        return ct_wrap(err, "--max-shard-size");
    if (cli_flag(args, "merge")) return export_merged(args, c, dtype, shard, err);
    if (cli_str(args, "lora.adapter_path"))
        return ct_fail(err, "--lora.adapter_path is read by export --merge only");
    if (!given) return ct_fail(err, "export needs --checkpoint DIR");

    char dir[4096], cfg_path[4200];
    if (cli_resolve_checkpoint(dir, sizeof dir, given, err) != 0) return -1;
    if (same_folder(dir, out))
        return ct_fail(err, "--output %s is the checkpoint folder itself; choose another folder",
                       out);
    // The tokenizer folder from the run's config.toml (checked with the rest by the export).
    char *toml = NULL, tok_dir[4096];
    size_t toml_len;
    snprintf(cfg_path, sizeof cfg_path, "%s/config.toml", dir);
    ct_error ignored;
    if (file_read_all(&toml, &toml_len, cfg_path, 16u << 20, &ignored) != 0) toml = NULL;
    if (cli_str(args, "tokenizer"))
        snprintf(tok_dir, sizeof tok_dir, "%s", cli_str(args, "tokenizer"));
    else
        ckpt_tokenizer_dir(tok_dir, sizeof tok_dir, toml);
    free(toml);
    train_state st;
    size_t n_params = 0;
    int n_tok;
    if (ckpt_verify(dir, NULL, &st, err) != 0) return -1;
    if (st.lora_base_hash) return export_adapter(dir, out, &st, err);
    if (!c->debug.guard_device_memory) {
        // Tensor by tensor from the checkpoint's files: the model is never in memory.
        n_tok = ckpt_export_hf_streaming_info(dir, out, dtype, shard, tok_dir, &st, &n_params, err);
    } else {
        snprintf(cfg_path, sizeof cfg_path, "%s/config.json", dir);
        qwen3_config cfg;
        qwen3_model m;
        if (qwen3_config_load(&cfg, cfg_path, err) != 0 ||
            qwen3_init_forward_only(&m, &cfg, ct_backend_cpu_guarded(), NULL, NULL, err) != 0)
            return -1;
        int rc = ckpt_load(dir, &m, NULL, NULL, 0, 0, &st, NULL, err);
        n_tok = rc == 0 ? ckpt_export_hf(&m, out, dtype, shard, tok_dir, err) : -1;
        n_params = m.num_params;
        qwen3_free(&m);
    }
    if (n_tok < 0) return -1;

    char index[4200];
    struct stat sb;
    snprintf(index, sizeof index, "%s/model.safetensors.index.json", out);
    bool sharded = stat(index, &sb) == 0;
    printf("exported step %lld of %s (%zu parameters) to %s: config.json, %s as %s\n",
           (long long)st.step, dir, n_params, out,
           sharded ? "sharded safetensors with model.safetensors.index.json" : "model.safetensors",
           cli_str(args, "dtype"));
    if (n_tok > 0)
        printf("tokenizer: %d file(s) from %s\n", n_tok, tok_dir);
    else
        fprintf(stderr,
                "ctitan: warning: no tokenizer.json in %s: the export has no tokenizer files "
                "(pass --tokenizer DIR)\n",
                tok_dir);
    return 0;
}

int cmd_export(int argc, char **argv) {
    const int n_opts = sizeof export_options / sizeof export_options[0];
    if (cli_wants_help(argc, argv)) {
        cli_print_help_keys(
            "ctitan export --checkpoint DIR --output HFDIR [--dtype bfloat16|float16|"
            "float32] [--max-shard-size SIZE] [--tokenizer DIR]\n"
            "       ctitan export --merge --model.hf_path HFDIR --lora.adapter_path DIR "
            "--output HFDIR [...]",
            "Writes a training checkpoint as a Hugging Face folder: config.json, the "
            "weights as\nsafetensors (sharded with an index above --max-shard-size) "
            "and the tokenizer files.\nThe checkpoint is fully verified first "
            "(sizes, checksums, tensor names and shapes). Under "
            "--debug.guard_device_memory\nthe whole model is loaded into the guarded "
            "backend and saved from there.\nWith --merge, the base HF folder and a PEFT LoRA "
            "adapter are written merged (PEFT's merge_and_unload),\ntensor by tensor.",
            export_options, n_opts, &export_use);
        return 0;
    }
    ct_error err;
    cli_args args;
    ct_config cfg;
    config_use use = export_use;
    use.ctx = &args;
    if (cli_parse_config(&args, &cfg, &use, export_options, n_opts, argc, argv, &err) != 0 ||
        export_run(&args, &cfg, &err) != 0)
        return cli_report(&err);
    return 0;
}
