// Attributes, items and slices: obj.name, obj[key], obj[a:b:c].
#include <stdio.h>
#include <stdlib.h>

#include "text/jinja_value.h"

// Python's methods that templates do not get: calling one is an error that names it.
static const char *const str_other[] = {
    "format",       "find",       "rfind",      "index",     "rindex",   "count",    "join",
    "rsplit",       "splitlines", "isdigit",    "isalpha",   "isalnum",  "isspace",  "isupper",
    "islower",      "istitle",    "isnumeric",  "isdecimal", "zfill",    "center",   "ljust",
    "rjust",        "partition",  "rpartition", "encode",    "casefold", "swapcase", "removeprefix",
    "removesuffix", "expandtabs", "format_map", NULL};
static const char *const dict_other[] = {"pop",   "update",  "copy",     "setdefault",
                                         "clear", "popitem", "fromkeys", NULL};
static const char *const list_other[] = {"append", "pop",     "extend", "insert", "remove", "index",
                                         "count",  "reverse", "sort",   "copy",   "clear",  NULL};

static bool name_in(const char *const *list, const char *s, size_t n) {
    for (; *list; list++)
        if (strlen(*list) == n && memcmp(*list, s, n) == 0) return true;
    return false;
}

// id: the jinja_method, or -1 for a Python method that is not supported.
static int mkmethod(ctx *c, const jnode *at, jval self, const char *name, size_t n, int id,
                    jval *out) {
    jmethod *m = jv_alloc(c, at, sizeof *m);
    if (!m) return -1;
    *m = (jmethod){self, name, n, id};
    *out = (jval){.t = JV_METHOD, .bm = m};
    return 0;
}

static jval undef_attr(const char *name, size_t n) {
    return (jval){.t = JV_UNDEF, .flag = 1, .s = {name, n}};
}

static int loop_attr(ctx *c, const jnode *at, const jloop *lp, const char *s, size_t n, jval *out) {
    jval self = {.t = JV_LOOP, .lp = (jloop *)lp};
    int method = jv_method_find(JV_LOOP, s, n);
    if (method >= 0) return mkmethod(c, at, self, s, n, method, out);
    size_t i = lp->index0, len = lp->length;
    switch (jinja_name_find(jinja_loop_field_names, JINJA_N_LOOP_FIELDS, s, n)) {
    case JL_INDEX:
        *out = mkint((int64_t)i + 1);
        break;
    case JL_INDEX0:
        *out = mkint((int64_t)i);
        break;
    case JL_REVINDEX:
        *out = mkint((int64_t)(len - i));
        break;
    case JL_REVINDEX0:
        *out = mkint((int64_t)(len - i - 1));
        break;
    case JL_FIRST:
        *out = mkbool(i == 0);
        break;
    case JL_LAST:
        *out = mkbool(i + 1 == len);
        break;
    case JL_LENGTH:
        *out = mkint((int64_t)len);
        break;
    case JL_DEPTH:
        *out = mkint(1);
        break;
    case JL_DEPTH0:
        *out = mkint(0);
        break;
    case JL_PREVITEM:
        *out = i > 0 ? lp->items[i - 1] : undef_attr(s, n);
        break;
    case JL_NEXTITEM:
        *out = i + 1 < len ? lp->items[i + 1] : undef_attr(s, n);
        break;
    default:
        *out = undef_attr(s, n);
        break;
    }
    return 0;
}

// obj.name: Python's attribute first (methods), then the item, as Jinja2's getattr does.
int jv_get_attr(ctx *c, const jnode *at, jval obj, const char *s, size_t n, jval *out) {
    switch (obj.t) {
    case JV_UNDEF:
        return jv_undefined_error(c, at, obj);
    case JV_STR:
    case JV_DICT: {
        int method = jv_method_find(obj.t, s, n);
        if (method >= 0 || name_in(obj.t == JV_STR ? str_other : dict_other, s, n))
            return mkmethod(c, at, obj, s, n, method, out);
        if (obj.t == JV_STR) break;
    }
        /* fall through */
    case JV_NS: {
        jval *v = jv_dict_find_str(obj.d, s, n);
        *out = v ? *v : undef_attr(s, n);
        return 0;
    }
    case JV_LIST:
        if (name_in(list_other, s, n)) return mkmethod(c, at, obj, s, n, -1, out);
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
        return jv_fail(c, at, "slice indices must be integers or None, not %s", jv_type_name(v));
    *out = as_int(v);
    return 0;
}

int jv_get_slice(ctx *c, const jnode *at, jval obj, jval lo, jval hi, jval st, jval *out) {
    if (obj.t == JV_UNDEF) return jv_undefined_error(c, at, obj);
    if (obj.t != JV_STR && obj.t != JV_LIST)
        return jv_fail(c, at, "'%s' object is not subscriptable with a slice", jv_type_name(obj));
    size_t *offs = NULL, n;
    if (obj.t == JV_STR)
        TRY(jv_cp_index(c, at, obj.s.p, obj.s.n, &offs, &n));
    else
        n = obj.l->n;
    int64_t len = (int64_t)n, start = 0, stop = 0, step = 1;
    bool gs, ge, gt;
    TRY(slice_bound(c, at, st, &gt, &step));
    TRY(slice_bound(c, at, lo, &gs, &start));
    TRY(slice_bound(c, at, hi, &ge, &stop));
    if (step == 0) return jv_fail(c, at, "slice step cannot be zero");
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
    jlist *l = obj.t == JV_LIST ? jv_list_new(c, at, 4) : NULL;
    jbuf b = {0};
    if (obj.t == JV_LIST && !l) return -1;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        int rc = l ? jv_list_push(c, at, l, obj.l->v[i])
                   : jv_buf_put(c, at, &b, obj.s.p + offs[i], offs[i + 1] - offs[i]);
        if (rc) {
            free(b.p);
            return -1;
        }
    }
    if (l) {
        *out = mklist(l, obj.flag);
        return 0;
    }
    return jv_buf_take(c, at, &b, out);
}

// obj[key]: the item, then (for a string key) the attribute, else undefined.
int jv_get_item(ctx *c, const jnode *at, jval obj, jval key, jval *out) {
    if (obj.t == JV_UNDEF) return jv_undefined_error(c, at, obj);
    if ((obj.t == JV_LIST || obj.t == JV_STR) && is_intlike(key)) {
        int64_t i = as_int(key);
        if (obj.t == JV_LIST) {
            int64_t n = (int64_t)obj.l->n;
            if (i < 0) i += n;
            *out = i >= 0 && i < n ? obj.l->v[i] : UNDEF;
            return 0;
        }
        size_t *offs, n;
        TRY(jv_cp_index(c, at, obj.s.p, obj.s.n, &offs, &n));
        if (i < 0) i += (int64_t)n;
        *out = i >= 0 && i < (int64_t)n
                   ? (jval){.t = JV_STR, .s = {obj.s.p + offs[i], offs[i + 1] - offs[i]}}
                   : UNDEF;
        return 0;
    }
    if (obj.t == JV_DICT || obj.t == JV_NS) {
        jval *v = jv_dict_find(obj.d, key);
        if (v) {
            *out = *v;
            return 0;
        }
    }
    if (key.t == JV_STR) {
        TRY(jv_get_attr(c, at, obj, key.s.p, key.s.n, out));
        return 0;
    }
    *out = UNDEF;
    return 0;
}
