// Values: allocation, output buffers, lists and dicts, conversion from cJSON, truth, equality and
// order, and the arguments of a call.
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/grow.h"
#include "text/jinja_value.h"

int jv_fail(ctx *c, const jnode *at, const char *fmt, ...) {
    char msg[3000];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return jinja_fail_at(c->t, at ? at->pos : 0, c->err, "%s", msg);
}

void *jv_alloc(ctx *c, const jnode *at, size_t n) {
    void *p = ja_alloc(&c->ar, n);
    if (!p)
        jv_fail(c, at, "the template made more than %zu MiB of values (the limit)",
                c->t->limits.max_memory >> 20);
    return p;
}

int jv_mkstr(ctx *c, const jnode *at, const char *p, size_t n, jval *out) {
    char *s = jv_alloc(c, at, n + 1);
    if (!s) return -1;
    if (n) memcpy(s, p, n);
    *out = (jval){.t = JV_STR, .s = {s, n}};
    return 0;
}

// ---- buffers

int jv_buf_put(ctx *c, const jnode *at, jbuf *b, const char *p, size_t n) {
    if (n > c->t->limits.max_output - b->n)
        return jv_fail(c, at, "the output passed %zu MiB (the limit)",
                       c->t->limits.max_output >> 20);
    if (grow_to((void **)&b->p, &b->cap, b->n + n + 1, 1) != 0)
        return jv_fail(c, at, "out of memory for %zu bytes of output", b->n + n + 1);
    if (n) memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}
int jv_buf_puts(ctx *c, const jnode *at, jbuf *b, const char *s) {
    return jv_buf_put(c, at, b, s, strlen(s));
}

// Moves b into an arena string and frees it.
int jv_buf_take(ctx *c, const jnode *at, jbuf *b, jval *out) {
    int rc = jv_mkstr(c, at, b->p ? b->p : "", b->n, out);
    free(b->p);
    *b = (jbuf){0};
    return rc;
}

// ---- lists and dicts

jlist *jv_list_new(ctx *c, const jnode *at, size_t cap) {
    jlist *l = jv_alloc(c, at, sizeof *l);
    if (!l) return NULL;
    l->cap = cap ? cap : 4;
    if (!(l->v = jv_alloc(c, at, l->cap * sizeof *l->v))) return NULL;
    return l;
}

int jv_list_push(ctx *c, const jnode *at, jlist *l, jval v) {
    if (l->n == l->cap) {
        jval *p = jv_alloc(c, at, 2 * l->cap * sizeof *p);
        if (!p) return -1;
        memcpy(p, l->v, l->n * sizeof *p);
        l->v = p;
        l->cap *= 2;
    }
    l->v[l->n++] = v;
    return 0;
}

jdict *jv_dict_new(ctx *c, const jnode *at) {
    jdict *d = jv_alloc(c, at, sizeof *d);
    return d;
}

jval *jv_dict_find(const jdict *d, jval key) {
    for (size_t i = 0; i < d->n; i++)
        if (jv_py_eq(d->k[i], key)) return &d->v[i];
    return NULL;
}

jval *jv_dict_find_str(const jdict *d, const char *s, size_t n) {
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].t == JV_STR && d->k[i].s.n == n && memcmp(d->k[i].s.p, s, n) == 0)
            return &d->v[i];
    return NULL;
}

int jv_dict_set(ctx *c, const jnode *at, jdict *d, jval key, jval v) {
    jval *slot = jv_dict_find(d, key);
    if (slot) {
        *slot = v;
        return 0;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? 2 * d->cap : 4;
        jval *k = jv_alloc(c, at, cap * sizeof *k), *vv = jv_alloc(c, at, cap * sizeof *vv);
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

// ---- conversions from cJSON

int jv_from_json(ctx *c, const cJSON *j, jval *out, int level) {
    if (level > 1000) return jv_fail(c, NULL, "the variables nest deeper than 1000");
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
        jlist *l = jv_list_new(c, NULL, (size_t)cJSON_GetArraySize(j));
        if (!l) return -1;
        const cJSON *e;
        cJSON_ArrayForEach(e, j) {
            jval v;
            TRY(jv_from_json(c, e, &v, level + 1));
            TRY(jv_list_push(c, NULL, l, v));
        }
        *out = mklist(l, false);
    } else if (cJSON_IsObject(j)) {
        jdict *d = jv_dict_new(c, NULL);
        if (!d) return -1;
        const cJSON *e;
        cJSON_ArrayForEach(e, j) {
            jval v;
            TRY(jv_from_json(c, e, &v, level + 1));
            TRY(jv_dict_set(c, NULL, d, cstr(e->string ? e->string : ""), v));
        }
        *out = (jval){.t = JV_DICT, .d = d};
    } else {
        *out = UNDEF;
    }
    return 0;
}

// ---- truth, equality, order

bool jv_truthy(jval v) {
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

bool jv_py_eq(jval a, jval b) {
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
            if (!jv_py_eq(a.l->v[i], b.l->v[i])) return false;
        return true;
    case JV_DICT:
        if (a.d->n != b.d->n) return false;
        for (size_t i = 0; i < a.d->n; i++) {
            jval *o = jv_dict_find(b.d, a.d->k[i]);
            if (!o || !jv_py_eq(a.d->v[i], *o)) return false;
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

int jv_undefined_error(ctx *c, const jnode *at, jval v) {
    if (v.flag) return jv_fail(c, at, "no attribute or item '%.*s' (undefined)", (int)v.s.n, v.s.p);
    return jv_fail(c, at, "'%.*s' is undefined", (int)v.s.n, v.s.p);
}

// Python's a < b (and the others) as -1/0/1 in *r; a TypeError between unordered types.
int jv_py_cmp(ctx *c, const jnode *at, jval a, jval b, const char *op, int *r) {
    if (a.t == JV_UNDEF) return jv_undefined_error(c, at, a);
    if (b.t == JV_UNDEF) return jv_undefined_error(c, at, b);
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
            if (jv_py_eq(a.l->v[i], b.l->v[i])) continue;
            return jv_py_cmp(c, at, a.l->v[i], b.l->v[i], op, r);
        }
        *r = (a.l->n > b.l->n) - (a.l->n < b.l->n);
        return 0;
    }
    return jv_fail(c, at, "'%s' not supported between instances of '%s' and '%s'", op,
                   jv_type_name(a), jv_type_name(b));
}

bool jv_str_find(const char *h, size_t hn, const char *nd, size_t nn, size_t from, size_t *at) {
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

int jv_py_in(ctx *c, const jnode *at, jval x, jval seq, bool *r) {
    size_t pos;
    switch (seq.t) {
    case JV_UNDEF:
        *r = false;
        return 0;
    case JV_STR:
        if (x.t != JV_STR)
            return jv_fail(c, at, "'in <string>' requires string as left operand, not %s",
                           jv_type_name(x));
        *r = jv_str_find(seq.s.p, seq.s.n, x.s.p, x.s.n, 0, &pos);
        return 0;
    case JV_LIST:
        *r = false;
        for (size_t i = 0; i < seq.l->n && !*r; i++) *r = jv_py_eq(x, seq.l->v[i]);
        return 0;
    case JV_DICT:
    case JV_NS:
        *r = jv_dict_find(seq.d, x) != NULL;
        return 0;
    default:
        return jv_fail(c, at, "argument of type '%s' is not iterable", jv_type_name(seq));
    }
}

// ---- arguments

jval jv_arg_get(const jargs *a, size_t idx, const char *name) {
    if (idx < a->npos) return a->pos[idx];
    for (size_t i = 0; name && i < a->nkw; i++)
        if (a->kl[i] == strlen(name) && memcmp(a->kn[i], name, a->kl[i]) == 0) return a->kv[i];
    return UNDEF;
}

// At most maxpos positional arguments, and keywords only from names (a NULL-ended list).
int jv_arg_check(ctx *c, const jnode *at, const jargs *a, const char *what, size_t maxpos,
                 const char *const *names) {
    if (a->npos > maxpos)
        return jv_fail(c, at, "%s takes at most %zu positional argument%s, got %zu", what, maxpos,
                       maxpos == 1 ? "" : "s", a->npos);
    for (size_t i = 0; i < a->nkw; i++) {
        bool ok = false;
        for (size_t k = 0; names && names[k]; k++) {
            if (a->kl[i] == strlen(names[k]) && memcmp(a->kn[i], names[k], a->kl[i]) == 0) {
                ok = true;
                if (k < a->npos)
                    return jv_fail(c, at, "%s got argument '%s' twice", what, names[k]);
            }
        }
        if (!ok)
            return jv_fail(c, at, "%s got an unexpected keyword argument '%.*s'", what,
                           (int)a->kl[i], a->kn[i]);
    }
    return 0;
}

int jv_need_str(ctx *c, const jnode *at, jval v, const char *what) {
    if (v.t == JV_STR) return 0;
    if (v.t == JV_UNDEF) return jv_undefined_error(c, at, v);
    return jv_fail(c, at, "%s: expected a string, got %s", what, jv_type_name(v));
}

int jv_need_int(ctx *c, const jnode *at, jval v, const char *what, int64_t *out) {
    if (!is_intlike(v))
        return jv_fail(c, at, "%s: expected an integer, got %s", what, jv_type_name(v));
    *out = as_int(v);
    return 0;
}
