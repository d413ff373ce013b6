// The tokenizer's parts and its error paths, on the real Qwen3 tokenizer.json and variants of it:
// UTF-8 repair against Python's errors="replace", the byte-level alphabet, BPE scan vs heap,
// added-token matching, both merge formats, cut points, chat formatting, and every "bad input"
// case of the issue (malformed tokenizer.json, unknown model type, unsupported features, invalid
// UTF-8, unknown ids).
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "check.h"
#include "io/json.h"
#include "text/bpe.h"
#include "text/bytelevel.h"
#include "text/chat.h"
#include "text/tokenizer.h"
#include "text/tokenizer_internal.h"
#include "core/utf8.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

static char *cat_path(const char *a, const char *b) {
    size_t n = strlen(a) + strlen(b) + 2;
    char *p = malloc(n);
    snprintf(p, n, "%s/%s", a, b);
    return p;
}

// Random byte strings (mostly bytes that occur in UTF-8) repaired by us and decoded by Python's
// bytes.decode("utf-8", errors="replace") must agree byte for byte.
static void test_utf8_vs_python(const char *tmp) {
    static const unsigned char pool[] = {'a',  ' ',  0x00, 0x7F, 0x80, 0xBF, 0xC0, 0xC1,
                                         0xC2, 0xDF, 0xE0, 0xE1, 0xED, 0xEF, 0xF0, 0xF1,
                                         0xF4, 0xF5, 0xFF, 0x9F, 0xA0, 0x8F, 0x90, 0xA5};
    enum { N = 3000 };
    char *in_path = cat_path(tmp, "utf8_in.txt"), *out_path = cat_path(tmp, "utf8_out.txt");
    FILE *f = fopen(in_path, "w");
    static unsigned char cases[N][24];
    static int lens[N];
    for (int i = 0; i < N; i++) {
        lens[i] = 1 + (int)(rnd() % 24);
        for (int k = 0; k < lens[i]; k++) cases[i][k] = pool[rnd() % sizeof pool];
        for (int k = 0; k < lens[i]; k++) fprintf(f, "%02x", cases[i][k]);
        fputc('\n', f);
    }
    fclose(f);
    const char *py = getenv("CTITAN_PYTHON");
    char cmd[8192];
    snprintf(cmd, sizeof cmd,
             "'%s' -c \"import sys\nfor l in open(sys.argv[1]):\n"
             "    print(bytes.fromhex(l.strip()).decode('utf-8', 'replace').encode().hex())\" "
             "'%s' > '%s'",
             py ? py : "python3", in_path, out_path);
    CHECK(system(cmd) == 0, "python failed: %s", cmd);
    f = fopen(out_path, "r");
    char line[512], out[128];
    int agree = 0;
    for (int i = 0; i < N && f && fgets(line, sizeof line, f); i++) {
        size_t n_bad, n = utf8_repair(out, (const char *)cases[i], (size_t)lens[i], &n_bad);
        char hex[512];
        for (size_t k = 0; k < n; k++) snprintf(hex + 2 * k, 3, "%02x", (unsigned char)out[k]);
        hex[2 * n] = 0;
        line[strcspn(line, "\n")] = 0;
        bool ok = strcmp(hex, line) == 0;
        agree += ok;
        if (!ok) CHECK(0, "case %d: ours %s, Python %s", i, hex, line);
        bool valid = utf8_valid_prefix((const char *)cases[i], (size_t)lens[i]) == (size_t)lens[i];
        CHECK(valid == (n_bad == 0), "case %d: valid %d but %zu replaced", i, valid, n_bad);
    }
    if (f) fclose(f);
    printf("utf8: %d/%d random byte strings repaired exactly as Python's errors=\"replace\"\n",
           agree, N);
    CHECK(agree == N, "utf8 repair disagrees with Python");
    free(in_path);
    free(out_path);
}

static void test_bytelevel(void) {
    int seen[0x200] = {0};
    for (int b = 0; b < 256; b++) {
        uint32_t c = bytelevel_char((unsigned char)b);
        CHECK(c < 0x200 && !seen[c]++, "byte %d maps to U+%04X twice", b, c);
        CHECK(bytelevel_byte(c) == b, "byte %d -> U+%04X -> %d", b, c, bytelevel_byte(c));
    }
    // GPT-2's anchors: space is 'Ġ' (U+0120), newline 'Ċ' (U+010A), printable ASCII itself.
    CHECK(bytelevel_char(' ') == 0x120 && bytelevel_char('\n') == 0x10A &&
              bytelevel_char('A') == 'A',
          "anchors");
    CHECK(bytelevel_byte(0x20) == -1 && bytelevel_byte(0x144) == -1, "outside the alphabet");
    char out[16];
    CHECK(bytelevel_decode(out, "<x>", 3) == 3 && memcmp(out, "<x>", 3) == 0, "ascii decodes");
    // A token with a character outside the alphabet decodes to its own UTF-8 (HF's rule).
    CHECK(bytelevel_decode(out, "a\xe2\x82\xac", 4) == 4, "non-alphabet token kept whole");
}

// The scan (short words) and the heap (long words) must merge identically.
static void test_bpe_methods(const tokenizer *t) {
    bpe_scratch s = {0};
    ct_error err;
    int same = 0, n_words = 400;
    static const char alpha[] = "aaabbcdeeeinnorsstt  ..";
    for (int w = 0; w < n_words; w++) {
        size_t n = 2 + rnd() % 200;
        int32_t a[256], b[256];
        for (size_t i = 0; i < n; i++)
            a[i] = b[i] = t->byte_id[(unsigned char)alpha[rnd() % (sizeof alpha - 1)]];
        size_t na, nb;
        CHECK(bpe_merge_scan(&na, &t->pairs, a, n, &s, &err) == 0, "%s", err.msg);
        CHECK(bpe_merge_heap(&nb, &t->pairs, b, n, &s, &err) == 0, "%s", err.msg);
        same += na == nb && memcmp(a, b, na * sizeof *a) == 0;
    }
    CHECK(same == n_words, "scan and heap differ on %d of %d words", n_words - same, n_words);
    bpe_scratch_free(&s);
}

static void encode_str(tok_encoder *e, tok_ids *ids, const char *s) {
    ct_error err;
    ids->n = 0;
    CHECK(tok_encode(e, ids, s, strlen(s), &err) == 0, "encode \"%s\": %s", s, err.msg);
}

static void test_encode_decode(const tokenizer *t) {
    ct_error err;
    tok_encoder *e;
    CHECK(tok_encoder_new(&e, t, &err) == 0, "%s", err.msg);
    tok_ids ids = {0};
    int32_t end = tok_token_id(t, "<|im_end|>"), eot = tok_token_id(t, "<|endoftext|>");
    CHECK(end == 151645 && eot == 151643 && tok_eos_id(t) == 151643, "special ids %d %d", end, eot);
    CHECK(tok_vocab_size(t) == 151669, "vocab size %d", tok_vocab_size(t));
    CHECK(tok_is_special(t, end) && !tok_is_special(t, tok_token_id(t, "<think>")),
          "special flags");
    CHECK(strcmp(tok_token_str(t, end), "<|im_end|>") == 0, "token string");
    CHECK(tok_token_str(t, -1) == NULL && tok_token_str(t, 1 << 30) == NULL, "out of range ids");

    // An added token inside text is one id, wherever it sits.
    encode_str(e, &ids, "a<|im_end|>b");
    CHECK(ids.n == 3 && ids.v[1] == end, "<|im_end|> inside text: %zu ids", ids.n);
    // The longest added token at the leftmost position wins; a near-miss is plain text.
    encode_str(e, &ids, "<|im_end|");
    for (size_t i = 0; i < ids.n; i++) CHECK(ids.v[i] < 151643, "near-miss became special");

    // Invalid UTF-8 is an error naming the offset, never ids.
    ids.n = 0;
    CHECK(tok_encode(e, &ids, "ok \xff", 4, &err) != 0 && strstr(err.msg, "offset 3") && ids.n == 0,
          "invalid UTF-8: %s", err.msg);
    CHECK(tok_encode(e, &ids, "\xed\xa0\x80", 3, &err) != 0, "a UTF-8 surrogate is invalid");
    CHECK(tok_encode(e, &ids, "", 0, &err) == 0 && ids.n == 0, "empty text, no ids");

    // Decoding: special tokens kept or skipped; an id cut in the middle of a character is U+FFFD.
    char *text;
    size_t len;
    encode_str(e, &ids, "<|im_start|>hi 👍<|im_end|>");
    CHECK(tok_decode(t, &text, &len, ids.v, ids.n, true, &err) == 0 && strcmp(text, "hi 👍") == 0,
          "skip special: \"%s\"", text);
    free(text);
    CHECK(tok_decode(t, &text, &len, ids.v, ids.n, false, &err) == 0 &&
              strcmp(text, "<|im_start|>hi 👍<|im_end|>") == 0,
          "keep special: \"%s\"", text);
    free(text);
    encode_str(e, &ids, "\xf0\x92\x80\x80"); // U+12000, a cuneiform sign: rare, so byte tokens
    CHECK(ids.n > 1, "U+12000 is several byte tokens (%zu)", ids.n);
    CHECK(tok_decode(t, &text, &len, ids.v, 1, false, &err) == 0 &&
              strcmp(text, UTF8_REPLACEMENT) == 0,
          "partial character: \"%s\"", text);
    free(text);
    int32_t bad[] = {5, -1};
    CHECK(tok_decode(t, &text, &len, bad, 2, false, &err) != 0 && strstr(err.msg, "index 1"),
          "unknown id: %s", err.msg);
    int32_t unused[] = {151669};
    CHECK(tok_decode(t, &text, &len, unused, 1, false, &err) != 0, "id past the vocab");

    // The cache must not change results: a fresh encoder agrees with a warm one.
    const char *s = "the cat sat on the mat; the cat sat on the mat";
    encode_str(e, &ids, s);
    tok_encoder *fresh;
    tok_ids ids2 = {0};
    CHECK(tok_encoder_new(&fresh, t, &err) == 0, "%s", err.msg);
    encode_str(fresh, &ids2, s);
    CHECK(ids.n == ids2.n && memcmp(ids.v, ids2.v, ids.n * sizeof *ids.v) == 0, "cache");
    tok_encoder_free(fresh);
    tok_ids_free(&ids2);
    tok_ids_free(&ids);
    tok_encoder_free(e);
}

// Encoding the pieces between cut points gives the ids of the whole text.
static void test_cut_points(const tokenizer *t, const char *corpus) {
    char *text;
    size_t len;
    ct_error err;
    if (file_read_all(&text, &len, corpus, 1 << 30, &err) != 0) {
        CHECK(0, "%s", err.msg);
        return;
    }
    len = len > (2u << 20) ? (2u << 20) : len;
    size_t cuts[512];
    size_t n = tok_cut_points(t, cuts, 512, text, len, 16 << 10);
    CHECK(n > 50, "only %zu cut points in %zu bytes", n, len);
    tok_encoder *e;
    CHECK(tok_encoder_new(&e, t, &err) == 0, "%s", err.msg);
    tok_ids whole = {0}, parts = {0};
    CHECK(tok_encode(e, &whole, text, len, &err) == 0, "%s", err.msg);
    size_t prev = 0;
    for (size_t i = 0; i <= n; i++) {
        size_t end = i < n ? cuts[i] : len;
        CHECK(end > prev && (i == n || (text[end - 1] == '\n')), "cut %zu at %zu", i, end);
        CHECK(tok_encode(e, &parts, text + prev, end - prev, &err) == 0, "%s", err.msg);
        prev = end;
    }
    CHECK(whole.n == parts.n && memcmp(whole.v, parts.v, whole.n * sizeof *whole.v) == 0,
          "pieces give %zu ids, the whole %zu", parts.n, whole.n);
    printf("cuts: %zu pieces of %zu bytes encode to the same %zu ids as the whole\n", n + 1, len,
           whole.n);
    tok_ids_free(&whole);
    tok_ids_free(&parts);
    tok_encoder_free(e);
    free(text);
}

// The folder's chat template (Qwen3's, from tokenizer_config.json) renders plain messages as
// ChatML; the engine itself is tested in test_jinja.c, its parity in test_tok_chat.c.
static void test_chat(const char *dir) {
    chat_template *ct;
    ct_error err;
    char *out = NULL;
    size_t len = 0;
    cJSON *msgs = cJSON_Parse("[{\"role\": \"system\", \"content\": \"You are helpful.\"},"
                              " {\"role\": \"user\", \"content\": \"Hi!\"}]");
    CHECK(chat_template_load(&ct, dir, &err) == 0, "%s", err.msg);
    CHECK(chat_render(ct, msgs, NULL, true, -1, &out, &len, &err) == 0, "%s", err.msg);
    const char *want = "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!"
                       "<|im_end|>\n<|im_start|>assistant\n";
    CHECK(out && strcmp(out, want) == 0 && len == strlen(want), "chat: \"%s\"", out ? out : "");
    free(out);
    cJSON_Delete(msgs);
    chat_template_free(ct);
}

// Variants of the real tokenizer.json: each edit must load identically or fail with a message.
typedef struct variant {
    const char *name;
    void (*edit)(cJSON *root);
    const char *expect; // substring of the error; NULL = must load
} variant;

static cJSON *obj_path(cJSON *root, const char *a, const char *b) {
    cJSON *x = cJSON_GetObjectItem(root, a);
    return b ? cJSON_GetObjectItem(x, b) : x;
}

static void set_str(cJSON *obj, const char *key, const char *v) {
    cJSON_ReplaceItemInObject(obj, key, cJSON_CreateString(v));
}

static void edit_merges_as_strings(cJSON *root) {
    cJSON *merges = obj_path(root, "model", "merges"), *strings = cJSON_CreateArray(), *m;
    cJSON_ArrayForEach(m, merges) {
        char buf[1024];
        snprintf(buf, sizeof buf, "%s %s", cJSON_GetArrayItem(m, 0)->valuestring,
                 cJSON_GetArrayItem(m, 1)->valuestring);
        cJSON_AddItemToArray(strings, cJSON_CreateString(buf));
    }
    cJSON_ReplaceItemInObject(cJSON_GetObjectItem(root, "model"), "merges", strings);
}
static void edit_model_wordpiece(cJSON *r) {
    set_str(obj_path(r, "model", NULL), "type", "WordPiece");
}
static void edit_normalizer_nfkc(cJSON *r) {
    set_str(obj_path(r, "normalizer", NULL), "type", "NFKC");
}
static void edit_split_removed(cJSON *r) {
    cJSON *split = cJSON_GetArrayItem(obj_path(r, "pre_tokenizer", "pretokenizers"), 0);
    set_str(split, "behavior", "Removed");
}
static void edit_bad_regex(cJSON *r) {
    cJSON *split = cJSON_GetArrayItem(obj_path(r, "pre_tokenizer", "pretokenizers"), 0);
    set_str(cJSON_GetObjectItem(split, "pattern"), "Regex", "(\\p{L}+");
}
static void edit_regex_word_class(cJSON *r) {
    cJSON *split = cJSON_GetArrayItem(obj_path(r, "pre_tokenizer", "pretokenizers"), 0);
    set_str(cJSON_GetObjectItem(split, "pattern"), "Regex", "\\w+|\\s+");
}
static void edit_decoder_null(cJSON *r) {
    cJSON_ReplaceItemInObject(r, "decoder", cJSON_CreateNull());
}
static void edit_post_template(cJSON *r) {
    set_str(obj_path(r, "post_processor", NULL), "type", "TemplateProcessing");
}
static void edit_byte_fallback(cJSON *r) {
    cJSON_ReplaceItemInObject(obj_path(r, "model", NULL), "byte_fallback", cJSON_CreateTrue());
}
static void edit_added_lstrip(cJSON *r) {
    cJSON_ReplaceItemInObject(cJSON_GetArrayItem(cJSON_GetObjectItem(r, "added_tokens"), 1),
                              "lstrip", cJSON_CreateTrue());
}
static void edit_truncation(cJSON *r) {
    cJSON *t = cJSON_CreateObject();
    cJSON_AddNumberToObject(t, "max_length", 10);
    cJSON_ReplaceItemInObject(r, "truncation", t);
}
static void edit_merge_unknown(cJSON *r) {
    cJSON *m = cJSON_CreateArray();
    cJSON_AddItemToArray(m, cJSON_CreateString("nosuchtoken"));
    cJSON_AddItemToArray(m, cJSON_CreateString("x"));
    cJSON_AddItemToArray(obj_path(r, "model", "merges"), m);
}
static void edit_merge_three(cJSON *r) {
    cJSON_AddItemToArray(obj_path(r, "model", "merges"), cJSON_CreateString("a b c"));
}
static void edit_drop_byte(cJSON *r) {
    cJSON_DeleteItemFromObject(obj_path(r, "model", "vocab"), "Ġ");
}
static void edit_id_clash(cJSON *r) {
    cJSON_ReplaceItemInObject(cJSON_GetArrayItem(cJSON_GetObjectItem(r, "added_tokens"), 0), "id",
                              cJSON_CreateNumber(0));
}
static void edit_no_model(cJSON *r) {
    cJSON_DeleteItemFromObject(r, "model");
}
static void edit_stray_id(cJSON *r) { // the per-id tables would be 48 GB
    cJSON_ReplaceItemInObject(cJSON_GetArrayItem(cJSON_GetObjectItem(r, "added_tokens"), 0), "id",
                              cJSON_CreateNumber(2000000000));
}

static void test_variants(const char *json_path, const tokenizer *real, const char *corpus) {
    cJSON *base;
    ct_error err;
    if (json_parse_file(&base, json_path, &err) != 0) {
        CHECK(0, "%s", err.msg);
        return;
    }
    const variant vs[] = {
        {"merges as \"a b\" strings", edit_merges_as_strings, NULL},
        {"WordPiece model", edit_model_wordpiece, "not supported: model type WordPiece"},
        {"NFKC normalizer", edit_normalizer_nfkc, "not supported: normalizer type NFKC"},
        {"Split Removed", edit_split_removed, "not supported: Split behavior Removed"},
        {"broken regex", edit_bad_regex, "does not compile"},
        {"\\w in the regex", edit_regex_word_class, "not supported: \\w"},
        {"no decoder", edit_decoder_null, "not supported: decoder null"},
        {"TemplateProcessing", edit_post_template, "not supported: post_processor"},
        {"byte_fallback", edit_byte_fallback, "not supported: BPE byte_fallback"},
        {"added token lstrip", edit_added_lstrip, "lstrip=true"},
        {"truncation", edit_truncation, "not supported: truncation"},
        {"merge of unknown tokens", edit_merge_unknown, "\"nosuchtoken\" is not in the vocab"},
        {"merge with two spaces", edit_merge_three, "not two tokens"},
        {"vocab without 'Ġ'", edit_drop_byte, "no token for byte 0x20"},
        {"two tokens on one id", edit_id_clash, "id 0 is both"},
        {"no model", edit_no_model, "no \"model\""},
        {"a stray id of 2e9", edit_stray_id, "token id 2000000000 leaves more than 1048576 ids"},
    };
    for (size_t i = 0; i < sizeof vs / sizeof vs[0]; i++) {
        cJSON *copy = cJSON_Duplicate(base, 1);
        vs[i].edit(copy);
        char *text = cJSON_PrintUnformatted(copy);
        tokenizer *t = NULL;
        int rc = tok_load_json(&t, text, strlen(text), NULL, 0, "variant.json", NULL, &err);
        if (vs[i].expect) {
            CHECK(rc != 0 && strstr(err.msg, vs[i].expect),
                  "%s: expected an error with \"%s\", "
                  "got %s",
                  vs[i].name, vs[i].expect, rc ? err.msg : "success");
        } else if (rc != 0) {
            CHECK(0, "%s: %s", vs[i].name, err.msg);
        } else {
            // The same ids as the original on real text.
            char *body;
            size_t len;
            CHECK(file_read_all(&body, &len, corpus, 1 << 30, &err) == 0, "%s", err.msg);
            len = len > 200000 ? 200000 : len;
            tok_encoder *a, *b;
            tok_ids ia = {0}, ib = {0};
            tok_encoder_new(&a, real, &err);
            tok_encoder_new(&b, t, &err);
            tok_encode(a, &ia, body, len, &err);
            tok_encode(b, &ib, body, len, &err);
            CHECK(ia.n == ib.n && memcmp(ia.v, ib.v, ia.n * sizeof *ia.v) == 0,
                  "%s: ids differ from the original", vs[i].name);
            tok_ids_free(&ia);
            tok_ids_free(&ib);
            tok_encoder_free(a);
            tok_encoder_free(b);
            free(body);
        }
        tok_free(t);
        free(text);
        cJSON_Delete(copy);
    }
    // Malformed JSON: a truncated file, and not JSON at all.
    char *text = cJSON_PrintUnformatted(base);
    tokenizer *t;
    CHECK(tok_load_json(&t, text, strlen(text) / 2, NULL, 0, "half.json", NULL, &err) != 0 &&
              strstr(err.msg, "invalid JSON at byte"),
          "truncated tokenizer.json: %s", err.msg);
    CHECK(tok_load_json(&t, "[1,2]", 5, NULL, 0, "array.json", NULL, &err) != 0, "not an object");
    // tokenizer_config.json that asks for what we do not do, or names unknown tokens.
    const char *cfg_bos = "{\"add_bos_token\": true}";
    CHECK(tok_load_json(&t, text, strlen(text), cfg_bos, strlen(cfg_bos), "x",
                        "dir/tokenizer_config.json", &err) != 0 &&
              strstr(err.msg, "add_bos_token") && strstr(err.msg, "dir/tokenizer_config.json: "),
          "add_bos_token, naming the config's path: %s", err.msg);
    CHECK(tok_load_json(&t, text, strlen(text), "{", 1, "x", "dir/tokenizer_config.json", &err) !=
                  0 &&
              strstr(err.msg, "dir/tokenizer_config.json: invalid JSON"),
          "a broken config, named by its path: %s", err.msg);
    const char *cfg_extra =
        "{\"added_tokens_decoder\": {\"151700\": {\"content\": \"<|extra|>\", \"special\": true}}}";
    CHECK(tok_load_json(&t, text, strlen(text), cfg_extra, strlen(cfg_extra), "x", NULL, &err) !=
                  0 &&
              strstr(err.msg, "<|extra|>"),
          "config-only token: %s", err.msg);
    // split_special_tokens: special tokens are then plain text (non-special added ones are not).
    const char *cfg_split = "{\"split_special_tokens\": true}";
    CHECK(tok_load_json(&t, text, strlen(text), cfg_split, strlen(cfg_split), "x", NULL, &err) == 0,
          "%s", err.msg);
    tok_encoder *e;
    tok_ids ids = {0};
    tok_encoder_new(&e, t, &err);
    tok_encode(e, &ids, "<|im_end|><think>", 17, &err);
    CHECK(ids.n > 2 && ids.v[ids.n - 1] == tok_token_id(t, "<think>"), "split_special_tokens");
    tok_ids_free(&ids);
    tok_encoder_free(e);
    tok_free(t);
    CHECK(tok_load(&t, "/nonexistent-dir", &err) != 0 && strstr(err.msg, "tokenizer.json"),
          "missing folder: %s", err.msg);
    free(text);
    cJSON_Delete(base);
}

int main(void) {
    const char *assets = check_env("CTITAN_ASSETS_DIR"), *tmp = check_env("CTITAN_TMP");
    char *stamp = cat_path(assets, ".fetch-assets-stamp");
    struct stat st;
    if (stat(stamp, &st) != 0) {
        printf("FAIL: %s has no assets: run scripts/fetch-assets (it needs node and npm)\n",
               assets);
        return 1;
    }
    free(stamp);
    char *dir = cat_path(assets, "qwen3-tokenizer"), *json = cat_path(dir, "tokenizer.json");
    char *corpus = cat_path(assets, "corpus/nlp-corpus.txt");
    ct_error err;
    tokenizer *t;
    if (tok_load(&t, dir, &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    test_utf8_vs_python(tmp);
    test_bytelevel();
    test_bpe_methods(t);
    test_encode_decode(t);
    test_cut_points(t, corpus);
    test_chat(dir);
    test_variants(json, t, corpus);
    tok_free(t);
    free(dir);
    free(json);
    free(corpus);
    return check_summary();
}
