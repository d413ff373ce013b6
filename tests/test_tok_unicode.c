// Every code point against Hugging Face: for each one, in contexts that expose how it is
// classed (letter, digit, whitespace, other, contraction) and how NFC treats it, ctitan's NFC and
// pre-tokenizer pieces must equal HF's (tests/ref/tok_ref.mjs --unicode). Large uniform blocks
// (CJK ideographs, Hangul syllables, planes 2-3) and unassigned planes are sampled.
//
// The only differences allowed are Unicode-version differences: ctitan's libraries (the system's
// libpcre2 and libutf8proc) may have older Unicode tables than HF's (tokenizers 0.23.2: its regex
// is Oniguruma with Unicode 16.0). A difference at a code point is excused only when
//   - pre-tokenizer: libpcre2 calls it unassigned (\p{Cn}), so ctitan's regex classes it with
//     the "other" characters (punctuation, symbols), AND node's own tables (ICU, newer: the
//     reference reports them, tests/ref/tok_ref.mjs) call it a letter or a digit (\p{L},
//     \p{N}). Those are the only classes the Split regex treats apart from "other" (\s is spelled
//     out as a fixed list, src/text/pretokenizer.c), so a new mark, symbol or punctuation is
//     "other" on both sides and a difference there is a bug, as is any at a code point libpcre2
//     knows;
//   - NFC: libutf8proc calls it unassigned AND node calls it assigned (any new character may
//     bring a decomposition or a combining class).
// Node can vouch only when its Unicode is at least HF's; an older node (Debian 12's 18.x has
// Unicode 15.0) cannot tell HF's newest letters from unassigned code points, so those are then
// left to the pins alone, and the test says so.
//
// The excused code points are pinned exactly (count and FNV-1a hash, for each library Unicode
// version seen), so that a change in them fails too. They follow from the library's tables, HF's
// (the `tokenizers` version that scripts/fetch-assets pins) and the sampling below; changing any
// of those changes them, and the test then prints the new count, hash and list to pin. A library
// as new as HF's Unicode must have none. NUL and the C0 controls are checked like any other
// code point.
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
#include "core/utf8.h"

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

// The Unicode of HF's regex tables (Oniguruma in the pinned `tokenizers`): the letters this test
// meets that are new in Unicode 17.0 are "other" to HF (the summary counts them), those of 16.0
// are not.
#define HF_UNICODE "16.0"
#define FNV_BASIS 0x811c9dc5u

static bool unicode_at_least(const char *version, const char *than) {
    int a = 0, b = 0, c = 0, d = 0;
    sscanf(version, "%d.%d", &a, &b);
    sscanf(than, "%d.%d", &c, &d);
    return a > c || (a == c && b >= d);
}

// Differences of one kind (pre-tokenizer or NFC) excused as newer Unicode than the library's.
typedef struct excused {
    const char *what, *lib, *lib_version, *unicode;
    int n;        // how many
    uint32_t fnv; // FNV-1a over the code points, ascending, as 4 little-endian bytes each
} excused;

static const struct pin {
    const char *what, *unicode;
    int count;
    uint32_t fnv;
} pins[] = {
    {"pre-tokenizer", "14.0.0", 4878, 0x702f7ad7}, // libpcre2 10.42 (Debian 12)
    {"NFC", "15.0.0", 0, FNV_BASIS},               // libutf8proc 2.8.0 (Debian 12): none
};

static int n_fail;
static FILE *excused_list;

// A difference from HF at cp; lib_cn: the library calls cp unassigned; node: its class for cp
// ('L', 'N', 'o', '-': tests/ref/tok_ref.mjs); ok: the criterion above excuses it.
static void differs(excused *x, uint32_t cp, bool lib_cn, char node, bool ok) {
    if (!ok) {
        n_fail++;
        CHECK(0, "%s differs from HF at U+%04X (%s: %s; node: %c)", x->what, cp, x->lib,
              lib_cn ? "unassigned" : "assigned", node);
        return;
    }
    for (int i = 0; i < 4; i++) x->fnv = (x->fnv ^ ((cp >> (8 * i)) & 0xFF)) * 16777619u;
    if (excused_list) fprintf(excused_list, "%s U+%04X %c\n", x->what, cp, node);
    if (x->n++ < 8)
        printf("  %s differs at U+%04X: unassigned to %s (Unicode %s), '%c' to node\n", x->what, cp,
               x->lib, x->unicode, node);
}

static void check_pin(const excused *x, const char *list_path) {
    if (unicode_at_least(x->unicode, HF_UNICODE)) {
        CHECK(x->n == 0, "%s: %d differences excused, but %s's Unicode %s is not older than HF's",
              x->what, x->n, x->lib, x->unicode);
        return;
    }
    for (size_t i = 0; i < sizeof pins / sizeof pins[0]; i++) {
        if (strcmp(pins[i].what, x->what) != 0 || strcmp(pins[i].unicode, x->unicode) != 0)
            continue;
        CHECK(x->n == pins[i].count && x->fnv == pins[i].fnv,
              "%s: %d differences excused (FNV-1a %08x), pinned %d (%08x) for %s's Unicode %s; "
              "list: %s",
              x->what, x->n, x->fnv, pins[i].count, pins[i].fnv, x->lib, x->unicode, list_path);
        return;
    }
    CHECK(0,
          "%s: no pin for %s's Unicode %s: %d differences excused (FNV-1a %08x); review %s "
          "and add them to pins[]",
          x->what, x->lib, x->unicode, x->n, x->fnv, list_path);
}

int main(void) {
    const char *assets = check_env("CTITAN_ASSETS_DIR"), *tmp = check_env("CTITAN_TMP");
    const char *src = check_env("CTITAN_SOURCE_DIR");
    char in_path[4096], out_path[4096], stamp[4096], tok_path[4096], list_path[4096];
    snprintf(in_path, sizeof in_path, "%s/tok_unicode_in.jsonl", tmp);
    snprintf(list_path, sizeof list_path, "%s/tok_unicode_excused.txt", tmp);
    snprintf(out_path, sizeof out_path, "%s/tok_unicode_ref.jsonl", tmp);
    snprintf(stamp, sizeof stamp, "%s/.fetch-assets-stamp", assets);
    snprintf(tok_path, sizeof tok_path, "%s/qwen3-tokenizer/tokenizer.json", assets);
    struct stat st;
    if (stat(stamp, &st) != 0) {
        printf("FAIL: %s has no assets: run scripts/fetch-assets (it needs node and npm)\n",
               assets);
        return 1;
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
    char pcre_version[64] = "?", pcre_unicode[64] = "?", node_unicode[32] = "?";
    pcre2_config(PCRE2_CONFIG_VERSION, pcre_version);
    pcre2_config(PCRE2_CONFIG_UNICODE_VERSION, pcre_unicode);
    excused x_pre = {.what = "pre-tokenizer",
                     .lib = "libpcre2",
                     .lib_version = pcre_version,
                     .unicode = pcre_unicode,
                     .fnv = FNV_BASIS};
    excused x_nfc = {.what = "NFC",
                     .lib = "libutf8proc",
                     .lib_version = utf8proc_version(),
                     .unicode = utf8proc_unicode_version(),
                     .fnv = FNV_BASIS};
    CHECK((excused_list = fopen(list_path, "w")) != NULL, "cannot write %s", list_path);
    bool node_vouches = false;
    nfc_scratch nfc = {0};
    int k = 0, checked = 0, node_ahead = 0;
    for (char *line = strtok(ref, "\n"); line && k < n_chunks; line = strtok(NULL, "\n"), k++) {
        chunk *c = &chunks[k];
        cJSON *j = cJSON_Parse(line);
        const cJSON *nfcs = cJSON_GetObjectItem(j, "nfc"),
                    *hf_ends = cJSON_GetObjectItem(j, "ends");
        const char *cls = cJSON_GetStringValue(cJSON_GetObjectItem(j, "class"));
        const char *uv = cJSON_GetStringValue(cJSON_GetObjectItem(j, "unicode"));
        CHECK(cJSON_GetArraySize(nfcs) == c->n && cls && strlen(cls) == (size_t)c->n && uv,
              "chunk %d: %d NFC segments, node classes '%s'", k, cJSON_GetArraySize(nfcs),
              cls ? cls : "(none)");
        if (!cls || strlen(cls) != (size_t)c->n) break;
        if (k == 0) {
            snprintf(node_unicode, sizeof node_unicode, "%s", uv ? uv : "?");
            node_vouches = unicode_at_least(node_unicode, HF_UNICODE);
        }
        const cJSON *he = hf_ends ? hf_ends->child : NULL, *want = nfcs ? nfcs->child : NULL;
        for (int s = 0; s < c->n; s++, checked++, want = want ? want->next : NULL) {
            // Node's class of the code point. When node is older than HF, its '-' may be one of
            // HF's newest characters: it proves nothing, and only the pins check those.
            char node = cls[s];
            bool node_unsure = node == '-' && !node_vouches;
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
            bool lib_cn = utf8proc_category((utf8proc_int32_t)c->cp[s]) == UTF8PROC_CATEGORY_CN;
            if (!ok)
                differs(&x_nfc, c->cp[s], lib_cn, node, lib_cn && (node != '-' || node_unsure));
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
            lib_cn = pcre2_unassigned(c->cp[s]);
            if (!ok)
                differs(&x_pre, c->cp[s], lib_cn, node,
                        lib_cn && (node == 'L' || node == 'N' || node_unsure));
            if (ok && lib_cn && (node == 'L' || node == 'N')) node_ahead++;
        }
        cJSON_Delete(j);
    }
    CHECK(k == n_chunks, "reference has %d chunks, expected %d", k, n_chunks);
    if (excused_list) fclose(excused_list);
    if (!node_vouches)
        printf("  node's Unicode %s is older than HF's %s: it cannot vouch for HF's newest "
               "characters, which only the pins below then check\n",
               node_unicode, HF_UNICODE);
    check_pin(&x_pre, list_path);
    check_pin(&x_nfc, list_path);
    printf("unicode: %d code points checked against HF (NFC and pre-tokenizer pieces). Excused as "
           "newer Unicode (unassigned to the library, a letter or digit (NFC: assigned) to node's "
           "Unicode %s): pre-tokenizer at %d code points (FNV-1a %08x) for libpcre2 %s (Unicode "
           "%s), NFC at %d (%08x) for libutf8proc %s (Unicode %s); listed in %s. %d other "
           "differences. %d letters or digits to node are unknown to libpcre2 and HF alike (HF's "
           "Unicode: %s)\n",
           checked, node_unicode, x_pre.n, x_pre.fnv, x_pre.lib_version, x_pre.unicode, x_nfc.n,
           x_nfc.fnv, x_nfc.lib_version, x_nfc.unicode, list_path, n_fail, node_ahead, HF_UNICODE);
    nfc_scratch_free(&nfc);
    pretok_state_free(ps);
    pretok_free(pt);
    pcre2_code_free(unassigned_re);
    for (int i = 0; i < n_chunks; i++) free(chunks[i].text);
    free(chunks);
    free(ref);
    return check_summary();
}
