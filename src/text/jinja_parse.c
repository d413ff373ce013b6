// Jinja2 lexer and parser for the chat-template subset (see jinja.h). The lexer applies the
// whitespace rules as Jinja2's does with trim_blocks and lstrip_blocks; the parser follows
// Jinja2's grammar (jinja2/parser.py) and its operator precedences.
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/grow.h"
#include "core/utf8.h"
#include "text/jinja_internal.h"

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

static bool in_list(const char *const *list, const char *s, size_t n) {
    for (; *list; list++)
        if (strlen(*list) == n && memcmp(*list, s, n) == 0) return true;
    return false;
}

// ---- lexer

typedef enum {
    T_TEXT,
    T_BBEGIN,
    T_BEND,
    T_VBEGIN,
    T_VEND,
    T_NAME,
    T_STR,
    T_INT,
    T_FLOAT,
    T_OP,
    T_EOF
} ttype;

typedef struct {
    ttype t;
    size_t pos;
    const char *s; // text, name, op or the decoded string
    size_t n;
    int64_t ival;
    double fval;
} token;

typedef struct {
    jinja_template *t;
    ct_error *err;
    token *tok;
    size_t ntok, cap, i;
    int depth, loops;
} pstate;

#define FAIL(ps, pos, ...) jinja_fail_at((ps)->t, (pos), (ps)->err, __VA_ARGS__)

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

static int lex(pstate *ps) {
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

// ---- parser

#define MAX_PARSE_DEPTH 200

static token *cur(pstate *ps) {
    return &ps->tok[ps->i];
}
static bool is_op(const token *k, const char *op) {
    return k->t == T_OP && k->n == strlen(op) && memcmp(k->s, op, k->n) == 0;
}
static bool is_name(const token *k, const char *name) {
    return k->t == T_NAME && k->n == strlen(name) && memcmp(k->s, name, k->n) == 0;
}

static const char *describe(const token *k, char *buf, size_t cap) {
    switch (k->t) {
    case T_EOF:
        return "end of template";
    case T_TEXT:
        return "template text";
    case T_BBEGIN:
        return "'{%'";
    case T_VBEGIN:
        return "'{{'";
    case T_STR:
        return "a string";
    default:
        snprintf(buf, cap, "'%.*s'", (int)(k->n > 40 ? 40 : k->n), k->s);
        return buf;
    }
}

static int expected(pstate *ps, const char *what) {
    char buf[64];
    return FAIL(ps, cur(ps)->pos, "expected %s but found %s", what,
                describe(cur(ps), buf, sizeof buf));
}

static int expect_op(pstate *ps, const char *op) {
    if (!is_op(cur(ps), op)) {
        char w[16];
        snprintf(w, sizeof w, "'%s'", op);
        return expected(ps, w);
    }
    ps->i++;
    return 0;
}

static int expect_end(pstate *ps, ttype t) {
    if (cur(ps)->t != t) return expected(ps, t == T_BEND ? "'%}'" : "'}}'");
    ps->i++;
    return 0;
}

static jnode *new_node(pstate *ps, jnode_kind kind, size_t pos) {
    jnode *n = ja_alloc(&ps->t->arena, sizeof *n);
    if (!n) {
        FAIL(ps, pos, "out of memory");
        return NULL;
    }
    n->kind = kind;
    n->pos = pos;
    return n;
}

// A growable list of nodes (and optional keyword names), moved into the arena when done.
typedef struct {
    jnode **v;
    const char **names;
    size_t *lens;
    int *ops;
    size_t n, cap;
} nlist;

static int nl_push(pstate *ps, nlist *l, jnode *x, const char *name, size_t len, int op) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 8;
        jnode **v = ja_alloc(&ps->t->arena, cap * sizeof *v);
        const char **nm = ja_alloc(&ps->t->arena, cap * sizeof *nm);
        size_t *ln = ja_alloc(&ps->t->arena, cap * sizeof *ln);
        int *o = ja_alloc(&ps->t->arena, cap * sizeof *o);
        if (!v || !nm || !ln || !o) return FAIL(ps, cur(ps)->pos, "out of memory");
        if (l->n) {
            memcpy(v, l->v, l->n * sizeof *v);
            memcpy(nm, l->names, l->n * sizeof *nm);
            memcpy(ln, l->lens, l->n * sizeof *ln);
            memcpy(o, l->ops, l->n * sizeof *o);
        }
        l->v = v, l->names = nm, l->lens = ln, l->ops = o, l->cap = cap;
    }
    l->v[l->n] = x;
    l->names[l->n] = name;
    l->lens[l->n] = len;
    l->ops[l->n] = op;
    l->n++;
    return 0;
}

static void nl_store(jnode *n, const nlist *l) {
    n->kids = l->v;
    n->names = l->names;
    n->name_lens = l->lens;
    n->ops = l->ops;
    n->nkids = l->n;
}

static jnode *parse_expr(pstate *ps, bool with_cond);
static jnode *parse_unary(pstate *ps, bool with_filter);
static jnode *parse_primary(pstate *ps);
static jnode *parse_postfix(pstate *ps, jnode *node);

// Expressions separated by commas: a tuple unless it is one without a trailing comma.
static jnode *parse_tuple(pstate *ps, bool with_cond, bool parens) {
    size_t pos = cur(ps)->pos;
    nlist l = {0};
    bool comma = false;
    for (;;) {
        token *k = cur(ps);
        if (l.n &&
            (k->t == T_BEND || k->t == T_VEND || is_op(k, ")") || (!with_cond && is_name(k, "if"))))
            break;
        if (parens && l.n == 0 && is_op(k, ")")) break;
        jnode *e = parse_expr(ps, with_cond);
        if (!e || nl_push(ps, &l, e, NULL, 0, 0)) return NULL;
        if (!is_op(cur(ps), ",")) break;
        comma = true;
        ps->i++;
    }
    if (l.n == 1 && !comma) return l.v[0];
    jnode *t = new_node(ps, N_TUPLE, pos);
    if (t) nl_store(t, &l);
    return t;
}

static int parse_args(pstate *ps, jnode *n) {
    // at '('
    ps->i++;
    nlist l = {0};
    while (!is_op(cur(ps), ")")) {
        if (l.n && expect_op(ps, ",")) return -1;
        if (is_op(cur(ps), ")")) break;
        token *k = cur(ps);
        if (is_op(k, "*") || is_op(k, "**"))
            return FAIL(ps, k->pos, "unsupported: *args and **kwargs in a call");
        const char *name = NULL;
        size_t len = 0;
        if (k->t == T_NAME && is_op(&ps->tok[ps->i + 1], "=")) {
            name = k->s, len = k->n;
            ps->i += 2;
        } else if (l.n && l.names[l.n - 1]) {
            return FAIL(ps, k->pos, "a positional argument after a keyword argument");
        }
        jnode *e = parse_expr(ps, true);
        if (!e || nl_push(ps, &l, e, name, len, 0)) return -1;
    }
    ps->i++;
    nl_store(n, &l);
    return 0;
}

// node(...), at the '('.
static jnode *parse_call(pstate *ps, jnode *node) {
    jnode *n = new_node(ps, N_CALL, cur(ps)->pos);
    if (!n) return NULL;
    n->a = node;
    return parse_args(ps, n) ? NULL : n;
}

// The filter or test named at the cursor, applied to node; one we do not implement is an error.
static jnode *filter_or_test(pstate *ps, jnode_kind kind, jnode *node) {
    bool filter = kind == N_FILTER;
    token *f = cur(ps);
    if (f->t != T_NAME && (filter || (!is_op(f, "==") && !is_op(f, "!=")))) {
        expected(ps, filter ? "a filter name" : "a test name");
        return NULL;
    }
    int id = filter ? jinja_name_find(jinja_filter_names, JINJA_N_FILTERS, f->s, f->n)
                    : jinja_name_find(jinja_test_names, JINJA_N_TESTS, f->s, f->n);
    if (id < 0) {
        FAIL(ps, f->pos, "unsupported %s '%.*s'", filter ? "filter" : "test", (int)f->n, f->s);
        return NULL;
    }
    jnode *n = new_node(ps, kind, f->pos);
    if (!n) return NULL;
    ps->i++;
    n->a = node, n->str = f->s, n->len = f->n, n->ival = id;
    return n;
}

static jnode *parse_filter_expr(pstate *ps, jnode *node) {
    for (;;) {
        token *k = cur(ps);
        if (is_op(k, "|")) {
            ps->i++;
            jnode *n = filter_or_test(ps, N_FILTER, node);
            if (!n) return NULL;
            if (is_op(cur(ps), "(") && parse_args(ps, n)) return NULL;
            node = n;
        } else if (is_name(k, "is")) {
            ps->i++;
            bool neg = is_name(cur(ps), "not");
            if (neg) ps->i++;
            jnode *n = filter_or_test(ps, N_TEST, node);
            if (!n) return NULL;
            n->op = neg;
            token *a = cur(ps);
            if (is_op(a, "(")) {
                if (parse_args(ps, n)) return NULL;
            } else if ((a->t == T_NAME || a->t == T_STR || a->t == T_INT || a->t == T_FLOAT ||
                        is_op(a, "[") || is_op(a, "{")) &&
                       !is_name(a, "else") && !is_name(a, "or") && !is_name(a, "and") &&
                       !is_name(a, "if") && !is_name(a, "in") && !is_name(a, "not")) {
                if (is_name(a, "is")) {
                    FAIL(ps, a->pos, "tests cannot be chained with 'is'");
                    return NULL;
                }
                jnode *arg = parse_primary(ps);
                if (!arg || !(arg = parse_postfix(ps, arg))) return NULL;
                nlist l = {0};
                if (nl_push(ps, &l, arg, NULL, 0, 0)) return NULL;
                nl_store(n, &l);
            }
            node = n;
        } else if (is_op(k, "(")) {
            if (!(node = parse_call(ps, node))) return NULL;
        } else {
            return node;
        }
    }
}

static jnode *parse_postfix(pstate *ps, jnode *node) {
    for (;;) {
        token *k = cur(ps);
        if (is_op(k, ".")) {
            ps->i++;
            token *f = cur(ps);
            jnode *n;
            if (f->t == T_NAME) {
                if (!(n = new_node(ps, N_ATTR, f->pos))) return NULL;
                n->str = f->s, n->len = f->n;
            } else if (f->t == T_INT) {
                if (!(n = new_node(ps, N_ITEM, f->pos)) || !(n->b = new_node(ps, N_CONST, f->pos)))
                    return NULL;
                n->b->op = JC_INT, n->b->ival = f->ival;
            } else {
                expected(ps, "an attribute name");
                return NULL;
            }
            ps->i++;
            n->a = node;
            node = n;
        } else if (is_op(k, "[")) {
            ps->i++;
            jnode *parts[3] = {0};
            int np = 0;
            bool slice = false;
            for (;;) {
                token *t = cur(ps);
                if (is_op(t, ":")) {
                    slice = true;
                    if (++np > 2) {
                        FAIL(ps, t->pos, "a slice has at most three parts");
                        return NULL;
                    }
                    ps->i++;
                    continue;
                }
                if (is_op(t, "]")) break;
                if (parts[np]) {
                    expected(ps, "']'");
                    return NULL;
                }
                if (!(parts[np] = parse_expr(ps, true))) return NULL;
            }
            ps->i++;
            jnode *n = new_node(ps, slice ? N_SLICE : N_ITEM, k->pos);
            if (!n) return NULL;
            n->a = node;
            if (slice) {
                nlist l = {0};
                for (int j = 0; j < 3; j++)
                    if (nl_push(ps, &l, parts[j], NULL, 0, 0)) return NULL;
                nl_store(n, &l);
            } else if (!(n->b = parts[0])) {
                FAIL(ps, k->pos, "an empty subscript");
                return NULL;
            }
            node = n;
        } else if (is_op(k, "(")) {
            if (!(node = parse_call(ps, node))) return NULL;
        } else {
            return node;
        }
    }
}

static jnode *parse_primary(pstate *ps) {
    token *k = cur(ps);
    jnode *n = NULL;
    if (k->t == T_NAME) {
        static const char *const consts[] = {"true", "True", "false", "False",
                                             "none", "None", NULL};
        static const int kinds[] = {JC_TRUE, JC_TRUE, JC_FALSE, JC_FALSE, JC_NONE, JC_NONE};
        for (int j = 0; consts[j]; j++)
            if (is_name(k, consts[j])) {
                if (!(n = new_node(ps, N_CONST, k->pos))) return NULL;
                n->op = kinds[j];
            }
        if (!n) {
            if (!(n = new_node(ps, N_NAME, k->pos))) return NULL;
            n->str = k->s, n->len = k->n;
        }
        ps->i++;
    } else if (k->t == T_STR) {
        if (!(n = new_node(ps, N_CONST, k->pos))) return NULL;
        n->op = JC_STR, n->str = k->s, n->len = k->n;
        ps->i++;
        if (cur(ps)->t == T_STR) { // adjacent literals join, as in Python
            size_t total = n->len;
            for (size_t j = ps->i; ps->tok[j].t == T_STR; j++) total += ps->tok[j].n;
            char *s = ja_alloc(&ps->t->arena, total + 1);
            if (!s) {
                FAIL(ps, k->pos, "out of memory");
                return NULL;
            }
            memcpy(s, n->str, n->len);
            size_t at = n->len;
            for (; cur(ps)->t == T_STR; ps->i++) {
                memcpy(s + at, cur(ps)->s, cur(ps)->n);
                at += cur(ps)->n;
            }
            n->str = s, n->len = total;
        }
    } else if (k->t == T_INT || k->t == T_FLOAT) {
        if (!(n = new_node(ps, N_CONST, k->pos))) return NULL;
        n->op = k->t == T_INT ? JC_INT : JC_FLOAT, n->ival = k->ival, n->fval = k->fval;
        ps->i++;
    } else if (is_op(k, "(")) {
        ps->i++;
        if (!(n = parse_tuple(ps, true, true)) || expect_op(ps, ")")) return NULL;
    } else if (is_op(k, "[") || is_op(k, "{")) {
        bool dict = is_op(k, "{");
        const char *close = dict ? "}" : "]";
        ps->i++;
        if (!(n = new_node(ps, dict ? N_DICT : N_LIST, k->pos))) return NULL;
        nlist l = {0};
        while (!is_op(cur(ps), close)) {
            if (l.n && expect_op(ps, ",")) return NULL;
            if (is_op(cur(ps), close)) break;
            jnode *e = parse_expr(ps, true);
            if (!e || nl_push(ps, &l, e, NULL, 0, 0)) return NULL;
            if (dict) {
                if (expect_op(ps, ":") || !(e = parse_expr(ps, true)) ||
                    nl_push(ps, &l, e, NULL, 0, 0))
                    return NULL;
            }
        }
        ps->i++;
        nl_store(n, &l);
    } else {
        expected(ps, "an expression");
        return NULL;
    }
    return n;
}

static jnode *parse_unary(pstate *ps, bool with_filter) {
    token *k = cur(ps);
    jnode *node;
    if (++ps->depth > MAX_PARSE_DEPTH) {
        FAIL(ps, k->pos, "expression nested deeper than %d", MAX_PARSE_DEPTH);
        return NULL;
    }
    if (is_op(k, "-") || is_op(k, "+")) {
        ps->i++;
        if (!(node = new_node(ps, N_UNARY, k->pos)) || !(node->a = parse_unary(ps, false)))
            return NULL;
        node->op = k->s[0];
    } else if (!(node = parse_primary(ps))) {
        return NULL;
    }
    if (!(node = parse_postfix(ps, node))) return NULL;
    if (with_filter && !(node = parse_filter_expr(ps, node))) return NULL;
    ps->depth--;
    return node;
}

static jnode *binary(pstate *ps, int op, jnode *a, jnode *b, size_t pos) {
    jnode *n = new_node(ps, N_BINARY, pos);
    if (n) n->op = op, n->a = a, n->b = b;
    return n;
}

static jnode *parse_pow(pstate *ps) {
    jnode *left = parse_unary(ps, true);
    while (left && is_op(cur(ps), "**")) {
        size_t pos = cur(ps)->pos;
        ps->i++;
        jnode *right = parse_unary(ps, true);
        left = right ? binary(ps, JB_POW, left, right, pos) : NULL;
    }
    return left;
}

static jnode *parse_math2(pstate *ps) {
    jnode *left = parse_pow(ps);
    for (;;) {
        token *k = cur(ps);
        int op = is_op(k, "*")    ? JB_MUL
                 : is_op(k, "/")  ? JB_DIV
                 : is_op(k, "//") ? JB_FLOORDIV
                 : is_op(k, "%")  ? JB_MOD
                                  : -1;
        if (!left || op < 0) return left;
        ps->i++;
        jnode *right = parse_pow(ps);
        left = right ? binary(ps, op, left, right, k->pos) : NULL;
    }
}

static jnode *parse_concat(pstate *ps) {
    jnode *left = parse_math2(ps);
    while (left && is_op(cur(ps), "~")) {
        size_t pos = cur(ps)->pos;
        ps->i++;
        jnode *right = parse_math2(ps);
        left = right ? binary(ps, JB_CONCAT, left, right, pos) : NULL;
    }
    return left;
}

static jnode *parse_math1(pstate *ps) {
    jnode *left = parse_concat(ps);
    for (;;) {
        token *k = cur(ps);
        int op = is_op(k, "+") ? JB_ADD : is_op(k, "-") ? JB_SUB : -1;
        if (!left || op < 0) return left;
        ps->i++;
        jnode *right = parse_concat(ps);
        left = right ? binary(ps, op, left, right, k->pos) : NULL;
    }
}

static jnode *parse_compare(pstate *ps) {
    size_t pos = cur(ps)->pos;
    jnode *first = parse_math1(ps);
    if (!first) return NULL;
    nlist l = {0};
    for (;;) {
        token *k = cur(ps);
        int op = is_op(k, "==")     ? JO_EQ
                 : is_op(k, "!=")   ? JO_NE
                 : is_op(k, "<")    ? JO_LT
                 : is_op(k, "<=")   ? JO_LE
                 : is_op(k, ">")    ? JO_GT
                 : is_op(k, ">=")   ? JO_GE
                 : is_name(k, "in") ? JO_IN
                                    : -1;
        if (op < 0 && is_name(k, "not") && is_name(&ps->tok[ps->i + 1], "in")) {
            op = JO_NOTIN;
            ps->i++;
        }
        if (op < 0) break;
        ps->i++;
        jnode *e = parse_math1(ps);
        if (!e || nl_push(ps, &l, e, NULL, 0, op)) return NULL;
    }
    if (!l.n) return first;
    jnode *n = new_node(ps, N_COMPARE, pos);
    if (n) n->a = first, nl_store(n, &l);
    return n;
}

static jnode *parse_not(pstate *ps) {
    token *k = cur(ps);
    if (!is_name(k, "not")) return parse_compare(ps);
    ps->i++;
    if (++ps->depth > MAX_PARSE_DEPTH) {
        FAIL(ps, k->pos, "expression nested deeper than %d", MAX_PARSE_DEPTH);
        return NULL;
    }
    jnode *n = new_node(ps, N_UNARY, k->pos);
    if (!n || !(n->a = parse_not(ps))) return NULL;
    ps->depth--;
    n->op = '!';
    return n;
}

static jnode *parse_logic(pstate *ps, bool is_or) {
    jnode *left = is_or ? parse_logic(ps, false) : parse_not(ps);
    while (left && is_name(cur(ps), is_or ? "or" : "and")) {
        size_t pos = cur(ps)->pos;
        ps->i++;
        jnode *right = is_or ? parse_logic(ps, false) : parse_not(ps);
        jnode *n = right ? new_node(ps, is_or ? N_OR : N_AND, pos) : NULL;
        if (n) n->a = left, n->b = right;
        left = n;
    }
    return left;
}

static jnode *parse_expr(pstate *ps, bool with_cond) {
    if (++ps->depth > MAX_PARSE_DEPTH) {
        FAIL(ps, cur(ps)->pos, "expression nested deeper than %d", MAX_PARSE_DEPTH);
        return NULL;
    }
    jnode *e = parse_logic(ps, true);
    while (e && with_cond && is_name(cur(ps), "if")) {
        jnode *n = new_node(ps, N_COND, cur(ps)->pos);
        if (!n) return NULL;
        ps->i++;
        n->a = e;
        if (!(n->b = parse_logic(ps, true))) return NULL;
        if (is_name(cur(ps), "else")) {
            ps->i++;
            if (!(n->c = parse_expr(ps, true))) return NULL;
        }
        e = n;
    }
    ps->depth--;
    return e;
}

// ---- statements

static jnode *parse_body(pstate *ps, const char *const *ends, const char **found, size_t open_pos,
                         const char *opener);

// A name list "a" or "a, b" (for / set targets) into n->names.
static int parse_targets(pstate *ps, jnode *n) {
    const char *names[16];
    size_t lens[16], k = 0;
    for (;;) {
        token *t = cur(ps);
        if (t->t != T_NAME) return expected(ps, "a variable name");
        if (k == 16) return FAIL(ps, t->pos, "more than 16 names to unpack");
        names[k] = t->s, lens[k++] = t->n;
        ps->i++;
        if (!is_op(cur(ps), ",")) break;
        ps->i++;
    }
    n->names = ja_alloc(&ps->t->arena, k * sizeof *n->names);
    n->name_lens = ja_alloc(&ps->t->arena, k * sizeof *n->name_lens);
    if (!n->names || !n->name_lens) return FAIL(ps, n->pos, "out of memory");
    memcpy(n->names, names, k * sizeof *names);
    memcpy(n->name_lens, lens, k * sizeof *lens);
    n->nnames = k;
    return 0;
}

// After a body that ended at `found`: an {% else %} body up to the closer into n->c, then the
// closer's '%}'.
static jnode *parse_else(pstate *ps, jnode *n, const char *found, const char *closer, size_t pos,
                         const char *opener) {
    if (!strcmp(found, "else")) {
        const char *const ends[] = {closer, NULL};
        if (expect_end(ps, T_BEND) || !(n->c = parse_body(ps, ends, &found, pos, opener)))
            return NULL;
    }
    return expect_end(ps, T_BEND) ? NULL : n;
}

static jnode *parse_if(pstate *ps, size_t pos) {
    jnode *n = new_node(ps, N_IF, pos);
    if (!n || !(n->a = parse_expr(ps, true)) || expect_end(ps, T_BEND)) return NULL;
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    const char *found;
    size_t at = cur(ps)->pos;
    if (!(n->b = parse_body(ps, ends, &found, pos, "if"))) return NULL;
    if (!strcmp(found, "elif")) {
        jnode *body = new_node(ps, N_BODY, at);
        nlist l = {0};
        jnode *inner = body ? parse_if(ps, at) : NULL;
        if (!inner || nl_push(ps, &l, inner, NULL, 0, 0)) return NULL;
        nl_store(body, &l);
        n->c = body;
        return n;
    }
    return parse_else(ps, n, found, "endif", pos, "if");
}

static jnode *parse_for(pstate *ps, size_t pos) {
    jnode *n = new_node(ps, N_FOR, pos);
    if (!n || parse_targets(ps, n)) return NULL;
    if (!is_name(cur(ps), "in")) {
        expected(ps, "'in'");
        return NULL;
    }
    ps->i++;
    if (!(n->a = parse_tuple(ps, false, false))) return NULL;
    if (is_name(cur(ps), "if")) {
        ps->i++;
        if (!(n->d = parse_expr(ps, true))) return NULL;
    }
    if (is_name(cur(ps), "recursive")) {
        FAIL(ps, cur(ps)->pos, "unsupported: recursive for loops");
        return NULL;
    }
    if (expect_end(ps, T_BEND)) return NULL;
    static const char *const ends[] = {"else", "endfor", NULL};
    const char *found;
    ps->loops++;
    n->b = parse_body(ps, ends, &found, pos, "for");
    ps->loops--;
    if (!n->b) return NULL;
    return parse_else(ps, n, found, "endfor", pos, "for");
}

static jnode *parse_set(pstate *ps, size_t pos) {
    jnode *n = new_node(ps, N_SET, pos);
    if (!n || parse_targets(ps, n)) return NULL;
    if (n->nnames == 1 && is_op(cur(ps), ".")) { // ns.attr
        ps->i++;
        token *a = cur(ps);
        if (a->t != T_NAME) {
            expected(ps, "an attribute name");
            return NULL;
        }
        n->str = a->s, n->len = a->n;
        ps->i++;
    }
    if (is_op(cur(ps), "=")) {
        ps->i++;
        if (!(n->a = parse_tuple(ps, true, false)) || expect_end(ps, T_BEND)) return NULL;
        return n;
    }
    if (n->nnames != 1 || n->str) {
        expected(ps, "'='");
        return NULL;
    }
    if (is_op(cur(ps), "|")) {
        FAIL(ps, cur(ps)->pos, "unsupported: a filter on a block set");
        return NULL;
    }
    if (expect_end(ps, T_BEND)) return NULL;
    static const char *const ends[] = {"endset", NULL};
    const char *found;
    n->kind = N_SETBLOCK;
    if (!(n->b = parse_body(ps, ends, &found, pos, "set"))) return NULL;
    return expect_end(ps, T_BEND) ? NULL : n;
}

static jnode *parse_macro(pstate *ps, size_t pos) {
    jnode *n = new_node(ps, N_MACRO, pos);
    if (!n) return NULL;
    token *k = cur(ps);
    if (k->t != T_NAME) {
        expected(ps, "a macro name");
        return NULL;
    }
    n->str = k->s, n->len = k->n;
    ps->i++;
    if (expect_op(ps, "(")) return NULL;
    nlist l = {0};
    while (!is_op(cur(ps), ")")) {
        if (l.n && expect_op(ps, ",")) return NULL;
        token *p = cur(ps);
        if (p->t != T_NAME) {
            expected(ps, "a parameter name");
            return NULL;
        }
        ps->i++;
        jnode *def = NULL;
        if (is_op(cur(ps), "=")) {
            ps->i++;
            if (!(def = parse_expr(ps, true))) return NULL;
        } else if (l.n && l.v[l.n - 1]) {
            FAIL(ps, p->pos, "a parameter without a default after one with a default");
            return NULL;
        }
        if (nl_push(ps, &l, def, p->s, p->n, 0)) return NULL;
    }
    ps->i++;
    nl_store(n, &l);
    n->nnames = l.n;
    if (expect_end(ps, T_BEND)) return NULL;
    static const char *const ends[] = {"endmacro", NULL};
    const char *found;
    int loops = ps->loops;
    ps->loops = 0;
    n->b = parse_body(ps, ends, &found, pos, "macro");
    ps->loops = loops;
    if (!n->b || expect_end(ps, T_BEND)) return NULL;
    return n;
}

static jnode *parse_statement(pstate *ps, size_t pos) {
    token *k = cur(ps);
    if (k->t != T_NAME) {
        expected(ps, "a tag name");
        return NULL;
    }
    ps->i++;
    if (is_name(k, "if")) return parse_if(ps, pos);
    if (is_name(k, "for")) return parse_for(ps, pos);
    if (is_name(k, "set")) return parse_set(ps, pos);
    if (is_name(k, "macro")) return parse_macro(ps, pos);
    if (is_name(k, "break") || is_name(k, "continue")) {
        if (!ps->loops) {
            FAIL(ps, k->pos, "'%.*s' outside a for loop", (int)k->n, k->s);
            return NULL;
        }
        jnode *n = new_node(ps, is_name(k, "break") ? N_BREAK : N_CONTINUE, pos);
        return n && !expect_end(ps, T_BEND) ? n : NULL;
    }
    if (is_name(k, "generation")) { // transformers' assistant-mask tag: renders its body
        static const char *const ends[] = {"endgeneration", NULL};
        const char *found;
        jnode *b;
        if (expect_end(ps, T_BEND) || !(b = parse_body(ps, ends, &found, pos, "generation")) ||
            expect_end(ps, T_BEND))
            return NULL;
        return b;
    }
    static const char *const unsupported[] = {"include", "import",    "from", "extends",    "block",
                                              "call",    "filter",    "with", "autoescape", "do",
                                              "trans",   "pluralize", NULL};
    if (in_list(unsupported, k->s, k->n))
        FAIL(ps, k->pos, "unsupported tag '%.*s'", (int)k->n, k->s);
    else
        FAIL(ps, k->pos, "unknown tag '%.*s'", (int)(k->n > 40 ? 40 : k->n), k->s);
    return NULL;
}

// Statements up to a {% NAME %} with NAME in ends (*found, the cursor after NAME) or, with
// ends NULL, to the end of the template.
static jnode *parse_body(pstate *ps, const char *const *ends, const char **found, size_t open_pos,
                         const char *opener) {
    jnode *body = new_node(ps, N_BODY, cur(ps)->pos);
    if (!body) return NULL;
    if (++ps->depth > MAX_PARSE_DEPTH) {
        FAIL(ps, cur(ps)->pos, "blocks nested deeper than %d", MAX_PARSE_DEPTH);
        return NULL;
    }
    nlist l = {0};
    for (;;) {
        token *k = cur(ps);
        jnode *n = NULL;
        if (k->t == T_EOF) {
            if (ends) {
                char w[96];
                snprintf(w, sizeof w, "'%s'", ends[0]);
                for (int j = 1; ends[j]; j++)
                    snprintf(w + strlen(w), sizeof w - strlen(w), " or '%s'", ends[j]);
                size_t line, col;
                jinja_line_col(ps->t, open_pos, &line, &col);
                FAIL(ps, k->pos,
                     "unexpected end of template: expected %s to close the '%s' at %zu:%zu", w,
                     opener, line, col);
                return NULL;
            }
            break;
        }
        if (k->t == T_TEXT) {
            if (!(n = new_node(ps, N_TEXT, k->pos))) return NULL;
            n->str = k->s, n->len = k->n;
            ps->i++;
        } else if (k->t == T_VBEGIN) {
            ps->i++;
            if (!(n = new_node(ps, N_OUTPUT, k->pos)) || !(n->a = parse_tuple(ps, true, false)) ||
                expect_end(ps, T_VEND))
                return NULL;
        } else if (k->t == T_BBEGIN) {
            token *name = &ps->tok[ps->i + 1];
            for (int j = 0; ends && ends[j]; j++)
                if (is_name(name, ends[j])) {
                    *found = ends[j];
                    ps->i += 2;
                    nl_store(body, &l);
                    ps->depth--;
                    return body;
                }
            static const char *const closers[] = {"elif",   "else",          "endif",
                                                  "endfor", "endset",        "endmacro",
                                                  "endraw", "endgeneration", NULL};
            if (name->t == T_NAME && in_list(closers, name->s, name->n)) {
                FAIL(ps, name->pos, "unexpected '%.*s'%s%s%s", (int)name->n, name->s,
                     ends ? " inside '" : "", ends ? opener : "", ends ? "'" : "");
                return NULL;
            }
            ps->i++;
            if (!(n = parse_statement(ps, k->pos))) return NULL;
        } else {
            char buf[64];
            FAIL(ps, k->pos, "unexpected %s", describe(k, buf, sizeof buf));
            return NULL;
        }
        if (nl_push(ps, &l, n, NULL, 0, 0)) return NULL;
    }
    nl_store(body, &l);
    ps->depth--;
    return body;
}

int jinja_parse(jinja_template **out, const char *src, size_t len, const char *name,
                ct_error *err) {
    *out = NULL;
    jinja_template *t = calloc(1, sizeof *t);
    if (!t || !(t->src = malloc(len + 1))) {
        free(t);
        return ct_fail(err, "%s: out of memory", name);
    }
    // As Jinja2 reads a template: "\r\n" and "\r" become "\n", and one trailing newline goes
    // (keep_trailing_newline is off).
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            t->src[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            t->src[n++] = src[i];
        }
    }
    if (n && t->src[n - 1] == '\n') n--;
    t->src[n] = 0;
    t->len = n;
    snprintf(t->name, sizeof t->name, "%s", name ? name : "template");
    t->arena.cap = (size_t)1 << 40;
    t->limits = (jinja_limits){.max_output = (size_t)64 << 20,
                               .max_memory = (size_t)256 << 20,
                               .max_steps = 10000000,
                               .max_depth = 200};
    pstate ps = {.t = t, .err = err};
    int rc = lex(&ps);
    if (rc == 0) {
        t->root = parse_body(&ps, NULL, NULL, 0, NULL);
        if (!t->root) rc = -1;
    }
    free(ps.tok);
    if (rc) {
        jinja_free(t);
        return -1;
    }
    *out = t;
    return 0;
}

void jinja_free(jinja_template *t) {
    if (!t) return;
    ja_free(&t->arena);
    free(t->src);
    free(t);
}

void jinja_set_limits(jinja_template *t, const jinja_limits *l) {
    if (l->max_output) t->limits.max_output = l->max_output;
    if (l->max_memory) t->limits.max_memory = l->max_memory;
    if (l->max_steps) t->limits.max_steps = l->max_steps;
    if (l->max_depth) t->limits.max_depth = l->max_depth;
}
