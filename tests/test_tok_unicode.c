// Every code point against Hugging Face: for each one, in contexts that expose how it is
// classed (letter, digit, whitespace, other, contraction) and how NFC treats it, ctitan's NFC and
// pre-tokenizer pieces must equal HF's (tests/ref/tok_ref.mjs --unicode). Large uniform blocks
// (CJK ideographs, Hangul syllables, planes 2-3) and unassigned planes are sampled.
//
// The only differences allowed are at code points that the system's libpcre2 or libutf8proc
// does not know yet (assigned by a Unicode version newer than their tables, which HF has); they
// are counted and listed.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <utf8proc.h>

#include <cjson/cJSON.h>

#include "check.h"
#include "io/json.h"
#include "text/normalize.h"
#include "text/pretokenizer.h"
#include "text/utf8.h"

#define CHUNK 512 // code points per reference line

static bool sampled_out(uint32_t cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) return true; // surrogates are not text
    bool uniform = (cp >= 0x3400 && cp <= 0x4DBF) || (cp >= 0x4E00 && cp <= 0x9FFF) ||
                   (cp >= 0xAC00 && cp <= 0xD7A3) || (cp >= 0x20000 && cp <= 0x3FFFF);
    if (uniform) return cp % 16 != 0;
    bool sparse = (cp >= 0x40000 && cp <= 0xDFFFF) || cp >= 0xE1000;
    if (sparse) return cp % 256 != 0 && (cp & 0xFFFF) < 0xFFFE;
    return false;
}

// One code point's segment. It ends with '\n' and the next begins with 'x': a cut that no
// pre-token spans and NFC does not cross (see tok_cut_points), so each segment is checked alone.
static size_t segment(char *out, uint32_t cp) {
    char c[4];
    int n = utf8_encode(c, cp);
    const char *parts[] = {"x", "x ", "1", "\n'", "|", "e", "\n"};
    size_t o = 0;
    for (int i = 0; i < 7; i++) {
        size_t k = strlen(parts[i]);
        memcpy(out + o, parts[i], k);
        o += k;
        if (i < 6) {
            memcpy(out + o, c, (size_t)n);
            o += (size_t)n;
        }
    }
    return o;
}

typedef struct chunk {
    uint32_t cp[CHUNK];
    size_t start[CHUNK + 1]; // segment byte offsets
    int n;
    char *text;
} chunk;

static int hexval(char c) {
    return c <= '9' ? c - '0' : c - 'a' + 10;
}

static void tohex(FILE *f, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) fprintf(f, "%02x", (unsigned char)s[i]);
}

static pcre2_code *unassigned_re;

static bool pcre2_unassigned(uint32_t cp) {
    char c[4];
    int n = utf8_encode(c, cp);
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    int rc = pcre2_match(unassigned_re, (PCRE2_SPTR)c, (size_t)n, 0, 0, md, NULL);
    pcre2_match_data_free(md);
    return rc > 0;
}

typedef struct piece_ends {
    size_t v[64], n;
    const char *seg;
} piece_ends;

static int collect_end(void *ctx, const char *piece, size_t len) {
    piece_ends *p = ctx;
    if (p->n < 64) p->v[p->n++] = (size_t)(piece + len - p->seg);
    return 0;
}

static int n_newer_regex, n_newer_nfc, n_fail;

static void report(const char *what, uint32_t cp, bool newer) {
    if (newer) {
        if (what[0] == 'p' ? n_newer_regex++ < 8 : n_newer_nfc++ < 8)
            printf("  %s differs at U+%04X, which this %s does not know (newer Unicode)\n", what,
                   cp, what[0] == 'p' ? "libpcre2" : "libutf8proc");
    } else {
        n_fail++;
        CHECK(0, "%s differs from HF at U+%04X", what, cp);
    }
}

int main(void) {
    const char *assets = check_env("CTITAN_ASSETS_DIR"), *tmp = check_env("CTITAN_TMP");
    const char *src = check_env("CTITAN_SOURCE_DIR");
    char in_path[4096], out_path[4096], stamp[4096], tok_path[4096];
    snprintf(in_path, sizeof in_path, "%s/tok_unicode_in.jsonl", tmp);
    snprintf(out_path, sizeof out_path, "%s/tok_unicode_ref.jsonl", tmp);
    snprintf(stamp, sizeof stamp, "%s/.fetch-assets-stamp", assets);
    snprintf(tok_path, sizeof tok_path, "%s/qwen3-tokenizer/tokenizer.json", assets);
    struct stat st;
    if (stat(stamp, &st) != 0) {
        printf("SKIP: %s has no assets (scripts/fetch-assets needs node and npm)\n", assets);
        return 77;
    }

    // The chunks, written for node.
    int n_chunks = 0, cap = 0;
    chunk *chunks = NULL;
    FILE *f = fopen(in_path, "w");
    uint32_t cp = 0;
    while (cp <= 0x10FFFF) {
        if (n_chunks == cap) {
            cap = cap ? 2 * cap : 256;
            chunks = realloc(chunks, (size_t)cap * sizeof *chunks);
        }
        chunk *c = &chunks[n_chunks++];
        c->n = 0;
        c->text = malloc(CHUNK * 48); // a segment is at most 9 + 6 * 4 bytes
        size_t len = 0;
        for (; cp <= 0x10FFFF && c->n < CHUNK; cp++) {
            if (sampled_out(cp)) continue;
            c->start[c->n] = len;
            c->cp[c->n++] = cp;
            len += segment(c->text + len, cp);
        }
        c->start[c->n] = len;
        fprintf(f, "{\"name\":\"U+%04X\",\"hex\":\"", c->cp[0]);
        tohex(f, c->text, len);
        fprintf(f, "\",\"segments\":[");
        for (int i = 0; i < c->n; i++)
            fprintf(f, "%s%zu", i ? "," : "", c->start[i + 1] - c->start[i]);
        fprintf(f, "]}\n");
    }
    fclose(f);
    char cmd[16384];
    snprintf(cmd, sizeof cmd,
             "node '%s/tests/ref/tok_ref.mjs' --assets '%s' --unicode '%s' --out '%s'", src, assets,
             in_path, out_path);
    fprintf(stderr, "running: %s\n", cmd);
    if (system(cmd) != 0) {
        fprintf(stderr, "the node reference failed\n");
        return 1;
    }

    // The pre-tokenizer exactly as the tokenizer.json declares it.
    ct_error err;
    cJSON *tj;
    if (json_parse_file(&tj, tok_path, &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    const cJSON *split = cJSON_GetArrayItem(
        cJSON_GetObjectItem(cJSON_GetObjectItem(tj, "pre_tokenizer"), "pretokenizers"), 0);
    const char *pattern =
        cJSON_GetObjectItem(cJSON_GetObjectItem(split, "pattern"), "Regex")->valuestring;
    pretok *pt;
    pretok_state *ps;
    CHECK(pretok_compile(&pt, pattern, &err) == 0, "%s", err.msg);
    CHECK(pretok_state_new(&ps, pt, &err) == 0, "%s", err.msg);
    cJSON_Delete(tj);
    int ec;
    PCRE2_SIZE eo;
    unassigned_re =
        pcre2_compile((PCRE2_SPTR) "\\p{Cn}", PCRE2_ZERO_TERMINATED, PCRE2_UTF, &ec, &eo, NULL);

    char *ref;
    size_t ref_len;
    if (file_read_all(&ref, &ref_len, out_path, (size_t)1 << 30, &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    nfc_scratch nfc = {0};
    int k = 0, checked = 0;
    for (char *line = strtok(ref, "\n"); line && k < n_chunks; line = strtok(NULL, "\n"), k++) {
        chunk *c = &chunks[k];
        cJSON *j = cJSON_Parse(line);
        const cJSON *nfcs = cJSON_GetObjectItem(j, "nfc"),
                    *hf_ends = cJSON_GetObjectItem(j, "ends");
        CHECK(cJSON_GetArraySize(nfcs) == c->n, "chunk %d: %d NFC segments", k,
              cJSON_GetArraySize(nfcs));
        const cJSON *he = hf_ends ? hf_ends->child : NULL, *want = nfcs ? nfcs->child : NULL;
        for (int s = 0; s < c->n; s++, checked++, want = want ? want->next : NULL) {
            const char *seg = c->text + c->start[s];
            size_t seg_len = c->start[s + 1] - c->start[s], base = c->start[s];
            // NFC of the segment.
            const char *norm;
            size_t norm_len;
            size_t want_len = want ? strlen(want->valuestring) / 2 : 0;
            bool ok = nfc_apply(&norm, &norm_len, &nfc, seg, seg_len, &err) == 0 && want &&
                      norm_len == want_len;
            for (size_t b = 0; ok && b < norm_len; b++)
                ok = (unsigned char)norm[b] ==
                     (hexval(want->valuestring[2 * b]) << 4 | hexval(want->valuestring[2 * b + 1]));
            if (!ok)
                report("NFC", c->cp[s],
                       utf8proc_category((utf8proc_int32_t)c->cp[s]) == UTF8PROC_CATEGORY_CN);
            // Pre-tokenizer pieces of the (unnormalised) segment vs HF's that end inside it.
            piece_ends mine = {.seg = seg};
            ok = pretok_split(ps, seg, seg_len, collect_end, &mine, &err) == 0;
            size_t n_theirs = 0;
            for (; he && (size_t)he->valuedouble <= base + seg_len; he = he->next) {
                size_t e = (size_t)he->valuedouble - base;
                if (n_theirs >= mine.n || mine.v[n_theirs] != e) ok = false;
                n_theirs++;
            }
            if (n_theirs != mine.n) ok = false;
            if (!ok) report("pre-tokenizer", c->cp[s], pcre2_unassigned(c->cp[s]));
        }
        cJSON_Delete(j);
    }
    CHECK(k == n_chunks, "reference has %d chunks, expected %d", k, n_chunks);
    char pcre_version[64] = "?", pcre_unicode[64] = "?";
    pcre2_config(PCRE2_CONFIG_VERSION, pcre_version);
    pcre2_config(PCRE2_CONFIG_UNICODE_VERSION, pcre_unicode);
    printf("unicode: %d code points checked against HF (NFC and pre-tokenizer pieces); differences "
           "only where the system library predates the character: pre-tokenizer at %d code "
           "points unknown to libpcre2 %s (Unicode %s), NFC at %d unknown to libutf8proc %s "
           "(Unicode %s); %d other differences\n",
           checked, n_newer_regex, pcre_version, pcre_unicode, n_newer_nfc, utf8proc_version(),
           utf8proc_unicode_version(), n_fail);
    nfc_scratch_free(&nfc);
    pretok_state_free(ps);
    pretok_free(pt);
    pcre2_code_free(unassigned_re);
    for (int i = 0; i < n_chunks; i++) free(chunks[i].text);
    free(chunks);
    free(ref);
    return check_summary();
}
