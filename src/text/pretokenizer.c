#define PCRE2_CODE_UNIT_WIDTH 8
#include "text/pretokenizer.h"

#include <stdlib.h>
#include <string.h>

#include <pcre2.h>

struct pretok {
    pcre2_code *code;
    bool jit;
    char *pattern;
};

struct pretok_state {
    const pretok *p;
    pcre2_match_data *md;
    pcre2_match_context *mc;
    pcre2_jit_stack *stack;
};

// Unicode's White_Space property, which is what \s means in Oniguruma (HF's regex engine).
// PCRE2's \s in UCP mode is that plus U+180E MONGOLIAN VOWEL SEPARATOR (through \h, a leftover
// from before Unicode 6.3 made it a format character), so \s and \S are spelled out.
static const char white_space[] = "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}"
                                  "\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}"
                                  "\\x{3000}";

static void put_str(char *out, size_t *o, const char *s) {
    size_t n = strlen(s);
    memcpy(out + *o, s, n);
    *o += n;
}

// Rewrites a tokenizer.json regex for PCRE2 so that it means what it means to Oniguruma. Escapes
// whose meaning differs between the two engines (\h is a hex digit in Oniguruma, \w and \b
// include marks there) are rejected rather than translated.
static int translate_pattern(char **out, const char *p, ct_error *err) {
    size_t n = strlen(p), o = 0;
    char *r = malloc(n * (sizeof white_space + 4) + 1); // every byte could be a \s
    if (!r) return ct_fail(err, "pre-tokenizer: out of memory");
    bool in_class = false;
    for (size_t i = 0; i < n;) {
        char c = p[i];
        if (c == '\\' && i + 1 < n) {
            char e = p[i + 1];
            if (e == 's' || (e == 'S' && !in_class)) {
                put_str(r, &o, in_class ? "" : e == 's' ? "[" : "[^");
                put_str(r, &o, white_space);
                put_str(r, &o, in_class ? "" : "]");
                i += 2;
                continue;
            }
            if (strchr("SQhHvVwWbBRX", e)) {
                free(r);
                return ct_fail(err, "pre-tokenizer regex: not supported: \\%c%s (offset %zu)", e,
                               e == 'S' ? " inside a character class" : "", i);
            }
            size_t len = 2; // \p{..}, \x{..}: copy the braces whole
            if ((e == 'p' || e == 'P' || e == 'x') && i + 2 < n && p[i + 2] == '{') {
                const char *close = strchr(p + i + 2, '}');
                if (close) len = (size_t)(close - (p + i)) + 1;
            }
            memcpy(r + o, p + i, len);
            o += len;
            i += len;
            continue;
        }
        r[o++] = c;
        i++;
        if (c == '[' && !in_class) {
            in_class = true;
            if (i < n && p[i] == '^') r[o++] = p[i++];
            if (i < n && p[i] == ']') r[o++] = p[i++]; // a leading ']' is literal
        } else if (c == '[' && in_class && i < n && p[i] == ':') {
            const char *close = strstr(p + i, ":]"); // POSIX [:alpha:]
            if (close) {
                size_t len = (size_t)(close - (p + i)) + 2;
                memcpy(r + o, p + i, len);
                o += len;
                i += len;
            }
        } else if (c == ']' && in_class) {
            in_class = false;
        }
    }
    r[o] = 0;
    *out = r;
    return 0;
}

int pretok_compile(pretok **out, const char *pattern, ct_error *err) {
    *out = NULL;
    pretok *p = calloc(1, sizeof *p);
    char *translated = NULL;
    if (!p || !(p->pattern = strdup(pattern))) {
        free(p);
        return ct_fail(err, "pre-tokenizer: out of memory");
    }
    if (translate_pattern(&translated, pattern, err) != 0) {
        pretok_free(p);
        return -1;
    }
    int code;
    PCRE2_SIZE at;
    p->code = pcre2_compile((PCRE2_SPTR)translated, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                            &code, &at, NULL);
    free(translated);
    if (!p->code) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        pretok_free(p);
        return ct_fail(err,
                       "pre-tokenizer regex does not compile (offset %zu as given to PCRE2): %s",
                       (size_t)at, (const char *)msg);
    }
    // Without JIT (a platform PCRE2 lacks it for) the interpreter gives the same matches, slower.
    p->jit = pcre2_jit_compile(p->code, PCRE2_JIT_COMPLETE) == 0;
    *out = p;
    return 0;
}

void pretok_free(pretok *p) {
    if (!p) return;
    pcre2_code_free(p->code);
    free(p->pattern);
    free(p);
}

const char *pretok_pattern(const pretok *p) {
    return p->pattern;
}

int pretok_state_new(pretok_state **out, const pretok *p, ct_error *err) {
    pretok_state *s = calloc(1, sizeof *s);
    *out = NULL;
    if (!s) return ct_fail(err, "pre-tokenizer: out of memory");
    s->p = p;
    s->md = pcre2_match_data_create_from_pattern(p->code, NULL);
    s->mc = pcre2_match_context_create(NULL);
    // The JIT's default stack is 32 KB on the machine stack; give each thread its own that can
    // grow, so that patterns which backtrack over long runs cannot fail on a 100 KB word.
    if (p->jit) s->stack = pcre2_jit_stack_create(32 << 10, 8 << 20, NULL);
    if (!s->md || !s->mc || (p->jit && !s->stack)) {
        pretok_state_free(s);
        return ct_fail(err, "pre-tokenizer: out of memory for match data");
    }
    if (p->jit) pcre2_jit_stack_assign(s->mc, NULL, s->stack);
    *out = s;
    return 0;
}

void pretok_state_free(pretok_state *s) {
    if (!s) return;
    pcre2_match_data_free(s->md);
    pcre2_match_context_free(s->mc);
    pcre2_jit_stack_free(s->stack);
    free(s);
}

static size_t utf8_char_len(unsigned char b) {
    return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
}

int pretok_split(pretok_state *s, const char *text, size_t n, pretok_emit emit, void *ctx,
                 ct_error *err) {
    const pretok *p = s->p;
    size_t pos = 0, gap = 0; // text[gap..) is not yet emitted; matching resumes at pos
    while (pos < n) {
        // The caller validated the UTF-8, so PCRE2's own check (a full pass per call) is skipped.
        int rc = p->jit ? pcre2_jit_match(p->code, (PCRE2_SPTR)text, n, pos, 0, s->md, s->mc)
                        : pcre2_match(p->code, (PCRE2_SPTR)text, n, pos, PCRE2_NO_UTF_CHECK, s->md,
                                      s->mc);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return ct_fail(err, "pre-tokenizer regex failed at byte %zu: %s", pos,
                           (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(s->md);
        size_t ms = ov[0], me = ov[1];
        if (me == ms) {
            // An empty match splits nothing (as in HF); look again one character further on.
            if (ms >= n) break;
            pos = ms + utf8_char_len((unsigned char)text[ms]);
            continue;
        }
        int r;
        if (ms > gap && (r = emit(ctx, text + gap, ms - gap)) != 0) return r;
        if ((r = emit(ctx, text + ms, me - ms)) != 0) return r;
        gap = pos = me;
    }
    if (n > gap) return emit(ctx, text + gap, n - gap);
    return 0;
}
