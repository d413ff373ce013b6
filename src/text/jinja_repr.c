// Python's str() and repr() of values, and tojson (json.dumps with ensure_ascii=False).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <utf8proc.h>

#include "core/utf8.h"
#include "io/json.h"
#include "text/jinja_value.h"

// ---- Python's str() and repr()

const char *jv_type_name(jval v) {
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
    TRY(jv_buf_put(c, at, b, &q, 1));
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
        TRY(e[0] ? jv_buf_puts(c, at, b, e) : jv_buf_put(c, at, b, s + i, (size_t)l));
        i += (size_t)l;
    }
    return jv_buf_put(c, at, b, &q, 1);
}

static int put_dict(ctx *c, const jnode *at, jbuf *b, const jdict *d) {
    TRY(jv_buf_puts(c, at, b, "{"));
    for (size_t i = 0; i < d->n; i++) {
        if (i) TRY(jv_buf_puts(c, at, b, ", "));
        TRY(jv_put_str(c, at, b, d->k[i], true));
        TRY(jv_buf_puts(c, at, b, ": "));
        TRY(jv_put_str(c, at, b, d->v[i], true));
    }
    return jv_buf_puts(c, at, b, "}");
}

// Appends str(v) (or repr(v)) as Python writes it.
int jv_put_str(ctx *c, const jnode *at, jbuf *b, jval v, bool repr) {
    char tmp[64];
    if (++c->depth > 1000) return jv_fail(c, at, "a value nested deeper than 1000");
    int rc = 0;
    switch (v.t) {
    case JV_UNDEF:
        break;
    case JV_NONE:
        rc = jv_buf_puts(c, at, b, "None");
        break;
    case JV_BOOL:
        rc = jv_buf_puts(c, at, b, v.b ? "True" : "False");
        break;
    case JV_INT:
        snprintf(tmp, sizeof tmp, "%lld", (long long)v.i);
        rc = jv_buf_puts(c, at, b, tmp);
        break;
    case JV_FLOAT:
        float_repr(tmp, sizeof tmp, v.f);
        rc = jv_buf_puts(c, at, b, tmp);
        break;
    case JV_STR:
        rc = repr ? str_repr(c, at, b, v.s.p, v.s.n) : jv_buf_put(c, at, b, v.s.p, v.s.n);
        break;
    case JV_LIST:
        rc = jv_buf_puts(c, at, b, v.flag ? "(" : "[");
        for (size_t i = 0; rc == 0 && i < v.l->n; i++) {
            if (i) rc = jv_buf_puts(c, at, b, ", ");
            if (rc == 0) rc = jv_put_str(c, at, b, v.l->v[i], true);
        }
        if (rc == 0 && v.flag && v.l->n == 1) rc = jv_buf_puts(c, at, b, ",");
        if (rc == 0) rc = jv_buf_puts(c, at, b, v.flag ? ")" : "]");
        break;
    case JV_DICT:
        rc = put_dict(c, at, b, v.d);
        break;
    case JV_NS:
        rc = jv_buf_puts(c, at, b, "<Namespace ");
        if (rc == 0) rc = put_dict(c, at, b, v.d);
        if (rc == 0) rc = jv_buf_puts(c, at, b, ">");
        break;
    case JV_LOOP:
        snprintf(tmp, sizeof tmp, "<LoopContext %zu/%zu>", v.lp->index0 + 1, v.lp->length);
        rc = jv_buf_puts(c, at, b, tmp);
        break;
    default:
        rc = jv_buf_puts(c, at, b, "<function>");
        break;
    }
    c->depth--;
    return rc;
}

// str(v) as a value.
int jv_to_string(ctx *c, const jnode *at, jval v, jval *out) {
    if (v.t == JV_STR) {
        *out = v;
        return 0;
    }
    jbuf b = {0};
    if (jv_put_str(c, at, &b, v, false)) {
        free(b.p);
        return -1;
    }
    return jv_buf_take(c, at, &b, out);
}

// ---- JSON (tojson: Python's json.dumps with ensure_ascii=False)

int jv_put_json(ctx *c, const jnode *at, jbuf *b, jval v, const json_opts *o, int level) {
    char tmp[64];
    if (level > 1000) return jv_fail(c, at, "tojson: a value nested deeper than 1000");
    switch (v.t) {
    case JV_NONE:
        return jv_buf_puts(c, at, b, "null");
    case JV_BOOL:
        return jv_buf_puts(c, at, b, v.b ? "true" : "false");
    case JV_INT:
        snprintf(tmp, sizeof tmp, "%lld", (long long)v.i);
        return jv_buf_puts(c, at, b, tmp);
    case JV_FLOAT:
        if (isnan(v.f)) return jv_buf_puts(c, at, b, "NaN");
        if (isinf(v.f)) return jv_buf_puts(c, at, b, v.f < 0 ? "-Infinity" : "Infinity");
        float_repr(tmp, sizeof tmp, v.f);
        return jv_buf_puts(c, at, b, tmp);
    case JV_STR: {
        json_buf q = {0};
        if (json_quote(&q, v.s.p, v.s.n, JSON_SHORT) != 0)
            return jv_fail(c, at, "out of memory for %zu bytes of output", v.s.n);
        int rc = jv_buf_put(c, at, b, q.p, q.len);
        free(q.p);
        return rc;
    }
    case JV_LIST:
    case JV_DICT:
    case JV_NS: {
        bool list = v.t == JV_LIST;
        size_t n = list ? v.l->n : v.d->n;
        TRY(jv_buf_puts(c, at, b, list ? "[" : "{"));
        if (n == 0) return jv_buf_puts(c, at, b, list ? "]" : "}");
        for (size_t i = 0; i < n; i++) {
            if (i) TRY(jv_buf_put(c, at, b, o->item_sep.s.p, o->item_sep.s.n));
            if (o->indent >= 0) {
                TRY(jv_buf_puts(c, at, b, "\n"));
                for (int k = 0; k < o->indent * (level + 1); k++) TRY(jv_buf_puts(c, at, b, " "));
            }
            if (!list) {
                jval k = v.d->k[i];
                if (k.t == JV_STR) {
                    TRY(jv_put_json(c, at, b, k, o, level + 1));
                } else if (k.t == JV_INT || k.t == JV_FLOAT || k.t == JV_BOOL || k.t == JV_NONE) {
                    TRY(jv_buf_puts(c, at, b, "\""));
                    TRY(jv_put_json(c, at, b, k, o, level + 1));
                    TRY(jv_buf_puts(c, at, b, "\""));
                } else {
                    return jv_fail(c, at,
                                   "tojson: keys must be str, int, float, bool or None, not %s",
                                   jv_type_name(k));
                }
                TRY(jv_buf_put(c, at, b, o->key_sep.s.p, o->key_sep.s.n));
            }
            TRY(jv_put_json(c, at, b, list ? v.l->v[i] : v.d->v[i], o, level + 1));
        }
        if (o->indent >= 0) {
            TRY(jv_buf_puts(c, at, b, "\n"));
            for (int k = 0; k < o->indent * level; k++) TRY(jv_buf_puts(c, at, b, " "));
        }
        return jv_buf_puts(c, at, b, list ? "]" : "}");
    }
    default:
        return jv_fail(c, at, "tojson: Object of type %s is not JSON serializable",
                       jv_type_name(v));
    }
}
