// ctitan generate: text from an HF folder or a training checkpoint, through the KV cache of
// model/qwen3.h (qwen3_gen_*) and HF's sampling (gen/sample.h). A prompt (--prompt, raw text),
// a JSONL file of prompts (--input: {"prompt": text} or {"messages": [...]} rendered with the
// chat template and add_generation_prompt), or a terminal chat (--chat: user lines from stdin,
// the history rendered with the template each turn, /reset clears it, EOF ends). A chat keeps
// the KV cache across turns, as llama.cpp's server keeps its prompt cache: each turn prefills
// only what follows the longest common prefix of the rendered history and the cached ids. Stops at
// any eos_token_id (generation_config.json, else config.json) or after --max_new_tokens. The model,
// its kernels, plugins, backend and memory check are train's run setup (train/run_setup.c), with
// the keys from train's table.
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cblas.h>
#include <cjson/cJSON.h>

#include "cli/cli.h"
#include "core/clock.h"
#include "core/grow.h"
#include "core/utf8.h"
#include "gen/gen_config.h"
#include "gen/sample.h"
#include "io/json.h"
#include "model/hf_adapter.h"
#include "ops/ops_profile.h"
#include "model/peft_adapter.h"
#include "model/qwen3.h"
#include "model/qwen3_lora.h"
#include "text/chat.h"
#include "text/tokenizer.h"
#include "checkpoint/checkpoint.h"
#include "train/run_setup.h"

// generate's own options; the config keys it takes are generate_keys (train/config.c's table).
static const cli_option generate_options[] = {
    {"checkpoint", NULL,
     "a checkpoint folder (step-N), or a folder of them (the newest), instead of "
     "--model.hf_path; the tokenizer is the run's unless --model.tokenizer_path",
     false},
    {"prompt", NULL, "the prompt, as raw text (no chat template)", false},
    {"input", NULL, "JSONL: one {\"prompt\": text} or {\"messages\": [...]} per line", false},
    {"chat", "false",
     "a multi-turn chat: user lines from stdin, each turn prefilling only what the KV cache "
     "lacks; /reset clears the history",
     true},
    {"max_new_tokens", "256", "stop after this many new tokens", false},
    {"temperature", NULL,
     "divide the logits by it; 0 = greedy (default: generation_config.json's, see below)", false},
    {"top_k", NULL, "keep the k most likely tokens (0 = off)", false},
    {"top_p", NULL, "keep the smallest set with this much probability (1 = off)", false},
    {"min_p", NULL,
     "after top-p, drop the tokens less likely than min_p times the likeliest (0 = off)", false},
    {"repetition_penalty", NULL,
     "divide the logit of each id seen so far, prompt included, by it (times it where "
     "negative); also when greedy (1 = off)",
     false},
    {"seed", "0", "the sampling seed: the same seed gives the same text", false},
    {"cache_len", "0",
     "KV cache positions (0: the longest prompt + max_new_tokens; --chat: up to 4096)", false},
    {"json", "false",
     "print one JSON object per prompt: prompt_ids, ids, text, stop (eos | length)", true},
    {"timing", "false",
     "print each prompt's prefill and decode times to stderr (the forwards and the sampling)",
     true},
};

// The run setup's keys: the model, its kernels and plugins, the backend and the memory check,
// as train takes them.
static const char *const generate_keys[] = {
    "model.hf_path",
    "model.tokenizer_path",
    "model.attn_backend",
    "model.moe_impl",
    "training.mixed_precision_param",
    "override.imports",
    "override.allow_mismatch",
    "training.allow_overcommit",
    "debug.guard_device_memory",
    "lora.adapter_path",
    "debug.profile_ops",
};
static const char *const generate_required[] = {"model.hf_path"};

typedef struct gen_run {
    const cli_args *args; // generate's own options, parsed before the config
    ct_config cfg;
    run_setup setup; // the model runs setup.ops on setup.be: it outlives the model
    bool setup_open;
    qwen3_model m;
    qwen3_gen g;
    gen_sampler s;
    tokenizer *tok;
    tok_encoder *enc;
    chat_template *tmpl;
    int32_t eos[GEN_MAX_EOS];
    int n_eos;
    // generation_config.json: the model folder's, else the tokenizer folder's (gen_dir: which;
    // -1 and gen empty when neither has one), read once for the stop ids and the sampling.
    gen_file_config gen;
    int gen_dir;
    char gen_path[4200];
    // The new ids and their bytes, and the repaired text being streamed: grown as needed and
    // reused, so a token costs no allocation once they reached their size.
    tok_ids new_ids;
    // The ids whose keys and values the cache holds (cached.n <= g.len: the prompt and the new
    // ids fed through decode), max_len of room planned with the cache; /reset empties it.
    tok_ids cached;
    char *raw, *shown;
    size_t raw_cap, shown_cap;
    int64_t max_new;
    bool json, timing;
    char model_dir[4096], tok_dir[4096];
} gen_run;

// generation_config.json, HF's way: the model folder's, else the tokenizer folder's.
static int load_generation_config(gen_run *r, ct_error *err) {
    const char *dirs[] = {r->model_dir, r->tok_dir};
    r->gen_dir = -1;
    for (int d = 0; d < 2 && r->gen_dir < 0; d++) {
        bool found;
        snprintf(r->gen_path, sizeof r->gen_path, "%s/generation_config.json", dirs[d]);
        if (gen_config_read(&r->gen, &found, r->gen_path, err) != 0) return -1;
        if (found) r->gen_dir = d;
    }
    return 0;
}

// The stop tokens, HF's way: generation_config.json's, else config.json's (the model folder's,
// then the tokenizer folder's), else the tokenizer's end of document. A negative id matches no
// token: it switches stopping off (bench/generate.py's folders use -1). Of config.json only
// eos_token_id is read.
static int load_eos(gen_run *r, ct_error *err) {
    const char *dirs[] = {r->model_dir, r->tok_dir};
    for (int d = 0; d < 2 && !r->n_eos; d++) {
        if (r->gen_dir == d) {
            memcpy(r->eos, r->gen.eos, sizeof r->eos);
            r->n_eos = r->gen.n_eos;
        }
        if (r->n_eos) break;
        char path[4200];
        snprintf(path, sizeof path, "%s/config.json", dirs[d]);
        if (access(path, F_OK) != 0) continue;
        cJSON *root;
        if (json_parse_file(&root, path, err) != 0) return -1;
        const int rc = gen_eos_read(r->eos, &r->n_eos, root, path, err);
        cJSON_Delete(root);
        if (rc != 0) return -1;
    }
    if (!r->n_eos && tok_eos_id(r->tok) >= 0) r->eos[r->n_eos++] = tok_eos_id(r->tok);
    return 0;
}

static bool is_eos(const gen_run *r, int32_t id) {
    for (int i = 0; i < r->n_eos; i++)
        if (r->eos[i] == id) return true;
    return false;
}

// One line on stderr for each setting of generation_config.json that HF's generate would use
// and ctitan does not: the text then differs from HF's in that respect, and the user is told so.
static void warn_unsupported(const gen_file_config *gc, const char *path) {
    for (int i = 0; i < gc->n_unsupported; i++)
        if (isnan(gc->unsupported_value[i]))
            fprintf(stderr, "generate: %s: %s is not supported; generating without it\n", path,
                    gc->unsupported[i]);
        else
            fprintf(stderr, "generate: %s: %s %g is not supported; generating without it\n", path,
                    gc->unsupported[i], gc->unsupported_value[i]);
}

// The sampling settings not given on the command line (NaN, or top_k < 0), as HF's generate
// takes them from generation_config.json (the model folder's, else the tokenizer folder's):
// without "do_sample": true (or without the file) it is greedy, unless a sampling setting
// (temperature, top_k, top_p, min_p) was given; otherwise its temperature, top_k, top_p and
// min_p, each at GenerationConfig's default (1.0, 50, 1.0, off) when absent. Its
// repetition_penalty (default 1.0) applies to greedy as well, as in HF. The choice is printed on
// stderr when it is a terminal; settings ctitan does not do are always named there.
static void sampling_defaults(const gen_run *r, gen_settings *set, int64_t *top_k) {
    const gen_file_config *gc = &r->gen;
    const bool found = r->gen_dir >= 0;
    if (found) warn_unsupported(gc, r->gen_path);
    const bool given =
        !isnan(set->temperature) || *top_k >= 0 || !isnan(set->top_p) || !isnan(set->min_p);
    const bool do_sample = gc->do_sample;
    // GenerationConfig's defaults where the file has no value
    const double t = isnan(gc->temperature) ? 1.0 : gc->temperature,
                 k = isnan(gc->top_k) ? 50 : gc->top_k, p = isnan(gc->top_p) ? 1.0 : gc->top_p,
                 mp = isnan(gc->min_p) ? 0.0 : gc->min_p,
                 rp = isnan(gc->repetition_penalty) ? 1.0 : gc->repetition_penalty;
    if (isnan(set->temperature)) set->temperature = !do_sample && !given ? 0.0f : (float)t;
    if (*top_k < 0) *top_k = k < 0 || k > INT32_MAX ? 0 : (int64_t)k;
    if (isnan(set->top_p)) set->top_p = (float)p;
    if (isnan(set->min_p)) set->min_p = (float)mp;
    if (isnan(set->repetition_penalty)) set->repetition_penalty = (float)rp;
    const char *from = found ? r->gen_path : "no generation_config.json";
    char extra[96] = "";
    if (set->repetition_penalty != 1.0f)
        snprintf(extra, sizeof extra, ", repetition_penalty %g", (double)set->repetition_penalty);
    if (!isatty(STDERR_FILENO)) { // scripts get only what they asked for
    } else if (set->temperature == 0)
        fprintf(stderr, "generate: greedy%s (%s%s)\n", extra, given ? "command line; " : "", from);
    else
        fprintf(stderr,
                "generate: sampling with temperature %g, top_k %lld, top_p %g, min_p %g%s "
                "(%s%s)\n",
                (double)set->temperature, (long long)*top_k, (double)set->top_p, (double)set->min_p,
                extra, given ? "command line, the rest from " : "", from);
}

// A number option; `unset` when it is not given.
static int parse_float(float *out, const cli_args *a, const char *key, float unset, ct_error *err) {
    const char *s = cli_str(a, key);
    *out = unset;
    if (!s) return 0;
    char *end;
    errno = 0;
    const double v = strtod(s, &end);
    if (errno || end == s || *end)
        return ct_fail(err, "option --%s: expected a number, found '%s'", key, s);
    *out = (float)v;
    return 0;
}

// What generate fixes in the config: an HF folder, or a checkpoint's (its config.json is the
// architecture, its run's tokenizer the default); one sequence. training.seq_len is only the
// plugins' parity check's length here (it runs min(seq_len, 256) tokens); the memory check
// below takes the KV cache's length.
static int generate_fix(ct_config *c, void *ctx, ct_error *err) {
    gen_run *r = ctx;
    snprintf(c->model.backend, sizeof c->model.backend, "hf");
    c->training.local_batch_size = 1;
    c->training.seq_len = 256;
    c->training.loss_chunk_tokens = 0;
    const char *ck = cli_str(r->args, "checkpoint");
    if (!ck) return 0;
    return cli_use_checkpoint(c, r->model_dir, sizeof r->model_dir, ck, err);
}

// A decode runs on OpenMP's threads alone (its products and attention are ctitan's kernels, no
// OpenBLAS), about 140 parallel regions a token, and ctitan's passive policy (main.c) puts the
// other threads to sleep after each: their wake-ups cost 10-15% of the decode's speed
// (docs/performance.md). So generate keeps them spinning between regions for a while
// (GOMP_SPINCOUNT: 10^6 spins, then they sleep, so an idle --chat does not hold a core), unless
// the user chose OMP_WAIT_POLICY or GOMP_SPINCOUNT. An fp32 prefill's products are OpenBLAS's
// sgemm: with OpenBLAS's pthread build, whose threads a spinning one starves (0.6B geometry, 512
// positions: prefill 165 -> 100 tokens/s, for a decode 3-6% faster), an fp32 generate stays
// passive; OpenBLAS's OpenMP build shares the spinning threads.
static void spin_for_decode(const gen_run *r) {
    const bool bf16 = strcmp(r->cfg.training.mixed_precision_param, "bfloat16") == 0;
    if (!(bf16 || openblas_get_parallel() == OPENBLAS_OPENMP) || !getenv("CTITAN_OMP_PASSIVE") ||
        getenv("GOMP_SPINCOUNT"))
        return;
    setenv("GOMP_SPINCOUNT", "1000000", 1);
    cli_exec_self(); // returns only without /proc: the decode then runs as it is
}

static const config_use generate_use = {
    .command = "generate",
    CONFIG_USE_KEYS(generate_keys),
    CONFIG_USE_REQUIRED(generate_required),
    .required_msg = "generate needs exactly one of --model.hf_path DIR, --checkpoint DIR",
    .fix = generate_fix,
};

// train's run setup: the architecture, the kernels (model.attn_backend, model.moe_impl), the
// plugins' check and the backend (debug.guard_device_memory). First: the check forks, which must
// precede any OpenMP region. Then the tokenizer and the stop tokens.
static int open_setup(gen_run *r, ct_error *err) {
    const char *ck = cli_str(r->args, "checkpoint");
    if (ck && strcmp(r->cfg.model.hf_path, r->model_dir) != 0)
        return ct_fail(err, "%s", generate_use.required_msg);
    if (!ck) snprintf(r->model_dir, sizeof r->model_dir, "%s", r->cfg.model.hf_path);
    snprintf(r->tok_dir, sizeof r->tok_dir, "%s", r->cfg.model.tokenizer_path);
    run_setup_opts so = {.log = stderr, .warn = stderr};
    if (run_setup_open(&r->setup, &r->cfg, &so, err) != 0)
        return ck ? ct_wrap(err, "--checkpoint %s", ck)
                  : ct_wrap(err, "--model.hf_path %s", r->model_dir);
    r->setup_open = true;
    if (tok_load(&r->tok, r->tok_dir, err) != 0 || tok_encoder_new(&r->enc, r->tok, err) != 0)
        return ct_wrap(err, "the tokenizer (--model.tokenizer_path)");
    return load_generation_config(r, err) != 0 ? -1 : load_eos(r, err);
}

// The weights, on the setup's backend with its kernels, once the memory check passed; no
// gradients (a forward-only model).
static int load_weights(gen_run *r, ct_error *err) {
    const char *ck = cli_str(r->args, "checkpoint");
    // --lora.adapter_path: the base frozen as train holds it, the adapter's branch beside each
    // adapted projection (its [lora] keys are adapter_config.json's, config_lora_adapter).
    lora_config lc;
    const ct_config *c = &r->cfg;
    if (c->lora.rank > 0 ? config_lora(&lc, c, err) != 0 ||
                               qwen3_init_lora(&r->m, &r->setup.model, r->setup.be, &r->setup.ops,
                                               &r->setup.mem_opts, &lc, err) != 0
                         : qwen3_init_forward_only(&r->m, &r->setup.model, r->setup.be,
                                                   &r->setup.ops, &r->setup.mem_opts, err) != 0)
        return -1;
    int rc = 0;
    if (ck) {
        train_state st;
        if (ckpt_load(r->model_dir, &r->m, NULL, NULL, 0, 0, &st, NULL, err) != 0)
            return ct_wrap(err, "--checkpoint %s", ck);
    } else {
        st_set set;
        hf_load_report rep = {0};
        if (st_set_open(&set, r->model_dir, err) != 0)
            return ct_wrap(err, "--model.hf_path %s", r->model_dir);
        rc = hf_load_weights(&r->m, &rep, &set, r->model_dir, err);
        st_set_close(&set);
        hf_report_free(&rep);
        if (rc != 0) return ct_wrap(err, "--model.hf_path %s", r->model_dir);
    }
    if (!r->m.lora) return 0;
    if (qwen3_lora_init_random(&r->m, 0, NULL, err) != 0 ||
        peft_adapter_apply(&r->m, c->lora.adapter_path, NULL, err) != 0)
        return ct_wrap(err, "--lora.adapter_path");
    fprintf(stderr, "lora: %s, rank %d, alpha %g (scaling %g%s), %s: %zu adapter parameters\n",
            c->lora.adapter_path, lc.rank, (double)lc.alpha, (double)lora_scale(&lc),
            lc.use_rslora ? ", rsLoRA" : "", c->lora.target_modules, r->m.lora->L.num);
    return 0;
}

// The repaired text of r->raw[from, to) into r->shown; its length, or -1 when out of memory.
static ptrdiff_t repair_range(gen_run *r, size_t from, size_t to) {
    if (grow_to((void **)&r->shown, &r->shown_cap, utf8_repair_bound(to - from) + 1, 1) != 0)
        return -1;
    return (ptrdiff_t)utf8_repair(r->shown, r->raw + from, to - from, NULL);
}

// Streams the new text of r->raw[0, len): from *printed up to the last complete character (a
// character still cut between tokens waits for its bytes; final: all), repaired as the whole
// text would be, so what streams is exactly decode(ids). Allocates nothing in steady state.
static int stream_text(gen_run *r, size_t len, size_t *printed, bool final, ct_error *err) {
    const size_t upto = final ? len : len - utf8_incomplete_tail(r->raw, len);
    if (upto <= *printed) return 0;
    const ptrdiff_t n = repair_range(r, *printed, upto);
    if (n < 0) return ct_fail(err, "out of memory for %zu bytes of text", upto - *printed);
    fwrite(r->shown, 1, (size_t)n, stdout);
    fflush(stdout);
    *printed = upto;
    return 0;
}

static void print_ids(const int32_t *ids, size_t n) {
    putchar('[');
    for (size_t i = 0; i < n; i++) printf(i ? ", %d" : "%d", ids[i]);
    putchar(']');
}

// The cached positions a prompt of ids[0, n) can keep: the longest common prefix with the
// cache's ids, less one when it is the whole prompt (the prefill must run a row for the logits).
static size_t reusable(const gen_run *r, const int32_t *ids, size_t n) {
    size_t keep = 0;
    while (keep < r->cached.n && keep < n && r->cached.v[keep] == ids[keep]) keep++;
    return keep == n && n > 0 ? n - 1 : keep;
}

// Generates from ids[0, n); *text gets the new text (malloc'd). Streams it unless --json, which
// prints the object instead. reuse (--chat): the cache keeps what it shares with ids, and only
// the rest is prefilled; otherwise everything is.
static int generate_one(gen_run *r, const int32_t *ids, size_t n, bool reuse, char **text,
                        ct_error *err) {
    *text = NULL;
    if (n + 1 > (size_t)r->g.max_len)
        return ct_fail(err,
                       "a prompt of %zu tokens does not fit the KV cache of %d positions "
                       "(--cache_len)",
                       n, r->g.max_len);
    tok_ids *out = &r->new_ids;
    out->n = 0;
    size_t len = 0, printed = 0; // r->raw[0, len): the new ids' bytes
    const char *stop = "length";
    const size_t keep = reuse ? reusable(r, ids, n) : 0, fresh = n - keep;
    double t0 = ct_now_s(), t_decode = 0;
    r->cached.n = 0; // until the prefill succeeds, nothing in the cache is known
    if (qwen3_gen_prefill(&r->g, (int)keep, ids + keep, (int)fresh, err) != 0) return -1;
    double t_prefill = ct_now_s() - t0;
    memcpy(r->cached.v + keep, ids + keep, fresh * sizeof *ids);
    r->cached.n = n;
    if (r->cfg.debug.profile_ops) ops_profile_reset(); // the table covers the decode steps
    int rc = 0, n_decode = 0;
    for (int64_t k = 0; k < r->max_new; k++) {
        // Each token's sampling counts with the forward that gave its logits, as llama.cpp's
        // timings count its sampler: the first with the prefill, the rest with the decode.
        t0 = ct_now_s();
        const int32_t next = gen_sample(&r->s, r->g.logits, r->cached.v, r->cached.n);
        *(k == 0 ? &t_prefill : &t_decode) += ct_now_s() - t0;
        if (is_eos(r, next)) {
            stop = "eos";
            break;
        }
        const char *bytes;
        size_t nb;
        if ((rc = tok_id_bytes(r->tok, next, true, &bytes, &nb, err)) != 0) break;
        if (grow_to((void **)&out->v, &out->cap, out->n + 1, sizeof *out->v) != 0 ||
            grow_to((void **)&r->raw, &r->raw_cap, len + nb + 1, 1) != 0) {
            rc = ct_fail(err, "out of memory for %zu generated ids", out->n + 1);
            break;
        }
        out->v[out->n++] = next;
        memcpy(r->raw + len, bytes, nb);
        len += nb;
        if (!r->json && (rc = stream_text(r, len, &printed, false, err)) != 0) break;
        if (k + 1 == r->max_new || r->g.len == r->g.max_len) break; // the cache is full
        t0 = ct_now_s();
        if ((rc = qwen3_gen_decode(&r->g, next, err)) != 0) break;
        t_decode += ct_now_s() - t0;
        r->cached.v[r->cached.n++] = next;
        n_decode++;
    }
    if (rc == 0 && !r->json) rc = stream_text(r, len, &printed, true, err);
    // The whole text, once: decode(ids), HF's lossy repair included.
    const ptrdiff_t text_len = rc == 0 ? repair_range(r, 0, len) : 0;
    if (rc == 0 && (text_len < 0 || !(*text = malloc((size_t)text_len + 1))))
        rc = ct_fail(err, "out of memory for %zu bytes of text", len);
    if (rc == 0) {
        memcpy(*text, r->shown, (size_t)text_len);
        (*text)[text_len] = 0;
    }
    if (rc == 0 && r->json) {
        printf("{\"prompt_ids\": ");
        print_ids(ids, n);
        printf(", \"ids\": ");
        print_ids(out->v, out->n);
        printf(", \"text\": ");
        // text_len, not strlen: a generated NUL byte is text too
        json_write_string(stdout, *text, (size_t)text_len, 0);
        printf(", \"stop\": \"%s\"}\n", stop);
        fflush(stdout);
    }
    // The prefill's count is the tokens it ran; a chat's line ends with those it reused.
    if (rc == 0 && r->timing) {
        fprintf(stderr,
                "ctitan: timing: prefill %zu tokens in %.4f s (%.1f tokens/s), decode %d tokens "
                "in %.4f s (%.2f tokens/s)",
                fresh, t_prefill, fresh / t_prefill, n_decode, t_decode,
                n_decode ? n_decode / t_decode : 0.0);
        if (reuse) fprintf(stderr, ", %zu tokens reused from the cache", keep);
        fputc('\n', stderr);
    }
    if (rc == 0 && r->cfg.debug.profile_ops && n_decode)
        ops_profile_print(stderr, t_decode / n_decode, n_decode);
    return rc;
}

static int encode(gen_run *r, tok_ids *ids, const char *text, size_t len, ct_error *err) {
    ids->n = 0;
    return tok_encode(r->enc, ids, text, len, err);
}

// The messages rendered with the template and add_generation_prompt, encoded.
static int encode_messages(gen_run *r, tok_ids *ids, const cJSON *messages, ct_error *err) {
    if (!r->tmpl && chat_template_load(&r->tmpl, r->tok_dir, err) != 0) return -1;
    char *text;
    size_t len;
    if (chat_render(r->tmpl, messages, NULL, true, -1, &text, &len, err) != 0) return -1;
    const int rc = encode(r, ids, text, len, err);
    free(text);
    return rc;
}

// One line of an --input file encoded into ids: 1 when it is blank (nothing to do), 0 when
// encoded, -1 on error (naming the file and line).
static int input_line(gen_run *r, tok_ids *ids, const char *line, const char *path, long no,
                      ct_error *err) {
    if (strspn(line, " \t\r\n") == strlen(line)) return 1;
    cJSON *o;
    if (json_parse(&o, line, strlen(line), path, err) != 0)
        return ct_wrap(err, "--input %s line %ld", path, no);
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(o, "prompt"),
                *msgs = cJSON_GetObjectItemCaseSensitive(o, "messages");
    int rc;
    if (cJSON_IsString(p))
        rc = encode(r, ids, p->valuestring, strlen(p->valuestring), err);
    else if (msgs)
        rc = encode_messages(r, ids, msgs, err);
    else
        rc = ct_fail(err, "expected {\"prompt\": text} or {\"messages\": [...]}");
    cJSON_Delete(o);
    return rc != 0 ? ct_wrap(err, "--input %s line %ld", path, no) : 0;
}

static int run_input(gen_run *r, const char *path, ct_error *err) {
    FILE *f = fopen(path, "r");
    if (!f) return ct_fail(err, "--input %s: %s", path, strerror(errno));
    char *line = NULL, *text = NULL;
    size_t cap = 0;
    tok_ids ids = {0};
    int rc = 0;
    for (long no = 1; rc == 0 && getline(&line, &cap, f) >= 0; no++) {
        const int got = input_line(r, &ids, line, path, no, err);
        if (got != 0) {
            rc = got < 0 ? -1 : 0;
            continue;
        }
        rc = generate_one(r, ids.v, ids.n, false, &text, err);
        if (rc == 0 && !r->json) putchar('\n');
        if (rc != 0) ct_wrap(err, "--input %s line %ld", path, no);
        free(text);
        text = NULL;
    }
    free(line);
    tok_ids_free(&ids);
    fclose(f);
    return rc;
}

// A chat line that cannot be sent (not UTF-8, a template that refuses it, a history that would
// not fit the cache) is refused alone: its error is printed, the history and the cache stay as
// they were, and the chat goes on; the exit status counts the refused lines at the end.
static int chat_turn_input(gen_run *r, cJSON *history, tok_ids *ids, const char *line, size_t n,
                           ct_error *err) {
    const size_t valid = utf8_valid_prefix(line, n);
    if (valid < n)
        return ct_fail(err, "invalid UTF-8 at byte %zu (0x%02X)", valid,
                       (unsigned char)line[valid]);
    cJSON *user = cJSON_CreateObject();
    cJSON_AddStringToObject(user, "role", "user");
    cJSON_AddStringToObject(user, "content", line);
    cJSON_AddItemToArray(history, user);
    int rc = encode_messages(r, ids, history, err);
    if (rc == 0 && ids->n + 1 > (size_t)r->g.max_len)
        rc =
            ct_fail(err,
                    "the history with this line is %zu tokens, and the KV cache holds %d "
                    "positions (--cache_len), one of them for the reply; /reset clears the history",
                    ids->n, r->g.max_len);
    if (rc != 0) cJSON_DeleteItemFromArray(history, cJSON_GetArraySize(history) - 1);
    return rc;
}

static int run_chat(gen_run *r, ct_error *err) {
    const bool tty = isatty(0);
    cJSON *history = cJSON_CreateArray();
    char *line = NULL, *text = NULL;
    size_t cap = 0;
    tok_ids ids = {0};
    int rc = 0;
    long refused = 0;
    if (tty) fprintf(stderr, "ctitan chat: /reset clears the history, Ctrl-D ends\n");
    for (long no = 1; rc == 0; no++) {
        if (tty) fprintf(stderr, "> "), fflush(stderr);
        ssize_t n = getline(&line, &cap, stdin);
        if (n < 0) break;
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
        if (n == 0) continue;
        if (strcmp(line, "/reset") == 0) {
            cJSON_Delete(history);
            history = cJSON_CreateArray();
            r->cached.n = 0;
            if (tty) fprintf(stderr, "(history cleared)\n");
            continue;
        }
        ct_error why;
        if (chat_turn_input(r, history, &ids, line, (size_t)n, &why) != 0) {
            ct_wrap(&why, "--chat: line %ld was not sent (the history is kept)", no);
            cli_report(&why);
            refused++;
            continue;
        }
        rc = generate_one(r, ids.v, ids.n, true, &text, err);
        if (rc == 0) {
            if (!r->json) putchar('\n');
            fflush(stdout);
            cJSON *reply = cJSON_CreateObject();
            cJSON_AddStringToObject(reply, "role", "assistant");
            cJSON_AddStringToObject(reply, "content", text);
            cJSON_AddItemToArray(history, reply);
        }
        free(text);
        text = NULL;
    }
    cJSON_Delete(history);
    free(line);
    tok_ids_free(&ids);
    if (rc == 0 && refused)
        rc = ct_fail(err, "--chat: %ld line(s) not sent (their errors above)", refused);
    return rc;
}

static void run_free(gen_run *r) {
    qwen3_gen_free(&r->g);
    gen_sampler_free(&r->s);
    qwen3_free(&r->m);
    if (r->setup_open) run_setup_close(&r->setup);
    tok_encoder_free(r->enc);
    tok_ids_free(&r->new_ids);
    tok_ids_free(&r->cached);
    free(r->raw);
    free(r->shown);
    tok_free(r->tok);
    chat_template_free(r->tmpl);
}

// The longest prompt of an --input file, in tokens (for the default cache length), every line
// checked before the model loads; with cache_len > 0, each prompt must also fit it.
static int input_longest(gen_run *r, const char *path, int64_t cache_len, int64_t *longest,
                         ct_error *err);

static int generate_run(gen_run *r, const cli_args *a, ct_error *err) {
    const char *prompt = cli_str(a, "prompt"), *input = cli_str(a, "input");
    const bool chat = cli_flag(a, "chat");
    if ((prompt != NULL) + (input != NULL) + chat != 1)
        return ct_fail(err, "generate needs exactly one of --prompt TEXT, --input FILE, --chat");
    gen_settings set;
    int64_t top_k = -1, seed, cache_len;
    if (cli_int(&r->max_new, a, "max_new_tokens", err) ||
        (cli_str(a, "top_k") && cli_int(&top_k, a, "top_k", err)) ||
        cli_int(&seed, a, "seed", err) || cli_int(&cache_len, a, "cache_len", err) ||
        parse_float(&set.temperature, a, "temperature", NAN, err) ||
        parse_float(&set.top_p, a, "top_p", NAN, err) ||
        parse_float(&set.min_p, a, "min_p", NAN, err) ||
        parse_float(&set.repetition_penalty, a, "repetition_penalty", NAN, err))
        return -1;
    if (r->max_new < 1)
        return ct_fail(err, "option --max_new_tokens: %lld, expected >= 1", (long long)r->max_new);
    if (cache_len < 0)
        return ct_fail(err, "option --cache_len: %lld, expected >= 0", (long long)cache_len);
    if (top_k > INT32_MAX)
        return ct_fail(err, "option --top_k: %lld is too large", (long long)top_k);
    r->json = cli_flag(a, "json");
    r->timing = cli_flag(a, "timing");
    set.seed = (uint64_t)seed;
    gen_sampler probe; // the sampling options given, checked before the model loads
    const gen_settings given = {.temperature = isnan(set.temperature) ? 1 : set.temperature,
                                .top_k = top_k < 0 ? 0 : (int)top_k,
                                .top_p = isnan(set.top_p) ? 1 : set.top_p,
                                .min_p = isnan(set.min_p) ? 0 : set.min_p,
                                .repetition_penalty =
                                    isnan(set.repetition_penalty) ? 1 : set.repetition_penalty};
    if (gen_sampler_init(&probe, 1, &given, err) != 0) return -1;
    gen_sampler_free(&probe);
    if (open_setup(r, err) != 0) return -1;
    sampling_defaults(r, &set, &top_k);
    set.top_k = (int)top_k;
    if (gen_sampler_init(&r->s, r->setup.model.vocab_size, &set, err) != 0)
        return ct_wrap(err, "generation_config.json's sampling settings");
    // The prompts are read and checked before the weights load: a bad line or a prompt too long
    // for --cache_len is refused before any work, not after the lines before it ran.
    tok_ids ids = {0};
    const int max_pos = r->setup.model.max_position_embeddings;
    int64_t longest = 0;
    if (prompt) {
        if (encode(r, &ids, prompt, strlen(prompt), err) != 0) return ct_wrap(err, "--prompt");
        longest = (int64_t)ids.n;
        if (cache_len > 0 && longest + 1 > cache_len) {
            tok_ids_free(&ids);
            return ct_fail(err,
                           "--prompt: a prompt of %lld tokens does not fit the KV cache of %lld "
                           "positions (--cache_len)",
                           (long long)longest, (long long)cache_len);
        }
    } else if (input && input_longest(r, input, cache_len, &longest, err) != 0) {
        return -1;
    }
    if (cache_len == 0) {
        const int64_t want = chat ? 4096 : longest + r->max_new;
        cache_len = want < max_pos ? want : max_pos;
    }
    int rc = cache_len > max_pos
                 ? ct_fail(err, "option --cache_len: %lld exceeds max_position_embeddings %d",
                           (long long)cache_len, max_pos)
                 : run_setup_check_generate_fit(&r->setup, (int)cache_len, err);
    if (rc == 0) rc = load_weights(r, err);
    if (rc == 0) rc = qwen3_gen_plan(&r->g, &r->m, (int)cache_len, err);
    if (rc == 0 &&
        grow_to((void **)&r->cached.v, &r->cached.cap, (size_t)cache_len, sizeof *r->cached.v) != 0)
        rc = ct_fail(err, "out of memory for %lld cached ids", (long long)cache_len);
    if (rc == 0 && prompt) {
        char *text = NULL;
        rc = generate_one(r, ids.v, ids.n, false, &text, err);
        if (rc != 0) ct_wrap(err, "--prompt");
        if (rc == 0 && !r->json) putchar('\n');
        free(text);
    } else if (rc == 0) {
        rc = input ? run_input(r, input, err) : run_chat(r, err);
    }
    tok_ids_free(&ids);
    return rc;
}

static int input_longest(gen_run *r, const char *path, int64_t cache_len, int64_t *longest,
                         ct_error *err) {
    FILE *f = fopen(path, "r");
    if (!f) return ct_fail(err, "--input %s: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    tok_ids ids = {0};
    int rc = 0;
    *longest = 1;
    for (long no = 1; rc == 0 && getline(&line, &cap, f) >= 0; no++) {
        const int got = input_line(r, &ids, line, path, no, err);
        rc = got < 0 ? -1 : 0;
        if (got == 0 && cache_len > 0 && (int64_t)ids.n + 1 > cache_len)
            rc = ct_fail(err,
                         "--input %s line %ld: a prompt of %zu tokens does not fit the KV cache of "
                         "%lld positions (--cache_len)",
                         path, no, ids.n, (long long)cache_len);
        if (got == 0 && (int64_t)ids.n > *longest) *longest = (int64_t)ids.n;
    }
    free(line);
    tok_ids_free(&ids);
    fclose(f);
    return rc;
}

int cmd_generate(int argc, char **argv) {
    const int n_opts = sizeof generate_options / sizeof generate_options[0];
    if (cli_wants_help(argc, argv)) {
        cli_print_help_keys(
            "ctitan generate (--model.hf_path DIR | --checkpoint DIR) (--prompt TEXT | --chat | "
            "--input prompts.jsonl) [--max_new_tokens N] [--temperature T] [--top_k K] "
            "[--top_p P] [--min_p P] [--repetition_penalty R] [--seed S] [--json]",
            "Samples text with a KV cache: HF generate's order (repetition penalty, temperature,\n"
            "top-k, top-p, min-p), seeded; --temperature 0 is greedy. Settings not given come\n"
            "from generation_config.json as HF's generate takes them: greedy without\n"
            "\"do_sample\": true, else its temperature, top_k (50 when absent), top_p and min_p;\n"
            "its repetition_penalty either way. Stops at the model's eos_token_id "
            "(generation_config.json,\n"
            "else config.json) or after --max_new_tokens. --chat reads user lines from stdin;\n"
            "/reset clears the history.",
            generate_options, n_opts, &generate_use);
        return 0;
    }
    ct_error err;
    cli_args args;
    gen_run r;
    memset(&r, 0, sizeof r);
    r.args = &args;
    config_use use = generate_use;
    use.ctx = &r;
    int rc = cli_parse_config(&args, &r.cfg, &use, generate_options, n_opts, argc, argv, &err);
    if (rc == 0) spin_for_decode(&r);
    if (rc == 0) rc = generate_run(&r, &args, &err);
    // The plugins' own call counters: proof that their kernels ran (stderr: stdout is the text).
    if (rc == 0 && r.setup_open) override_report_calls(&r.setup.overrides, stderr);
    run_free(&r);
    return rc != 0 ? cli_report(&err) : 0;
}
