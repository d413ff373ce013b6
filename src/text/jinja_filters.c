// Filters: `x | name(args)`, one function per family of jinja_names.h's JINJA_FILTERS.
#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "text/jinja_value.h"

// v is the value filtered; what names the filter for messages ("filter 'join'").
typedef int filter_fn(ctx *c, const jnode *at, jinja_filter id, const char *what, jval v,
                      const jargs *a, jval *out);

static const char *const none[] = {NULL};

static int parse_py_int(jval s, int64_t *out) {
    jval t = jv_py_strip(s, UNDEF, true, true);
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
    jval t = jv_py_strip(s, UNDEF, true, true);
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
    if (is_intlike(path)) return jv_get_item(c, at, v, path, out);
    TRY(jv_need_str(c, at, path, "attribute"));
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
        TRY(jv_get_item(c, at, v, key, &v));
        if (!dot) break;
        p = dot + 1;
    }
    *out = v;
    return 0;
}

static int select_items(ctx *c, const jnode *at, jval v, const jargs *a, bool attr, bool keep,
                        jval *out) {
    const jval *items;
    size_t n;
    TRY(jv_iter_items(c, at, v, &items, &n));
    size_t first = attr ? 1 : 0;
    jval test = jv_arg_get(a, first, NULL);
    if (test.t != JV_UNDEF) TRY(jv_need_str(c, at, test, "select: the test name"));
    int test_id = test.t == JV_STR
                      ? jinja_name_find(jinja_test_names, JINJA_N_TESTS, test.s.p, test.s.n)
                      : -1;
    if (test.t == JV_STR && test_id < 0)
        return jv_fail(c, at, "unsupported test '%.*s'", (int)test.s.n, test.s.p);
    jargs rest = {.pos = a->npos > first + 1 ? a->pos + first + 1 : NULL,
                  .npos = a->npos > first + 1 ? a->npos - first - 1 : 0};
    jlist *l = jv_list_new(c, at, n);
    if (!l) return -1;
    for (size_t i = 0; i < n; i++) {
        jval x = items[i];
        if (attr) TRY(attr_path(c, at, x, jv_arg_get(a, 0, NULL), &x));
        bool ok;
        if (test.t == JV_STR)
            TRY(jv_apply_test(c, at, (jinja_test)test_id, x, &rest, &ok));
        else
            ok = jv_truthy(x);
        if (ok == keep) TRY(jv_list_push(c, at, l, items[i]));
    }
    *out = mklist(l, false);
    return 0;
}

static int filter_tojson(ctx *c, const jnode *at, jinja_filter id, const char *what, jval v,
                         const jargs *a, jval *out) {
    (void)id, (void)what;
    static const char *const names[] = {"indent", "separators", "sort_keys", "ensure_ascii", NULL};
    TRY(jv_arg_check(c, at, a, "tojson", 1, names));
    json_opts o = {.indent = -1, .item_sep = cstr(", "), .key_sep = cstr(": ")};
    jval indent = jv_arg_get(a, 0, "indent"), seps = jv_arg_get(a, 99, "separators");
    if (is_intlike(indent)) {
        int64_t k = as_int(indent);
        o.indent = k < 0 ? 0 : k > 64 ? 64 : (int)k;
        o.item_sep = cstr(",");
    } else if (indent.t != JV_UNDEF && indent.t != JV_NONE) {
        return jv_fail(c, at, "tojson: indent must be an integer, got %s", jv_type_name(indent));
    }
    if (seps.t == JV_LIST && seps.l->n == 2 && seps.l->v[0].t == JV_STR &&
        seps.l->v[1].t == JV_STR) {
        o.item_sep = seps.l->v[0];
        o.key_sep = seps.l->v[1];
    } else if (seps.t != JV_UNDEF && seps.t != JV_NONE) {
        return jv_fail(c, at, "tojson: separators must be two strings");
    }
    if (jv_truthy(jv_arg_get(a, 99, "sort_keys")) || jv_truthy(jv_arg_get(a, 99, "ensure_ascii")))
        return jv_fail(c, at, "tojson: sort_keys and ensure_ascii are not supported");
    jbuf b = {0};
    if (jv_put_json(c, at, &b, v, &o, 0)) {
        free(b.p);
        return -1;
    }
    return jv_buf_take(c, at, &b, out);
}

static int filter_length(ctx *c, const jnode *at, jinja_filter id, const char *what, jval v,
                         const jargs *a, jval *out) {
    (void)id;
    int64_t k = 0;
    TRY(jv_arg_check(c, at, a, what, 0, none));
    TRY(jv_py_len(c, at, v, &k));
    *out = mkint(k);
    return 0;
}

static int filter_safe(ctx *c, const jnode *at, jinja_filter id, const char *what, jval v,
                       const jargs *a, jval *out) {
    (void)c, (void)at, (void)id, (void)what, (void)a;
    *out = v;
    return 0;
}

static int filter_string(ctx *c, const jnode *at, jinja_filter id, const char *what, jval v,
                         const jargs *a, jval *out) {
    (void)id;
    TRY(jv_arg_check(c, at, a, what, 0, none));
    return jv_to_string(c, at, v, out);
}

// trim, upper, lower, title, capitalize
static int filter_text(ctx *c, const jnode *at, jinja_filter id, const char *what, jval v,
                       const jargs *a, jval *out) {
    static const char *const chars[] = {"chars", NULL};
    jval s;
    TRY(jv_arg_check(c, at, a, what, id == JF_TRIM, chars));
    TRY(jv_to_string(c, at, v, &s));
    if (id == JF_TRIM) {
        jval ch = jv_arg_get(a, 0, "chars");
        if (ch.t != JV_UNDEF && ch.t != JV_NONE) TRY(jv_need_str(c, at, ch, what));
        *out = jv_py_strip(s, ch, true, true);
        return 0;
    }
    // Jinja's title, not str.title: see case_op.
    static const case_op cases[JINJA_N_FILTERS] = {[JF_UPPER] = CASE_UPPER,
                                                   [JF_LOWER] = CASE_LOWER,
                                                   [JF_TITLE] = CASE_JINJA_TITLE,
                                                   [JF_CAPITALIZE] = CASE_CAPITALIZE};
    return jv_change_case(c, at, s, cases[id], out);
}

// int, float
static int filter_number(ctx *c, const jnode *at, jinja_filter id, const char *what, jval v,
                         const jargs *a, jval *out) {
    static const char *const names[] = {"default", "base", NULL};
    bool to_int = id == JF_INT;
    TRY(jv_arg_check(c, at, a, what, to_int ? 2 : 1, names));
    jval def = jv_arg_get(a, 0, "default");
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
        if (to_int && parse_py_int(v, &i) == 0)
            d = (double)i;
        else if (parse_py_float(v, &d) == 0) {
            ok = !to_int || (isfinite(d) && fabs(d) < 9.2e18);
            i = ok ? (int64_t)d : 0;
        } else {
            ok = false;
        }
    } else {
        ok = false;
    }
    if (to_int)
        *out = ok ? mkint(i) : def.t != JV_UNDEF ? def : mkint(0);
    else
        *out = ok ? mkfloat(d) : def.t != JV_UNDEF ? def : mkfloat(0);
    return 0;
}

// list, reverse, first, last
static int filter_sequence(ctx *c, const jnode *at, jinja_filter id, const char *what, jval v,
                           const jargs *a, jval *out) {
    TRY(jv_arg_check(c, at, a, what, 0, none));
    if (id == JF_REVERSE && v.t == JV_STR) {
        jval all = mkint(-1);
        return jv_get_slice(c, at, v, UNDEF, UNDEF, all, out);
    }
    const jval *items;
    size_t k;
    TRY(jv_iter_items(c, at, v, &items, &k));
    if (id == JF_FIRST || id == JF_LAST) {
        *out = k == 0 ? UNDEF : items[id == JF_FIRST ? 0 : k - 1];
        return 0;
    }
    jlist *l = jv_list_new(c, at, k);
    if (!l) return -1;
    for (size_t i = 0; i < k; i++)
        TRY(jv_list_push(c, at, l, items[id == JF_LIST ? i : k - 1 - i]));
    *out = mklist(l, false);
    return 0;
}

static int filter_join(ctx *c, const jnode *at, jinja_filter id, const char *what, jval v,
                       const jargs *a, jval *out) {
    (void)id;
    static const char *const names[] = {"d", "attribute", NULL};
    TRY(jv_arg_check(c, at, a, what, 2, names));
    jval sep = jv_arg_get(a, 0, "d"), attr = jv_arg_get(a, 1, "attribute");
    if (sep.t == JV_UNDEF) sep = cstr("");
    TRY(jv_to_string(c, at, sep, &sep));
    const jval *items;
    size_t k;
    TRY(jv_iter_items(c, at, v, &items, &k));
    jbuf b = {0};
    for (size_t i = 0; i < k; i++) {
        jval x = items[i];
        if ((attr.t != JV_UNDEF && attr_path(c, at, x, attr, &x)) ||
            (i && jv_buf_put(c, at, &b, sep.s.p, sep.s.n)) || jv_put_str(c, at, &b, x, false)) {
            free(b.p);
            return -1;
        }
    }
    return jv_buf_take(c, at, &b, out);
}

// default, d
static int filter_default(ctx *c, const jnode *at, jinja_filter id, const char *what, jval v,
                          const jargs *a, jval *out) {
    (void)id;
    static const char *const names[] = {"default_value", "boolean", NULL};
    TRY(jv_arg_check(c, at, a, what, 2, names));
    jval def = jv_arg_get(a, 0, "default_value");
    bool use = v.t == JV_UNDEF || (jv_truthy(jv_arg_get(a, 1, "boolean")) && !jv_truthy(v));
    *out = use ? (def.t == JV_UNDEF ? cstr("") : def) : v;
    return 0;
}

static int filter_items(ctx *c, const jnode *at, jinja_filter id, const char *what, jval v,
                        const jargs *a, jval *out) {
    (void)id;
    TRY(jv_arg_check(c, at, a, what, 0, none));
    if (v.t == JV_UNDEF) {
        jlist *l = jv_list_new(c, at, 1);
        if (!l) return -1;
        *out = mklist(l, false);
        return 0;
    }
    if (v.t != JV_DICT)
        return jv_fail(c, at, "%s: expected a mapping, got %s", what, jv_type_name(v));
    jlist *l = jv_list_new(c, at, v.d->n);
    if (!l) return -1;
    for (size_t i = 0; i < v.d->n; i++) {
        jlist *pair = jv_list_new(c, at, 2);
        if (!pair || jv_list_push(c, at, pair, v.d->k[i]) || jv_list_push(c, at, pair, v.d->v[i]) ||
            jv_list_push(c, at, l, mklist(pair, true)))
            return -1;
    }
    *out = mklist(l, false);
    return 0;
}

static int filter_replace(ctx *c, const jnode *at, jinja_filter id, const char *what, jval v,
                          const jargs *a, jval *out) {
    (void)id;
    static const char *const names[] = {"old", "new", "count", NULL};
    TRY(jv_arg_check(c, at, a, what, 3, names));
    jval cnt = jv_arg_get(a, 2, "count"), s;
    int64_t k = -1;
    if (cnt.t != JV_UNDEF && cnt.t != JV_NONE) TRY(jv_need_int(c, at, cnt, what, &k));
    TRY(jv_to_string(c, at, v, &s));
    return jv_py_replace(c, at, s, jv_arg_get(a, 0, "old"), jv_arg_get(a, 1, "new"), k, out);
}

static int filter_map(ctx *c, const jnode *at, jinja_filter id, const char *what, jval v,
                      const jargs *a, jval *out) {
    (void)id;
    const jval *items;
    size_t k;
    TRY(jv_iter_items(c, at, v, &items, &k));
    jval attr = jv_arg_get(a, 99, "attribute"), def = jv_arg_get(a, 99, "default");
    jval fname = jv_arg_get(a, 0, NULL);
    int filter = -1;
    if (attr.t == JV_UNDEF) {
        TRY(jv_need_str(c, at, fname, "map: the filter name"));
        filter = jinja_name_find(jinja_filter_names, JINJA_N_FILTERS, fname.s.p, fname.s.n);
        if (filter < 0)
            return jv_fail(c, at, "unsupported filter '%.*s'", (int)fname.s.n, fname.s.p);
    } else {
        static const char *const names[] = {"attribute", "default", NULL};
        TRY(jv_arg_check(c, at, a, what, 0, names));
    }
    jargs rest = *a;
    if (rest.npos) rest.pos++, rest.npos--;
    jlist *l = jv_list_new(c, at, k);
    if (!l) return -1;
    for (size_t i = 0; i < k; i++) {
        jval x;
        if (attr.t != JV_UNDEF) {
            TRY(attr_path(c, at, items[i], attr, &x));
            if (x.t == JV_UNDEF && def.t != JV_UNDEF) x = def;
        } else {
            TRY(jv_apply_filter(c, at, (jinja_filter)filter, items[i], &rest, &x));
        }
        TRY(jv_list_push(c, at, l, x));
    }
    *out = mklist(l, false);
    return 0;
}

// select, reject, selectattr, rejectattr
static int filter_select(ctx *c, const jnode *at, jinja_filter id, const char *what, jval v,
                         const jargs *a, jval *out) {
    TRY(jv_arg_check(c, at, a, what, 8, none));
    return select_items(c, at, v, a, id == JF_SELECTATTR || id == JF_REJECTATTR,
                        id == JF_SELECT || id == JF_SELECTATTR, out);
}

static int filter_abs(ctx *c, const jnode *at, jinja_filter id, const char *what, jval v,
                      const jargs *a, jval *out) {
    (void)id;
    TRY(jv_arg_check(c, at, a, what, 0, none));
    if (is_intlike(v)) {
        if (as_int(v) == INT64_MIN) return jv_fail(c, at, "integer overflow in abs");
        *out = mkint(as_int(v) < 0 ? -as_int(v) : as_int(v));
    } else if (v.t == JV_FLOAT) {
        *out = mkfloat(fabs(v.f));
    } else {
        return jv_fail(c, at, "bad operand type for abs(): '%s'", jv_type_name(v));
    }
    return 0;
}

#define FILTER_FN(id, name, fn) fn,
static filter_fn *const filters[] = {JINJA_FILTERS(FILTER_FN)};
static_assert(sizeof filters / sizeof *filters == JINJA_N_FILTERS, "a filter without its function");

int jv_apply_filter(ctx *c, const jnode *at, jinja_filter id, jval v, const jargs *a, jval *out) {
    char what[64];
    snprintf(what, sizeof what, "filter '%s'", jinja_filter_names[id]);
    return filters[id](c, at, id, what, v, a, out);
}
