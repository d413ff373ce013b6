// Text datasets through the real Qwen3 tokenizer (assets/): .txt, .jsonl, folders, invalid
// UTF-8, thread-count independence, and the text error classes. Each stream is compared with a
// plain single-encoder tok_encode of the same documents, <|endoftext|> after each.
#include <stdint.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "check.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "io/json.h"
#include "io/npy.h"
#include "io/toml.h"
#include "text/tokenizer.h"

#define VOCAB 151936 // Qwen3's embedding rows

static const char *tmp;
static tokenizer *tok;
static tok_encoder *enc;
static int32_t eos;

static char *tmp_path(const char *name) {
    static char buf[8][1024];
    static int k;
    char *p = buf[k++ % 8];
    snprintf(p, sizeof buf[0], "%s/%s", tmp, name);
    return p;
}

static void write_bytes(const char *path, const char *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n || fclose(f) != 0) {
        fprintf(stderr, "setup: cannot write %s\n", path);
        exit(2);
    }
}

static void write_file(const char *path, const char *text) {
    write_bytes(path, text, strlen(text));
}

// Writes text to dir/name.
static void write_in(const char *dir, const char *name, const char *text) {
    char p[1200];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    write_file(p, text);
}

static char *read_file(const char *path, size_t *len) {
    char *text;
    ct_error err;
    if (file_read_all(&text, len, path, (size_t)1 << 30, &err) != 0) {
        fprintf(stderr, "setup: %s\n", err.msg);
        exit(2);
    }
    return text;
}

static void push_id(tok_ids *ids, int32_t id) {
    if (ids->n == ids->cap) {
        ids->cap = ids->cap ? 2 * ids->cap : 1024;
        if (!(ids->v = realloc(ids->v, ids->cap * sizeof *ids->v))) exit(2);
    }
    ids->v[ids->n++] = id;
}

// The reference: one document's ids from a single encoder, then <|endoftext|>.
static void ref_doc(tok_ids *ids, const char *text, size_t len) {
    ct_error err;
    if (tok_encode(enc, ids, text, len, &err) != 0) {
        fprintf(stderr, "reference encode: %s\n", err.msg);
        exit(2);
    }
    push_id(ids, eos);
}

// Token i of the stream, read as the loader reads it.
static int32_t token_at(const token_stream *s, uint64_t i) {
    int32_t id = -1;
    ct_error err;
    if (stream_read(s, i, 1, &id, NULL, &err) != 0) fprintf(stderr, "%s\n", err.msg);
    return id;
}

static bool same_ids(const token_stream *s, const tok_ids *want, const char *what) {
    size_t first = 0;
    while (first < s->n_tokens && first < want->n && token_at(s, first) == want->v[first]) first++;
    bool ok = s->n_tokens == want->n && first == want->n;
    CHECK(ok, "%s: %llu tokens vs %zu expected, first difference at %zu", what,
          (unsigned long long)s->n_tokens, want->n, first);
    return ok;
}

static void open_ok(token_stream *s, const char *path, int threads) {
    ct_error err = {{0}};
    int rc = stream_open(s, path, tok, VOCAB, threads, &err);
    CHECK(rc == 0, "%s (%d threads): %s", path, threads, err.msg);
}

static void check_open_fails(const char *path, int32_t vocab, int threads, const char *a,
                             const char *b) {
    token_stream s;
    ct_error err = {{0}};
    CHECK(stream_open(&s, path, tok, vocab, threads, &err) != 0,
          "%s opened, expected an error about \"%s\"", path, a);
    CHECK(strstr(err.msg, a) != NULL, "message \"%s\" lacks \"%s\"", err.msg, a);
    if (b) CHECK(strstr(err.msg, b) != NULL, "message \"%s\" lacks \"%s\"", err.msg, b);
    stream_free(&s);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

// A .txt is one document, and a long one is encoded in pieces on several threads: the ids
// must equal one encoder's ids of the whole file, for every thread count.
static void test_txt(const char *assets) {
    char src[1024];
    snprintf(src, sizeof src, "%s/corpus/nlp-corpus.txt", assets);
    size_t len;
    char *all = read_file(src, &len);
    // About 1.5 MB (several 256 KiB pieces), ending at a line end.
    size_t n = len < 1500000 ? len : 1500000;
    while (n < len && all[n - 1] != '\n') n++;
    char *p = tmp_path("long.txt");
    write_bytes(p, all, n);
    tok_ids want = {0};
    ref_doc(&want, all, n);
    free(all);
    for (int threads = 1; threads <= 3; threads++) {
        token_stream s;
        double t0 = now();
        open_ok(&s, p, threads);
        double secs = now() - t0;
        same_ids(&s, &want, "long.txt");
        CHECK(s.n_docs == 1 && s.n_files == 1 && s.n_replaced == 0 && !s.warning[0], "%llu docs",
              (unsigned long long)s.n_docs);
        CHECK(s.n_tokens > 300000 && token_at(&s, s.n_tokens - 1) == eos, "%llu tokens",
              (unsigned long long)s.n_tokens);
        printf("long.txt: %zu bytes, %llu tokens in %.2f s on %d thread(s)\n", n,
               (unsigned long long)s.n_tokens, secs, threads);
        stream_free(&s);
    }
    tok_ids_free(&want);
    // The demo's small file.
    snprintf(src, sizeof src, "%s/corpus/small.txt", assets);
    char *small = read_file(src, &len);
    tok_ids w2 = {0};
    ref_doc(&w2, small, len);
    token_stream s;
    open_ok(&s, src, 2);
    same_ids(&s, &w2, "small.txt");
    stream_free(&s);
    tok_ids_free(&w2);
    free(small);
}

// .jsonl: one document per non-empty line, the "text" field decoded by an independent cJSON
// parse here.
static void test_jsonl(const char *assets) {
    char src[1024];
    snprintf(src, sizeof src, "%s/corpus/nlp-corpus.jsonl", assets);
    size_t len;
    char *all = read_file(src, &len);
    // The first 3000 lines, with blank lines and a CRLF ending mixed in.
    size_t pos = 0;
    int lines = 0;
    FILE *f = fopen(tmp_path("part.jsonl"), "wb");
    tok_ids want = {0};
    while (pos < len && lines < 3000) {
        char *nl = memchr(all + pos, '\n', len - pos);
        size_t n = nl ? (size_t)(nl - (all + pos)) : len - pos;
        fwrite(all + pos, 1, n, f);
        fputs(lines % 97 == 5 ? "\r\n" : "\n", f);
        if (lines % 113 == 7) fputs("\n", f);
        cJSON *j = cJSON_ParseWithLength(all + pos, n);
        const char *text = cJSON_GetObjectItemCaseSensitive(j, "text")->valuestring;
        ref_doc(&want, text, strlen(text));
        cJSON_Delete(j);
        pos += n + 1;
        lines++;
    }
    fclose(f);
    free(all);
    for (int threads = 1; threads <= 3; threads += 2) {
        token_stream s;
        open_ok(&s, tmp_path("part.jsonl"), threads);
        same_ids(&s, &want, "part.jsonl");
        CHECK(s.n_docs == 3000, "%llu documents", (unsigned long long)s.n_docs);
        stream_free(&s);
    }
    tok_ids_free(&want);

    // Escapes, non-ASCII, an empty text (a document of just <|endoftext|>), an added token in
    // the text (matched whole, as HF does), extra fields, a last line without \n.
    const char *docs[] = {"Tab\there, quote \" and \\ slash / é 中文 😀", "", "a<|im_end|>b",
                          "line one\nline two"};
    write_file(tmp_path("misc.jsonl"),
               "{\"text\": \"Tab\\there, quote \\\" and \\\\ slash \\/ \\u00e9 中文 "
               "\\ud83d\\ude00\"}\n"
               "{\"id\": 7, \"text\": \"\"}\n"
               "{\"text\": \"a<|im_end|>b\", \"meta\": {\"text\": 1}}\n"
               "{\"text\": \"line one\\nline two\"}");
    tok_ids w2 = {0};
    for (int i = 0; i < 4; i++) ref_doc(&w2, docs[i], strlen(docs[i]));
    token_stream s;
    open_ok(&s, tmp_path("misc.jsonl"), 2);
    same_ids(&s, &w2, "misc.jsonl");
    CHECK(s.n_docs == 4, "%llu documents", (unsigned long long)s.n_docs);
    CHECK(s.n_tokens > 3 && token_at(&s, 0) != eos, "first token");
    stream_free(&s);
    tok_ids_free(&w2);
}

// A folder mixes .txt, .jsonl and .npy in sorted name order; .npy ids are used as is.
static void test_folder(void) {
    char *dir = tmp_path("mixed");
    mkdir(dir, 0755);
    char p[1200];
    write_in(dir, "b.jsonl",
             "{\"text\": \"second file, first doc\"}\n{\"text\": \"second doc\"}\n");
    write_in(dir, "a.txt", "The first file.\nIts second line.\n");
    snprintf(p, sizeof p, "%s/c.npy", dir);
    int64_t raw[] = {1, 2, 3, 151935};
    ct_error err;
    CHECK(npy_write(p, raw, 4, "<u4", &err) == 0, "%s", err.msg);
    write_in(dir, "readme.md", "ignored");
    tok_ids want = {0};
    const char *a = "The first file.\nIts second line.\n";
    ref_doc(&want, a, strlen(a));
    ref_doc(&want, "second file, first doc", 22);
    ref_doc(&want, "second doc", 10);
    for (int i = 0; i < 4; i++) push_id(&want, (int32_t)raw[i]);
    token_stream s;
    open_ok(&s, dir, 2);
    same_ids(&s, &want, "mixed folder");
    CHECK(s.n_files == 3 && s.n_docs == 3, "%llu files, %llu docs", (unsigned long long)s.n_files,
          (unsigned long long)s.n_docs);
    // The loader over a text stream: window 0 is the first seq_len+1 ids.
    data_loader l;
    CHECK(loader_init(&l, &s, 8, false, 0, &err) == 0, "%s", err.msg);
    int32_t in[8], tg[8];
    CHECK(loader_sample(&l, in, tg, NULL, 0, &err) == 0, "%s", err.msg);
    CHECK(memcmp(in, want.v, sizeof in) == 0 && memcmp(tg, want.v + 1, sizeof tg) == 0, "window 0");
    loader_free(&l);
    CHECK(loader_init(&l, &s, (int)s.n_tokens, false, 0, &err) != 0, "too few tokens");
    CHECK(strstr(err.msg, "mixed has") && strstr(err.msg, "fewer than seq_len+1"), "%s", err.msg);
    stream_free(&s);
    tok_ids_free(&want);
}

// Invalid UTF-8 is replaced by U+FFFD per maximal ill-formed subsequence (Python's
// errors="replace"), counted, and the first one located in the warning.
static void test_invalid_utf8(void) {
    const char bad[] = "ab\xff"
                       "cd \xe2\x82 x \xc3"; // 0xFF, a truncated 3-byte, a lone lead at the end
    write_bytes(tmp_path("bad.txt"), bad, sizeof bad - 1);
    const char *fixed = "ab\xEF\xBF\xBD"
                        "cd \xEF\xBF\xBD x \xEF\xBF\xBD";
    tok_ids want = {0};
    ref_doc(&want, fixed, strlen(fixed));
    token_stream s;
    open_ok(&s, tmp_path("bad.txt"), 2);
    same_ids(&s, &want, "bad.txt");
    CHECK(s.n_replaced == 3, "%llu replaced", (unsigned long long)s.n_replaced);
    CHECK(strstr(s.warning, "3 invalid UTF-8") && strstr(s.warning, "bad.txt at byte offset 2"),
          "warning: %s", s.warning);
    stream_free(&s);
    tok_ids_free(&want);
    // In a .jsonl the raw bytes sit inside the JSON string; the warning names the line.
    const char jl[] = "{\"text\": \"fine\"}\n{\"text\": \"x\xfey\"}\n{\"text\": \"\xc0\xaf\"}\n";
    write_bytes(tmp_path("bad.jsonl"), jl, sizeof jl - 1);
    tok_ids w2 = {0};
    ref_doc(&w2, "fine", 4);
    ref_doc(&w2, "x\xEF\xBF\xBDy", 5);
    ref_doc(&w2, "\xEF\xBF\xBD\xEF\xBF\xBD", 6); // C0 AF: two ill-formed bytes
    for (int threads = 1; threads <= 2; threads++) {
        open_ok(&s, tmp_path("bad.jsonl"), threads);
        same_ids(&s, &w2, "bad.jsonl");
        CHECK(s.n_replaced == 3 && strstr(s.warning, "bad.jsonl at line 2"), "%llu: %s",
              (unsigned long long)s.n_replaced, s.warning);
        stream_free(&s);
    }
    tok_ids_free(&w2);
}

// path opened on 1 and 2 threads gives want, n_docs documents.
static void check_stream(const char *path, const tok_ids *want, uint64_t n_docs) {
    for (int threads = 1; threads <= 2; threads++) {
        token_stream s;
        open_ok(&s, path, threads);
        same_ids(&s, want, path);
        CHECK(s.n_docs == n_docs, "%s: %llu documents", path, (unsigned long long)s.n_docs);
        stream_free(&s);
    }
}

// Text is bytes: NUL and the other C0 controls are characters like any other (HF encodes them
// with byte-level BPE). A .txt carries them raw; a .jsonl as \u0000-style escapes, short escapes
// (\b \f \n \r \t) or raw bytes inside the string; either way the document is every byte.
static void test_controls(void) {
    char all[80], *p = all; // "a", then U+0000..U+001F each followed by "x", then "end"
    *p++ = 'a';
    for (int c = 0; c < 32; c++) *p++ = (char)c, *p++ = 'x';
    memcpy(p, "end", 3);
    size_t all_n = (size_t)(p + 3 - all);
    write_bytes(tmp_path("controls.txt"), all, all_n);
    tok_ids want = {0};
    ref_doc(&want, all, all_n);
    check_stream(tmp_path("controls.txt"), &want, 1);
    tok_ids_free(&want);

    // The same text in a .jsonl, every control as a \u escape; then NUL at the start, at the
    // end, twice in a row, after a backslash escape, as a short escape's neighbour, and raw.
    char line[512];
    size_t o = 0;
    o += (size_t)snprintf(line + o, sizeof line - o, "{\"text\": \"a");
    for (int c = 0; c < 32; c++) o += (size_t)snprintf(line + o, sizeof line - o, "\\u%04Xx", c);
    o += (size_t)snprintf(line + o, sizeof line - o, "end\"}\n");
    static const char rest[] = "{\"text\": \"\\u0000lead\"}\n"
                               "{\"id\": \"\\u0000\", \"text\": \"trail\\u0000\"}\n"
                               "{\"text\": \"two\\u0000\\u0000nuls \\\\u0000 is text\"}\n"
                               "{\"text\": \"\\b\\f\\n\\r\\t\\u0000\\\"\\/\\ud83d\\ude00\"}\n"
                               "{\"text\": \"raw \0 nul\"}\n"
                               "{\"text\": \"\\u0000\"}\n";
    memcpy(line + o, rest, sizeof rest - 1);
    o += sizeof rest - 1;
    write_bytes(tmp_path("controls.jsonl"), line, o);
    static const struct {
        const char *s;
        size_t n;
    } docs[] = {
        {"\0lead", 5},
        {"trail\0", 6},
        {"two\0\0nuls \\u0000 is text", 24},
        {"\b\f\n\r\t\0\"/\xF0\x9F\x98\x80", 12},
        {"raw \0 nul", 9},
        {"\0", 1},
    };
    tok_ids w2 = {0};
    ref_doc(&w2, all, all_n);
    for (size_t i = 0; i < sizeof docs / sizeof docs[0]; i++) ref_doc(&w2, docs[i].s, docs[i].n);
    check_stream(tmp_path("controls.jsonl"), &w2, 7);
    tok_ids_free(&w2);
}

// A folder that holds the same text twice (a .txt and a .jsonl of it, or two copies of a file)
// trains it twice: one warning names the first two files that share a document.
static void test_duplicates(const char *src) {
    char *dir = tmp_path("dup");
    mkdir(dir, 0755);
    char p[1200];
    write_in(dir, "corpus.txt", "The same sentence.\nAnother one.\n");
    write_in(dir, "corpus.jsonl",
             "{\"text\": \"The same sentence.\"}\n{\"text\": \"Another one.\"}\n");
    write_in(dir, "other.txt", "Different text.\n");
    token_stream s;
    open_ok(&s, dir, 2);
    CHECK(strstr(s.warning, "corpus.jsonl and ") && strstr(s.warning, "corpus.txt") &&
              strstr(s.warning, "2 documents") && !strstr(s.warning, "other.txt"),
          "warning: \"%s\"", s.warning);
    stream_free(&s);
    // Two copies of a .jsonl, and a document that is also a whole .txt.
    char *dir2 = tmp_path("dup2");
    mkdir(dir2, 0755);
    const char *jl = "{\"text\": \"one\"}\n{\"text\": \"two\\u0000\"}\n";
    write_in(dir2, "a.jsonl", jl);
    write_in(dir2, "b.jsonl", jl);
    write_in(dir2, "c.txt", "one");
    open_ok(&s, dir2, 1);
    CHECK(strstr(s.warning, "a.jsonl and ") && strstr(s.warning, "b.jsonl hold") &&
              strstr(s.warning, "1 more pair"),
          "warning: \"%s\"", s.warning);
    stream_free(&s);
    // Lines two .txt files share (boilerplate) are not a duplicate document, nor are empty
    // documents, nor a document repeated within one file.
    char *dir3 = tmp_path("nodup");
    mkdir(dir3, 0755);
    write_in(dir3, "a.txt", "Chapter 1\nIt begins.\n");
    write_in(dir3, "b.txt", "Chapter 1\nIt ends.\n");
    write_in(dir3, "c.jsonl", "{\"text\": \"\"}\n{\"text\": \"x\"}\n{\"text\": \"x\"}\n");
    write_in(dir3, "d.jsonl", "{\"text\": \"\"}\n");
    open_ok(&s, dir3, 2);
    CHECK(!s.warning[0], "warning: \"%s\"", s.warning);
    stream_free(&s);

    // The recipe on an HF folder trains each sentence once (assets/corpus holds the nlp-corpus
    // sentences as .txt and as .jsonl).
    snprintf(p, sizeof p, "%s/configs/hf_qwen3_4b.toml", src);
    toml_doc doc;
    ct_error err;
    CHECK(toml_parse_file(&doc, p, &err) == 0, "%s", err.msg);
    const char *path = NULL;
    for (int i = 0; i < doc.n_entries; i++)
        if (!strcmp(doc.entries[i].section, "training") &&
            !strcmp(doc.entries[i].key, "dataset_path"))
            path = doc.entries[i].value.str;
    CHECK(path != NULL, "%s has no training.dataset_path", p);
    if (path) {
        snprintf(p, sizeof p, "%s/%s", src, path);
        open_ok(&s, p, 0);
        CHECK(!strstr(s.warning, "same"), "%s: %s", path, s.warning);
        CHECK(s.n_docs == 100000, "%s: %llu documents", path, (unsigned long long)s.n_docs);
        stream_free(&s);
    }
    toml_free(&doc);
}

static void test_errors(void) {
    write_file(tmp_path("empty.txt"), "");
    check_open_fails(tmp_path("empty.txt"), VOCAB, 2, "empty.txt", "empty");
    write_file(tmp_path("empty.jsonl"), "");
    check_open_fails(tmp_path("empty.jsonl"), VOCAB, 2, "empty.jsonl", "empty");
    write_file(tmp_path("blank.jsonl"), "\n\r\n\n");
    check_open_fails(tmp_path("blank.jsonl"), VOCAB, 2, "blank.jsonl", "no documents");
    check_open_fails(tmp_path("nope.jsonl"), VOCAB, 2, "nope.jsonl", "No such file");
    write_file(tmp_path("notext.jsonl"),
               "{\"text\": \"ok\"}\n\n{\"content\": \"no text key\"}\n{\"text\": \"ok\"}\n");
    check_open_fails(tmp_path("notext.jsonl"), VOCAB, 2,
                     "notext.jsonl:3:", "no \"text\", \"messages\" or \"ids\" field");
    write_file(tmp_path("number.jsonl"), "{\"text\": \"ok\"}\n{\"text\": 42}\n");
    check_open_fails(tmp_path("number.jsonl"), VOCAB, 2,
                     "number.jsonl:2:", "\"text\" is not a string: found a number");
    write_file(tmp_path("array.jsonl"), "[\"text\"]\n");
    check_open_fails(tmp_path("array.jsonl"), VOCAB, 2,
                     "array.jsonl:1:", "expected a JSON object, found an array");
    write_file(tmp_path("broken.jsonl"), "{\"text\": \"ok\"}\n{\"text\": \"unterminated}\n");
    check_open_fails(tmp_path("broken.jsonl"), VOCAB, 2, "broken.jsonl:2:", "invalid JSON");
    // cJSON reads a \u with a bad hex digit as \u0000, which would end its C string there.
    write_file(tmp_path("badhex.jsonl"), "{\"text\": \"ok\"}\n{\"text\": \"a\\u00zzb\"}\n");
    check_open_fails(tmp_path("badhex.jsonl"), VOCAB, 2, "badhex.jsonl:2: invalid JSON",
                     "4 hex digits");
    // The first bad line in file order is reported, whatever the thread count.
    FILE *f = fopen(tmp_path("late.jsonl"), "wb");
    for (int i = 1; i <= 2000; i++)
        fputs(i == 1500 || i == 1900 ? "{\"txt\": 1}\n" : "{\"text\": \"fine text\"}\n", f);
    fclose(f);
    for (int threads = 1; threads <= 3; threads++)
        check_open_fails(tmp_path("late.jsonl"), VOCAB, threads, "late.jsonl:1500:", "no \"text\"");
    // An id beyond the model's vocabulary (<|im_end|> = 151645 with vocab_size 151644, which
    // still holds <|endoftext|> = 151643), and an <|endoftext|> beyond it.
    write_file(tmp_path("words.jsonl"), "{\"text\": \"a\"}\n{\"text\": \"hi<|im_end|>\"}\n");
    CHECK(tok_token_id(tok, "<|im_end|>") == 151645, "<|im_end|> id");
    check_open_fails(tmp_path("words.jsonl"), 151644, 2,
                     "words.jsonl:2: token id 151645 (<|im_end|>)",
                     "outside the model's vocab_size 151644");
    check_open_fails(tmp_path("words.jsonl"), 1000, 2, "end-of-document id 151643",
                     "vocab_size 1000");
    // Parse errors and id errors are found in different passes; the first in the file wins.
    write_file(tmp_path("order1.jsonl"), "{\"text\": \"a\"}\n{\"text\": \"<|im_end|>\"}\n{\n");
    write_file(tmp_path("order2.jsonl"), "{\"text\": \"a\"}\n{\n{\"text\": \"<|im_end|>\"}\n");
    for (int threads = 1; threads <= 2; threads++) {
        check_open_fails(tmp_path("order1.jsonl"), 151644, threads, "order1.jsonl:2: token id",
                         NULL);
        check_open_fails(tmp_path("order2.jsonl"), 151644, threads, "order2.jsonl:2: invalid",
                         NULL);
    }
    // A folder reports the file at fault.
    char *dir = tmp_path("faulty");
    mkdir(dir, 0755);
    write_in(dir, "1.txt", "good");
    write_in(dir, "2.jsonl", "{\"text\": \"good\"}\n{}\n");
    check_open_fails(dir, VOCAB, 2, "2.jsonl:2:", "no \"text\", \"messages\" or \"ids\" field");
}

int main(void) {
    tmp = check_env("CTITAN_TMP");
    const char *assets = check_env("CTITAN_ASSETS_DIR");
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/qwen3-tokenizer", assets);
    ct_error err;
    if (tok_load(&tok, dir, &err) != 0 || tok_encoder_new(&enc, tok, &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    eos = tok_eos_id(tok);
    CHECK(eos == 151643, "<|endoftext|> is %d", eos);
    test_txt(assets);
    test_jsonl(assets);
    test_folder();
    test_invalid_utf8();
    test_controls();
    test_duplicates(check_env("CTITAN_SOURCE_DIR"));
    test_errors();
    tok_encoder_free(enc);
    tok_free(tok);
    return check_summary();
}
