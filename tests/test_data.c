// The data pipeline without a tokenizer: .npy token streams, folders, the counter-based RNG, the
// loader's windows, epochs and shuffle, and every data error class that needs no text.
// (Text through the real Qwen3 tokenizer: test_tok_data.c.)
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "check.h"
#include "data/ctr_rng.h"
#include "data/dataset.h"
#include "data/jsonl.h"
#include "data/loader.h"
#include "io/npy.h"

static const char *tmp;

// Token i of the stream, read as the loader reads it.
static int32_t token_at(const token_stream *s, uint64_t i) {
    int32_t id = -1;
    ct_error err;
    if (stream_read(s, i, 1, &id, NULL, &err) != 0) fprintf(stderr, "%s\n", err.msg);
    return id;
}

static char *tmp_path(const char *name) {
    static char buf[8][1024];
    static int k;
    char *p = buf[k++ % 8];
    snprintf(p, sizeof buf[0], "%s/%s", tmp, name);
    return p;
}

static void write_npy(const char *path, int64_t start, size_t n, const char *descr) {
    int64_t *v = malloc((n ? n : 1) * sizeof *v);
    for (size_t i = 0; i < n; i++) v[i] = start + (int64_t)i;
    ct_error err;
    if (npy_write(path, v, n, descr, &err) != 0) {
        fprintf(stderr, "setup: %s\n", err.msg);
        exit(2);
    }
    free(v);
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(text, 1, strlen(text), f) != strlen(text) || fclose(f) != 0) {
        fprintf(stderr, "setup: cannot write %s\n", path);
        exit(2);
    }
}

// Opening must fail with a message containing every one of the given fragments.
static void check_open_fails(const char *path, int32_t vocab, const char *a, const char *b) {
    token_stream s;
    ct_error err = {{0}};
    int rc = stream_open(&s, path, NULL, vocab, 1, &err);
    CHECK(rc != 0, "%s opened, expected an error about \"%s\"", path, a);
    CHECK(strstr(err.msg, a) != NULL, "message \"%s\" lacks \"%s\"", err.msg, a);
    if (b) CHECK(strstr(err.msg, b) != NULL, "message \"%s\" lacks \"%s\"", err.msg, b);
    CHECK(s.tokens == NULL && s.n_tokens == 0, "a failed open left tokens behind");
    stream_free(&s);
}

static void test_rng(void) {
    // SplitMix64's published first outputs for state 0: its finalizer is ctr_rng_mix.
    CHECK(ctr_rng_mix(0) == 0xE220A8397B1DCDAFull, "mix(0) = %llx",
          (unsigned long long)ctr_rng_mix(0));
    CHECK(ctr_rng_mix(0x9E3779B97F4A7C15ull) == 0x6E789E6AA1B965F4ull, "mix(golden)");
    // Pinned from an independent Python implementation (arbitrary-precision integers).
    CHECK(ctr_rng_u64(1, 2, 3) == 0xD0734750FDE362B3ull, "u64(1,2,3)");
    CHECK(ctr_rng_u64(0, 0, 0) == 0x238275BC38FCBE91ull, "u64(0,0,0)");
    CHECK(ctr_rng_u64(1, 2, 3) != ctr_rng_u64(1, 3, 2), "stream and counter are not symmetric");
    // bound = 2^63+1 rejects often; counter 8 takes the retry path.
    uint64_t big = (1ull << 63) + 1;
    CHECK(ctr_rng_below(5, 6, 0, big) == 6971450861532279913ull, "below c=0");
    CHECK(ctr_rng_below(5, 6, 8, big) == 5862170056047365524ull, "below c=8 (retried)");
    CHECK(ctr_rng_below(5, 6, 9, big) == 161247261985833610ull, "below c=9");
    int out_of_range = 0;
    for (uint64_t c = 0; c < 10000; c++) out_of_range += ctr_rng_below(7, 1, c, big) >= big;
    CHECK(out_of_range == 0, "%d draws >= bound", out_of_range);
    // Uniform over 6 values: chi-square with 5 degrees of freedom, 60000 draws.
    int count[6] = {0};
    for (uint64_t c = 0; c < 60000; c++) count[ctr_rng_below(42, 0, c, 6)]++;
    double chi2 = 0;
    for (int i = 0; i < 6; i++) chi2 += (count[i] - 10000.0) * (count[i] - 10000.0) / 10000.0;
    CHECK(chi2 < 25, "die chi-square %.1f (p < 1e-4 if uniform)", chi2);
    CHECK(ctr_rng_below(9, 9, 9, 1) == 0, "bound 1");
}

static void test_npy_stream(void) {
    const char *descrs[] = {"<u2", "<i4", "<u4", "<i8"};
    for (int d = 0; d < 4; d++) {
        char *p = tmp_path("dtype.npy");
        write_npy(p, 100, 1000, descrs[d]);
        token_stream s;
        ct_error err;
        CHECK(stream_open(&s, p, NULL, 2000, 2, &err) == 0, "%s: %s", descrs[d], err.msg);
        CHECK(s.n_tokens == 1000 && s.n_files == 1 && s.n_docs == 0 && s.n_replaced == 0,
              "%s: %llu tokens", descrs[d], (unsigned long long)s.n_tokens);
        int bad = 0;
        for (size_t i = 0; i < s.n_tokens; i++) bad += token_at(&s, i) != 100 + (int32_t)i;
        CHECK(bad == 0, "%s: %d tokens differ", descrs[d], bad);
        CHECK(strcmp(s.path, p) == 0 && s.warning[0] == 0, "path/warning");
        stream_free(&s);
    }
    // vocab_size <= 0 disables the check.
    char *p = tmp_path("big.npy");
    write_npy(p, 151930, 10, "<i8");
    token_stream s;
    ct_error err;
    CHECK(stream_open(&s, p, NULL, 0, 1, &err) == 0, "%s", err.msg);
    CHECK(s.n_tokens == 10 && token_at(&s, 9) == 151939, "unchecked ids");
    stream_free(&s);
    // Token id >= vocab_size names the file and the index.
    check_open_fails(p, 151936, "big.npy", "index 6");
    // A negative id too.
    char *neg = tmp_path("neg.npy");
    write_npy(neg, -3, 10, "<i4");
    check_open_fails(neg, 100, "neg.npy", "index 0");
}

static void test_folder(void) {
    char *dir = tmp_path("folder");
    mkdir(dir, 0755);
    char path[1200];
    snprintf(path, sizeof path, "%s/b.npy", dir); // left by an earlier run's last check
    unlink(path);
    // Written out of order: the stream follows byte-wise sorted names (B < a < c).
    snprintf(path, sizeof path, "%s/c.npy", dir);
    write_npy(path, 300, 3, "<u2");
    snprintf(path, sizeof path, "%s/B.npy", dir);
    write_npy(path, 100, 2, "<i4");
    snprintf(path, sizeof path, "%s/a.npy", dir);
    write_npy(path, 200, 4, "<u4");
    // Ignored: other extensions, hidden files, sub-folders even when named like data.
    snprintf(path, sizeof path, "%s/notes.md", dir);
    write_file(path, "not data");
    snprintf(path, sizeof path, "%s/.hidden.npy", dir);
    write_npy(path, 900, 5, "<i4");
    snprintf(path, sizeof path, "%s/sub.npy", dir);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/sub.npy/inner.npy", dir);
    write_npy(path, 800, 5, "<i4");
    token_stream s;
    ct_error err;
    CHECK(stream_open(&s, dir, NULL, 1000, 2, &err) == 0, "%s", err.msg);
    int32_t want[] = {100, 101, 200, 201, 202, 203, 300, 301, 302};
    CHECK(s.n_tokens == 9 && s.n_files == 3, "%llu tokens from %llu files",
          (unsigned long long)s.n_tokens, (unsigned long long)s.n_files);
    int32_t got[9];
    CHECK(s.n_tokens == 9 && stream_read(&s, 0, 9, got, NULL, &err) == 0 &&
              memcmp(got, want, sizeof want) == 0,
          "folder order");
    stream_free(&s);
    // A trailing slash is the same folder.
    snprintf(path, sizeof path, "%s/", dir);
    CHECK(stream_open(&s, path, NULL, 1000, 1, &err) == 0 && s.n_tokens == 9, "%s", err.msg);
    stream_free(&s);
    // A bad file inside a folder is named.
    snprintf(path, sizeof path, "%s/b.npy", dir);
    write_npy(path, 5000, 2, "<i4");
    check_open_fails(dir, 1000, "b.npy", "outside [0, 1000)");
}

static void test_errors(void) {
    check_open_fails(tmp_path("missing.npy"), 100, "missing.npy", "No such file");
    check_open_fails(tmp_path("missing_dir/"), 100, "missing_dir", "No such file");
    char *empty = tmp_path("empty.npy");
    write_file(empty, "");
    check_open_fails(empty, 100, "empty.npy", "empty");
    char *zero = tmp_path("zero.npy");
    write_npy(zero, 0, 0, "<i4");
    check_open_fails(zero, 100, "zero.npy", "empty (0 tokens)");
    char *notnpy = tmp_path("garbage.npy");
    write_file(notnpy, "this is not a numpy file at all, just text");
    check_open_fails(notnpy, 100, "garbage.npy", NULL);
    char *dir = tmp_path("empty_dir");
    mkdir(dir, 0755);
    check_open_fails(dir, 100, "empty_dir", "no .txt, .jsonl or .npy files");
    char *csv = tmp_path("data.csv");
    write_file(csv, "1,2,3");
    check_open_fails(csv, 100, "data.csv", "expected a .txt, .jsonl or .npy file");
    // Text needs a tokenizer (which the text tests pass).
    char *txt = tmp_path("doc.txt");
    write_file(txt, "hello");
    check_open_fails(txt, 100, "doc.txt", "needs a tokenizer");
    char *tdir = tmp_path("npy_and_jsonl");
    mkdir(tdir, 0755);
    char path[1200];
    snprintf(path, sizeof path, "%s/a.npy", tdir);
    write_npy(path, 0, 10, "<i4");
    snprintf(path, sizeof path, "%s/b.jsonl", tdir);
    write_file(path, "{\"text\": \"hi\"}\n");
    check_open_fails(tdir, 100, "b.jsonl", "needs a tokenizer");
}

// A stream whose token i is i: a window's tokens say where they came from.
static token_stream counting_stream(size_t n) {
    char *p = tmp_path("count.npy");
    write_npy(p, 0, n, "<i4");
    token_stream s;
    ct_error err;
    if (stream_open(&s, p, NULL, 0, 1, &err) != 0) {
        fprintf(stderr, "setup: %s\n", err.msg);
        exit(2);
    }
    return s;
}

static void test_windows(void) {
    token_stream s = counting_stream(53); // T=4: 10 windows of 5, 3 tokens left over
    data_loader l;
    ct_error err;
    CHECK(loader_init(&l, &s, 4, false, 0, &err) == 0, "%s", err.msg);
    CHECK(l.n_windows == 10 && l.perm == NULL, "n_windows %llu", (unsigned long long)l.n_windows);
    int32_t in[64], tg[64];
    int bad = 0;
    for (uint64_t g = 0; g < 35; g++) {
        CHECK(loader_sample(&l, in, tg, NULL, g, &err) == 0, "%s", err.msg);
        int32_t w = (int32_t)(g % 10);
        for (int t = 0; t < 4; t++) bad += in[t] != 5 * w + t || tg[t] != 5 * w + t + 1;
        bad += loader_window(&l, g) != (uint64_t)w || loader_epoch(&l, g) != g / 10;
    }
    CHECK(bad == 0, "%d mismatches in unshuffled windows/epochs", bad);
    loader_free(&l);
    // Exactly seq_len+1 tokens: one window. One fewer: an error naming the counts.
    CHECK(loader_init(&l, &s, 52, true, 0, &err) == 0 && l.n_windows == 1, "%s", err.msg);
    CHECK(loader_sample(&l, in, tg, NULL, 5, &err) == 0, "%s",
          err.msg); // any g reads the one window
    CHECK(in[0] == 0 && tg[0] == 1, "single window");
    loader_free(&l);
    CHECK(loader_init(&l, &s, 53, false, 0, &err) != 0, "53 tokens for seq_len 53");
    CHECK(strstr(err.msg, "count.npy has 53 tokens, fewer than seq_len+1 = 54") != NULL, "%s",
          err.msg);
    CHECK(loader_init(&l, &s, 0, false, 0, &err) != 0, "seq_len 0 accepted");
    stream_free(&s);
}

static bool is_perm(const uint64_t *w, uint64_t n) {
    char *seen = calloc(n, 1);
    bool ok = true;
    for (uint64_t i = 0; i < n; i++) {
        if (w[i] >= n || seen[w[i]])
            ok = false;
        else
            seen[w[i]] = 1;
    }
    free(seen);
    return ok;
}

static void epoch_windows(uint64_t *out, data_loader *l, uint64_t epoch) {
    for (uint64_t i = 0; i < l->n_windows; i++) out[i] = loader_window(l, epoch * l->n_windows + i);
}

static void test_shuffle(void) {
    token_stream s = counting_stream(1000); // T=9: 100 windows
    data_loader a, b, c;
    ct_error err;
    CHECK(loader_init(&a, &s, 9, true, 0, &err) == 0, "%s", err.msg);
    CHECK(loader_init(&b, &s, 9, true, 0, &err) == 0, "%s", err.msg);
    CHECK(loader_init(&c, &s, 9, true, 1, &err) == 0, "%s", err.msg);
    uint64_t e0[100], e1[100], e0b[100], s1[100];
    int identity = 0;
    for (uint64_t e = 0; e < 5; e++) {
        epoch_windows(e0, &a, e);
        CHECK(is_perm(e0, 100), "epoch %llu is not a permutation", (unsigned long long)e);
        for (int i = 0; i < 100; i++) identity += e0[i] == (uint64_t)i;
    }
    CHECK(identity < 25, "%d of 500 windows in place: not shuffled", identity);
    epoch_windows(e0, &a, 0);
    epoch_windows(e1, &a, 1);
    epoch_windows(e0b, &b, 0);
    epoch_windows(s1, &c, 0);
    CHECK(memcmp(e0, e1, sizeof e0) != 0, "epochs 0 and 1 have the same order");
    CHECK(memcmp(e0, e0b, sizeof e0) == 0, "same seed, different order");
    CHECK(memcmp(e0, s1, sizeof e0) != 0, "seeds 0 and 1 give the same order");
    // The pinned permutations (seed, epoch, n) from the Python reimplementation of the spec.
    token_stream ten = counting_stream(10 * 13); // T=12: 10 windows (token count 130)
    data_loader p;
    uint64_t want00[] = {5, 8, 1, 2, 6, 4, 0, 3, 7, 9}, want01[] = {2, 6, 7, 4, 3, 1, 9, 8, 0, 5};
    uint64_t got[10];
    CHECK(loader_init(&p, &ten, 12, true, 0, &err) == 0 && p.n_windows == 10, "%s", err.msg);
    epoch_windows(got, &p, 1);
    CHECK(memcmp(got, want01, sizeof got) == 0, "seed 0 epoch 1 differs from the reference");
    epoch_windows(got, &p, 0);
    CHECK(memcmp(got, want00, sizeof got) == 0, "seed 0 epoch 0 differs from the reference");
    loader_free(&p);
    uint64_t want1234[] = {4, 9, 2, 6, 7, 8, 3, 0, 5, 1};
    CHECK(loader_init(&p, &ten, 12, true, 1234, &err) == 0, "%s", err.msg);
    epoch_windows(got, &p, 0);
    CHECK(memcmp(got, want1234, sizeof got) == 0, "seed 1234 differs from the reference");
    loader_free(&p);
    stream_free(&ten);

    // Samples carry the window's tokens.
    int32_t in[9], tg[9];
    int bad = 0;
    for (uint64_t g = 0; g < 300; g += 7) {
        CHECK(loader_sample(&a, in, tg, NULL, g, &err) == 0, "%s", err.msg);
        uint64_t w = loader_window(&a, g);
        for (int t = 0; t < 9; t++)
            bad += in[t] != (int32_t)(10 * w) + t || tg[t] != (int32_t)(10 * w) + t + 1;
    }
    CHECK(bad == 0, "%d shuffled samples differ from their window", bad);

    // Resume by index: a fresh loader started at any g (mid-epoch, across a boundary, in
    // random order) reads exactly what the uninterrupted one read.
    uint64_t straight[350];
    for (uint64_t g = 0; g < 350; g++) straight[g] = loader_window(&a, g);
    uint64_t starts[] = {0, 1, 99, 100, 101, 250, 349};
    for (int k = 0; k < 7; k++) {
        data_loader r;
        loader_init(&r, &s, 9, true, 0, &err);
        int diff = 0;
        for (uint64_t g = starts[k]; g < 350; g++) diff += loader_window(&r, g) != straight[g];
        CHECK(diff == 0, "resume at %llu: %d samples differ", (unsigned long long)starts[k], diff);
        loader_free(&r);
    }
    int diff = 0;
    for (uint64_t k = 0; k < 2000; k++) {
        uint64_t g = ctr_rng_below(3, 3, k, 350);
        diff += loader_window(&b, g) != straight[g];
    }
    CHECK(diff == 0, "random-order reads: %d differ", diff);
    // Two ranks of batch 3 taking turns (rank r reads g = step*6 + r*3 + i) cover the same
    // global samples as one process reading g in order.
    data_loader r1;
    loader_init(&r1, &s, 9, true, 0, &err);
    diff = 0;
    for (uint64_t step = 0; step < 50; step++)
        for (uint64_t r = 0; r < 2; r++)
            for (uint64_t i = 0; i < 3; i++) {
                uint64_t g = step * 6 + r * 3 + i;
                diff += g < 350 && loader_window(r ? &r1 : &b, g) != straight[g];
            }
    CHECK(diff == 0, "two ranks: %d samples differ from one process", diff);
    loader_free(&r1);
    loader_free(&a);
    loader_free(&b);
    loader_free(&c);
    stream_free(&s);
}

// Every order of 4 windows is equally likely: 24 permutations over 24000 epochs.
static void test_shuffle_uniform(void) {
    token_stream s = counting_stream(8); // T=1: 4 windows
    data_loader l;
    ct_error err;
    CHECK(loader_init(&l, &s, 1, true, 77, &err) == 0, "%s", err.msg);
    int count[256] = {0};
    for (uint64_t e = 0; e < 24000; e++) {
        uint64_t w[4];
        epoch_windows(w, &l, e);
        count[w[0] * 64 + w[1] * 16 + w[2] * 4 + w[3]]++;
    }
    int distinct = 0;
    double chi2 = 0;
    for (int i = 0; i < 256; i++) {
        if (!count[i]) continue;
        distinct++;
        chi2 += (count[i] - 1000.0) * (count[i] - 1000.0) / 1000.0;
    }
    CHECK(distinct == 24, "%d distinct orders of 4", distinct);
    // 23 degrees of freedom: P(chi2 > 60) < 1e-4 for a uniform shuffle.
    CHECK(chi2 < 60, "permutation chi-square %.1f", chi2);
    loader_free(&l);
    stream_free(&s);
}

// A pre-tokenized line's ids and mask: every number that is not a small non-negative integer
// is refused with its own words, before anything converts it (issue 36: 3e102 reached a cast).
static void test_ids_numbers(void) {
    static const struct {
        const char *line, *want;
    } cases[] = {
        {"{\"ids\": [1, 0, 3e102]}",
         "\"ids\"[2]: expected an integer in [0, 151936), found a number outside it"},
        {"{\"ids\": [1, 1e999]}", "\"ids\"[1]: expected an integer in [0, 151936), found infinity"},
        {"{\"ids\": [-1e999]}", "\"ids\"[0]: expected an integer in [0, 151936), found infinity"},
        {"{\"ids\": [-0]}", "\"ids\"[0]: expected an integer in [0, 151936), found -0"},
        {"{\"ids\": [5, -3]}",
         "\"ids\"[1]: expected an integer in [0, 151936), found a number outside it"},
        {"{\"ids\": [151936]}",
         "\"ids\"[0]: expected an integer in [0, 151936), found a number outside it"},
        {"{\"ids\": [2.5]}", "\"ids\"[0]: expected an integer in [0, 151936), found a fraction"},
        {"{\"ids\": [1, \"2\"]}", "\"ids\"[1]: expected an integer in [0, 151936), found a string"},
        {"{\"ids\": [1, 2], \"mask\": [0, 3e102]}",
         "\"mask\"[1]: expected 0 or 1, found a number outside it"},
        {"{\"ids\": [1, 2], \"mask\": [1e999, 0]}", "\"mask\"[0]: expected 0 or 1, found infinity"},
        {"{\"ids\": [1, 2], \"mask\": [0, -0]}", "\"mask\"[1]: expected 0 or 1, found -0"},
        {"{\"ids\": [1, 2], \"mask\": [0.5, 1]}", "\"mask\"[0]: expected 0 or 1, found a fraction"},
        {"{\"ids\": [1, 2], \"mask\": [0, 2]}",
         "\"mask\"[1]: expected 0 or 1, found a number outside it"},
        {"{\"ids\": [0, 151935], \"mask\": [0, 1]}", NULL},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        cJSON *root = cJSON_Parse(cases[c].line);
        CHECK(root != NULL, "case %zu does not parse", c);
        if (!root) continue;
        ct_error err = {0};
        size_t n = 0;
        bool has_mask = false;
        const int rc = jsonl_ids_check(root, 151936, &n, &has_mask, &err);
        if (cases[c].want)
            CHECK(rc != 0 && strcmp(err.msg, cases[c].want) == 0, "%s: got \"%s\", want \"%s\"",
                  cases[c].line, rc ? err.msg : "(accepted)", cases[c].want);
        else
            CHECK(rc == 0 && n == 2 && has_mask, "%s: %s", cases[c].line, err.msg);
        cJSON_Delete(root);
    }
}

int main(void) {
    tmp = check_env("CTITAN_TMP");
    test_rng();
    test_npy_stream();
    test_folder();
    test_errors();
    test_windows();
    test_shuffle();
    test_shuffle_uniform();
    test_ids_numbers();
    return check_summary();
}
