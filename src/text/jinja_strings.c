// Strings by code point: indexing, case mappings, strip, split, replace; the items and length of
// any sequence.
#include <stdlib.h>

#include <utf8proc.h>

#include "core/utf8.h"
#include "text/jinja_value.h"

// Offsets of each code point of s (n+1 entries, the last = len) in an arena array.
int jv_cp_index(ctx *c, const jnode *at, const char *s, size_t len, size_t **offs, size_t *n) {
    size_t k = 0;
    size_t *o = jv_alloc(c, at, (len + 1) * sizeof *o);
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

static bool jinja_title_sep(uint32_t cp) {
    return cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || jinja_py_space(cp);
}

int jv_change_case(ctx *c, const jnode *at, jval s, case_op op, jval *out) {
    jbuf b = {0};
    bool prev_cased = false, first = true;
    for (size_t i = 0; i < s.s.n;) {
        uint32_t cp;
        int l = utf8_decode(&cp, (const unsigned char *)s.s.p + i, s.s.n - i);
        if (l < 0) {
            if (jv_buf_put(c, at, &b, s.s.p + i, (size_t)-l)) goto fail;
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
        if (jv_buf_put(c, at, &b, e, (size_t)w)) goto fail;
        i += (size_t)l;
    }
    return jv_buf_take(c, at, &b, out);
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
jval jv_py_strip(jval s, jval chars, bool left, bool right) {
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

int jv_py_split(ctx *c, const jnode *at, jval s, jval sep, int64_t maxsplit, jval *out) {
    jlist *l = jv_list_new(c, at, 4);
    if (!l) return -1;
    const char *p = s.s.p;
    size_t n = s.s.n, i = 0;
    if (sep.t == JV_STR) {
        if (sep.s.n == 0) return jv_fail(c, at, "split: empty separator");
        size_t hit;
        while ((maxsplit < 0 || (int64_t)l->n < maxsplit) &&
               jv_str_find(p, n, sep.s.p, sep.s.n, i, &hit)) {
            TRY(jv_list_push(c, at, l, (jval){.t = JV_STR, .s = {p + i, hit - i}}));
            i = hit + sep.s.n;
        }
        TRY(jv_list_push(c, at, l, (jval){.t = JV_STR, .s = {p + i, n - i}}));
    } else {
        for (;;) {
            i += jinja_space_run(p + i, n - i, false);
            if (i >= n) break;
            if (maxsplit >= 0 && (int64_t)l->n >= maxsplit) {
                TRY(jv_list_push(c, at, l, (jval){.t = JV_STR, .s = {p + i, n - i}}));
                break;
            }
            size_t j = i;
            while (j < n && jinja_space_run(p + j, n - j, false) == 0) {
                uint32_t cp;
                int w = utf8_decode(&cp, (const unsigned char *)p + j, n - j);
                j += (size_t)(w < 0 ? -w : w);
            }
            TRY(jv_list_push(c, at, l, (jval){.t = JV_STR, .s = {p + i, j - i}}));
            i = j;
        }
    }
    *out = mklist(l, false);
    return 0;
}

int jv_py_replace(ctx *c, const jnode *at, jval s, jval old, jval rep, int64_t count, jval *out) {
    if (old.t != JV_STR || rep.t != JV_STR)
        return jv_fail(c, at, "replace: arguments must be strings, not %s and %s",
                       jv_type_name(old), jv_type_name(rep));
    jbuf b = {0};
    size_t i = 0, hit;
    int64_t done = 0;
    if (old.s.n == 0) {
        size_t *offs, n;
        if (jv_cp_index(c, at, s.s.p, s.s.n, &offs, &n)) return -1;
        for (size_t k = 0; k <= n; k++) {
            if ((count < 0 || done++ < count) && jv_buf_put(c, at, &b, rep.s.p, rep.s.n)) goto fail;
            if (k < n && jv_buf_put(c, at, &b, s.s.p + offs[k], offs[k + 1] - offs[k])) goto fail;
        }
        return jv_buf_take(c, at, &b, out);
    }
    while ((count < 0 || done < count) && jv_str_find(s.s.p, s.s.n, old.s.p, old.s.n, i, &hit)) {
        if (jv_buf_put(c, at, &b, s.s.p + i, hit - i) || jv_buf_put(c, at, &b, rep.s.p, rep.s.n))
            goto fail;
        i = hit + old.s.n;
        done++;
    }
    if (jv_buf_put(c, at, &b, s.s.p + i, s.s.n - i)) goto fail;
    return jv_buf_take(c, at, &b, out);
fail:
    free(b.p);
    return -1;
}

// The items a for loop (or list(), join, ...) goes through: a list's items, a dict's keys, a
// string's characters; nothing for undefined.
int jv_iter_items(ctx *c, const jnode *at, jval v, const jval **items, size_t *n) {
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
        TRY(jv_cp_index(c, at, v.s.p, v.s.n, &offs, &k));
        jval *out = jv_alloc(c, at, (k ? k : 1) * sizeof *out);
        if (!out) return -1;
        for (size_t i = 0; i < k; i++)
            out[i] = (jval){.t = JV_STR, .s = {v.s.p + offs[i], offs[i + 1] - offs[i]}};
        *items = out, *n = k;
        return 0;
    }
    default:
        return jv_fail(c, at, "'%s' object is not iterable", jv_type_name(v));
    }
}

int jv_py_len(ctx *c, const jnode *at, jval v, int64_t *n) {
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
        return jv_fail(c, at, "object of type '%s' has no len()", jv_type_name(v));
    }
}
