// The template's source: the arena its tree and values live in, positions (line and column)
// for messages, and the lexer, which applies the whitespace rules as Jinja2's does with
// trim_blocks and lstrip_blocks.
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/grow.h"
#include "core/utf8.h"
#include "text/jinja_lex.h"

// ---- arena

struct jchunk {
    struct jchunk *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
};

void *ja_alloc(jarena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (n == 0) n = 16;
    struct jchunk *c = a->head;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        if (a->total + cap > a->cap) return NULL;
        c = malloc(sizeof *c + cap);
        if (!c) return NULL;
        c->next = a->head;
        c->used = 0;
        c->cap = cap;
        a->head = c;
        a->total += cap;
    }
    void *p = c->data + c->used;
    c->used += n;
    memset(p, 0, n);
    return p;
}

void ja_free(jarena *a) {
    for (struct jchunk *c = a->head, *next; c; c = next) {
        next = c->next;
        free(c);
    }
    a->head = NULL;
    a->total = 0;
}

void jinja_line_col(const jinja_template *t, size_t pos, size_t *line, size_t *col) {
    *line = *col = 1;
    for (size_t i = 0; i < pos && i < t->len; i++) {
        if (t->src[i] == '\n') {
            ++*line;
            *col = 1;
        } else {
            ++*col;
        }
    }
}

int jinja_fail_at(const jinja_template *t, size_t pos, ct_error *err, const char *fmt, ...) {
    size_t line, col;
    jinja_line_col(t, pos, &line, &col);
    char msg[3800];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ct_fail(err, "%s:%zu:%zu: %s", t->name, line, col, msg);
}

// ---- lexer

static token *emit(pstate *ps, ttype t, size_t pos, const char *s, size_t n) {
    if (grow_to((void **)&ps->tok, &ps->cap, ps->ntok + 1, sizeof *ps->tok) != 0) return NULL;
    token *k = &ps->tok[ps->ntok++];
    *k = (token){.t = t, .pos = pos, .s = s, .n = n};
    return k;
}

// Python's str.isspace for one code point (what str.strip() and Jinja's '-' remove).
bool jinja_py_space(uint32_t c) {
    return (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
           c == 0x202f || c == 0x205f || c == 0x3000;
}

// Length of the Python whitespace run at s[0..n) (forward) or ending at s+n (backward).
size_t jinja_space_run(const char *s, size_t n, bool backward) {
    size_t k = 0;
    while (k < n) {
        uint32_t cp;
        int l = 0;
        if (!backward) {
            l = utf8_decode(&cp, (const unsigned char *)s + k, n - k);
        } else {
            size_t b = n - k, st = b - 1;
            while (st > 0 && b - st < 4 && ((unsigned char)s[st] & 0xc0) == 0x80) st--;
            l = utf8_decode(&cp, (const unsigned char *)s + st, b - st);
            if (l != (int)(b - st)) l = -1;
        }
        if (l <= 0 || !jinja_py_space(cp)) break;
        k += (size_t)l;
    }
    return k;
}

static int lex_string(pstate *ps, size_t *p) {
    const char *src = ps->t->src;
    size_t len = ps->t->len, start = *p, i = start + 1;
    char q = src[start];
    while (i < len && src[i] != q) {
        if (src[i] == '\\' && i + 1 < len) i++;
        i++;
    }
    if (i >= len) return FAIL(ps, start, "unterminated string");
    char *out = ja_alloc(&ps->t->arena, (i - start) * 4 + 1);
    if (!out) return FAIL(ps, start, "out of memory");
    size_t n = 0;
    for (size_t j = start + 1; j < i; j++) {
        char c = src[j];
        if (c != '\\') {
            out[n++] = c;
            continue;
        }
        char e = src[++j];
        int hex = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
        const char *simple = strchr("nrtabfv\\'\"\n", e);
        if (e && simple) {
            static const char from[] = "nrtabfv\\'\"\n", to[] = "\n\r\t\a\b\f\v\\'\"";
            if (e != '\n') out[n++] = to[strchr(from, e) - from];
        } else if (hex) {
            uint32_t cp = 0;
            for (int k = 1; k <= hex; k++) {
                char h = j + (size_t)k < i ? src[j + (size_t)k] : 0;
                int v = h >= '0' && h <= '9'   ? h - '0'
                        : h >= 'a' && h <= 'f' ? h - 'a' + 10
                        : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                               : -1;
                if (v < 0) return FAIL(ps, j - 1, "truncated \\%c escape in a string", e);
                cp = cp * 16 + (uint32_t)v;
            }
            if (cp > 0x10ffff || (cp >= 0xd800 && cp < 0xe000))
                return FAIL(ps, j - 1, "escape \\%c for a code point UTF-8 cannot hold", e);
            n += (size_t)utf8_encode(out + n, cp);
            j += (size_t)hex;
        } else if (e >= '0' && e <= '7') {
            uint32_t cp = 0;
            int k = 0;
            while (k < 3 && j < i && src[j] >= '0' && src[j] <= '7')
                cp = cp * 8 + (uint32_t)(src[j++] - '0'), k++;
            j--;
            n += (size_t)utf8_encode(out + n, cp);
        } else {
            out[n++] = '\\';
            out[n++] = e;
        }
    }
    out[n] = 0;
    token *k = emit(ps, T_STR, start, out, n);
    if (!k) return FAIL(ps, start, "out of memory");
    *p = i + 1;
    return 0;
}

static int lex_number(pstate *ps, size_t *p) {
    const char *src = ps->t->src;
    size_t len = ps->t->len, i = *p;
    char buf[128];
    size_t n = 0;
    bool flt = false;
    for (;; i++) {
        char c = i < len ? src[i] : 0;
        if (c >= '0' && c <= '9') {
            if (n < sizeof buf - 1) buf[n++] = c;
        } else if (c == '_' && i + 1 < len && src[i + 1] >= '0' && src[i + 1] <= '9') {
            continue;
        } else if (c == '.' && !flt && i + 1 < len && src[i + 1] >= '0' && src[i + 1] <= '9' &&
                   !(*p > 0 && src[*p - 1] == '.')) {
            flt = true;
            if (n < sizeof buf - 1) buf[n++] = c;
        } else if ((c == 'e' || c == 'E') && i + 1 < len &&
                   ((src[i + 1] >= '0' && src[i + 1] <= '9') ||
                    ((src[i + 1] == '+' || src[i + 1] == '-') && i + 2 < len && src[i + 2] >= '0' &&
                     src[i + 2] <= '9'))) {
            flt = true;
            if (n < sizeof buf - 2) buf[n++] = c, buf[n++] = src[i + 1];
            i++;
        } else {
            break;
        }
    }
    buf[n] = 0;
    token *k = emit(ps, flt ? T_FLOAT : T_INT, *p, src + *p, i - *p);
    if (!k) return FAIL(ps, *p, "out of memory");
    if (flt) {
        k->fval = strtod(buf, NULL);
    } else {
        char *end;
        unsigned long long v = strtoull(buf, &end, 10);
        if (n > 18 && (n > 19 || v > (unsigned long long)INT64_MAX))
            return FAIL(ps, *p, "integer literal too large");
        k->ival = (int64_t)v;
    }
    *p = i;
    return 0;
}

static bool starts(const char *src, size_t len, size_t i, const char *s) {
    size_t n = strlen(s);
    return i + n <= len && memcmp(src + i, s, n) == 0;
}

// Lexes the inside of a {{ }} or {% %} from *p through its end marker (emitted as T_VEND or
// T_BEND); *minus_end tells whether it was "-}}" / "-%}".
static int lex_tag(pstate *ps, size_t *p, bool block, bool *minus_end) {
    const char *src = ps->t->src;
    size_t len = ps->t->len, i = *p;
    int depth = 0;
    const char *end = block ? "%}" : "}}";
    for (;;) {
        while (i < len && (src[i] == ' ' || src[i] == '\t' || src[i] == '\n' || src[i] == '\r'))
            i++;
        if (i >= len) return FAIL(ps, i, "unexpected end of template: expected '%s'", end);
        char c = src[i];
        if (depth == 0 && (starts(src, len, i, end) ||
                           ((c == '-' || (block && c == '+')) && starts(src, len, i + 1, end)))) {
            *minus_end = c == '-';
            size_t at = i;
            i += c == end[0] ? 2 : 3;
            if (!emit(ps, block ? T_BEND : T_VEND, at, src + at, i - at))
                return FAIL(ps, at, "out of memory");
            *p = i;
            return 0;
        }
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_') {
            size_t s = i;
            while (i < len &&
                   ((src[i] >= 'a' && src[i] <= 'z') || (src[i] >= 'A' && src[i] <= 'Z') ||
                    (src[i] >= '0' && src[i] <= '9') || src[i] == '_'))
                i++;
            if (!emit(ps, T_NAME, s, src + s, i - s)) return FAIL(ps, s, "out of memory");
        } else if (c >= '0' && c <= '9') {
            if (lex_number(ps, &i)) return -1;
        } else if (c == '\'' || c == '"') {
            if (lex_string(ps, &i)) return -1;
        } else {
            static const char *const two[] = {"**", "//", "==", "!=", "<=", ">=", NULL};
            size_t n = 0;
            for (int k = 0; two[k]; k++)
                if (starts(src, len, i, two[k])) n = 2;
            if (!n && strchr("+-*/%~<>=()[]{},.:|", c)) n = 1;
            if (!n) {
                if ((unsigned char)c < 0x20 || (unsigned char)c >= 0x7f)
                    return FAIL(ps, i, "unexpected byte 0x%02x", (unsigned char)c);
                return FAIL(ps, i, "unexpected character '%c'", c);
            }
            if (n == 1 && strchr("([{", c)) depth++;
            if (n == 1 && strchr(")]}", c) && depth > 0) depth--;
            if (!emit(ps, T_OP, i, src + i, n)) return FAIL(ps, i, "out of memory");
            i += n;
        }
    }
}

int jinja_lex(pstate *ps) {
    const char *src = ps->t->src;
    size_t len = ps->t->len, pos = 0;
    bool strip_next = false, trim_next = false;
    while (pos <= len) {
        size_t ts = pos;
        while (ts + 1 < len && !(src[ts] == '{' && strchr("{%#", src[ts + 1]))) ts++;
        if (ts + 1 >= len) ts = len;
        size_t a = pos, b = ts;
        if (strip_next)
            a += jinja_space_run(src + a, b - a, false);
        else if (trim_next && a < b && src[a] == '\n')
            a++;
        strip_next = trim_next = false;
        char kind = ts < len ? src[ts + 1] : 0;
        char mod = ts + 2 < len ? src[ts + 2] : 0;
        if (kind && mod == '-') {
            b -= jinja_space_run(src + a, b - a, true);
        } else if ((kind == '%' || kind == '#') && mod != '+') {
            size_t l = b;
            while (l > a && (src[l - 1] == ' ' || src[l - 1] == '\t')) l--;
            if ((l > a && src[l - 1] == '\n') || (l == a && (a == 0 || src[a - 1] == '\n'))) b = l;
        }
        if (b > a && !emit(ps, T_TEXT, a, src + a, b - a)) return FAIL(ps, a, "out of memory");
        if (ts >= len) break;
        size_t body = ts + 2 + (mod == '-' || mod == '+');
        if (kind == '#') {
            size_t e = body;
            while (e + 1 < len && !(src[e] == '#' && src[e + 1] == '}')) e++;
            if (e + 1 >= len) return FAIL(ps, ts, "unterminated comment: expected '#}'");
            strip_next = e > body && src[e - 1] == '-';
            trim_next = !strip_next;
            pos = e + 2;
            continue;
        }
        size_t first = ps->ntok;
        if (!emit(ps, kind == '%' ? T_BBEGIN : T_VBEGIN, ts, src + ts, body - ts))
            return FAIL(ps, ts, "out of memory");
        bool minus = false;
        pos = body;
        if (lex_tag(ps, &pos, kind == '%', &minus)) return -1;
        strip_next = minus;
        trim_next = kind == '%' && !minus;
        if (kind == '%' && ps->ntok == first + 3 && ps->tok[first + 1].t == T_NAME &&
            ps->tok[first + 1].n == 3 && memcmp(ps->tok[first + 1].s, "raw", 3) == 0) {
            // {% raw %}...{% endraw %}: the text in between as it is.
            ps->ntok = first;
            size_t e = pos, tag_end = 0, text_end = 0;
            for (; e + 1 < len; e++) {
                if (src[e] != '{' || src[e + 1] != '%') continue;
                size_t k = e + 2;
                bool m = k < len && src[k] == '-';
                k += k < len && (src[k] == '-' || src[k] == '+');
                while (k < len && (src[k] == ' ' || src[k] == '\t' || src[k] == '\n')) k++;
                if (!starts(src, len, k, "endraw")) continue;
                k += 6;
                while (k < len && (src[k] == ' ' || src[k] == '\t' || src[k] == '\n')) k++;
                bool m2 = k < len && src[k] == '-';
                if (m2) k++;
                if (!starts(src, len, k, "%}")) continue;
                text_end = e;
                if (m) text_end -= jinja_space_run(src + pos, e - pos, true);
                tag_end = k + 2;
                strip_next = m2;
                trim_next = !m2;
                break;
            }
            if (!tag_end) return FAIL(ps, ts, "unterminated raw block: expected '{%% endraw %%}'");
            size_t a2 = pos;
            if (minus)
                a2 += jinja_space_run(src + a2, text_end - a2, false);
            else if (a2 < text_end && src[a2] == '\n')
                a2++;
            if (text_end > a2 && !emit(ps, T_TEXT, a2, src + a2, text_end - a2))
                return FAIL(ps, a2, "out of memory");
            pos = tag_end;
        }
    }
    if (!emit(ps, T_EOF, len, src + len, 0)) return FAIL(ps, len, "out of memory");
    return 0;
}
