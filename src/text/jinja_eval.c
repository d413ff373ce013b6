// The evaluator for jinja_parse.c's tree: Python's semantics for the values a chat template
// meets (jinja.h). Values live in an arena freed when jinja_render returns.
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <utf8proc.h>

#include "core/utf8.h"
#include "io/json.h"
#include "text/jinja_internal.h"

typedef enum {
    JV_UNDEF,
    JV_NONE,
    JV_BOOL,
    JV_INT,
    JV_FLOAT,
    JV_STR,
    JV_LIST,
    JV_DICT,
    JV_NS,
    JV_MACRO,
    JV_FUNC,
    JV_METHOD,
    JV_LOOP
} jtype;

typedef struct jval {
    uint8_t t;
    uint8_t flag; // JV_LIST: a tuple; JV_UNDEF: 1 when it was an attribute or item
    union {
        bool b;
        int64_t i;
        double f;
        struct {
            const char *p;
            size_t n;
        } s; // JV_STR; JV_UNDEF: the name; JV_FUNC: the global's name
        struct jlist *l;
        struct jdict *d; // JV_DICT, JV_NS
        struct jmacro *m;
        struct jmethod *bm;
        struct jloop *lp;
    };
} jval;

typedef struct jlist {
    size_t n, cap;
    jval *v;
} jlist;
typedef struct jdict {
    size_t n, cap;
    jval *k, *v;
} jdict;
typedef struct jframe jframe;
typedef struct jmacro {
    const jnode *node;
    jframe *env;
} jmacro;
typedef struct jmethod {
    jval self;
    const char *name;
    size_t n;
    bool supported;
} jmethod;
typedef struct jloop {
    size_t index0, length;
    const jval *items;
} jloop;

typedef struct jvar {
    const char *name;
    size_t n;
    jval v;
} jvar;
struct jframe {
    jframe *parent;
    jvar *v;
    size_t n, cap;
};

typedef struct {
    char *p;
    size_t n, cap;
} jbuf;

typedef struct {
    const jinja_template *t;
    jarena ar;
    ct_error *err;
    size_t steps, depth;
    int ctl; // 1: break, 2: continue
} ctx;

typedef struct {
    jval *pos;
    size_t npos;
    const char **kn;
    size_t *kl;
    jval *kv;
    size_t nkw;
} jargs;

#define UNDEF ((jval){.t = JV_UNDEF})
#define NONE ((jval){.t = JV_NONE})
#define TRY(x)                                                                                     \
    do {                                                                                           \
        if ((x) != 0) return -1;                                                                   \
    } while (0)

static int fail(ctx *c, const jnode *at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(ctx *c, const jnode *at, const char *fmt, ...) {
    char msg[3000];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return jinja_fail_at(c->t, at ? at->pos : 0, c->err, "%s", msg);
}

static void *cx_alloc(ctx *c, const jnode *at, size_t n) {
    void *p = ja_alloc(&c->ar, n);
    if (!p)
        fail(c, at, "the template made more than %zu MiB of values (the limit)",
             c->t->limits.max_memory >> 20);
    return p;
}

static jval mkbool(bool b) {
    return (jval){.t = JV_BOOL, .b = b};
}
static jval mkint(int64_t i) {
    return (jval){.t = JV_INT, .i = i};
}
static jval mkfloat(double f) {
    return (jval){.t = JV_FLOAT, .f = f};
}
static jval cstr(const char *s) {
    return (jval){.t = JV_STR, .s = {s, strlen(s)}};
}

static int mkstr(ctx *c, const jnode *at, const char *p, size_t n, jval *out) {
    char *s = cx_alloc(c, at, n + 1);
    if (!s) return -1;
    if (n) memcpy(s, p, n);
    *out = (jval){.t = JV_STR, .s = {s, n}};
    return 0;
}

// ---- buffers

static int buf_put(ctx *c, const jnode *at, jbuf *b, const char *p, size_t n) {
    if (n > c->t->limits.max_output - b->n)
        return fail(c, at, "the output passed %zu MiB (the limit)", c->t->limits.max_output >> 20);
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) return fail(c, at, "out of memory for %zu bytes of output", cap);
        b->p = q;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}
static int buf_puts(ctx *c, const jnode *at, jbuf *b, const char *s) {
    return buf_put(c, at, b, s, strlen(s));
}

// Moves b into an arena string and frees it.
static int buf_take(ctx *c, const jnode *at, jbuf *b, jval *out) {
    int rc = mkstr(c, at, b->p ? b->p : "", b->n, out);
    free(b->p);
    *b = (jbuf){0};
    return rc;
}

// ---- lists and dicts

static jlist *list_new(ctx *c, const jnode *at, size_t cap) {
    jlist *l = cx_alloc(c, at, sizeof *l);
    if (!l) return NULL;
    l->cap = cap ? cap : 4;
    if (!(l->v = cx_alloc(c, at, l->cap * sizeof *l->v))) return NULL;
    return l;
}

static int list_push(ctx *c, const jnode *at, jlist *l, jval v) {
    if (l->n == l->cap) {
        jval *p = cx_alloc(c, at, 2 * l->cap * sizeof *p);
        if (!p) return -1;
        memcpy(p, l->v, l->n * sizeof *p);
        l->v = p;
        l->cap *= 2;
    }
    l->v[l->n++] = v;
    return 0;
}

static jval mklist(jlist *l, bool tuple) {
    return (jval){.t = JV_LIST, .flag = tuple, .l = l};
}

static jdict *dict_new(ctx *c, const jnode *at) {
    jdict *d = cx_alloc(c, at, sizeof *d);
    return d;
}

static bool py_eq(jval a, jval b);

static jval *dict_find(const jdict *d, jval key) {
    for (size_t i = 0; i < d->n; i++)
        if (py_eq(d->k[i], key)) return &d->v[i];
    return NULL;
}

static jval *dict_find_str(const jdict *d, const char *s, size_t n) {
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].t == JV_STR && d->k[i].s.n == n && memcmp(d->k[i].s.p, s, n) == 0)
            return &d->v[i];
    return NULL;
}

static int dict_set(ctx *c, const jnode *at, jdict *d, jval key, jval v) {
    jval *slot = dict_find(d, key);
    if (slot) {
        *slot = v;
        return 0;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? 2 * d->cap : 4;
        jval *k = cx_alloc(c, at, cap * sizeof *k), *vv = cx_alloc(c, at, cap * sizeof *vv);
        if (!k || !vv) return -1;
        if (d->n) {
            memcpy(k, d->k, d->n * sizeof *k);
            memcpy(vv, d->v, d->n * sizeof *vv);
        }
        d->k = k, d->v = vv, d->cap = cap;
    }
    d->k[d->n] = key;
    d->v[d->n++] = v;
    return 0;
}

// ---- frames

static jval *frame_find(jframe *f, const char *name, size_t n) {
    for (; f; f = f->parent)
        for (size_t i = f->n; i-- > 0;)
            if (f->v[i].n == n && memcmp(f->v[i].name, name, n) == 0) return &f->v[i].v;
    return NULL;
}

static int frame_set(ctx *c, const jnode *at, jframe *f, const char *name, size_t n, jval v) {
    for (size_t i = 0; i < f->n; i++)
        if (f->v[i].n == n && memcmp(f->v[i].name, name, n) == 0) {
            f->v[i].v = v;
            return 0;
        }
    if (f->n == f->cap) {
        size_t cap = f->cap ? 2 * f->cap : 8;
        jvar *p = cx_alloc(c, at, cap * sizeof *p);
        if (!p) return -1;
        if (f->n) memcpy(p, f->v, f->n * sizeof *p);
        f->v = p;
        f->cap = cap;
    }
    f->v[f->n++] = (jvar){name, n, v};
    return 0;
}

// ---- Python's str() and repr()

static const char *type_name(jval v) {
    switch (v.t) {
    case JV_UNDEF:
        return "Undefined";
    case JV_NONE:
        return "NoneType";
    case JV_BOOL:
        return "bool";
    case JV_INT:
        return "int";
    case JV_FLOAT:
        return "float";
    case JV_STR:
        return "str";
    case JV_LIST:
        return v.flag ? "tuple" : "list";
    case JV_DICT:
        return "dict";
    case JV_NS:
        return "Namespace";
    case JV_MACRO:
        return "Macro";
    case JV_LOOP:
        return "LoopContext";
    default:
        return "function";
    }
}

// Python's repr(float): the shortest digits that read back the same, in fixed notation for
// exponents -4..15 and with ".0" on whole numbers, else like 1e+16 and 1.5e-07.
static void float_repr(char *out, size_t cap, double d) {
    if (isnan(d)) {
        snprintf(out, cap, "nan");
        return;
    }
    if (isinf(d)) {
        snprintf(out, cap, d < 0 ? "-inf" : "inf");
        return;
    }
    char tmp[64];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, d);
        if (strtod(tmp, NULL) == d) break;
    }
    // tmp: [-]D[.DDD]e[+-]XX
    bool neg = tmp[0] == '-';
    char digits[32];
    size_t nd = 0;
    const char *p = tmp + neg;
    for (; *p && *p != 'e'; p++)
        if (*p != '.') digits[nd++] = *p;
    int exp = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    char *o = out;
    size_t left = cap;
#define PUT(...)                                                                                   \
    do {                                                                                           \
        int w_ = snprintf(o, left, __VA_ARGS__);                                                   \
        o += w_, left -= (size_t)w_;                                                               \
    } while (0)
    if (neg) PUT("-");
    if (exp >= -4 && exp < 16) {
        if (exp < 0) {
            PUT("0.");
            for (int k = 0; k < -exp - 1; k++) PUT("0");
            PUT("%.*s", (int)nd, digits);
        } else if ((int)nd <= exp + 1) {
            PUT("%.*s", (int)nd, digits);
            for (int k = (int)nd; k < exp + 1; k++) PUT("0");
            PUT(".0");
        } else {
            PUT("%.*s.%.*s", exp + 1, digits, (int)nd - exp - 1, digits + exp + 1);
        }
    } else {
        PUT("%c", digits[0]);
        if (nd > 1) PUT(".%.*s", (int)nd - 1, digits + 1);
        PUT("e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    }
#undef PUT
}

static bool py_printable(uint32_t cp) {
    if (cp == ' ') return true;
    if (cp < 0x20 || cp == 0x7f) return false;
    if (cp < 0x7f) return true;
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)cp);
    return !(k == UTF8PROC_CATEGORY_CC || k == UTF8PROC_CATEGORY_CF || k == UTF8PROC_CATEGORY_CS ||
             k == UTF8PROC_CATEGORY_CO || k == UTF8PROC_CATEGORY_CN || k == UTF8PROC_CATEGORY_ZL ||
             k == UTF8PROC_CATEGORY_ZP || k == UTF8PROC_CATEGORY_ZS);
}

static int str_repr(ctx *c, const jnode *at, jbuf *b, const char *s, size_t n) {
    bool sq = memchr(s, '\'', n) != NULL, dq = memchr(s, '"', n) != NULL;
    char q = sq && !dq ? '"' : '\'';
    TRY(buf_put(c, at, b, &q, 1));
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int l = utf8_decode(&cp, (const unsigned char *)s + i, n - i);
        if (l < 0) l = 1, cp = 0xfffd;
        char e[16];
        if (cp == (uint32_t)q || cp == '\\')
            snprintf(e, sizeof e, "\\%c", (char)cp);
        else if (cp == '\n')
            snprintf(e, sizeof e, "\\n");
        else if (cp == '\r')
            snprintf(e, sizeof e, "\\r");
        else if (cp == '\t')
            snprintf(e, sizeof e, "\\t");
        else if (py_printable(cp))
            e[0] = 0;
        else if (cp < 0x100)
            snprintf(e, sizeof e, "\\x%02x", cp);
        else if (cp < 0x10000)
            snprintf(e, sizeof e, "\\u%04x", cp);
        else
            snprintf(e, sizeof e, "\\U%08x", cp);
        TRY(e[0] ? buf_puts(c, at, b, e) : buf_put(c, at, b, s + i, (size_t)l));
        i += (size_t)l;
    }
    return buf_put(c, at, b, &q, 1);
}

static int put_str(ctx *c, const jnode *at, jbuf *b, jval v, bool repr);

static int put_dict(ctx *c, const jnode *at, jbuf *b, const jdict *d) {
    TRY(buf_puts(c, at, b, "{"));
    for (size_t i = 0; i < d->n; i++) {
        if (i) TRY(buf_puts(c, at, b, ", "));
        TRY(put_str(c, at, b, d->k[i], true));
        TRY(buf_puts(c, at, b, ": "));
        TRY(put_str(c, at, b, d->v[i], true));
    }
    return buf_puts(c, at, b, "}");
}

// Appends str(v) (or repr(v)) as Python writes it.
static int put_str(ctx *c, const jnode *at, jbuf *b, jval v, bool repr) {
    char tmp[64];
    if (++c->depth > 1000) return fail(c, at, "a value nested deeper than 1000");
    int rc = 0;
    switch (v.t) {
    case JV_UNDEF:
        break;
    case JV_NONE:
        rc = buf_puts(c, at, b, "None");
        break;
    case JV_BOOL:
        rc = buf_puts(c, at, b, v.b ? "True" : "False");
        break;
    case JV_INT:
        snprintf(tmp, sizeof tmp, "%lld", (long long)v.i);
        rc = buf_puts(c, at, b, tmp);
        break;
    case JV_FLOAT:
        float_repr(tmp, sizeof tmp, v.f);
        rc = buf_puts(c, at, b, tmp);
        break;
    case JV_STR:
        rc = repr ? str_repr(c, at, b, v.s.p, v.s.n) : buf_put(c, at, b, v.s.p, v.s.n);
        break;
    case JV_LIST:
        rc = buf_puts(c, at, b, v.flag ? "(" : "[");
        for (size_t i = 0; rc == 0 && i < v.l->n; i++) {
            if (i) rc = buf_puts(c, at, b, ", ");
            if (rc == 0) rc = put_str(c, at, b, v.l->v[i], true);
        }
        if (rc == 0 && v.flag && v.l->n == 1) rc = buf_puts(c, at, b, ",");
        if (rc == 0) rc = buf_puts(c, at, b, v.flag ? ")" : "]");
        break;
    case JV_DICT:
        rc = put_dict(c, at, b, v.d);
        break;
    case JV_NS:
        rc = buf_puts(c, at, b, "<Namespace ");
        if (rc == 0) rc = put_dict(c, at, b, v.d);
        if (rc == 0) rc = buf_puts(c, at, b, ">");
        break;
    case JV_LOOP:
        snprintf(tmp, sizeof tmp, "<LoopContext %zu/%zu>", v.lp->index0 + 1, v.lp->length);
        rc = buf_puts(c, at, b, tmp);
        break;
    default:
        rc = buf_puts(c, at, b, "<function>");
        break;
    }
    c->depth--;
    return rc;
}

// str(v) as a value.
static int to_string(ctx *c, const jnode *at, jval v, jval *out) {
    if (v.t == JV_STR) {
        *out = v;
        return 0;
    }
    jbuf b = {0};
    if (put_str(c, at, &b, v, false)) {
        free(b.p);
        return -1;
    }
    return buf_take(c, at, &b, out);
}

// ---- JSON (tojson: Python's json.dumps with ensure_ascii=False)

typedef struct {
    int indent; // -1: none
    jval item_sep, key_sep;
} json_opts;

static int put_json(ctx *c, const jnode *at, jbuf *b, jval v, const json_opts *o, int level) {
    char tmp[64];
    if (level > 1000) return fail(c, at, "tojson: a value nested deeper than 1000");
    switch (v.t) {
    case JV_NONE:
        return buf_puts(c, at, b, "null");
    case JV_BOOL:
        return buf_puts(c, at, b, v.b ? "true" : "false");
    case JV_INT:
        snprintf(tmp, sizeof tmp, "%lld", (long long)v.i);
        return buf_puts(c, at, b, tmp);
    case JV_FLOAT:
        if (isnan(v.f)) return buf_puts(c, at, b, "NaN");
        if (isinf(v.f)) return buf_puts(c, at, b, v.f < 0 ? "-Infinity" : "Infinity");
        float_repr(tmp, sizeof tmp, v.f);
        return buf_puts(c, at, b, tmp);
    case JV_STR: {
        json_buf q = {0};
        if (json_quote(&q, v.s.p, v.s.n, JSON_SHORT) != 0)
            return fail(c, at, "out of memory for %zu bytes of output", v.s.n);
        int rc = buf_put(c, at, b, q.p, q.len);
        free(q.p);
        return rc;
    }
    case JV_LIST:
    case JV_DICT:
    case JV_NS: {
        bool list = v.t == JV_LIST;
        size_t n = list ? v.l->n : v.d->n;
        TRY(buf_puts(c, at, b, list ? "[" : "{"));
        if (n == 0) return buf_puts(c, at, b, list ? "]" : "}");
        for (size_t i = 0; i < n; i++) {
            if (i) TRY(buf_put(c, at, b, o->item_sep.s.p, o->item_sep.s.n));
            if (o->indent >= 0) {
                TRY(buf_puts(c, at, b, "\n"));
                for (int k = 0; k < o->indent * (level + 1); k++) TRY(buf_puts(c, at, b, " "));
            }
            if (!list) {
                jval k = v.d->k[i];
                if (k.t == JV_STR) {
                    TRY(put_json(c, at, b, k, o, level + 1));
                } else if (k.t == JV_INT || k.t == JV_FLOAT || k.t == JV_BOOL || k.t == JV_NONE) {
                    TRY(buf_puts(c, at, b, "\""));
                    TRY(put_json(c, at, b, k, o, level + 1));
                    TRY(buf_puts(c, at, b, "\""));
                } else {
                    return fail(c, at, "tojson: keys must be str, int, float, bool or None, not %s",
                                type_name(k));
                }
                TRY(buf_put(c, at, b, o->key_sep.s.p, o->key_sep.s.n));
            }
            TRY(put_json(c, at, b, list ? v.l->v[i] : v.d->v[i], o, level + 1));
        }
        if (o->indent >= 0) {
            TRY(buf_puts(c, at, b, "\n"));
            for (int k = 0; k < o->indent * level; k++) TRY(buf_puts(c, at, b, " "));
        }
        return buf_puts(c, at, b, list ? "]" : "}");
    }
    default:
        return fail(c, at, "tojson: Object of type %s is not JSON serializable", type_name(v));
    }
}

// ---- conversions from cJSON

static int from_json(ctx *c, const cJSON *j, jval *out, int level) {
    if (level > 1000) return fail(c, NULL, "the variables nest deeper than 1000");
    if (cJSON_IsNull(j))
        *out = NONE;
    else if (cJSON_IsBool(j))
        *out = mkbool(cJSON_IsTrue(j));
    else if (cJSON_IsNumber(j)) {
        double d = j->valuedouble;
        if (d == floor(d) && fabs(d) < 9.2e18)
            *out = mkint((int64_t)d);
        else
            *out = mkfloat(d);
    } else if (cJSON_IsString(j)) {
        *out = cstr(j->valuestring);
    } else if (cJSON_IsArray(j)) {
        jlist *l = list_new(c, NULL, (size_t)cJSON_GetArraySize(j));
        if (!l) return -1;
        const cJSON *e;
        cJSON_ArrayForEach(e, j) {
            jval v;
            TRY(from_json(c, e, &v, level + 1));
            TRY(list_push(c, NULL, l, v));
        }
        *out = mklist(l, false);
    } else if (cJSON_IsObject(j)) {
        jdict *d = dict_new(c, NULL);
        if (!d) return -1;
        const cJSON *e;
        cJSON_ArrayForEach(e, j) {
            jval v;
            TRY(from_json(c, e, &v, level + 1));
            TRY(dict_set(c, NULL, d, cstr(e->string ? e->string : ""), v));
        }
        *out = (jval){.t = JV_DICT, .d = d};
    } else {
        *out = UNDEF;
    }
    return 0;
}

// ---- truth, equality, order

static bool truthy(jval v) {
    switch (v.t) {
    case JV_UNDEF:
    case JV_NONE:
        return false;
    case JV_BOOL:
        return v.b;
    case JV_INT:
        return v.i != 0;
    case JV_FLOAT:
        return v.f != 0;
    case JV_STR:
        return v.s.n > 0;
    case JV_LIST:
        return v.l->n > 0;
    case JV_DICT:
        return v.d->n > 0;
    default:
        return true;
    }
}

static bool is_num(jval v) {
    return v.t == JV_BOOL || v.t == JV_INT || v.t == JV_FLOAT;
}
static bool is_intlike(jval v) {
    return v.t == JV_BOOL || v.t == JV_INT;
}
static int64_t as_int(jval v) {
    return v.t == JV_BOOL ? v.b : v.i;
}
static double as_double(jval v) {
    return v.t == JV_FLOAT ? v.f : (double)as_int(v);
}

static bool py_eq(jval a, jval b) {
    if (is_num(a) && is_num(b)) {
        if (is_intlike(a) && is_intlike(b)) return as_int(a) == as_int(b);
        return as_double(a) == as_double(b);
    }
    if (a.t != b.t) return false;
    switch (a.t) {
    case JV_UNDEF:
    case JV_NONE:
        return true;
    case JV_STR:
        return a.s.n == b.s.n && memcmp(a.s.p, b.s.p, a.s.n) == 0;
    case JV_LIST:
        if (a.flag != b.flag || a.l->n != b.l->n) return false;
        for (size_t i = 0; i < a.l->n; i++)
            if (!py_eq(a.l->v[i], b.l->v[i])) return false;
        return true;
    case JV_DICT:
        if (a.d->n != b.d->n) return false;
        for (size_t i = 0; i < a.d->n; i++) {
            jval *o = dict_find(b.d, a.d->k[i]);
            if (!o || !py_eq(a.d->v[i], *o)) return false;
        }
        return true;
    case JV_NS:
        return a.d == b.d;
    case JV_MACRO:
        return a.m == b.m;
    case JV_LOOP:
        return a.lp == b.lp;
    default:
        return false;
    }
}

static int undefined_error(ctx *c, const jnode *at, jval v) {
    if (v.flag) return fail(c, at, "no attribute or item '%.*s' (undefined)", (int)v.s.n, v.s.p);
    return fail(c, at, "'%.*s' is undefined", (int)v.s.n, v.s.p);
}

// Python's a < b (and the others) as -1/0/1 in *r; a TypeError between unordered types.
static int py_cmp(ctx *c, const jnode *at, jval a, jval b, const char *op, int *r) {
    if (a.t == JV_UNDEF) return undefined_error(c, at, a);
    if (b.t == JV_UNDEF) return undefined_error(c, at, b);
    if (is_num(a) && is_num(b)) {
        if (is_intlike(a) && is_intlike(b))
            *r = (as_int(a) > as_int(b)) - (as_int(a) < as_int(b));
        else
            *r = (as_double(a) > as_double(b)) - (as_double(a) < as_double(b));
        return 0;
    }
    if (a.t == JV_STR && b.t == JV_STR) {
        size_t n = a.s.n < b.s.n ? a.s.n : b.s.n;
        int k = n ? memcmp(a.s.p, b.s.p, n) : 0;
        *r = k ? (k > 0) - (k < 0) : (a.s.n > b.s.n) - (a.s.n < b.s.n);
        return 0;
    }
    if (a.t == JV_LIST && b.t == JV_LIST && a.flag == b.flag) {
        for (size_t i = 0; i < a.l->n && i < b.l->n; i++) {
            if (py_eq(a.l->v[i], b.l->v[i])) continue;
            return py_cmp(c, at, a.l->v[i], b.l->v[i], op, r);
        }
        *r = (a.l->n > b.l->n) - (a.l->n < b.l->n);
        return 0;
    }
    return fail(c, at, "'%s' not supported between instances of '%s' and '%s'", op, type_name(a),
                type_name(b));
}

static bool str_find(const char *h, size_t hn, const char *nd, size_t nn, size_t from, size_t *at) {
    if (nn == 0) {
        *at = from;
        return from <= hn;
    }
    for (size_t i = from; i + nn <= hn; i++)
        if (h[i] == nd[0] && memcmp(h + i, nd, nn) == 0) {
            *at = i;
            return true;
        }
    return false;
}

static int py_in(ctx *c, const jnode *at, jval x, jval seq, bool *r) {
    size_t pos;
    switch (seq.t) {
    case JV_UNDEF:
        *r = false;
        return 0;
    case JV_STR:
        if (x.t != JV_STR)
            return fail(c, at, "'in <string>' requires string as left operand, not %s",
                        type_name(x));
        *r = str_find(seq.s.p, seq.s.n, x.s.p, x.s.n, 0, &pos);
        return 0;
    case JV_LIST:
        *r = false;
        for (size_t i = 0; i < seq.l->n && !*r; i++) *r = py_eq(x, seq.l->v[i]);
        return 0;
    case JV_DICT:
    case JV_NS:
        *r = dict_find(seq.d, x) != NULL;
        return 0;
    default:
        return fail(c, at, "argument of type '%s' is not iterable", type_name(seq));
    }
}

// ---- code points

// Offsets of each code point of s (n+1 entries, the last = len) in an arena array.
static int cp_index(ctx *c, const jnode *at, const char *s, size_t len, size_t **offs, size_t *n) {
    size_t k = 0;
    size_t *o = cx_alloc(c, at, (len + 1) * sizeof *o);
    if (!o) return -1;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        int l = utf8_decode(&cp, (const unsigned char *)s + i, len - i);
        o[k++] = i;
        i += (size_t)(l < 0 ? -l : l);
    }
    o[k] = len;
    *offs = o;
    *n = k;
    return 0;
}

static size_t cp_count(const char *s, size_t len) {
    size_t k = 0;
    for (size_t i = 0; i < len; i++) k += ((unsigned char)s[i] & 0xc0) != 0x80;
    return k;
}

// Maps each code point of s through f (upper, lower, title-style) into *out.
typedef enum { CASE_UPPER, CASE_LOWER, CASE_CAPITALIZE, CASE_TITLE, CASE_JINJA_TITLE } case_op;

static bool jinja_title_sep(uint32_t cp) {
    return cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || jinja_py_space(cp);
}

static int change_case(ctx *c, const jnode *at, jval s, case_op op, jval *out) {
    jbuf b = {0};
    bool prev_cased = false, first = true;
    for (size_t i = 0; i < s.s.n;) {
        uint32_t cp;
        int l = utf8_decode(&cp, (const unsigned char *)s.s.p + i, s.s.n - i);
        if (l < 0) {
            if (buf_put(c, at, &b, s.s.p + i, (size_t)-l)) goto fail;
            i += (size_t)-l;
            continue;
        }
        utf8proc_int32_t u = (utf8proc_int32_t)cp, r = u;
        utf8proc_category_t k = utf8proc_category(u);
        bool cased =
            k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT;
        switch (op) {
        case CASE_UPPER:
            r = utf8proc_toupper(u);
            break;
        case CASE_LOWER:
            r = utf8proc_tolower(u);
            break;
        case CASE_CAPITALIZE:
            r = first ? utf8proc_totitle(u) : utf8proc_tolower(u);
            break;
        case CASE_TITLE:
            r = prev_cased ? utf8proc_tolower(u) : utf8proc_totitle(u);
            break;
        case CASE_JINJA_TITLE:
            r = jinja_title_sep(cp) ? u : prev_cased ? utf8proc_tolower(u) : utf8proc_toupper(u);
            cased = !jinja_title_sep(cp);
            break;
        }
        prev_cased = cased;
        first = false;
        char e[4];
        int w = utf8_encode(e, (uint32_t)r);
        if (buf_put(c, at, &b, e, (size_t)w)) goto fail;
        i += (size_t)l;
    }
    return buf_take(c, at, &b, out);
fail:
    free(b.p);
    return -1;
}

static bool in_chars(uint32_t cp, jval chars) {
    if (chars.t != JV_STR) return jinja_py_space(cp);
    for (size_t i = 0; i < chars.s.n;) {
        uint32_t x;
        int l = utf8_decode(&x, (const unsigned char *)chars.s.p + i, chars.s.n - i);
        if (l < 0) l = -l, x = 0xffffffff;
        if (x == cp) return true;
        i += (size_t)l;
    }
    return false;
}

// str.strip / lstrip / rstrip; chars not a string: whitespace.
static jval py_strip(jval s, jval chars, bool left, bool right) {
    size_t a = 0, b = s.s.n;
    while (left && a < b) {
        uint32_t cp;
        int l = utf8_decode(&cp, (const unsigned char *)s.s.p + a, b - a);
        if (l < 0 || !in_chars(cp, chars)) break;
        a += (size_t)l;
    }
    while (right && b > a) {
        size_t st = b - 1;
        while (st > a && ((unsigned char)s.s.p[st] & 0xc0) == 0x80 && b - st < 4) st--;
        uint32_t cp;
        int l = utf8_decode(&cp, (const unsigned char *)s.s.p + st, b - st);
        if (l != (int)(b - st) || !in_chars(cp, chars)) break;
        b = st;
    }
    return (jval){.t = JV_STR, .s = {s.s.p + a, b - a}};
}

static int py_split(ctx *c, const jnode *at, jval s, jval sep, int64_t maxsplit, jval *out) {
    jlist *l = list_new(c, at, 4);
    if (!l) return -1;
    const char *p = s.s.p;
    size_t n = s.s.n, i = 0;
    if (sep.t == JV_STR) {
        if (sep.s.n == 0) return fail(c, at, "split: empty separator");
        size_t hit;
        while ((maxsplit < 0 || (int64_t)l->n < maxsplit) &&
               str_find(p, n, sep.s.p, sep.s.n, i, &hit)) {
            TRY(list_push(c, at, l, (jval){.t = JV_STR, .s = {p + i, hit - i}}));
            i = hit + sep.s.n;
        }
        TRY(list_push(c, at, l, (jval){.t = JV_STR, .s = {p + i, n - i}}));
    } else {
        for (;;) {
            i += jinja_space_run(p + i, n - i, false);
            if (i >= n) break;
            if (maxsplit >= 0 && (int64_t)l->n >= maxsplit) {
                TRY(list_push(c, at, l, (jval){.t = JV_STR, .s = {p + i, n - i}}));
                break;
            }
            size_t j = i;
            while (j < n && jinja_space_run(p + j, n - j, false) == 0) {
                uint32_t cp;
                int w = utf8_decode(&cp, (const unsigned char *)p + j, n - j);
                j += (size_t)(w < 0 ? -w : w);
            }
            TRY(list_push(c, at, l, (jval){.t = JV_STR, .s = {p + i, j - i}}));
            i = j;
        }
    }
    *out = mklist(l, false);
    return 0;
}

static int py_replace(ctx *c, const jnode *at, jval s, jval old, jval rep, int64_t count,
                      jval *out) {
    if (old.t != JV_STR || rep.t != JV_STR)
        return fail(c, at, "replace: arguments must be strings, not %s and %s", type_name(old),
                    type_name(rep));
    jbuf b = {0};
    size_t i = 0, hit;
    int64_t done = 0;
    if (old.s.n == 0) {
        size_t *offs, n;
        if (cp_index(c, at, s.s.p, s.s.n, &offs, &n)) return -1;
        for (size_t k = 0; k <= n; k++) {
            if ((count < 0 || done++ < count) && buf_put(c, at, &b, rep.s.p, rep.s.n)) goto fail;
            if (k < n && buf_put(c, at, &b, s.s.p + offs[k], offs[k + 1] - offs[k])) goto fail;
        }
        return buf_take(c, at, &b, out);
    }
    while ((count < 0 || done < count) && str_find(s.s.p, s.s.n, old.s.p, old.s.n, i, &hit)) {
        if (buf_put(c, at, &b, s.s.p + i, hit - i) || buf_put(c, at, &b, rep.s.p, rep.s.n))
            goto fail;
        i = hit + old.s.n;
        done++;
    }
    if (buf_put(c, at, &b, s.s.p + i, s.s.n - i)) goto fail;
    return buf_take(c, at, &b, out);
fail:
    free(b.p);
    return -1;
}

// The items a for loop (or list(), join, ...) goes through: a list's items, a dict's keys, a
// string's characters; nothing for undefined.
static int iter_items(ctx *c, const jnode *at, jval v, const jval **items, size_t *n) {
    switch (v.t) {
    case JV_UNDEF:
        *items = NULL, *n = 0;
        return 0;
    case JV_LIST:
        *items = v.l->v, *n = v.l->n;
        return 0;
    case JV_DICT:
    case JV_NS:
        *items = v.d->k, *n = v.d->n;
        return 0;
    case JV_STR: {
        size_t *offs, k;
        TRY(cp_index(c, at, v.s.p, v.s.n, &offs, &k));
        jval *out = cx_alloc(c, at, (k ? k : 1) * sizeof *out);
        if (!out) return -1;
        for (size_t i = 0; i < k; i++)
            out[i] = (jval){.t = JV_STR, .s = {v.s.p + offs[i], offs[i + 1] - offs[i]}};
        *items = out, *n = k;
        return 0;
    }
    default:
        return fail(c, at, "'%s' object is not iterable", type_name(v));
    }
}

static int py_len(ctx *c, const jnode *at, jval v, int64_t *n) {
    switch (v.t) {
    case JV_UNDEF:
        *n = 0;
        return 0;
    case JV_STR:
        *n = (int64_t)cp_count(v.s.p, v.s.n);
        return 0;
    case JV_LIST:
        *n = (int64_t)v.l->n;
        return 0;
    case JV_DICT:
    case JV_NS:
        *n = (int64_t)v.d->n;
        return 0;
    default:
        return fail(c, at, "object of type '%s' has no len()", type_name(v));
    }
}

// ---- attributes and items

static const char *const str_methods[] = {"startswith", "endswith", "split",      "strip",
                                          "lstrip",     "rstrip",   "upper",      "lower",
                                          "replace",    "title",    "capitalize", NULL};
static const char *const str_other[] = {
    "format",       "find",       "rfind",      "index",     "rindex",   "count",    "join",
    "rsplit",       "splitlines", "isdigit",    "isalpha",   "isalnum",  "isspace",  "isupper",
    "islower",      "istitle",    "isnumeric",  "isdecimal", "zfill",    "center",   "ljust",
    "rjust",        "partition",  "rpartition", "encode",    "casefold", "swapcase", "removeprefix",
    "removesuffix", "expandtabs", "format_map", NULL};
static const char *const dict_methods[] = {"get", "items", "keys", "values", NULL};
static const char *const dict_other[] = {"pop",   "update",  "copy",     "setdefault",
                                         "clear", "popitem", "fromkeys", NULL};
static const char *const list_other[] = {"append", "pop",     "extend", "insert", "remove", "index",
                                         "count",  "reverse", "sort",   "copy",   "clear",  NULL};

static bool name_in(const char *const *list, const char *s, size_t n) {
    for (; *list; list++)
        if (strlen(*list) == n && memcmp(*list, s, n) == 0) return true;
    return false;
}

static int mkmethod(ctx *c, const jnode *at, jval self, const char *name, size_t n, bool ok,
                    jval *out) {
    jmethod *m = cx_alloc(c, at, sizeof *m);
    if (!m) return -1;
    *m = (jmethod){self, name, n, ok};
    *out = (jval){.t = JV_METHOD, .bm = m};
    return 0;
}

static jval undef_attr(const char *name, size_t n) {
    return (jval){.t = JV_UNDEF, .flag = 1, .s = {name, n}};
}

static int loop_attr(ctx *c, const jnode *at, const jloop *lp, const char *s, size_t n, jval *out) {
#define IS(x) (n == strlen(x) && memcmp(s, x, n) == 0)
    size_t i = lp->index0, len = lp->length;
    if (IS("index"))
        *out = mkint((int64_t)i + 1);
    else if (IS("index0"))
        *out = mkint((int64_t)i);
    else if (IS("revindex"))
        *out = mkint((int64_t)(len - i));
    else if (IS("revindex0"))
        *out = mkint((int64_t)(len - i - 1));
    else if (IS("first"))
        *out = mkbool(i == 0);
    else if (IS("last"))
        *out = mkbool(i + 1 == len);
    else if (IS("length"))
        *out = mkint((int64_t)len);
    else if (IS("depth"))
        *out = mkint(1);
    else if (IS("depth0"))
        *out = mkint(0);
    else if (IS("previtem"))
        *out = i > 0 ? lp->items[i - 1] : undef_attr(s, n);
    else if (IS("nextitem"))
        *out = i + 1 < len ? lp->items[i + 1] : undef_attr(s, n);
    else if (IS("cycle"))
        return mkmethod(c, at, (jval){.t = JV_LOOP, .lp = (jloop *)lp}, s, n, true, out);
    else
        *out = undef_attr(s, n);
    return 0;
#undef IS
}

// obj.name: Python's attribute first (methods), then the item, as Jinja2's getattr does.
static int get_attr(ctx *c, const jnode *at, jval obj, const char *s, size_t n, jval *out) {
    switch (obj.t) {
    case JV_UNDEF:
        return undefined_error(c, at, obj);
    case JV_STR:
        if (name_in(str_methods, s, n) || name_in(str_other, s, n))
            return mkmethod(c, at, obj, s, n, name_in(str_methods, s, n), out);
        break;
    case JV_DICT:
        if (name_in(dict_methods, s, n) || name_in(dict_other, s, n))
            return mkmethod(c, at, obj, s, n, name_in(dict_methods, s, n), out);
        /* fall through */
    case JV_NS: {
        jval *v = dict_find_str(obj.d, s, n);
        *out = v ? *v : undef_attr(s, n);
        return 0;
    }
    case JV_LIST:
        if (name_in(list_other, s, n)) return mkmethod(c, at, obj, s, n, false, out);
        break;
    case JV_LOOP:
        return loop_attr(c, at, obj.lp, s, n, out);
    default:
        break;
    }
    *out = undef_attr(s, n);
    return 0;
}

static int slice_bound(ctx *c, const jnode *at, jval v, bool *given, int64_t *out) {
    *given = v.t != JV_UNDEF && v.t != JV_NONE;
    if (!*given) return 0;
    if (!is_intlike(v))
        return fail(c, at, "slice indices must be integers or None, not %s", type_name(v));
    *out = as_int(v);
    return 0;
}

static int get_slice(ctx *c, const jnode *at, jval obj, jval lo, jval hi, jval st, jval *out) {
    if (obj.t == JV_UNDEF) return undefined_error(c, at, obj);
    if (obj.t != JV_STR && obj.t != JV_LIST)
        return fail(c, at, "'%s' object is not subscriptable with a slice", type_name(obj));
    size_t *offs = NULL, n;
    if (obj.t == JV_STR)
        TRY(cp_index(c, at, obj.s.p, obj.s.n, &offs, &n));
    else
        n = obj.l->n;
    int64_t len = (int64_t)n, start = 0, stop = 0, step = 1;
    bool gs, ge, gt;
    TRY(slice_bound(c, at, st, &gt, &step));
    TRY(slice_bound(c, at, lo, &gs, &start));
    TRY(slice_bound(c, at, hi, &ge, &stop));
    if (step == 0) return fail(c, at, "slice step cannot be zero");
    if (step > 0) {
        if (!gs)
            start = 0;
        else if (start < 0)
            start = start + len < 0 ? 0 : start + len;
        else if (start > len)
            start = len;
        if (!ge)
            stop = len;
        else if (stop < 0)
            stop = stop + len < 0 ? 0 : stop + len;
        else if (stop > len)
            stop = len;
    } else {
        if (!gs)
            start = len - 1;
        else if (start < 0)
            start = start + len < 0 ? -1 : start + len;
        else if (start >= len)
            start = len - 1;
        if (!ge)
            stop = -1;
        else if (stop < 0)
            stop = stop + len < 0 ? -1 : stop + len;
        else if (stop >= len)
            stop = len - 1;
    }
    jlist *l = obj.t == JV_LIST ? list_new(c, at, 4) : NULL;
    jbuf b = {0};
    if (obj.t == JV_LIST && !l) return -1;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        int rc = l ? list_push(c, at, l, obj.l->v[i])
                   : buf_put(c, at, &b, obj.s.p + offs[i], offs[i + 1] - offs[i]);
        if (rc) {
            free(b.p);
            return -1;
        }
    }
    if (l) {
        *out = mklist(l, obj.flag);
        return 0;
    }
    return buf_take(c, at, &b, out);
}

// obj[key]: the item, then (for a string key) the attribute, else undefined.
static int get_item(ctx *c, const jnode *at, jval obj, jval key, jval *out) {
    if (obj.t == JV_UNDEF) return undefined_error(c, at, obj);
    if ((obj.t == JV_LIST || obj.t == JV_STR) && is_intlike(key)) {
        int64_t i = as_int(key);
        if (obj.t == JV_LIST) {
            int64_t n = (int64_t)obj.l->n;
            if (i < 0) i += n;
            *out = i >= 0 && i < n ? obj.l->v[i] : UNDEF;
            return 0;
        }
        size_t *offs, n;
        TRY(cp_index(c, at, obj.s.p, obj.s.n, &offs, &n));
        if (i < 0) i += (int64_t)n;
        *out = i >= 0 && i < (int64_t)n
                   ? (jval){.t = JV_STR, .s = {obj.s.p + offs[i], offs[i + 1] - offs[i]}}
                   : UNDEF;
        return 0;
    }
    if (obj.t == JV_DICT || obj.t == JV_NS) {
        jval *v = dict_find(obj.d, key);
        if (v) {
            *out = *v;
            return 0;
        }
    }
    if (key.t == JV_STR) {
        TRY(get_attr(c, at, obj, key.s.p, key.s.n, out));
        return 0;
    }
    *out = UNDEF;
    return 0;
}

// ---- arithmetic

static int arith(ctx *c, const jnode *at, int op, jval a, jval b, jval *out) {
    static const char *const names[] = {"+", "-", "*", "/", "//", "%", "**", "~"};
    if (op == JB_CONCAT) {
        jbuf buf = {0};
        if (put_str(c, at, &buf, a, false) || put_str(c, at, &buf, b, false)) {
            free(buf.p);
            return -1;
        }
        return buf_take(c, at, &buf, out);
    }
    if (a.t == JV_UNDEF) return undefined_error(c, at, a);
    if (b.t == JV_UNDEF) return undefined_error(c, at, b);
    if (is_intlike(a) && is_intlike(b)) {
        int64_t x = as_int(a), y = as_int(b), r = 0;
        bool ovf = false;
        switch (op) {
        case JB_ADD:
            ovf = __builtin_add_overflow(x, y, &r);
            break;
        case JB_SUB:
            ovf = __builtin_sub_overflow(x, y, &r);
            break;
        case JB_MUL:
            ovf = __builtin_mul_overflow(x, y, &r);
            break;
        case JB_DIV:
            if (y == 0) return fail(c, at, "division by zero");
            *out = mkfloat((double)x / (double)y);
            return 0;
        case JB_FLOORDIV:
        case JB_MOD:
            if (y == 0) return fail(c, at, "integer division or modulo by zero");
            if (x == INT64_MIN && y == -1) {
                ovf = op == JB_FLOORDIV;
                r = 0;
                break;
            }
            r = op == JB_FLOORDIV ? x / y - ((x % y != 0) && ((x < 0) != (y < 0)))
                                  : ((x % y) + ((x % y != 0) && ((x < 0) != (y < 0)) ? y : 0));
            break;
        case JB_POW:
            if (y < 0) {
                if (x == 0) return fail(c, at, "0 cannot be raised to a negative power");
                *out = mkfloat(pow((double)x, (double)y));
                return 0;
            }
            r = 1;
            for (int64_t k = 0; k < y && !ovf; k++) {
                ovf = __builtin_mul_overflow(r, x, &r);
                if (r == 0 || r == 1 || (r == -1 && x == -1)) {
                    if (r == -1 && ((y - k - 1) % 2)) r = 1;
                    break;
                }
            }
            break;
        }
        if (ovf) return fail(c, at, "integer overflow in '%s' (beyond 64 bits)", names[op]);
        *out = mkint(r);
        return 0;
    }
    if (is_num(a) && is_num(b)) {
        double x = as_double(a), y = as_double(b), r = 0;
        switch (op) {
        case JB_ADD:
            r = x + y;
            break;
        case JB_SUB:
            r = x - y;
            break;
        case JB_MUL:
            r = x * y;
            break;
        case JB_DIV:
            if (y == 0) return fail(c, at, "float division by zero");
            r = x / y;
            break;
        case JB_FLOORDIV:
        case JB_MOD: {
            if (y == 0) return fail(c, at, "float modulo by zero");
            double m = fmod(x, y), div = (x - m) / y;
            if (m != 0) {
                if ((y < 0) != (m < 0)) m += y, div -= 1.0;
            } else {
                m = copysign(0.0, y);
            }
            double fl = floor(div);
            if (div != 0 && div - fl > 0.5) fl += 1.0;
            if (div == 0) fl = copysign(0.0, x / y);
            r = op == JB_MOD ? m : fl;
            break;
        }
        case JB_POW:
            if (x == 0 && y < 0) return fail(c, at, "0.0 cannot be raised to a negative power");
            r = pow(x, y);
            break;
        }
        *out = mkfloat(r);
        return 0;
    }
    if (op == JB_ADD && a.t == JV_STR && b.t == JV_STR) {
        char *s = cx_alloc(c, at, a.s.n + b.s.n + 1);
        if (!s) return -1;
        memcpy(s, a.s.p, a.s.n);
        memcpy(s + a.s.n, b.s.p, b.s.n);
        *out = (jval){.t = JV_STR, .s = {s, a.s.n + b.s.n}};
        return 0;
    }
    if (op == JB_ADD && a.t == JV_LIST && b.t == JV_LIST && a.flag == b.flag) {
        jlist *l = list_new(c, at, a.l->n + b.l->n);
        if (!l) return -1;
        for (size_t i = 0; i < a.l->n; i++) TRY(list_push(c, at, l, a.l->v[i]));
        for (size_t i = 0; i < b.l->n; i++) TRY(list_push(c, at, l, b.l->v[i]));
        *out = mklist(l, a.flag);
        return 0;
    }
    if (op == JB_MUL && (a.t == JV_STR || a.t == JV_LIST || b.t == JV_STR || b.t == JV_LIST) &&
        (is_intlike(a) || is_intlike(b))) {
        jval seq = is_intlike(a) ? b : a;
        int64_t k = as_int(is_intlike(a) ? a : b);
        if (k < 0) k = 0;
        size_t unit = seq.t == JV_STR ? seq.s.n : seq.l->n * sizeof(jval);
        if (unit && (uint64_t)k > c->t->limits.max_memory / unit)
            return fail(c, at, "'*' would make more than %zu MiB", c->t->limits.max_memory >> 20);
        if (seq.t == JV_STR) {
            char *s = cx_alloc(c, at, seq.s.n * (size_t)k + 1);
            if (!s) return -1;
            for (int64_t i = 0; i < k; i++) memcpy(s + (size_t)i * seq.s.n, seq.s.p, seq.s.n);
            *out = (jval){.t = JV_STR, .s = {s, seq.s.n * (size_t)k}};
            return 0;
        }
        jlist *l = list_new(c, at, seq.l->n * (size_t)k);
        if (!l) return -1;
        for (int64_t i = 0; i < k; i++)
            for (size_t j = 0; j < seq.l->n; j++) TRY(list_push(c, at, l, seq.l->v[j]));
        *out = mklist(l, seq.flag);
        return 0;
    }
    return fail(c, at, "unsupported operand type(s) for %s: '%s' and '%s'", names[op], type_name(a),
                type_name(b));
}

// ---- arguments

static jval arg_get(const jargs *a, size_t idx, const char *name) {
    if (idx < a->npos) return a->pos[idx];
    for (size_t i = 0; name && i < a->nkw; i++)
        if (a->kl[i] == strlen(name) && memcmp(a->kn[i], name, a->kl[i]) == 0) return a->kv[i];
    return UNDEF;
}

// At most maxpos positional arguments, and keywords only from names (a NULL-ended list).
static int arg_check(ctx *c, const jnode *at, const jargs *a, const char *what, size_t maxpos,
                     const char *const *names) {
    if (a->npos > maxpos)
        return fail(c, at, "%s takes at most %zu positional argument%s, got %zu", what, maxpos,
                    maxpos == 1 ? "" : "s", a->npos);
    for (size_t i = 0; i < a->nkw; i++) {
        bool ok = false;
        for (size_t k = 0; names && names[k]; k++) {
            if (a->kl[i] == strlen(names[k]) && memcmp(a->kn[i], names[k], a->kl[i]) == 0) {
                ok = true;
                if (k < a->npos) return fail(c, at, "%s got argument '%s' twice", what, names[k]);
            }
        }
        if (!ok)
            return fail(c, at, "%s got an unexpected keyword argument '%.*s'", what, (int)a->kl[i],
                        a->kn[i]);
    }
    return 0;
}

static int need_str(ctx *c, const jnode *at, jval v, const char *what) {
    if (v.t == JV_STR) return 0;
    if (v.t == JV_UNDEF) return undefined_error(c, at, v);
    return fail(c, at, "%s: expected a string, got %s", what, type_name(v));
}

static int need_int(ctx *c, const jnode *at, jval v, const char *what, int64_t *out) {
    if (!is_intlike(v)) return fail(c, at, "%s: expected an integer, got %s", what, type_name(v));
    *out = as_int(v);
    return 0;
}

static int apply_filter(ctx *c, const jnode *at, const char *name, size_t n, jval v, const jargs *a,
                        jval *out);
static int apply_test(ctx *c, const jnode *at, const char *name, size_t n, jval v, const jargs *a,
                      bool *out);
static int call_value(ctx *c, const jnode *at, jval f, const jargs *a, jval *out);

// ---- tests

static int apply_test(ctx *c, const jnode *at, const char *name, size_t n, jval v, const jargs *a,
                      bool *out) {
#define IS(x) (n == strlen(x) && memcmp(name, x, n) == 0)
    jval x = arg_get(a, 0, NULL);
    char what[64];
    snprintf(what, sizeof what, "test '%.*s'", (int)n, name);
    TRY(arg_check(c, at, a, what,
                  IS("equalto") || IS("eq") || IS("==") || IS("ne") || IS("!=") || IS("sameas") ||
                          IS("divisibleby") || IS("in")
                      ? 1
                      : 0,
                  NULL));
    if (IS("defined"))
        *out = v.t != JV_UNDEF;
    else if (IS("undefined"))
        *out = v.t == JV_UNDEF;
    else if (IS("none"))
        *out = v.t == JV_NONE;
    else if (IS("string"))
        *out = v.t == JV_STR;
    else if (IS("number"))
        *out = is_num(v);
    else if (IS("integer"))
        *out = v.t == JV_INT;
    else if (IS("float"))
        *out = v.t == JV_FLOAT;
    else if (IS("boolean"))
        *out = v.t == JV_BOOL;
    else if (IS("true"))
        *out = v.t == JV_BOOL && v.b;
    else if (IS("false"))
        *out = v.t == JV_BOOL && !v.b;
    else if (IS("mapping"))
        *out = v.t == JV_DICT;
    else if (IS("sequence"))
        *out = v.t == JV_STR || v.t == JV_LIST || v.t == JV_DICT;
    else if (IS("iterable"))
        *out = v.t == JV_STR || v.t == JV_LIST || v.t == JV_DICT || v.t == JV_UNDEF;
    else if (IS("callable"))
        *out = v.t == JV_MACRO || v.t == JV_FUNC || v.t == JV_METHOD;
    else if (IS("equalto") || IS("eq") || IS("=="))
        *out = py_eq(v, x);
    else if (IS("ne") || IS("!="))
        *out = !py_eq(v, x);
    else if (IS("sameas"))
        *out =
            (v.t == x.t && (v.t == JV_NONE || v.t == JV_UNDEF || (v.t == JV_BOOL && v.b == x.b))) ||
            (v.t == x.t && v.t != JV_BOOL && v.t != JV_NONE && py_eq(v, x));
    else if (IS("odd") || IS("even") || IS("divisibleby")) {
        int64_t k, d = IS("divisibleby") ? 0 : 2;
        TRY(need_int(c, at, v, what, &k));
        if (!d) TRY(need_int(c, at, x, what, &d));
        if (d == 0) return fail(c, at, "%s: division by zero", what);
        int64_t m = d == -1 ? 0 : k % d;
        *out = IS("odd") ? m != 0 : m == 0;
    } else if (IS("in")) {
        TRY(py_in(c, at, v, x, out));
    } else if (IS("lower") || IS("upper")) {
        TRY(need_str(c, at, v, what));
        jval t;
        TRY(change_case(c, at, v, IS("lower") ? CASE_LOWER : CASE_UPPER, &t));
        bool cased = false;
        for (size_t i = 0; i < v.s.n; i++)
            cased |= v.s.p[i] != t.s.p[i] || (unsigned char)v.s.p[i] >= 0x80;
        *out = py_eq(v, t) && cased;
    } else {
        return fail(c, at, "unsupported test '%.*s'", (int)n, name);
    }
    return 0;
#undef IS
}

// ---- filters

static int parse_py_int(jval s, int64_t *out) {
    jval t = py_strip(s, UNDEF, true, true);
    const char *p = t.s.p;
    size_t n = t.s.n, i = 0;
    bool neg = false;
    if (i < n && (p[i] == '+' || p[i] == '-')) neg = p[i++] == '-';
    if (i == n) return -1;
    uint64_t v = 0;
    for (; i < n; i++) {
        if (p[i] == '_' && i > 0 && p[i - 1] >= '0' && p[i - 1] <= '9' && i + 1 < n) continue;
        if (p[i] < '0' || p[i] > '9') return -1;
        if (v > (UINT64_MAX - 9) / 10) return -1;
        v = v * 10 + (uint64_t)(p[i] - '0');
    }
    if (v > (uint64_t)INT64_MAX + neg) return -1;
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return 0;
}

static int parse_py_float(jval s, double *out) {
    jval t = py_strip(s, UNDEF, true, true);
    char buf[128];
    if (t.s.n == 0 || t.s.n >= sizeof buf) return -1;
    memcpy(buf, t.s.p, t.s.n);
    buf[t.s.n] = 0;
    for (size_t i = 0; buf[i]; i++)
        if (buf[i] == 'x' || buf[i] == 'X' || buf[i] == 'p' || buf[i] == 'P' || buf[i] == '_')
            return -1;
    char *end;
    *out = strtod(buf, &end);
    return *end ? -1 : 0;
}

// obj.a.b or obj[0]: a map/selectattr attribute path.
static int attr_path(ctx *c, const jnode *at, jval v, jval path, jval *out) {
    if (is_intlike(path)) return get_item(c, at, v, path, out);
    TRY(need_str(c, at, path, "attribute"));
    const char *p = path.s.p, *end = p + path.s.n;
    for (;;) {
        const char *dot = memchr(p, '.', (size_t)(end - p));
        size_t n = (size_t)((dot ? dot : end) - p);
        jval key = {.t = JV_STR, .s = {p, n}};
        int64_t k;
        if (parse_py_int(key, &k) == 0 && n && p[0] >= '0' && p[0] <= '9') key = mkint(k);
        if (v.t == JV_UNDEF) {
            *out = v;
            return 0;
        }
        TRY(get_item(c, at, v, key, &v));
        if (!dot) break;
        p = dot + 1;
    }
    *out = v;
    return 0;
}

static int filter_select(ctx *c, const jnode *at, jval v, const jargs *a, bool attr, bool keep,
                         jval *out) {
    const jval *items;
    size_t n;
    TRY(iter_items(c, at, v, &items, &n));
    size_t first = attr ? 1 : 0;
    jval test = arg_get(a, first, NULL);
    if (test.t != JV_UNDEF) TRY(need_str(c, at, test, "select: the test name"));
    if (test.t == JV_STR && !jinja_known_test(test.s.p, test.s.n))
        return fail(c, at, "unsupported test '%.*s'", (int)test.s.n, test.s.p);
    jargs rest = {.pos = a->npos > first + 1 ? a->pos + first + 1 : NULL,
                  .npos = a->npos > first + 1 ? a->npos - first - 1 : 0};
    jlist *l = list_new(c, at, n);
    if (!l) return -1;
    for (size_t i = 0; i < n; i++) {
        jval x = items[i];
        if (attr) TRY(attr_path(c, at, x, arg_get(a, 0, NULL), &x));
        bool ok;
        if (test.t == JV_STR)
            TRY(apply_test(c, at, test.s.p, test.s.n, x, &rest, &ok));
        else
            ok = truthy(x);
        if (ok == keep) TRY(list_push(c, at, l, items[i]));
    }
    *out = mklist(l, false);
    return 0;
}

static int filter_tojson(ctx *c, const jnode *at, jval v, const jargs *a, jval *out) {
    static const char *const names[] = {"indent", "separators", "sort_keys", "ensure_ascii", NULL};
    TRY(arg_check(c, at, a, "tojson", 1, names));
    json_opts o = {.indent = -1, .item_sep = cstr(", "), .key_sep = cstr(": ")};
    jval indent = arg_get(a, 0, "indent"), seps = arg_get(a, 99, "separators");
    if (is_intlike(indent)) {
        int64_t k = as_int(indent);
        o.indent = k < 0 ? 0 : k > 64 ? 64 : (int)k;
        o.item_sep = cstr(",");
    } else if (indent.t != JV_UNDEF && indent.t != JV_NONE) {
        return fail(c, at, "tojson: indent must be an integer, got %s", type_name(indent));
    }
    if (seps.t == JV_LIST && seps.l->n == 2 && seps.l->v[0].t == JV_STR &&
        seps.l->v[1].t == JV_STR) {
        o.item_sep = seps.l->v[0];
        o.key_sep = seps.l->v[1];
    } else if (seps.t != JV_UNDEF && seps.t != JV_NONE) {
        return fail(c, at, "tojson: separators must be two strings");
    }
    if (truthy(arg_get(a, 99, "sort_keys")) || truthy(arg_get(a, 99, "ensure_ascii")))
        return fail(c, at, "tojson: sort_keys and ensure_ascii are not supported");
    jbuf b = {0};
    if (put_json(c, at, &b, v, &o, 0)) {
        free(b.p);
        return -1;
    }
    return buf_take(c, at, &b, out);
}

static int apply_filter(ctx *c, const jnode *at, const char *name, size_t n, jval v, const jargs *a,
                        jval *out) {
#define IS(x) (n == strlen(x) && memcmp(name, x, n) == 0)
    char what[64];
    snprintf(what, sizeof what, "filter '%.*s'", (int)n, name);
    static const char *const none[] = {NULL};
    jval s;
    if (IS("length") || IS("count")) {
        int64_t k = 0;
        TRY(arg_check(c, at, a, what, 0, none));
        TRY(py_len(c, at, v, &k));
        *out = mkint(k);
    } else if (IS("tojson")) {
        return filter_tojson(c, at, v, a, out);
    } else if (IS("safe")) {
        *out = v;
    } else if (IS("string")) {
        TRY(arg_check(c, at, a, what, 0, none));
        return to_string(c, at, v, out);
    } else if (IS("trim") || IS("upper") || IS("lower") || IS("title") || IS("capitalize")) {
        static const char *const chars[] = {"chars", NULL};
        TRY(arg_check(c, at, a, what, IS("trim"), chars));
        TRY(to_string(c, at, v, &s));
        if (IS("trim")) {
            jval ch = arg_get(a, 0, "chars");
            if (ch.t != JV_UNDEF && ch.t != JV_NONE) TRY(need_str(c, at, ch, what));
            *out = py_strip(s, ch, true, true);
            return 0;
        }
        return change_case(c, at, s,
                           IS("upper")   ? CASE_UPPER
                           : IS("lower") ? CASE_LOWER
                           : IS("title") ? CASE_JINJA_TITLE
                                         : CASE_CAPITALIZE,
                           out);
    } else if (IS("int") || IS("float")) {
        static const char *const names[] = {"default", "base", NULL};
        TRY(arg_check(c, at, a, what, IS("int") ? 2 : 1, names));
        jval def = arg_get(a, 0, "default");
        int64_t i = 0;
        double d = 0;
        bool ok = true;
        if (is_intlike(v))
            i = as_int(v), d = (double)i;
        else if (v.t == JV_FLOAT) {
            d = v.f;
            ok = isfinite(d) && fabs(d) < 9.2e18;
            i = ok ? (int64_t)d : 0;
        } else if (v.t == JV_STR) {
            if (IS("int") && parse_py_int(v, &i) == 0)
                d = (double)i;
            else if (parse_py_float(v, &d) == 0) {
                ok = !IS("int") || (isfinite(d) && fabs(d) < 9.2e18);
                i = ok ? (int64_t)d : 0;
            } else {
                ok = false;
            }
        } else {
            ok = false;
        }
        if (IS("int"))
            *out = ok ? mkint(i) : def.t != JV_UNDEF ? def : mkint(0);
        else
            *out = ok ? mkfloat(d) : def.t != JV_UNDEF ? def : mkfloat(0);
    } else if (IS("list") || IS("reverse") || IS("first") || IS("last")) {
        TRY(arg_check(c, at, a, what, 0, none));
        if (IS("reverse") && v.t == JV_STR) {
            jval all = mkint(-1);
            return get_slice(c, at, v, UNDEF, UNDEF, all, out);
        }
        const jval *items;
        size_t k;
        TRY(iter_items(c, at, v, &items, &k));
        if (IS("first") || IS("last")) {
            *out = k == 0 ? UNDEF : items[IS("first") ? 0 : k - 1];
            return 0;
        }
        jlist *l = list_new(c, at, k);
        if (!l) return -1;
        for (size_t i = 0; i < k; i++) TRY(list_push(c, at, l, items[IS("list") ? i : k - 1 - i]));
        *out = mklist(l, false);
    } else if (IS("join")) {
        static const char *const names[] = {"d", "attribute", NULL};
        TRY(arg_check(c, at, a, what, 2, names));
        jval sep = arg_get(a, 0, "d"), attr = arg_get(a, 1, "attribute");
        if (sep.t == JV_UNDEF) sep = cstr("");
        TRY(to_string(c, at, sep, &sep));
        const jval *items;
        size_t k;
        TRY(iter_items(c, at, v, &items, &k));
        jbuf b = {0};
        for (size_t i = 0; i < k; i++) {
            jval x = items[i];
            if ((attr.t != JV_UNDEF && attr_path(c, at, x, attr, &x)) ||
                (i && buf_put(c, at, &b, sep.s.p, sep.s.n)) || put_str(c, at, &b, x, false)) {
                free(b.p);
                return -1;
            }
        }
        return buf_take(c, at, &b, out);
    } else if (IS("default") || IS("d")) {
        static const char *const names[] = {"default_value", "boolean", NULL};
        TRY(arg_check(c, at, a, what, 2, names));
        jval def = arg_get(a, 0, "default_value");
        bool use = v.t == JV_UNDEF || (truthy(arg_get(a, 1, "boolean")) && !truthy(v));
        *out = use ? (def.t == JV_UNDEF ? cstr("") : def) : v;
    } else if (IS("items")) {
        TRY(arg_check(c, at, a, what, 0, none));
        if (v.t == JV_UNDEF) {
            jlist *l = list_new(c, at, 1);
            if (!l) return -1;
            *out = mklist(l, false);
            return 0;
        }
        if (v.t != JV_DICT)
            return fail(c, at, "%s: expected a mapping, got %s", what, type_name(v));
        jlist *l = list_new(c, at, v.d->n);
        if (!l) return -1;
        for (size_t i = 0; i < v.d->n; i++) {
            jlist *pair = list_new(c, at, 2);
            if (!pair || list_push(c, at, pair, v.d->k[i]) || list_push(c, at, pair, v.d->v[i]) ||
                list_push(c, at, l, mklist(pair, true)))
                return -1;
        }
        *out = mklist(l, false);
    } else if (IS("replace")) {
        static const char *const names[] = {"old", "new", "count", NULL};
        TRY(arg_check(c, at, a, what, 3, names));
        jval cnt = arg_get(a, 2, "count");
        int64_t k = -1;
        if (cnt.t != JV_UNDEF && cnt.t != JV_NONE) TRY(need_int(c, at, cnt, what, &k));
        TRY(to_string(c, at, v, &s));
        return py_replace(c, at, s, arg_get(a, 0, "old"), arg_get(a, 1, "new"), k, out);
    } else if (IS("map")) {
        const jval *items;
        size_t k;
        TRY(iter_items(c, at, v, &items, &k));
        jval attr = arg_get(a, 99, "attribute"), def = arg_get(a, 99, "default");
        jval fname = arg_get(a, 0, NULL);
        if (attr.t == JV_UNDEF) {
            TRY(need_str(c, at, fname, "map: the filter name"));
            if (!jinja_known_filter(fname.s.p, fname.s.n))
                return fail(c, at, "unsupported filter '%.*s'", (int)fname.s.n, fname.s.p);
        } else {
            static const char *const names[] = {"attribute", "default", NULL};
            TRY(arg_check(c, at, a, what, 0, names));
        }
        jargs rest = *a;
        if (rest.npos) rest.pos++, rest.npos--;
        jlist *l = list_new(c, at, k);
        if (!l) return -1;
        for (size_t i = 0; i < k; i++) {
            jval x;
            if (attr.t != JV_UNDEF) {
                TRY(attr_path(c, at, items[i], attr, &x));
                if (x.t == JV_UNDEF && def.t != JV_UNDEF) x = def;
            } else {
                TRY(apply_filter(c, at, fname.s.p, fname.s.n, items[i], &rest, &x));
            }
            TRY(list_push(c, at, l, x));
        }
        *out = mklist(l, false);
    } else if (IS("select") || IS("reject") || IS("selectattr") || IS("rejectattr")) {
        TRY(arg_check(c, at, a, what, 8, none));
        return filter_select(c, at, v, a, name[0] == 's' ? n > 6 : n > 6, name[0] == 's', out);
    } else if (IS("abs")) {
        TRY(arg_check(c, at, a, what, 0, none));
        if (is_intlike(v)) {
            if (as_int(v) == INT64_MIN) return fail(c, at, "integer overflow in abs");
            *out = mkint(as_int(v) < 0 ? -as_int(v) : as_int(v));
        } else if (v.t == JV_FLOAT) {
            *out = mkfloat(fabs(v.f));
        } else {
            return fail(c, at, "bad operand type for abs(): '%s'", type_name(v));
        }
    } else {
        return fail(c, at, "unsupported filter '%.*s'", (int)n, name);
    }
    return 0;
#undef IS
}

// ---- methods and globals

static int call_method(ctx *c, const jnode *at, const jmethod *m, const jargs *a, jval *out) {
#define IS(x) (m->n == strlen(x) && memcmp(m->name, x, m->n) == 0)
    jval self = m->self;
    char what[64];
    snprintf(what, sizeof what, "%s.%.*s()", type_name(self), (int)m->n, m->name);
    if (!m->supported) return fail(c, at, "unsupported method %s", what);
    static const char *const none[] = {NULL};
    if (self.t == JV_LOOP) { // loop.cycle(a, b, ...)
        TRY(arg_check(c, at, a, what, SIZE_MAX, none));
        if (!a->npos) return fail(c, at, "%s: no items to cycle through", what);
        *out = a->pos[self.lp->index0 % a->npos];
        return 0;
    }
    if (self.t == JV_DICT) {
        TRY(arg_check(c, at, a, what, IS("get") ? 2 : 0, none));
        if (IS("get")) {
            jval *v = dict_find(self.d, arg_get(a, 0, NULL));
            jval def = arg_get(a, 1, NULL);
            *out = v ? *v : def.t == JV_UNDEF ? NONE : def;
            return 0;
        }
        if (IS("items")) return apply_filter(c, at, "items", 5, self, a, out);
        jlist *l = list_new(c, at, self.d->n);
        if (!l) return -1;
        for (size_t i = 0; i < self.d->n; i++)
            TRY(list_push(c, at, l, IS("keys") ? self.d->k[i] : self.d->v[i]));
        *out = mklist(l, false);
        return 0;
    }
    // a string
    if (IS("startswith") || IS("endswith")) {
        TRY(arg_check(c, at, a, what, 1, none));
        jval p = arg_get(a, 0, NULL);
        const jval *cands = &p;
        size_t k = 1;
        if (p.t == JV_LIST && p.flag) cands = p.l->v, k = p.l->n;
        bool r = false;
        for (size_t i = 0; i < k; i++) {
            TRY(need_str(c, at, cands[i], what));
            size_t pn = cands[i].s.n;
            if (pn <= self.s.n &&
                memcmp(self.s.p + (IS("startswith") ? 0 : self.s.n - pn), cands[i].s.p, pn) == 0)
                r = true;
        }
        *out = mkbool(r);
    } else if (IS("split")) {
        static const char *const names[] = {"sep", "maxsplit", NULL};
        TRY(arg_check(c, at, a, what, 2, names));
        jval sep = arg_get(a, 0, "sep"), ms = arg_get(a, 1, "maxsplit");
        int64_t k = -1;
        if (ms.t != JV_UNDEF) TRY(need_int(c, at, ms, what, &k));
        if (sep.t != JV_UNDEF && sep.t != JV_NONE) TRY(need_str(c, at, sep, what));
        return py_split(c, at, self, sep, k, out);
    } else if (IS("strip") || IS("lstrip") || IS("rstrip")) {
        static const char *const names[] = {"chars", NULL};
        TRY(arg_check(c, at, a, what, 1, names));
        jval ch = arg_get(a, 0, "chars");
        if (ch.t != JV_UNDEF && ch.t != JV_NONE) TRY(need_str(c, at, ch, what));
        *out = py_strip(self, ch, !IS("rstrip"), !IS("lstrip"));
    } else if (IS("upper") || IS("lower") || IS("title") || IS("capitalize")) {
        TRY(arg_check(c, at, a, what, 0, none));
        return change_case(c, at, self,
                           IS("upper")   ? CASE_UPPER
                           : IS("lower") ? CASE_LOWER
                           : IS("title") ? CASE_TITLE
                                         : CASE_CAPITALIZE,
                           out);
    } else if (IS("replace")) {
        static const char *const names[] = {"count", NULL};
        TRY(arg_check(c, at, a, what, 3, names));
        jval cnt = arg_get(a, 2, "count");
        int64_t k = -1;
        if (cnt.t != JV_UNDEF) TRY(need_int(c, at, cnt, what, &k));
        return py_replace(c, at, self, arg_get(a, 0, NULL), arg_get(a, 1, NULL), k, out);
    }
    return 0;
#undef IS
}

static const char *const builtins[] = {"range",           "namespace",    "dict",
                                       "raise_exception", "strftime_now", NULL};

static int call_builtin(ctx *c, const jnode *at, jval f, const jargs *a, jval *out) {
#define IS(x) (f.s.n == strlen(x) && memcmp(f.s.p, x, f.s.n) == 0)
    static const char *const none[] = {NULL};
    char what[64];
    snprintf(what, sizeof what, "%.*s()", (int)f.s.n, f.s.p);
    if (IS("raise_exception")) {
        TRY(arg_check(c, at, a, what, 1, none));
        jval msg;
        TRY(to_string(c, at, arg_get(a, 0, NULL), &msg));
        return fail(c, at, "raise_exception: %.*s", (int)(msg.s.n > 2000 ? 2000 : msg.s.n),
                    msg.s.p);
    }
    if (IS("strftime_now")) {
        TRY(arg_check(c, at, a, what, 1, none));
        jval fmt = arg_get(a, 0, NULL);
        TRY(need_str(c, at, fmt, what));
        char pat[256], res[512];
        if (fmt.s.n >= sizeof pat) return fail(c, at, "%s: the format is too long", what);
        memcpy(pat, fmt.s.p, fmt.s.n);
        pat[fmt.s.n] = 0;
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        size_t k = strftime(res, sizeof res, pat, &tm);
        return mkstr(c, at, res, k, out);
    }
    if (IS("range")) {
        TRY(arg_check(c, at, a, what, 3, none));
        int64_t v[3] = {0, 0, 1};
        if (a->npos == 0) return fail(c, at, "range expected at least 1 argument, got 0");
        for (size_t i = 0; i < a->npos; i++) TRY(need_int(c, at, a->pos[i], what, &v[i]));
        int64_t start = a->npos == 1 ? 0 : v[0], stop = a->npos == 1 ? v[0] : v[1], step = v[2];
        if (step == 0) return fail(c, at, "range() arg 3 must not be zero");
        jlist *l = list_new(c, at, 4);
        if (!l) return -1;
        for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
            if (++c->steps > c->t->limits.max_steps)
                return fail(c, at, "more than %zu loop iterations and calls (the limit)",
                            c->t->limits.max_steps);
            TRY(list_push(c, at, l, mkint(i)));
            if (__builtin_add_overflow(i, step, &i)) break;
        }
        *out = mklist(l, false);
        return 0;
    }
    // namespace(...) and dict(...): a mapping from an optional mapping and keyword arguments
    if (a->npos > 1)
        return fail(c, at, "%s takes at most 1 positional argument, got %zu", what, a->npos);
    jdict *d = dict_new(c, at);
    if (!d) return -1;
    jval init = arg_get(a, 0, NULL);
    if (init.t == JV_DICT || init.t == JV_NS) {
        for (size_t i = 0; i < init.d->n; i++) TRY(dict_set(c, at, d, init.d->k[i], init.d->v[i]));
    } else if (init.t != JV_UNDEF) {
        return fail(c, at, "%s: expected a mapping, got %s", what, type_name(init));
    }
    for (size_t i = 0; i < a->nkw; i++)
        TRY(dict_set(c, at, d, (jval){.t = JV_STR, .s = {a->kn[i], a->kl[i]}}, a->kv[i]));
    *out = (jval){.t = IS("dict") ? JV_DICT : JV_NS, .d = d};
    return 0;
#undef IS
}

// ---- evaluation

static int eval(ctx *c, const jnode *n, jframe *f, jval *out);
static int exec_body(ctx *c, const jnode *body, jframe *f, jbuf *b);

static int step(ctx *c, const jnode *at) {
    if (++c->steps > c->t->limits.max_steps)
        return fail(c, at, "more than %zu loop iterations and calls (the limit)",
                    c->t->limits.max_steps);
    return 0;
}

static int eval_args(ctx *c, const jnode *n, jframe *f, jargs *a) {
    *a = (jargs){0};
    if (!n->nkids) return 0;
    a->pos = cx_alloc(c, n, n->nkids * sizeof *a->pos);
    a->kv = cx_alloc(c, n, n->nkids * sizeof *a->kv);
    a->kn = cx_alloc(c, n, n->nkids * sizeof *a->kn);
    a->kl = cx_alloc(c, n, n->nkids * sizeof *a->kl);
    if (!a->pos || !a->kv || !a->kn || !a->kl) return -1;
    for (size_t i = 0; i < n->nkids; i++) {
        jval v;
        TRY(eval(c, n->kids[i], f, &v));
        if (n->names && n->names[i]) {
            a->kn[a->nkw] = n->names[i];
            a->kl[a->nkw] = n->name_lens[i];
            a->kv[a->nkw++] = v;
        } else {
            a->pos[a->npos++] = v;
        }
    }
    return 0;
}

static int call_macro(ctx *c, const jnode *at, const jmacro *m, const jargs *a, jval *out) {
    const jnode *d = m->node;
    if (c->depth >= c->t->limits.max_depth)
        return fail(c, at, "macro calls nested deeper than %zu (the limit)",
                    c->t->limits.max_depth);
    TRY(step(c, at));
    if (a->npos > d->nkids)
        return fail(c, at, "macro '%.*s' takes not more than %zu argument(s)", (int)d->len, d->str,
                    d->nkids);
    jframe *mf = cx_alloc(c, at, sizeof *mf);
    if (!mf) return -1;
    mf->parent = m->env;
    for (size_t i = 0; i < a->nkw; i++) {
        bool ok = false;
        for (size_t k = 0; k < d->nkids; k++)
            ok |= d->name_lens[k] == a->kl[i] && memcmp(d->names[k], a->kn[i], a->kl[i]) == 0;
        if (!ok)
            return fail(c, at, "macro '%.*s' has no argument '%.*s'", (int)d->len, d->str,
                        (int)a->kl[i], a->kn[i]);
    }
    for (size_t k = 0; k < d->nkids; k++) {
        jval v = UNDEF;
        if (k < a->npos) {
            v = a->pos[k];
        } else {
            bool found = false;
            for (size_t i = 0; i < a->nkw && !found; i++)
                if (d->name_lens[k] == a->kl[i] && memcmp(d->names[k], a->kn[i], a->kl[i]) == 0)
                    v = a->kv[i], found = true;
            if (!found && d->kids[k]) TRY(eval(c, d->kids[k], mf, &v));
        }
        TRY(frame_set(c, at, mf, d->names[k], d->name_lens[k], v));
    }
    jbuf b = {0};
    c->depth++;
    int rc = exec_body(c, d->b, mf, &b);
    c->depth--;
    c->ctl = 0;
    if (rc) {
        free(b.p);
        return -1;
    }
    return buf_take(c, at, &b, out);
}

static int call_value(ctx *c, const jnode *at, jval fn, const jargs *a, jval *out) {
    switch (fn.t) {
    case JV_MACRO:
        return call_macro(c, at, fn.m, a, out);
    case JV_FUNC:
        return call_builtin(c, at, fn, a, out);
    case JV_METHOD:
        return call_method(c, at, fn.bm, a, out);
    case JV_UNDEF:
        if (fn.flag)
            return fail(c, at, "unsupported or unknown method '%.*s' (undefined)", (int)fn.s.n,
                        fn.s.p);
        return fail(c, at, "'%.*s' is undefined", (int)fn.s.n, fn.s.p);
    default:
        return fail(c, at, "'%s' object is not callable", type_name(fn));
    }
}

static int eval_seq(ctx *c, const jnode *n, jframe *f, jval *out) {
    if (n->kind == N_DICT) {
        jdict *d = dict_new(c, n);
        if (!d) return -1;
        for (size_t i = 0; i + 1 < n->nkids; i += 2) {
            jval k, v;
            TRY(eval(c, n->kids[i], f, &k));
            TRY(eval(c, n->kids[i + 1], f, &v));
            if (k.t == JV_LIST || k.t == JV_DICT || k.t == JV_NS)
                return fail(c, n->kids[i], "unhashable type: '%s'", type_name(k));
            TRY(dict_set(c, n, d, k, v));
        }
        *out = (jval){.t = JV_DICT, .d = d};
        return 0;
    }
    jlist *l = list_new(c, n, n->nkids);
    if (!l) return -1;
    for (size_t i = 0; i < n->nkids; i++) {
        jval v;
        TRY(eval(c, n->kids[i], f, &v));
        TRY(list_push(c, n, l, v));
    }
    *out = mklist(l, n->kind == N_TUPLE);
    return 0;
}

static int eval(ctx *c, const jnode *n, jframe *f, jval *out) {
    jval a, b;
    jargs args;
    switch (n->kind) {
    case N_CONST:
        switch (n->op) {
        case JC_NONE:
            *out = NONE;
            break;
        case JC_TRUE:
            *out = mkbool(true);
            break;
        case JC_FALSE:
            *out = mkbool(false);
            break;
        case JC_INT:
            *out = mkint(n->ival);
            break;
        case JC_FLOAT:
            *out = mkfloat(n->fval);
            break;
        default:
            *out = (jval){.t = JV_STR, .s = {n->str, n->len}};
            break;
        }
        return 0;
    case N_NAME: {
        jval *v = frame_find(f, n->str, n->len);
        if (v)
            *out = *v;
        else if (name_in(builtins, n->str, n->len))
            *out = (jval){.t = JV_FUNC, .s = {n->str, n->len}};
        else
            *out = (jval){.t = JV_UNDEF, .s = {n->str, n->len}};
        return 0;
    }
    case N_ATTR:
        TRY(eval(c, n->a, f, &a));
        return get_attr(c, n, a, n->str, n->len, out);
    case N_ITEM:
        TRY(eval(c, n->a, f, &a));
        TRY(eval(c, n->b, f, &b));
        return get_item(c, n, a, b, out);
    case N_SLICE: {
        jval p[3] = {UNDEF, UNDEF, UNDEF};
        TRY(eval(c, n->a, f, &a));
        for (int i = 0; i < 3; i++)
            if (n->kids[i]) TRY(eval(c, n->kids[i], f, &p[i]));
        return get_slice(c, n, a, p[0], p[1], p[2], out);
    }
    case N_CALL:
        TRY(eval(c, n->a, f, &a));
        TRY(eval_args(c, n, f, &args));
        return call_value(c, n, a, &args, out);
    case N_FILTER:
        TRY(eval(c, n->a, f, &a));
        TRY(eval_args(c, n, f, &args));
        return apply_filter(c, n, n->str, n->len, a, &args, out);
    case N_TEST: {
        bool r;
        TRY(eval(c, n->a, f, &a));
        TRY(eval_args(c, n, f, &args));
        TRY(apply_test(c, n, n->str, n->len, a, &args, &r));
        *out = mkbool(r != (n->op != 0));
        return 0;
    }
    case N_UNARY:
        TRY(eval(c, n->a, f, &a));
        if (n->op == '!') {
            *out = mkbool(!truthy(a));
            return 0;
        }
        if (a.t == JV_UNDEF) return undefined_error(c, n, a);
        if (!is_num(a))
            return fail(c, n, "bad operand type for unary %c: '%s'", n->op, type_name(a));
        if (n->op == '+')
            *out = a.t == JV_BOOL ? mkint(a.b) : a;
        else if (a.t == JV_FLOAT)
            *out = mkfloat(-a.f);
        else if (as_int(a) == INT64_MIN)
            return fail(c, n, "integer overflow in unary -");
        else
            *out = mkint(-as_int(a));
        return 0;
    case N_BINARY:
        TRY(eval(c, n->a, f, &a));
        TRY(eval(c, n->b, f, &b));
        return arith(c, n, n->op, a, b, out);
    case N_AND:
    case N_OR:
        TRY(eval(c, n->a, f, &a));
        if (truthy(a) == (n->kind == N_OR)) {
            *out = a;
            return 0;
        }
        return eval(c, n->b, f, out);
    case N_COMPARE: {
        static const char *const ops[] = {"==", "!=", "<", "<=", ">", ">=", "in", "not in"};
        TRY(eval(c, n->a, f, &a));
        bool r = true;
        for (size_t i = 0; i < n->nkids && r; i++) {
            TRY(eval(c, n->kids[i], f, &b));
            int op = n->ops[i], k;
            if (op == JO_EQ || op == JO_NE) {
                r = py_eq(a, b) == (op == JO_EQ);
            } else if (op == JO_IN || op == JO_NOTIN) {
                TRY(py_in(c, n->kids[i], a, b, &r));
                if (op == JO_NOTIN) r = !r;
            } else {
                TRY(py_cmp(c, n->kids[i], a, b, ops[op], &k));
                r = op == JO_LT ? k < 0 : op == JO_LE ? k <= 0 : op == JO_GT ? k > 0 : k >= 0;
            }
            a = b;
        }
        *out = mkbool(r);
        return 0;
    }
    case N_COND:
        TRY(eval(c, n->b, f, &b));
        if (truthy(b)) return eval(c, n->a, f, out);
        if (n->c) return eval(c, n->c, f, out);
        *out = UNDEF;
        return 0;
    case N_LIST:
    case N_TUPLE:
    case N_DICT:
        return eval_seq(c, n, f, out);
    default:
        return fail(c, n, "internal error: node %d is not an expression", (int)n->kind);
    }
}

// Binds a for/set target list to v (unpacking when there are several names).
static int bind(ctx *c, const jnode *n, jframe *f, jval v) {
    if (n->nnames == 1) return frame_set(c, n, f, n->names[0], n->name_lens[0], v);
    const jval *items;
    size_t k;
    TRY(iter_items(c, n, v, &items, &k));
    if (k != n->nnames)
        return fail(c, n,
                    k > n->nnames ? "too many values to unpack (expected %zu, got %zu)"
                                  : "not enough values to unpack (expected %zu, got %zu)",
                    n->nnames, k);
    for (size_t i = 0; i < k; i++) TRY(frame_set(c, n, f, n->names[i], n->name_lens[i], items[i]));
    return 0;
}

static int exec_for(ctx *c, const jnode *n, jframe *f, jbuf *b) {
    jval seq;
    TRY(eval(c, n->a, f, &seq));
    if (seq.t == JV_NONE || is_num(seq))
        return fail(c, n->a, "'%s' object is not iterable", type_name(seq));
    const jval *items;
    size_t k;
    TRY(iter_items(c, n->a, seq, &items, &k));
    jframe *lf = cx_alloc(c, n, sizeof *lf);
    if (!lf) return -1;
    lf->parent = f;
    if (n->d) { // {% for x in xs if cond %}: the loop sees only the items that pass
        jval *kept = cx_alloc(c, n, (k ? k : 1) * sizeof *kept);
        size_t m = 0;
        if (!kept) return -1;
        for (size_t i = 0; i < k; i++) {
            jval cond;
            TRY(step(c, n));
            TRY(bind(c, n, lf, items[i]));
            TRY(eval(c, n->d, lf, &cond));
            if (truthy(cond)) kept[m++] = items[i];
        }
        items = kept, k = m;
    }
    jloop *lp = cx_alloc(c, n, sizeof *lp);
    if (!lp) return -1;
    *lp = (jloop){0, k, items};
    for (size_t i = 0; i < k; i++) {
        TRY(step(c, n));
        lp->index0 = i;
        TRY(bind(c, n, lf, items[i]));
        TRY(frame_set(c, n, lf, "loop", 4, (jval){.t = JV_LOOP, .lp = lp}));
        TRY(exec_body(c, n->b, lf, b));
        int ctl = c->ctl;
        c->ctl = 0;
        if (ctl == 1) break;
    }
    if (k == 0 && n->c) return exec_body(c, n->c, f, b);
    return 0;
}

static int exec_set(ctx *c, const jnode *n, jframe *f, jbuf *b) {
    (void)b;
    jval v;
    if (n->kind == N_SETBLOCK) {
        jbuf inner = {0};
        if (exec_body(c, n->b, f, &inner)) {
            free(inner.p);
            return -1;
        }
        TRY(buf_take(c, n, &inner, &v));
        return frame_set(c, n, f, n->names[0], n->name_lens[0], v);
    }
    TRY(eval(c, n->a, f, &v));
    if (!n->str) return bind(c, n, f, v);
    jval *ns = frame_find(f, n->names[0], n->name_lens[0]);
    if (!ns || ns->t != JV_NS)
        return fail(c, n, "cannot assign attribute on non-namespace object '%.*s'",
                    (int)n->name_lens[0], n->names[0]);
    return dict_set(c, n, ns->d, (jval){.t = JV_STR, .s = {n->str, n->len}}, v);
}

static int exec_body(ctx *c, const jnode *body, jframe *f, jbuf *b) {
    for (size_t i = 0; i < body->nkids && !c->ctl; i++) {
        const jnode *n = body->kids[i];
        jval v;
        switch (n->kind) {
        case N_TEXT:
            TRY(buf_put(c, n, b, n->str, n->len));
            break;
        case N_OUTPUT:
            TRY(eval(c, n->a, f, &v));
            TRY(put_str(c, n, b, v, false));
            break;
        case N_IF:
            TRY(eval(c, n->a, f, &v));
            if (truthy(v))
                TRY(exec_body(c, n->b, f, b));
            else if (n->c)
                TRY(exec_body(c, n->c, f, b));
            break;
        case N_FOR:
            TRY(exec_for(c, n, f, b));
            break;
        case N_SET:
        case N_SETBLOCK:
            TRY(exec_set(c, n, f, b));
            break;
        case N_MACRO: {
            jmacro *m = cx_alloc(c, n, sizeof *m);
            if (!m) return -1;
            *m = (jmacro){n, f};
            TRY(frame_set(c, n, f, n->str, n->len, (jval){.t = JV_MACRO, .m = m}));
            break;
        }
        case N_BREAK:
            c->ctl = 1;
            break;
        case N_CONTINUE:
            c->ctl = 2;
            break;
        case N_BODY:
            TRY(exec_body(c, n, f, b));
            break;
        default:
            return fail(c, n, "internal error: node %d is not a statement", (int)n->kind);
        }
    }
    return 0;
}

int jinja_render(const jinja_template *t, const cJSON *vars, char **out, size_t *out_len,
                 ct_error *err) {
    *out = NULL;
    if (out_len) *out_len = 0;
    if (vars && !cJSON_IsObject(vars))
        return ct_fail(err, "%s: the variables must be a JSON object, got %s", t->name,
                       cJSON_IsArray(vars) ? "an array" : "a scalar");
    ctx c = {.t = t, .err = err, .ar = {.cap = t->limits.max_memory}};
    jframe *root = cx_alloc(&c, NULL, sizeof *root);
    int rc = root ? 0 : -1;
    const cJSON *e;
    if (vars && rc == 0) {
        cJSON_ArrayForEach(e, vars) {
            jval v;
            if ((rc = from_json(&c, e, &v, 0)) != 0) break;
            const char *k = e->string ? e->string : "";
            if ((rc = frame_set(&c, NULL, root, k, strlen(k), v)) != 0) break;
        }
    }
    jbuf b = {0};
    if (rc == 0) rc = exec_body(&c, t->root, root, &b);
    if (rc == 0 && !b.p) rc = buf_put(&c, NULL, &b, "", 0);
    ja_free(&c.ar);
    if (rc) {
        free(b.p);
        return -1;
    }
    *out = b.p;
    if (out_len) *out_len = b.n;
    return 0;
}
