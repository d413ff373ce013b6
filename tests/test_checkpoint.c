// Checkpoints (src/checkpoint/checkpoint.h):
//  1. XXH64 gives the published reference values;
//  2. save -> load is bitwise for the model, both moments, train_state and config.toml (tied,
//     untied, with biases), and the folder is a loadable HF folder with no missing/unexpected keys;
//  3. a model of another architecture is an error naming the tensor, never "skipped";
//  4. saving a step that exists replaces it; keep_latest_k prunes only older ones;
//  5. every kind of corrupt or incomplete checkpoint (truncated file, flipped byte, missing or
//     unparsable state.json, renamed folder, missing file) is reported and skipped for the
//     previous one, and a failed load leaves the model untouched;
//  6. a NaN or inf anywhere is refused and nothing is written;
//  7. stale temporary folders of dead processes are removed, a live process's are kept;
//  8. SIGKILL at random moments of a save loop always leaves a checkpoint that loads, with the
//     values of its own step.
//  9. optimizer shards: saved as 1, 3 (unequal, boundaries inside tensors) or 4 (one empty)
//     shards, any flat range loads back bitwise, whatever the number of loading ranges; a
//     missing, flipped or lying shard is skipped; shards that do not tile are refused at
//     commit; NaN in a shard is refused at write, naming the flat element.
// 10. a checkpoint of another format (1, or unknown) is an error, never skipped.
// 11. range lists (FSDP): saved by 1, 2 or 3 ranks each holding a piece of every unit (model in
//     shards, or in model.safetensors), loaded by 1, 2 or 4 ranks of other partitions, bitwise,
//     also resumed, also from the old single-range layout; ckpt_load assembles a sharded model;
//     state.json stays format 3 where it can; ranges that leave a gap or overlap are refused at
//     commit naming the file; a flipped or missing model shard is skipped; NaN/inf in a shard
//     names its tensor and element.
#include <inttypes.h>
#include <signal.h>
#include <dirent.h>
#include <sys/wait.h>
#include <time.h>

#include "ckpt_util.h"
#include "core/fs.h"
#include "io/json.h"
#include "model/hf_adapter.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_internal.h"

static const char *tmp_dir;

static void test_xxh64(void) {
    static const struct {
        const char *text;
        uint64_t seed, want;
    } v[] = {
        {"", 0, 0xEF46DB3751D8E999ull},
        {"", 1, 0xD5AFBA1336A3BE4Bull},
        {"a", 0, 0xD24EC4F1A98C6E5Bull},
        {"abc", 0, 0x44BC2CF5AD770999ull},
        {"asdf", 0, 0x415872F599CEA71Eull},
        {"Call me Ishmael.", 0, 0x6D04390FC9D61A90ull},
        {"Nobody inspects the spammish repetition", 0, 0xFBCEA83C8A378BF1ull},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        uint64_t h = ct_xxh64(v[i].text, strlen(v[i].text), v[i].seed);
        CHECK(h == v[i].want, "XXH64(\"%s\", %" PRIu64 ") = %016" PRIx64 ", want %016" PRIx64,
              v[i].text, v[i].seed, h, v[i].want);
    }
    // The file path agrees with the memory path, across stripe and tail boundaries.
    char path[4096], buf[1000];
    for (int i = 0; i < (int)sizeof buf; i++) buf[i] = (char)(i * 7 + 3);
    snprintf(path, sizeof path, "%s/hash.bin", tmp_dir);
    for (size_t n = 0; n <= sizeof buf; n += 37) {
        FILE *f = fopen(path, "wb");
        fwrite(buf, 1, n, f);
        fclose(f);
        uint64_t h = 0, size = 0;
        ct_error err = {{0}};
        CHECK(ckpt_hash_file(&h, &size, path, &err) == 0 && size == n && h == ct_xxh64(buf, n, 0),
              "hash of a %zu-byte file: %s", n, err.msg);
    }
}

static train_state sample_state(int64_t step) {
    train_state st = {.step = step,
                      .opt_step = step - 1,
                      .samples_seen = 4503599627370000ull + (uint64_t)step, // near 2^52
                      .config_hash = 0xFEDCBA9876543210ull ^ (uint64_t)step,
                      .skipped_in_row = 1,
                      .time_s = 12.345678901234567 * (double)step};
    return st;
}

static const char *const toml_text =
    "# effective config\n[job]\ndump_folder = \"./out\"\n\n[model]\ntokenizer_path = "
    "\"assets/qwen3-tokenizer\"\nflavor = \"debugmodel\" # \xc3\xa9\n";

// A model and its moments filled for `step`, so any checkpoint's content can be predicted.
typedef struct run {
    qwen3_model m;
    float *m1, *m2;
} run;

static bool run_init(run *r, const qwen3_config *c) {
    memset(r, 0, sizeof *r);
    if (!tiny_model(&r->m, c, 0)) return false;
    r->m1 = malloc(r->m.num_params * sizeof(float));
    r->m2 = malloc(r->m.num_params * sizeof(float));
    return r->m1 && r->m2;
}

static void run_fill(run *r, int64_t step) {
    tiny_fill(r->m.param_mem, r->m.num_params, 3 * (uint64_t)step);
    tiny_fill(r->m1, r->m.num_params, 3 * (uint64_t)step + 1);
    tiny_fill_positive(r->m2, r->m.num_params, 3 * (uint64_t)step + 2);
}

static void run_free(run *r) {
    qwen3_free(&r->m);
    free(r->m1);
    free(r->m2);
}

static int save_step(run *r, const char *root, int64_t step) {
    ct_error err = {{0}};
    run_fill(r, step);
    train_state st = sample_state(step);
    int rc = ckpt_save(root, &r->m, r->m1, r->m2, r->m.num_params, &st, toml_text, &err);
    CHECK(rc == 0, "save step %" PRId64 ": %s", step, err.msg);
    return rc;
}

static bool same_floats(const float *a, const float *b, size_t n) {
    return memcmp(a, b, n * sizeof(float)) == 0;
}

static bool same_state(const train_state *a, const train_state *b) {
    return a->step == b->step && a->opt_step == b->opt_step && a->samples_seen == b->samples_seen &&
           a->config_hash == b->config_hash && a->skipped_in_row == b->skipped_in_row &&
           memcmp(&a->time_s, &b->time_s, sizeof a->time_s) == 0;
}

// Loads `dir` into a second run and checks it holds exactly step's values.
static void check_holds_step(const char *dir, const qwen3_config *c, int64_t step,
                             const char *what) {
    run want, got;
    ct_error err = {{0}};
    if (!run_init(&want, c) || !run_init(&got, c)) return;
    run_fill(&want, step);
    train_state st;
    char *toml = NULL;
    int rc = ckpt_load(dir, &got.m, got.m1, got.m2, 0, got.m.num_params, &st, &toml, &err);
    CHECK(rc == 0, "%s: load: %s", what, err.msg);
    if (rc == 0) {
        train_state ws = sample_state(step);
        CHECK(same_floats(got.m.param_mem, want.m.param_mem, want.m.num_params),
              "%s: parameters differ", what);
        CHECK(same_floats(got.m1, want.m1, want.m.num_params), "%s: exp_avg differs", what);
        CHECK(same_floats(got.m2, want.m2, want.m.num_params), "%s: exp_avg_sq differs", what);
        CHECK(same_state(&st, &ws), "%s: train_state differs (step %" PRId64 ")", what, st.step);
        CHECK(toml && strcmp(toml, toml_text) == 0, "%s: config.toml differs", what);
    }
    free(toml);
    run_free(&want);
    run_free(&got);
}

static void test_roundtrip(bool tied, bool bias) {
    char root[4096], dir[4200], what[64];
    snprintf(what, sizeof what, "roundtrip tied=%d bias=%d", tied, bias);
    snprintf(root, sizeof root, "%s/rt_%d%d", tmp_dir, tied, bias);
    qwen3_config c = tiny_config(tied, bias, 2, 40);
    run r;
    if (!run_init(&r, &c) || save_step(&r, root, 7) != 0) return;
    snprintf(dir, sizeof dir, "%s/step-7", root);
    check_holds_step(dir, &c, 7, what);

    // model.safetensors + config.json are an HF folder.
    qwen3_model h;
    hf_load_report rep;
    ct_error err = {{0}};
    int rc = hf_load_folder(&h, &rep, dir, NULL, &err);
    CHECK(rc == 0, "%s: hf_load_folder: %s", what, err.msg);
    if (rc == 0) {
        CHECK(rep.n_missing == 0 && rep.n_unexpected == 0 && rep.source_dtype == CT_F32,
              "%s: HF load missing %d unexpected %d", what, rep.n_missing, rep.n_unexpected);
        CHECK(h.cfg.tie_word_embeddings == tied && h.cfg.attention_bias == bias, "%s: config.json",
              what);
        CHECK(h.num_params == r.m.num_params &&
                  same_floats(h.param_mem, r.m.param_mem, r.m.num_params),
              "%s: HF-loaded weights differ", what);
        qwen3_free(&h);
    }
    hf_report_free(&rep);

    // Verify and find agree, and nothing but step-7 is in root.
    train_state st;
    char found[4096];
    ckpt_notes notes = {0};
    CHECK(ckpt_verify(dir, &r.m, &st, &err) == 0 && st.step == 7, "%s: verify: %s", what, err.msg);
    CHECK(ckpt_find_latest(found, sizeof found, &st, root, &r.m, &notes, &err) == 1 &&
              strcmp(found, dir) == 0 && notes.n == 0,
          "%s: find_latest: %s", what, err.msg);
    int64_t *steps;
    int n;
    CHECK(ckpt_list_steps(&steps, &n, root, &err) == 0 && n == 1 && steps[0] == 7,
          "%s: root holds %d checkpoints", what, n);
    free(steps);

    // Model only (export's path): the moments are not needed.
    run other;
    if (run_init(&other, &c)) {
        CHECK(ckpt_load(dir, &other.m, NULL, NULL, 0, 0, NULL, NULL, &err) == 0 &&
                  same_floats(other.m.param_mem, r.m.param_mem, r.m.num_params),
              "%s: model-only load: %s", what, err.msg);
        run_free(&other);
    }
    run_free(&r);
}

// A checkpoint of another architecture is the caller's error, not a corrupt folder to skip.
static void test_mismatch(void) {
    char root[4096], dir[4200], out[4096];
    snprintf(root, sizeof root, "%s/mismatch", tmp_dir);
    qwen3_config c = tiny_config(false, false, 2, 40);
    run r;
    if (!run_init(&r, &c) || save_step(&r, root, 3) != 0) return;
    snprintf(dir, sizeof dir, "%s/step-3", root);
    const struct {
        qwen3_config c;
        const char *want;
    } cases[] = {
        {tiny_config(false, false, 3, 40), "model.layers.2."}, // more layers: missing
        {tiny_config(false, false, 1, 40), "model.layers.1."}, // fewer: extra tensors
        {tiny_config(false, false, 2, 48), "expected F32 [48, 16]"},
        {tiny_config(true, false, 2, 40), "lm_head.weight"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        run o;
        if (!run_init(&o, &cases[i].c)) continue;
        tiny_fill(o.m.param_mem, o.m.num_params, 99);
        float before = o.m.param_mem[0];
        ct_error err = {{0}};
        train_state st;
        ckpt_notes notes = {0};
        int rc = ckpt_resume(out, sizeof out, &o.m, o.m1, o.m2, 0, o.m.num_params, &st, NULL, root,
                             &notes, &err);
        CHECK(rc == -1 && strstr(err.msg, cases[i].want) && strstr(err.msg, "step-3") &&
                  notes.n == 0,
              "mismatch %zu: rc %d, notes %d: %s", i, rc, notes.n, err.msg);
        CHECK(o.m.param_mem[0] == before, "mismatch %zu: model changed by a failed load", i);
        CHECK(ckpt_verify(dir, &o.m, NULL, &err) == -1, "mismatch %zu: verify passed", i);
        ckpt_notes_free(&notes);
        run_free(&o);
    }
    // A moment range past the model's parameters is refused before anything is read.
    ct_error err = {{0}};
    CHECK(ckpt_load(dir, &r.m, r.m1, r.m2, 1, r.m.num_params, NULL, NULL, &err) == -1 &&
              strstr(err.msg, "runs past"),
          "range past the end: %s", err.msg);
    CHECK(ckpt_load(dir, &r.m, r.m1, NULL, 0, r.m.num_params, NULL, NULL, &err) == -1,
          "one moment only was accepted");
    CHECK(ckpt_load(dir, &r.m, NULL, NULL, 0, 5, NULL, NULL, &err) == -1,
          "a range without buffers was accepted");
    run_free(&r);
}

static void test_replace_and_prune(void) {
    char root[4096], dir[4200], path[4400];
    snprintf(root, sizeof root, "%s/prune", tmp_dir);
    qwen3_config c = tiny_config(false, true, 1, 32);
    run r;
    if (!run_init(&r, &c)) return;
    ct_error err = {{0}};
    ckpt_notes notes = {0};
    for (int64_t s = 1; s <= 5; s++) {
        if (save_step(&r, root, s) != 0) break;
        CHECK(ckpt_prune(root, 2, s, &notes, &err) == 0, "prune after %" PRId64 ": %s", s, err.msg);
    }
    int64_t *steps;
    int n;
    CHECK(ckpt_list_steps(&steps, &n, root, &err) == 0 && n == 2 && steps[0] == 5 && steps[1] == 4,
          "keep_latest_k=2 left %d checkpoints", n);
    free(steps);
    CHECK(notes.n == 3 && strstr(notes.msgs[0], "step-1"), "prune notes: %d", notes.n);
    ckpt_notes_free(&notes);

    // A newer folder (not ours) is left alone; the one just written is never removed.
    if (save_step(&r, root, 9) == 0 && save_step(&r, root, 6) == 0) {
        CHECK(ckpt_prune(root, 1, 6, NULL, &err) == 0, "prune: %s", err.msg);
        CHECK(ckpt_list_steps(&steps, &n, root, &err) == 0 && n == 2 && steps[0] == 9 &&
                  steps[1] == 6,
              "prune with a newer folder left %d", n);
        free(steps);
    }
    // keep_latest_k = 0 keeps everything.
    CHECK(ckpt_prune(root, 0, 6, NULL, &err) == 0 && ckpt_list_steps(&steps, &n, root, &err) == 0 &&
              n == 2,
          "keep_latest_k=0 removed checkpoints");
    free(steps);

    // Saving step 6 again replaces it whole, leaving no temporary folder behind.
    snprintf(dir, sizeof dir, "%s/step-6", root);
    snprintf(path, sizeof path, "%s/stray.txt", dir);
    write_file_text(path, "left from before");
    run_fill(&r, 8); // different values, same step number
    train_state st = sample_state(6);
    CHECK(ckpt_save(root, &r.m, r.m1, r.m2, r.m.num_params, &st, toml_text, &err) == 0,
          "replace: %s", err.msg);
    CHECK(!file_exists_at(path), "replacing step-6 merged into the old folder");
    run want;
    if (run_init(&want, &c)) {
        run_fill(&want, 8);
        CHECK(ckpt_load(dir, &r.m, r.m1, r.m2, 0, r.m.num_params, NULL, NULL, &err) == 0 &&
                  same_floats(r.m.param_mem, want.m.param_mem, r.m.num_params) &&
                  same_floats(r.m2, want.m2, r.m.num_params),
              "replaced step-6 does not hold the new values: %s", err.msg);
        run_free(&want);
    }
    DIR *d = opendir(root);
    int stray = 0;
    for (struct dirent *de; d && (de = readdir(d));) stray += strstr(de->d_name, ".tmp-") != NULL;
    if (d) closedir(d);
    CHECK(stray == 0, "%d temporary folders left in %s", stray, root);
    run_free(&r);
}

typedef bool (*damage_fn)(const char *dir);

static bool truncate_model(const char *dir) {
    char p[4300];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    return truncate(p, file_size_at(p) / 2) == 0;
}
static bool flip_optimizer(const char *dir) {
    char p[4300];
    snprintf(p, sizeof p, "%s/optimizer-00000-of-00001.safetensors", dir);
    return flip_byte(p, file_size_at(p) - 5); // in the data: the header still parses
}
static bool flip_config_toml(const char *dir) {
    char p[4300];
    snprintf(p, sizeof p, "%s/config.toml", dir);
    return flip_byte(p, 3);
}
static bool remove_state(const char *dir) {
    char p[4300];
    snprintf(p, sizeof p, "%s/state.json", dir);
    return unlink(p) == 0;
}
static bool garble_state(const char *dir) {
    char p[4300];
    snprintf(p, sizeof p, "%s/state.json", dir);
    return truncate(p, file_size_at(p) / 2) == 0;
}
static bool remove_config_json(const char *dir) {
    char p[4300];
    snprintf(p, sizeof p, "%s/config.json", dir);
    return unlink(p) == 0;
}
// Rewrites state.json's "format" (one digit, as cJSON prints it: "format":<tab>3).
static bool set_format(const char *dir, char digit) {
    char p[4300];
    snprintf(p, sizeof p, "%s/state.json", dir);
    char *text = NULL;
    size_t len;
    ct_error err;
    if (file_read_all(&text, &len, p, 1 << 20, &err) != 0) return false;
    char *f = strstr(text, "\"format\":\t3");
    if (f) f[10] = digit;
    bool ok = f && write_file_text(p, text);
    free(text);
    return ok;
}
static bool unknown_format(const char *dir) {
    return set_format(dir, '7');
}
static bool format_one(const char *dir) {
    return set_format(dir, '1');
}
static bool format_two(const char *dir) {
    return set_format(dir, '2');
}
// The folder of step 20 renamed to step-25: its state.json disagrees with its name.
static bool rename_folder(const char *dir) {
    char to[4300];
    snprintf(to, sizeof to, "%.*s25", (int)strlen(dir) - 2, dir);
    return rename(dir, to) == 0;
}

// A checkpoint of another format is an error for verify, load, find and resume: skipping it
// would let the run start over and overwrite the other version's steps.
static void test_other_format(damage_fn damage, const char *want) {
    char root[4096], dir[4200], out[4096];
    snprintf(root, sizeof root, "%s/other_format_%c", tmp_dir, damage == format_one ? '1' : '7');
    snprintf(dir, sizeof dir, "%s/step-20", root);
    qwen3_config c = tiny_config(true, false, 2, 42);
    run r;
    if (!run_init(&r, &c)) return;
    if (save_step(&r, root, 10) == 0 && save_step(&r, root, 20) == 0) {
        CHECK(damage(dir), "%s: could not rewrite the format", want);
        ct_error err = {{0}};
        ckpt_notes notes = {0};
        train_state st;
        CHECK(ckpt_verify(dir, NULL, NULL, &err) == -1 && strstr(err.msg, want), "verify: %s",
              err.msg);
        CHECK(ckpt_load(dir, &r.m, NULL, NULL, 0, 0, NULL, NULL, &err) == -1 &&
                  strstr(err.msg, want),
              "load: %s", err.msg);
        CHECK(ckpt_find_latest(out, sizeof out, &st, root, NULL, &notes, &err) == -1 &&
                  strstr(err.msg, want),
              "find_latest: %s", err.msg);
        CHECK(ckpt_resume(out, sizeof out, &r.m, r.m1, r.m2, 0, r.m.num_params, &st, NULL, root,
                          &notes, &err) == -1 &&
                  strstr(err.msg, want) && notes.n == 0,
              "resume: %s (%d notes)", err.msg, notes.n);
        ckpt_notes_free(&notes);
    }
    run_free(&r);
}

// Format 2 differs from 3 only in where a layer's attention biases sit in the flat optimizer
// state: it resumes a model without biases, and is refused, naming why, for one with them.
static void test_format_two(void) {
    for (int bias = 0; bias < 2; bias++) {
        char root[4096], dir[4200], out[4096];
        snprintf(root, sizeof root, "%s/format_two_%d", tmp_dir, bias);
        snprintf(dir, sizeof dir, "%s/step-10", root);
        qwen3_config c = tiny_config(false, bias, 2, 42);
        run r;
        if (!run_init(&r, &c)) return;
        if (save_step(&r, root, 10) == 0) {
            CHECK(format_two(dir), "could not rewrite the format");
            ct_error err = {{0}};
            ckpt_notes notes = {0};
            train_state st;
            int rc = ckpt_resume(out, sizeof out, &r.m, r.m1, r.m2, 0, r.m.num_params, &st, NULL,
                                 root, &notes, &err);
            if (bias)
                CHECK(rc == -1 && strstr(err.msg, "checkpoint format 2 keeps the optimizer state"),
                      "format 2 with biases: rc %d: %s", rc, err.msg);
            else
                CHECK(rc == 1 && st.step == 10, "format 2 without biases: rc %d: %s", rc, err.msg);
            ckpt_notes_free(&notes);
        }
        run_free(&r);
    }
}

static void test_corrupt(void) {
    static const struct {
        const char *name;
        damage_fn damage;
        const char *want; // in the note
    } cases[] = {
        {"truncated model", truncate_model, "bytes, state.json lists"},
        {"flipped optimizer byte", flip_optimizer, "XXH64"},
        {"flipped config.toml byte", flip_config_toml, "XXH64"},
        {"no state.json", remove_state, "incomplete"},
        {"half a state.json", garble_state, "state.json"},
        {"missing config.json", remove_config_json, "missing"},
        {"renamed folder", rename_folder, "folder name"},
    };
    qwen3_config c = tiny_config(true, false, 2, 40);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char root[4096], dir[4200], good[4200], out[4096];
        snprintf(root, sizeof root, "%s/corrupt_%zu", tmp_dir, i);
        snprintf(dir, sizeof dir, "%s/step-20", root);
        snprintf(good, sizeof good, "%s/step-10", root);
        run r;
        if (!run_init(&r, &c)) continue;
        if (save_step(&r, root, 10) != 0 || save_step(&r, root, 20) != 0) {
            run_free(&r);
            continue;
        }
        CHECK(cases[i].damage(dir), "%s: could not damage the checkpoint", cases[i].name);

        // A direct load of the damaged folder fails and changes nothing.
        ct_error err = {{0}};
        tiny_fill(r.m.param_mem, r.m.num_params, 12345);
        tiny_fill(r.m1, r.m.num_params, 12346);
        run snap;
        if (run_init(&snap, &c)) {
            memcpy(snap.m.param_mem, r.m.param_mem, r.m.num_params * sizeof(float));
            memcpy(snap.m1, r.m1, r.m.num_params * sizeof(float));
            if (file_exists_at(dir)) {
                CHECK(ckpt_load(dir, &r.m, r.m1, r.m2, 0, r.m.num_params, NULL, NULL, &err) == -1,
                      "%s: the damaged checkpoint loaded", cases[i].name);
                CHECK(same_floats(r.m.param_mem, snap.m.param_mem, r.m.num_params) &&
                          same_floats(r.m1, snap.m1, r.m.num_params),
                      "%s: a failed load changed the model or moments", cases[i].name);
            }
            run_free(&snap);
        }

        // Resume skips it for step-10, and says why.
        ckpt_notes notes = {0};
        train_state st;
        int rc = ckpt_resume(out, sizeof out, &r.m, r.m1, r.m2, 0, r.m.num_params, &st, NULL, root,
                             &notes, &err);
        CHECK(rc == 1 && strcmp(out, good) == 0 && st.step == 10, "%s: resume rc %d (%s): %s",
              cases[i].name, rc, rc == 1 ? out : "", err.msg);
        CHECK(notes.n == 1 && strstr(notes.msgs[0], cases[i].want) &&
                  strstr(notes.msgs[0], "skipping checkpoint"),
              "%s: notes %d: %s", cases[i].name, notes.n, notes.n ? notes.msgs[0] : "");
        ckpt_notes_free(&notes);
        check_holds_step(good, &c, 10, cases[i].name);
        CHECK(ckpt_find_latest(out, sizeof out, &st, root, NULL, NULL, &err) == 1 && st.step == 10,
              "%s: find_latest did not skip it", cases[i].name);

        // With step-10 damaged the same way there is nothing to resume from.
        if (cases[i].damage != rename_folder && cases[i].damage(good)) {
            rc = ckpt_resume(out, sizeof out, &r.m, r.m1, r.m2, 0, r.m.num_params, &st, NULL, root,
                             &notes, &err);
            CHECK(rc == 0 && notes.n == 2, "%s: all damaged: rc %d, notes %d", cases[i].name, rc,
                  notes.n);
            ckpt_notes_free(&notes);
        }
        run_free(&r);
    }
    // An empty or missing root has nothing to resume from, and that is not an error.
    char root[4096], out[4096];
    ct_error err = {{0}};
    snprintf(root, sizeof root, "%s/no_such_root", tmp_dir);
    CHECK(ckpt_find_latest(out, sizeof out, NULL, root, NULL, NULL, &err) == 0, "missing root: %s",
          err.msg);
}

// ---------------------------------------------------------------- optimizer shards

#define TAG 4242L // any tag will do: one "run" of ranks shares it

// Shard boundaries for n parameters: 3 unequal shards, neither boundary on a tensor start.
static void three_sizes(size_t sizes[3], const qwen3_model *m) {
    size_t n = m->num_params, a = n / 3 + 5, b = n / 3 - 7;
    for (int i = 0; i < m->n_params; i++) { // move a boundary off a tensor start
        if (m->params[i].offset == a) a++;
        if (m->params[i].offset == a + b) b++;
    }
    sizes[0] = a;
    sizes[1] = b;
    sizes[2] = n - a - b;
}

// What the ranks of a data-parallel save do, from one process: begin, one shard per "rank",
// commit. sizes[i] elements each, in order.
static int save_sharded(run *r, const char *root, int64_t step, const size_t *sizes, int n) {
    ct_error err = {{0}};
    run_fill(r, step);
    train_state st = sample_state(step);
    char tmp[4200];
    ckpt_shard_info info[8];
    int rc = ckpt_begin(root, step, TAG, &err);
    if (rc == 0) rc = ckpt_tmp_path(tmp, sizeof tmp, root, step, TAG, &err);
    size_t off = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        rc = ckpt_write_optimizer_shard(tmp, i, n, off, sizes[i], r->m.num_params, r->m1 + off,
                                        r->m2 + off, &info[i], &err);
        off += sizes[i];
    }
    if (rc == 0) rc = ckpt_commit(root, TAG, &r->m, info, n, &st, toml_text, &err);
    CHECK(rc == 0, "sharded save of step %" PRId64 " (%d shards): %s", step, n, err.msg);
    return rc;
}

// Loads [offset, offset + numel) of dir's moments and checks them against step's values.
static void check_range(const char *dir, const qwen3_config *c, int64_t step, size_t offset,
                        size_t numel, const char *what) {
    run want, got;
    if (!run_init(&want, c) || !run_init(&got, c)) return;
    run_fill(&want, step);
    ct_error err = {{0}};
    train_state st;
    int rc = ckpt_load(dir, &got.m, got.m1, got.m2, offset, numel, &st, NULL, &err);
    CHECK(rc == 0, "%s [%zu, +%zu): load: %s", what, offset, numel, err.msg);
    if (rc == 0) {
        CHECK(same_floats(got.m.param_mem, want.m.param_mem, want.m.num_params) &&
                  same_floats(got.m1, want.m1 + offset, numel) &&
                  same_floats(got.m2, want.m2 + offset, numel),
              "%s [%zu, +%zu): values differ", what, offset, numel);
        train_state ws = sample_state(step);
        CHECK(same_state(&st, &ws), "%s: train_state differs", what);
    }
    run_free(&want);
    run_free(&got);
}

// The number of shards state.json lists, and that every shard is in its "files".
static int listed_shards(const char *dir) {
    char p[4300];
    snprintf(p, sizeof p, "%s/state.json", dir);
    cJSON *o = NULL;
    ct_error err;
    if (json_parse_file(&o, p, &err) != 0) return -1;
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(o, "optimizer_shards");
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(o, "files");
    int n = cJSON_GetArraySize(list), in_files = 0;
    const cJSON *f;
    cJSON_ArrayForEach(f, files) {
        const char *name = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(f, "name"));
        in_files += name && strncmp(name, "optimizer-", 10) == 0;
    }
    cJSON_Delete(o);
    return in_files == n ? n : -1;
}

static void test_shards(void) {
    char root[4096], dir[4200], out[4096];
    qwen3_config c = tiny_config(false, true, 2, 41);
    run r;
    if (!run_init(&r, &c)) return;
    size_t n = r.m.num_params, s3[3];
    three_sizes(s3, &r.m);
    CHECK(n % 3 != 0, "num_params %zu divides by 3: pick another tiny config", n);

    // One shard and three: the same ranges read back bitwise.
    const size_t one[1] = {n};
    const size_t *layouts[2] = {one, s3};
    const int counts[2] = {1, 3};
    for (int l = 0; l < 2; l++) {
        snprintf(root, sizeof root, "%s/shards_%d", tmp_dir, counts[l]);
        snprintf(dir, sizeof dir, "%s/step-5", root);
        if (save_sharded(&r, root, 5, layouts[l], counts[l]) != 0) continue;
        CHECK(listed_shards(dir) == counts[l], "%d shards: state.json lists %d", counts[l],
              listed_shards(dir));
        ct_error err = {{0}};
        CHECK(ckpt_verify(dir, &r.m, NULL, &err) == 0, "%d shards: verify: %s", counts[l], err.msg);
        check_holds_step(dir, &c, 5, "sharded save");
        check_range(dir, &c, 5, 0, n, "whole");
        check_range(dir, &c, 5, 0, 17, "[0, k)");
        check_range(dir, &c, 5, s3[0] - 3, s3[1] + 6, "across two shard boundaries");
        check_range(dir, &c, 5, n - 1, 1, "last element");
        check_range(dir, &c, 5, 0, 0, "empty range");
        // Resharding: saved by 3 "ranks", resumed by 2, by 1 (above) and by 4.
        for (int m = 2; m <= 4; m += 2) {
            for (int k = 0; k < m; k++) {
                size_t lo = n * (size_t)k / (size_t)m, hi = n * (size_t)(k + 1) / (size_t)m;
                check_range(dir, &c, 5, lo, hi - lo, m == 2 ? "as 2 ranges" : "as 4 ranges");
            }
        }
        // Resume reads a range too.
        run got, want;
        if (run_init(&got, &c) && run_init(&want, &c)) {
            run_fill(&want, 5);
            ckpt_notes notes = {0};
            size_t lo = n / 2, len = n - n / 2;
            int rc = ckpt_resume(out, sizeof out, &got.m, got.m1, got.m2, lo, len, NULL, NULL, root,
                                 &notes, &err);
            CHECK(rc == 1 && notes.n == 0 && same_floats(got.m1, want.m1 + lo, len) &&
                      same_floats(got.m2, want.m2 + lo, len),
                  "%d shards: resume of a range: rc %d: %s", counts[l], rc, err.msg);
            ckpt_notes_free(&notes);
            run_free(&got);
            run_free(&want);
        }
    }

    // An empty shard (more ranks than elements in a range) is allowed.
    snprintf(root, sizeof root, "%s/shards_empty", tmp_dir);
    snprintf(dir, sizeof dir, "%s/step-6", root);
    const size_t four[4] = {s3[0], 0, s3[1], s3[2]};
    if (save_sharded(&r, root, 6, four, 4) == 0) {
        ct_error err = {{0}};
        CHECK(ckpt_verify(dir, &r.m, NULL, &err) == 0, "empty shard: verify: %s", err.msg);
        check_range(dir, &c, 6, s3[0] - 1, 2, "around an empty shard");
    }
    run_free(&r);
}

// Steps 10 and 20 saved in 3 shards; damage(step-20) must make resume skip it for step-10 with
// a note holding `want`. shard0_ok: a load of shard 0's range alone still works.
static void expect_skipped(const char *name, damage_fn damage, const char *want, bool shard0_ok) {
    char root[4096], dir[4200], good[4200], out[4096];
    snprintf(root, sizeof root, "%s/shard_err_%s", tmp_dir, name);
    snprintf(dir, sizeof dir, "%s/step-20", root);
    snprintf(good, sizeof good, "%s/step-10", root);
    qwen3_config c = tiny_config(true, false, 2, 41);
    run r;
    if (!run_init(&r, &c)) return;
    size_t s3[3];
    three_sizes(s3, &r.m);
    if (save_sharded(&r, root, 10, s3, 3) == 0 && save_sharded(&r, root, 20, s3, 3) == 0) {
        CHECK(damage(dir), "%s: could not damage the checkpoint", name);
        ct_error err = {{0}};
        CHECK(ckpt_verify(dir, NULL, NULL, &err) == -1 && strstr(err.msg, want), "%s: verify: %s",
              name, err.msg);
        ckpt_notes notes = {0};
        train_state st;
        int rc = ckpt_resume(out, sizeof out, &r.m, r.m1, r.m2, 0, r.m.num_params, &st, NULL, root,
                             &notes, &err);
        CHECK(rc == 1 && strcmp(out, good) == 0 && st.step == 10, "%s: resume rc %d: %s", name, rc,
              err.msg);
        CHECK(notes.n == 1 && strstr(notes.msgs[0], want) &&
                  strstr(notes.msgs[0], "skipping checkpoint"),
              "%s: notes %d: %s", name, notes.n, notes.n ? notes.msgs[0] : "");
        ckpt_notes_free(&notes);
        // A range that needs only shard 0 still loads: ckpt_load reads (and checks) only the
        // shards it needs; resume checks all of them.
        if (shard0_ok) check_range(dir, &c, 20, 0, s3[0], name);
        run_free(&r);
        if (!run_init(&r, &c)) return;
        tiny_fill(r.m1, r.m.num_params, 777);
        float before = r.m1[0];
        CHECK(ckpt_load(dir, &r.m, r.m1, r.m2, 0, r.m.num_params, NULL, NULL, &err) == -1 &&
                  strstr(err.msg, want) && r.m1[0] == before,
              "%s: full load: %s", name, err.msg);
    }
    run_free(&r);
}

static bool remove_shard1(const char *dir) {
    char p[4300];
    snprintf(p, sizeof p, "%s/optimizer-00001-of-00003.safetensors", dir);
    return unlink(p) == 0;
}
static bool flip_shard2(const char *dir) {
    char p[4300];
    snprintf(p, sizeof p, "%s/optimizer-00002-of-00003.safetensors", dir);
    return flip_byte(p, file_size_at(p) - 5);
}

// A shard whose own metadata disagrees with state.json (written with an offset one too far, and
// reported to commit with the right one): its checksum matches, the content does not.
static void test_shard_metadata_lies(void) {
    char root[4096], dir[4200], tmp[4200];
    snprintf(root, sizeof root, "%s/shard_lies", tmp_dir);
    snprintf(dir, sizeof dir, "%s/step-3", root);
    qwen3_config c = tiny_config(false, false, 1, 41);
    run r;
    if (!run_init(&r, &c)) return;
    size_t s3[3];
    three_sizes(s3, &r.m);
    run_fill(&r, 3);
    train_state st = sample_state(3);
    ct_error err = {{0}};
    ckpt_shard_info info[3];
    int rc = ckpt_begin(root, 3, TAG, &err);
    if (rc == 0) rc = ckpt_tmp_path(tmp, sizeof tmp, root, 3, TAG, &err);
    size_t off = 0;
    for (int i = 0; i < 3 && rc == 0; i++) {
        rc = ckpt_write_optimizer_shard(tmp, i, 3, off + (i == 1), s3[i], r.m.num_params,
                                        r.m1 + off, r.m2 + off, &info[i], &err);
        off += s3[i];
    }
    info[1].offset = s3[0];
    if (rc == 0) rc = ckpt_commit(root, TAG, &r.m, info, 3, &st, toml_text, &err);
    CHECK(rc == 0, "lying shard: save: %s", err.msg);
    ckpt_notes notes = {0};
    char out[4096];
    rc = ckpt_resume(out, sizeof out, &r.m, r.m1, r.m2, 0, r.m.num_params, NULL, NULL, root, &notes,
                     &err);
    CHECK(rc == 0 && notes.n == 1 && strstr(notes.msgs[0], "optimizer-00001-of-00003") &&
              strstr(notes.msgs[0], "__metadata__ offset"),
          "lying shard: resume rc %d, notes %d: %s", rc, notes.n, notes.n ? notes.msgs[0] : "");
    ckpt_notes_free(&notes);
    run_free(&r);
}

// Commit refuses shards that leave a gap, overlap or stop short, and removes the folder.
static void test_commit_tiling(void) {
    char root[4096], tmp[4200];
    snprintf(root, sizeof root, "%s/tiling", tmp_dir);
    qwen3_config c = tiny_config(false, false, 1, 41);
    run r;
    if (!run_init(&r, &c)) return;
    size_t n = r.m.num_params, s3[3];
    three_sizes(s3, &r.m);
    run_fill(&r, 4);
    train_state st = sample_state(4);
    const struct {
        long delta1, delta2; // shift of shard 1's offset, change of shard 2's size
        const char *want;
    } cases[] = {
        {+1, 0, "leave a gap"},
        {-1, 0, "overlap"},
        {0, -1, "cover [0, "},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        ct_error err = {{0}};
        ckpt_shard_info info[3];
        size_t off[3] = {0, s3[0] + (size_t)cases[k].delta1, s3[0] + s3[1]};
        size_t len[3] = {s3[0], s3[1], s3[2] + (size_t)cases[k].delta2};
        if (cases[k].delta1) len[1] = off[2] - off[1];
        int rc = ckpt_begin(root, 4, TAG, &err);
        if (rc == 0) rc = ckpt_tmp_path(tmp, sizeof tmp, root, 4, TAG, &err);
        for (int i = 0; i < 3 && rc == 0; i++)
            rc = ckpt_write_optimizer_shard(tmp, i, 3, off[i], len[i], n, r.m1 + off[i],
                                            r.m2 + off[i], &info[i], &err);
        CHECK(rc == 0, "tiling %zu: writing: %s", k, err.msg);
        if (rc != 0) continue;
        rc = ckpt_commit(root, TAG, &r.m, info, 3, &st, toml_text, &err);
        CHECK(rc == -1 && strstr(err.msg, cases[k].want) &&
                  (k == 2 || strstr(err.msg, "optimizer-00001-of-00003")),
              "tiling %zu: commit rc %d: %s", k, rc, err.msg);
        CHECK(!file_exists_at(tmp), "tiling %zu: the temporary folder was left", k);
    }
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/step-4", root);
    CHECK(!file_exists_at(dir), "a refused commit made %s", dir);
    // A shard reported but not in the folder (another filesystem): refused at commit.
    ct_error err = {{0}};
    ckpt_shard_info info;
    int rc = ckpt_begin(root, 4, TAG, &err);
    if (rc == 0) rc = ckpt_tmp_path(tmp, sizeof tmp, root, 4, TAG, &err);
    if (rc == 0) rc = ckpt_write_optimizer_shard(tmp, 0, 1, 0, n, n, r.m1, r.m2, &info, &err);
    char p[4300];
    snprintf(p, sizeof p, "%s/%s", tmp, info.file);
    if (rc == 0) unlink(p);
    CHECK(rc == 0 && ckpt_commit(root, TAG, &r.m, &info, 1, &st, toml_text, &err) == -1 &&
              strstr(err.msg, "optimizer-00000-of-00001.safetensors: missing"),
          "commit with a missing shard: %s", err.msg);
    // ckpt_abandon removes a save's folder.
    CHECK(ckpt_begin(root, 4, TAG, &err) == 0 && file_exists_at(tmp), "begin: %s", err.msg);
    ckpt_abandon(root, 4, TAG);
    CHECK(!file_exists_at(tmp), "abandon left %s", tmp);
    run_free(&r);
}

// NaN or inf in a shard's moments is refused at write, naming the flat element.
static void test_shard_nonfinite(void) {
    char root[4096], tmp[4200];
    snprintf(root, sizeof root, "%s/shard_nan", tmp_dir);
    float a[64], b[64];
    tiny_fill(a, 64, 1);
    tiny_fill_positive(b, 64, 2);
    ct_error err = {{0}};
    ckpt_shard_info info;
    CHECK(ckpt_begin(root, 1, TAG, &err) == 0 &&
              ckpt_tmp_path(tmp, sizeof tmp, root, 1, TAG, &err) == 0,
          "begin: %s", err.msg);
    for (int k = 0; k < 2; k++) {
        float *x = k ? b : a;
        float saved = x[5];
        x[5] = k ? INFINITY : NAN;
        int rc = ckpt_write_optimizer_shard(tmp, 1, 2, 100, 64, 1000, a, b, &info, &err);
        CHECK(rc == -1 && strstr(err.msg, k ? "exp_avg_sq" : "exp_avg") &&
                  strstr(err.msg, "flat element 105") &&
                  strstr(err.msg, "optimizer-00001-of-00002.safetensors"),
              "non-finite shard %d: rc %d: %s", k, rc, err.msg);
        x[5] = saved;
    }
    char p[4300];
    snprintf(p, sizeof p, "%s/optimizer-00001-of-00002.safetensors", tmp);
    CHECK(!file_exists_at(p), "a refused shard was written");
    // Bad arguments: a range past total, a shard index out of range.
    CHECK(ckpt_write_optimizer_shard(tmp, 1, 2, 990, 64, 1000, a, b, &info, &err) == -1 &&
              strstr(err.msg, "does not fit"),
          "range past total: %s", err.msg);
    CHECK(ckpt_write_optimizer_shard(tmp, 2, 2, 0, 64, 1000, a, b, &info, &err) == -1,
          "shard 2 of 2 was accepted");
    ckpt_abandon(root, 1, TAG);
}

static void test_refuse_nonfinite(void) {
    char root[4096];
    snprintf(root, sizeof root, "%s/nan", tmp_dir);
    qwen3_config c = tiny_config(false, false, 1, 32);
    run r;
    if (!run_init(&r, &c)) return;
    run_fill(&r, 1);
    const qwen3_param *p = &r.m.params[3];
    const struct {
        float *buf;
        float v;
        const char *want;
    } cases[] = {
        {r.m.param_mem, NAN, "parameter"},
        {r.m1, INFINITY, "exp_avg of"},
        {r.m2, -INFINITY, "exp_avg_sq of"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        run_fill(&r, 1);
        cases[i].buf[p->offset + 2] = cases[i].v;
        train_state st = sample_state(1);
        ct_error err = {{0}};
        int rc = ckpt_save(root, &r.m, r.m1, r.m2, r.m.num_params, &st, toml_text, &err);
        CHECK(rc == -1 && strstr(err.msg, cases[i].want) && strstr(err.msg, p->name) &&
                  strstr(err.msg, "element 2"),
              "non-finite %zu: rc %d: %s", i, rc, err.msg);
    }
    CHECK(!file_exists_at(root), "a refused save created %s", root);
    run_free(&r);
}

// ---------------------------------------------------------------- range lists (FSDP)

#define MAX_UNITS 8
#define MAX_PARTS 4

// An FSDP-like partition: the model cut into units (the embedding, each layer, the head), each
// unit split among `parts` ranks at cuts moved by `skew` elements, so that two partitions of
// the same rank count differ. ranges[r] are rank r's pieces, ascending (empty ones left out).
typedef struct partition {
    ckpt_range ranges[MAX_PARTS][MAX_UNITS];
    int n[MAX_PARTS];
    size_t numel[MAX_PARTS];
    int parts;
} partition;

static void make_partition(partition *pt, const qwen3_model *m, int parts, size_t skew) {
    memset(pt, 0, sizeof *pt);
    pt->parts = parts;
    size_t cuts[MAX_UNITS + 1];
    int n_units = 0;
    cuts[n_units++] = 0;
    for (int i = 0; i < m->n_params; i++) {
        const char *name = m->params[i].name;
        if (strstr(name, "input_layernorm") || strcmp(name, "model.norm.weight") == 0)
            cuts[n_units++] = m->params[i].offset;
    }
    cuts[n_units] = m->num_params;
    for (int u = 0; u < n_units; u++) {
        size_t a = cuts[u], b = cuts[u + 1];
        for (int r = 0; r < parts; r++) {
            size_t lo = r == 0 ? a : a + (b - a) * (size_t)r / (size_t)parts + skew;
            size_t hi = r == parts - 1 ? b : a + (b - a) * (size_t)(r + 1) / (size_t)parts + skew;
            if (hi > lo) {
                pt->ranges[r][pt->n[r]++] = (ckpt_range){lo, hi};
                pt->numel[r] += hi - lo;
            }
        }
    }
}

// dst = src's elements over ranges, concatenated.
static void gather(float *dst, const float *src, const ckpt_range *ranges, int n) {
    for (int k = 0; k < n; k++) {
        memcpy(dst, src + ranges[k].lo, (ranges[k].hi - ranges[k].lo) * sizeof(float));
        dst += ranges[k].hi - ranges[k].lo;
    }
}

// What the FSDP ranks of a save do, from one process: begin, each rank's shard of its pieces
// (with the model's when model_shards), commit. Returns the commit's rc (err filled).
static int save_ranges(run *r, const char *root, int64_t step, const partition *pt,
                       bool model_shards, ct_error *err) {
    run_fill(r, step);
    train_state st = sample_state(step);
    char tmp[4200];
    ckpt_shard_info opt[MAX_PARTS], mod[MAX_PARTS];
    const ckpt_range *lists[MAX_PARTS];
    int rc = ckpt_begin(root, step, TAG, err);
    if (rc == 0) rc = ckpt_tmp_path(tmp, sizeof tmp, root, step, TAG, err);
    for (int k = 0; k < pt->parts && rc == 0; k++) {
        size_t n = pt->numel[k] + 1;
        float *p = malloc(n * sizeof *p), *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
        gather(p, r->m.param_mem, pt->ranges[k], pt->n[k]);
        gather(a, r->m1, pt->ranges[k], pt->n[k]);
        gather(b, r->m2, pt->ranges[k], pt->n[k]);
        rc = ckpt_write_shard(tmp, &r->m, k, pt->parts, pt->ranges[k], pt->n[k],
                              model_shards ? p : NULL, a, b, &opt[k], model_shards ? &mod[k] : NULL,
                              err);
        lists[k] = pt->ranges[k];
        free(p), free(a), free(b);
    }
    if (rc == 0)
        rc = ckpt_commit_ranges(root, TAG, &r->m, opt, model_shards ? mod : NULL, pt->parts, lists,
                                pt->n, &st, toml_text, err);
    return rc;
}

// Every rank of partition q loads its pieces from dir, and they equal step's values bitwise;
// resume_root (may be NULL) resumes them too.
static void check_partition(const char *dir, const char *resume_root, const qwen3_config *c,
                            int64_t step, const partition *q, const char *what) {
    run want;
    qwen3_model layout;
    ct_error err = {{0}};
    if (!run_init(&want, c)) return;
    run_fill(&want, step);
    CHECK(qwen3_init_layout(&layout, c, &err) == 0, "%s: layout: %s", what, err.msg);
    for (int k = 0; k < q->parts; k++) {
        size_t n = q->numel[k] + 1;
        float *buf[6];
        for (int i = 0; i < 6; i++) buf[i] = malloc(n * sizeof(float));
        gather(buf[3], want.m.param_mem, q->ranges[k], q->n[k]);
        gather(buf[4], want.m1, q->ranges[k], q->n[k]);
        gather(buf[5], want.m2, q->ranges[k], q->n[k]);
        train_state st;
        char *toml = NULL, out[4096];
        int rc = ckpt_load_ranges(dir, &layout, q->ranges[k], q->n[k], buf[0], buf[1], buf[2], &st,
                                  &toml, &err);
        train_state ws = sample_state(step);
        CHECK(rc == 0 && same_floats(buf[0], buf[3], q->numel[k]) &&
                  same_floats(buf[1], buf[4], q->numel[k]) &&
                  same_floats(buf[2], buf[5], q->numel[k]) && same_state(&st, &ws) && toml &&
                  strcmp(toml, toml_text) == 0,
              "%s: rank %d of %d: load rc %d: %s", what, k, q->parts, rc, err.msg);
        free(toml);
        if (resume_root) {
            ckpt_notes notes = {0};
            memset(buf[0], 0, n * sizeof(float));
            rc = ckpt_resume_ranges(out, sizeof out, &layout, q->ranges[k], q->n[k], buf[0], buf[1],
                                    buf[2], NULL, NULL, resume_root, &notes, &err);
            CHECK(rc == 1 && notes.n == 0 && strcmp(out, dir) == 0 &&
                      same_floats(buf[0], buf[3], q->numel[k]) &&
                      same_floats(buf[2], buf[5], q->numel[k]),
                  "%s: rank %d of %d: resume rc %d: %s", what, k, q->parts, rc, err.msg);
            ckpt_notes_free(&notes);
        }
        for (int i = 0; i < 6; i++) free(buf[i]);
    }
    qwen3_free(&layout);
    run_free(&want);
}

// The format state.json says, -1 if unreadable.
static int state_format(const char *dir) {
    char p[4300];
    snprintf(p, sizeof p, "%s/state.json", dir);
    cJSON *o = NULL;
    ct_error err;
    if (json_parse_file(&o, p, &err) != 0) return -1;
    int f = (int)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(o, "format"));
    bool model_shards = cJSON_GetObjectItemCaseSensitive(o, "model_shards") != NULL;
    cJSON_Delete(o);
    return f * 10 + model_shards;
}

// Saved by P in {1, 2, 3} FSDP-like ranks (model in shards, or in model.safetensors with
// multi-range optimizer shards), loaded by Q in {1, 2, 4} ranks of other partitions, bitwise;
// ckpt_load assembles a sharded model whole; the old single-range layout loads as ranges.
static void test_ranges(void) {
    qwen3_config c = tiny_config(false, true, 3, 41);
    run r;
    if (!run_init(&r, &c)) return;
    for (int P = 1; P <= 3; P++) {
        for (int model_shards = 0; model_shards < 2; model_shards++) {
            char root[4096], dir[4200], what[96];
            snprintf(root, sizeof root, "%s/ranges_%d_%d", tmp_dir, P, model_shards);
            snprintf(dir, sizeof dir, "%s/step-9", root);
            partition pt;
            make_partition(&pt, &r.m, P, 0);
            ct_error err = {{0}};
            int rc = save_ranges(&r, root, 9, &pt, model_shards, &err);
            CHECK(rc == 0, "save by %d ranks (model shards %d): %s", P, model_shards, err.msg);
            if (rc != 0) continue;
            // Several ranges per shard: format 4 (a unit's pieces are not merged into one range).
            int want_format = model_shards ? 41 : 40;
            CHECK(state_format(dir) == want_format, "P %d, model shards %d: state.json format %d",
                  P, model_shards, state_format(dir));
            snprintf(what, sizeof what, "model.safetensors%s", "");
            CHECK(file_exists_at(strcat(strcpy(what, dir), "/model.safetensors")) != model_shards,
                  "P %d, model shards %d: model.safetensors %s", P, model_shards,
                  model_shards ? "written" : "missing");
            CHECK(ckpt_verify(dir, &r.m, NULL, &err) == 0, "P %d: verify: %s", P, err.msg);
            for (int Q = 1; Q <= 4; Q *= 2) {
                partition q;
                make_partition(&q, &r.m, Q, Q == P ? 0 : 3);
                snprintf(what, sizeof what, "saved by %d (model shards %d), loaded by %d", P,
                         model_shards, Q);
                check_partition(dir, Q == 2 ? root : NULL, &c, 9, &q, what);
            }
            snprintf(what, sizeof what, "ckpt_load of %d shards (model shards %d)", P,
                     model_shards);
            check_holds_step(dir, &c, 9, what);
        }
    }
    // The old layout (3 single-range shards written by ckpt_write_optimizer_shard) as ranges.
    char root[4096], dir[4200];
    size_t s3[3];
    three_sizes(s3, &r.m);
    snprintf(root, sizeof root, "%s/ranges_old", tmp_dir);
    snprintf(dir, sizeof dir, "%s/step-5", root);
    if (save_sharded(&r, root, 5, s3, 3) == 0) {
        partition q;
        make_partition(&q, &r.m, 4, 3);
        check_partition(dir, root, &c, 5, &q, "old single-range layout, loaded by 4");
    }
    run_free(&r);
}

static bool flip_model_shard1(const char *dir) {
    char p[4300];
    snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", dir);
    return flip_byte(p, file_size_at(p) - 9);
}
static bool remove_model_shard0(const char *dir) {
    char p[4300];
    snprintf(p, sizeof p, "%s/model-00000-of-00002.safetensors", dir);
    return unlink(p) == 0;
}

// Ranges that do not tile are refused at commit, naming the files; a corrupt or missing model
// shard is skipped by resume (a note naming the file); a non-finite value names its tensor.
static void test_ranges_errors(void) {
    qwen3_config c = tiny_config(true, false, 2, 41);
    run r;
    if (!run_init(&r, &c)) return;
    char root[4096], tmp[4200], dir[4200], good[4200], out[4096];
    snprintf(root, sizeof root, "%s/ranges_tiling", tmp_dir);
    for (int k = 0; k < 2; k++) {
        partition pt;
        make_partition(&pt, &r.m, 2, 0);
        if (k == 0)
            pt.ranges[1][1].lo++; // rank 1's second piece starts one late: a gap
        else
            pt.ranges[1][1].lo--; // one early: over rank 0's piece
        pt.numel[1] += k == 0 ? (size_t)-1 : 1;
        ct_error err = {{0}};
        int rc = save_ranges(&r, root, 4, &pt, true, &err);
        CHECK(rc == -1 && strstr(err.msg, k == 0 ? "leave a gap" : "overlap") &&
                  strstr(err.msg, "optimizer-00001-of-00002.safetensors: range [") &&
                  strstr(err.msg, "optimizer-00000-of-00002"),
              "tiling %d: commit rc %d: %s", k, rc, err.msg);
        ckpt_tmp_path(tmp, sizeof tmp, root, 4, TAG, NULL);
        CHECK(!file_exists_at(tmp), "tiling %d: the temporary folder was left", k);
    }
    snprintf(dir, sizeof dir, "%s/step-4", root);
    CHECK(!file_exists_at(dir), "a refused commit made %s", dir);

    // Damaged model shards: verify names the file, resume skips to the previous checkpoint.
    const struct {
        const char *name;
        damage_fn damage;
        const char *want;
    } cases[] = {
        {"flipped", flip_model_shard1, "model-00001-of-00002.safetensors: XXH64"},
        {"missing", remove_model_shard0,
         "model-00000-of-00002.safetensors: missing (state.json lists it)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(root, sizeof root, "%s/ranges_damage_%s", tmp_dir, cases[i].name);
        snprintf(dir, sizeof dir, "%s/step-20", root);
        snprintf(good, sizeof good, "%s/step-10", root);
        partition pt;
        make_partition(&pt, &r.m, 2, 0);
        ct_error err = {{0}};
        if (save_ranges(&r, root, 10, &pt, true, &err) != 0 ||
            save_ranges(&r, root, 20, &pt, true, &err) != 0) {
            CHECK(0, "%s: save: %s", cases[i].name, err.msg);
            continue;
        }
        CHECK(cases[i].damage(dir), "%s: could not damage", cases[i].name);
        CHECK(ckpt_verify(dir, &r.m, NULL, &err) == -1 && strstr(err.msg, cases[i].want) &&
                  !strchr(err.msg, '\n'),
              "%s: verify: %s", cases[i].name, err.msg);
        float *buf = malloc(r.m.num_params * sizeof *buf);
        const ckpt_range all = {0, r.m.num_params};
        ckpt_notes notes = {0};
        train_state st;
        int rc = ckpt_resume_ranges(out, sizeof out, &r.m, &all, 1, buf, NULL, NULL, &st, NULL,
                                    root, &notes, &err);
        CHECK(rc == 1 && strcmp(out, good) == 0 && st.step == 10 && notes.n == 1 &&
                  strstr(notes.msgs[0], cases[i].want),
              "%s: resume rc %d, notes %d: %s", cases[i].name, rc, notes.n,
              notes.n ? notes.msgs[0] : err.msg);
        CHECK(ckpt_load(dir, &r.m, NULL, NULL, 0, 0, NULL, NULL, &err) == -1 &&
                  strstr(err.msg, cases[i].want),
              "%s: ckpt_load: %s", cases[i].name, err.msg);
        ckpt_notes_free(&notes);
        free(buf);
    }

    // A non-finite parameter or moment in a shard: refused, naming the HF tensor and element.
    snprintf(root, sizeof root, "%s/ranges_nan", tmp_dir);
    partition pt;
    make_partition(&pt, &r.m, 2, 0);
    run_fill(&r, 1);
    ct_error err = {{0}};
    CHECK(ckpt_begin(root, 1, TAG, &err) == 0 &&
              ckpt_tmp_path(tmp, sizeof tmp, root, 1, TAG, &err) == 0,
          "begin: %s", err.msg);
    // The last element of rank 1's second piece (layer 0's second half): its tensor and index.
    size_t flat = pt.ranges[1][1].hi - 1;
    size_t at = (pt.ranges[1][0].hi - pt.ranges[1][0].lo) + (flat - pt.ranges[1][1].lo);
    const qwen3_param *p = qwen3_param_at(&r.m, flat);
    float *buf[3];
    for (int i = 0; i < 3; i++) {
        buf[i] = malloc(pt.numel[1] * sizeof(float));
        gather(buf[i], i == 0 ? r.m.param_mem : i == 1 ? r.m1 : r.m2, pt.ranges[1], pt.n[1]);
    }
    static const char *const whats[3] = {"parameter", "optimizer exp_avg of",
                                         "optimizer exp_avg_sq of"};
    for (int i = 0; i < 3; i++) {
        float saved = buf[i][at];
        buf[i][at] = i == 1 ? INFINITY : NAN;
        ckpt_shard_info oi, mi;
        int rc = ckpt_write_shard(tmp, &r.m, 1, 2, pt.ranges[1], pt.n[1], buf[0], buf[1], buf[2],
                                  &oi, &mi, &err);
        char want[200];
        snprintf(want, sizeof want, "%s \"%s\" holds %s at element %zu", whats[i], p->name,
                 i == 1 ? "inf" : "nan", flat - p->offset);
        CHECK(rc == -1 && strstr(err.msg, want), "non-finite %d: rc %d: %s (want %s)", i, rc,
              err.msg, want);
        buf[i][at] = saved;
    }
    char path[4300];
    snprintf(path, sizeof path, "%s/model-00001-of-00002.safetensors", tmp);
    CHECK(!file_exists_at(path), "a refused model shard was written");
    // Ranges out of order are refused before anything is written.
    ckpt_range bad[2] = {pt.ranges[1][1], pt.ranges[1][0]};
    ckpt_shard_info oi;
    CHECK(ckpt_write_shard(tmp, &r.m, 1, 2, bad, 2, NULL, buf[1], buf[2], &oi, NULL, &err) == -1 &&
              strstr(err.msg, "ascending"),
          "ranges out of order: %s", err.msg);
    for (int i = 0; i < 3; i++) free(buf[i]);
    ckpt_abandon(root, 1, TAG);
    run_free(&r);
}

// A process that has exited (its pid is free, for now).
static long dead_pid(void) {
    pid_t pid = fork();
    if (pid == 0) _exit(0);
    waitpid(pid, NULL, 0);
    return (long)pid;
}

static void test_clean_stale(void) {
    char root[4096], path[4300], file[4400];
    snprintf(root, sizeof root, "%s/stale", tmp_dir);
    fs_mkdirs(root, NULL);
    const long pids[] = {dead_pid(), (long)getpid(), (long)getppid()};
    const bool removed[] = {true, true, false}; // the parent (ctest) is alive
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/step-30.tmp-%ld%s", root, pids[i], i == 1 ? ".old" : "");
        mkdir(path, 0777);
        snprintf(file, sizeof file, "%s/model.safetensors", path);
        write_file_text(file, "partial");
    }
    snprintf(path, sizeof path, "%s/notes.txt", root); // not ours: untouched
    write_file_text(path, "x");
    ckpt_notes notes = {0};
    ct_error err = {{0}};
    CHECK(ckpt_clean_stale(root, &notes, &err) == 0, "clean_stale: %s", err.msg);
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/step-30.tmp-%ld%s", root, pids[i], i == 1 ? ".old" : "");
        CHECK(file_exists_at(path) != removed[i], "stale folder of pid %ld %s", pids[i],
              removed[i] ? "kept" : "removed");
    }
    snprintf(path, sizeof path, "%s/notes.txt", root);
    CHECK(file_exists_at(path), "clean_stale removed an unrelated file");
    CHECK(notes.n == 3, "clean_stale notes: %d", notes.n);
    ckpt_notes_free(&notes);
    // A half-written temporary folder is never taken for a checkpoint.
    char out[4096];
    CHECK(ckpt_find_latest(out, sizeof out, NULL, root, NULL, NULL, &err) == 0,
          "a temporary folder was found as a checkpoint");
    CHECK(ckpt_clean_stale(root, NULL, &err) == 0, "second clean: %s", err.msg);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static qwen3_config kill_config(void) {
    return tiny_config(false, true, 3, 512);
}

// The saver process (this binary run as `--saver ROOT FIRST_STEP FD`): saves FIRST_STEP,
// FIRST_STEP+1, ... keeping 2, until killed; writes one byte to FD once it is about to start
// and one after each completed save, so the killer can count saves instead of guessing times.
// A fresh process rather than a fork, so no OpenMP thread pool is inherited.
static int saver_main(char **argv) {
    qwen3_config c = kill_config();
    run r;
    if (!run_init(&r, &c)) return 3;
    int fd = atoi(argv[4]);
    if (write(fd, "r", 1) != 1) return 3;
    for (int64_t s = atoll(argv[3]);; s++) {
        run_fill(&r, s);
        train_state st = sample_state(s);
        if (ckpt_save(argv[2], &r.m, r.m1, r.m2, r.m.num_params, &st, toml_text, NULL) != 0 ||
            ckpt_prune(argv[2], 2, s, NULL, NULL) != 0 || write(fd, "s", 1) != 1)
            return 3;
    }
}

// Whatever moment of a save (or prune) SIGKILL lands on, the next run cleans up and resumes
// from a complete checkpoint that holds exactly its own step's values.
static void test_kill_during_save(void) {
    char root[4096], out[4096];
    snprintf(root, sizeof root, "%s/kill", tmp_dir);
    ckpt_rmtree(root, NULL);
    qwen3_config c = kill_config(); // ~70k floats: a save takes milliseconds
    run r;
    if (!run_init(&r, &c) || save_step(&r, root, 1) != 0) return;
    double t0 = now_s();
    if (save_step(&r, root, 2) != 0) return;
    double save_s = now_s() - t0;
    srand((unsigned)time(NULL));
    int64_t last = 2, resumed_newer = 0;
    for (int trial = 0; trial < 12; trial++) {
        int fds[2];
        char first[32], fd_arg[16];
        if (pipe(fds) != 0) break;
        snprintf(first, sizeof first, "%" PRId64, last + 1);
        snprintf(fd_arg, sizeof fd_arg, "%d", fds[1]);
        pid_t pid = fork();
        if (pid == 0) {
            close(fds[0]);
            execl("/proc/self/exe", "test_checkpoint", "--saver", root, first, fd_arg,
                  (char *)NULL);
            _exit(4);
        }
        close(fds[1]);
        // Let 0, 1 or 2 saves complete (counted, not timed: a loaded machine saves slower than
        // the measurement above), then kill anywhere within the next two.
        int saves_done = trial % 3;
        char byte;
        for (int i = 0; i <= saves_done; i++)
            CHECK(read(fds[0], &byte, 1) == 1, "trial %d: the saver stopped early", trial);
        double wait_s = save_s * 2.0 * rand() / (double)RAND_MAX;
        struct timespec ts = {(time_t)wait_s, (long)((wait_s - (time_t)wait_s) * 1e9)};
        nanosleep(&ts, NULL);
        kill(pid, SIGKILL);
        close(fds[0]);
        int status;
        waitpid(pid, &status, 0);
        CHECK(WIFSIGNALED(status), "trial %d: the saver exited by itself (%d)", trial,
              WEXITSTATUS(status));

        ct_error err = {{0}};
        ckpt_notes notes = {0};
        CHECK(ckpt_clean_stale(root, &notes, &err) == 0, "trial %d: clean: %s", trial, err.msg);
        ckpt_notes_free(&notes);
        train_state st;
        int rc = ckpt_resume(out, sizeof out, &r.m, r.m1, r.m2, 0, r.m.num_params, &st, NULL, root,
                             &notes, &err);
        CHECK(rc == 1 && notes.n == 0, "trial %d: resume rc %d, notes %d: %s %s", trial, rc,
              notes.n, err.msg, notes.n ? notes.msgs[0] : "");
        ckpt_notes_free(&notes);
        if (rc != 1) break;
        CHECK(st.step >= last + saves_done, "trial %d: resumed step %" PRId64 " < %" PRId64, trial,
              st.step, last + saves_done);
        resumed_newer += st.step > last;
        check_holds_step(out, &c, st.step, "after SIGKILL");
        last = st.step;
    }
    printf("SIGKILL during saves: %d trials, %" PRId64 " resumed a newer step, last step %" PRId64
           " (a save takes %.1f ms)\n",
           12, resumed_newer, last, save_s * 1e3);
    CHECK(resumed_newer >= 8,
          "only %" PRId64 " of the 8 trials that saw a save complete resumed it", resumed_newer);
    run_free(&r);
}

int main(int argc, char **argv) {
    if (argc == 5 && strcmp(argv[1], "--saver") == 0) return saver_main(argv);
    tmp_dir = check_env("CTITAN_TMP");
    ckpt_rmtree(tmp_dir, NULL); // a fresh folder: earlier runs' checkpoints would change counts
    fs_mkdirs(tmp_dir, NULL);
    test_xxh64();
    test_roundtrip(false, false);
    test_roundtrip(true, false);
    test_roundtrip(false, true);
    test_mismatch();
    test_replace_and_prune();
    test_corrupt();
    test_shards();
    expect_skipped("missing", remove_shard1,
                   "optimizer-00001-of-00003.safetensors: missing (state.json lists it)", true);
    expect_skipped("flipped", flip_shard2, "optimizer-00002-of-00003.safetensors: XXH64", true);
    test_other_format(unknown_format, "step-20/state.json: checkpoint format 7, this ctitan reads "
                                      "formats 2 to 4; resume it with the ctitan that wrote it");
    test_format_two();
    test_other_format(format_one, "checkpoint format 1 (written before ctitan had sharded "
                                  "optimizer state), this ctitan reads formats 2 to 4");
    test_shard_metadata_lies();
    test_commit_tiling();
    test_ranges();
    test_ranges_errors();
    test_shard_nonfinite();
    test_refuse_nonfinite();
    test_clean_stale();
    test_kill_during_save();
    return check_summary();
}
