// The methods of str, dict and loop, and the globals (range, namespace, dict, raise_exception,
// strftime_now): jinja_names.h's JINJA_METHODS and JINJA_GLOBALS, one function per family.
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "text/jinja_value.h"

static const char *const none[] = {NULL};

// self is the value the method belongs to; what names it for messages ("str.split()").
typedef int method_fn(ctx *c, const jnode *at, jinja_method id, const char *what, jval self,
                      const jargs *a, jval *out);

// loop.cycle(a, b, ...)
static int method_cycle(ctx *c, const jnode *at, jinja_method id, const char *what, jval self,
                        const jargs *a, jval *out) {
    (void)id;
    TRY(jv_arg_check(c, at, a, what, SIZE_MAX, none));
    if (!a->npos) return jv_fail(c, at, "%s: no items to cycle through", what);
    *out = a->pos[self.lp->index0 % a->npos];
    return 0;
}

static int method_get(ctx *c, const jnode *at, jinja_method id, const char *what, jval self,
                      const jargs *a, jval *out) {
    (void)id;
    TRY(jv_arg_check(c, at, a, what, 2, none));
    jval *v = jv_dict_find(self.d, jv_arg_get(a, 0, NULL));
    jval def = jv_arg_get(a, 1, NULL);
    *out = v ? *v : def.t == JV_UNDEF ? NONE : def;
    return 0;
}

// items, keys, values
static int method_dict_list(ctx *c, const jnode *at, jinja_method id, const char *what, jval self,
                            const jargs *a, jval *out) {
    TRY(jv_arg_check(c, at, a, what, 0, none));
    if (id == JM_ITEMS) return jv_apply_filter(c, at, JF_ITEMS, self, a, out);
    jlist *l = jv_list_new(c, at, self.d->n);
    if (!l) return -1;
    for (size_t i = 0; i < self.d->n; i++)
        TRY(jv_list_push(c, at, l, id == JM_KEYS ? self.d->k[i] : self.d->v[i]));
    *out = mklist(l, false);
    return 0;
}

// startswith, endswith: a string or a tuple of them
static int method_affix(ctx *c, const jnode *at, jinja_method id, const char *what, jval self,
                        const jargs *a, jval *out) {
    TRY(jv_arg_check(c, at, a, what, 1, none));
    jval p = jv_arg_get(a, 0, NULL);
    const jval *cands = &p;
    size_t k = 1;
    if (p.t == JV_LIST && p.flag) cands = p.l->v, k = p.l->n;
    bool r = false;
    for (size_t i = 0; i < k; i++) {
        TRY(jv_need_str(c, at, cands[i], what));
        size_t pn = cands[i].s.n;
        if (pn <= self.s.n &&
            memcmp(self.s.p + (id == JM_STARTSWITH ? 0 : self.s.n - pn), cands[i].s.p, pn) == 0)
            r = true;
    }
    *out = mkbool(r);
    return 0;
}

static int method_split(ctx *c, const jnode *at, jinja_method id, const char *what, jval self,
                        const jargs *a, jval *out) {
    (void)id;
    static const char *const names[] = {"sep", "maxsplit", NULL};
    TRY(jv_arg_check(c, at, a, what, 2, names));
    jval sep = jv_arg_get(a, 0, "sep"), ms = jv_arg_get(a, 1, "maxsplit");
    int64_t k = -1;
    if (ms.t != JV_UNDEF) TRY(jv_need_int(c, at, ms, what, &k));
    if (sep.t != JV_UNDEF && sep.t != JV_NONE) TRY(jv_need_str(c, at, sep, what));
    return jv_py_split(c, at, self, sep, k, out);
}

// strip, lstrip, rstrip
static int method_strip(ctx *c, const jnode *at, jinja_method id, const char *what, jval self,
                        const jargs *a, jval *out) {
    static const char *const names[] = {"chars", NULL};
    TRY(jv_arg_check(c, at, a, what, 1, names));
    jval ch = jv_arg_get(a, 0, "chars");
    if (ch.t != JV_UNDEF && ch.t != JV_NONE) TRY(jv_need_str(c, at, ch, what));
    *out = jv_py_strip(self, ch, id != JM_RSTRIP, id != JM_LSTRIP);
    return 0;
}

// upper, lower, title, capitalize
static int method_case(ctx *c, const jnode *at, jinja_method id, const char *what, jval self,
                       const jargs *a, jval *out) {
    static const case_op cases[JINJA_N_METHODS] = {[JM_UPPER] = CASE_UPPER,
                                                   [JM_LOWER] = CASE_LOWER,
                                                   [JM_TITLE] = CASE_TITLE,
                                                   [JM_CAPITALIZE] = CASE_CAPITALIZE};
    TRY(jv_arg_check(c, at, a, what, 0, none));
    return jv_change_case(c, at, self, cases[id], out);
}

static int method_replace(ctx *c, const jnode *at, jinja_method id, const char *what, jval self,
                          const jargs *a, jval *out) {
    (void)id;
    static const char *const names[] = {"count", NULL};
    TRY(jv_arg_check(c, at, a, what, 3, names));
    jval cnt = jv_arg_get(a, 2, "count");
    int64_t k = -1;
    if (cnt.t != JV_UNDEF) TRY(jv_need_int(c, at, cnt, what, &k));
    return jv_py_replace(c, at, self, jv_arg_get(a, 0, NULL), jv_arg_get(a, 1, NULL), k, out);
}

#define METHOD_ENTRY(id, type, name, fn) {type, fn},
static const struct {
    jtype type;
    method_fn *fn;
} methods[] = {JINJA_METHODS(METHOD_ENTRY)};
static_assert(sizeof methods / sizeof *methods == JINJA_N_METHODS, "a method without its function");

int jv_method_find(jtype type, const char *s, size_t n) {
    for (int i = 0; i < JINJA_N_METHODS; i++)
        if (methods[i].type == type && strlen(jinja_method_names[i]) == n &&
            memcmp(jinja_method_names[i], s, n) == 0)
            return i;
    return -1;
}

int jv_call_method(ctx *c, const jnode *at, const jmethod *m, const jargs *a, jval *out) {
    char what[64];
    snprintf(what, sizeof what, "%s.%.*s()", jv_type_name(m->self), (int)m->n, m->name);
    if (m->id < 0) return jv_fail(c, at, "unsupported method %s", what);
    return methods[m->id].fn(c, at, (jinja_method)m->id, what, m->self, a, out);
}

// ---- globals: what names the call for messages ("range()")

typedef int global_fn(ctx *c, const jnode *at, jinja_global id, const char *what, const jargs *a,
                      jval *out);

static int global_raise_exception(ctx *c, const jnode *at, jinja_global id, const char *what,
                                  const jargs *a, jval *out) {
    (void)id, (void)out;
    TRY(jv_arg_check(c, at, a, what, 1, none));
    jval msg;
    TRY(jv_to_string(c, at, jv_arg_get(a, 0, NULL), &msg));
    return jv_fail(c, at, "raise_exception: %.*s", (int)(msg.s.n > 2000 ? 2000 : msg.s.n), msg.s.p);
}

static int global_strftime_now(ctx *c, const jnode *at, jinja_global id, const char *what,
                               const jargs *a, jval *out) {
    (void)id;
    TRY(jv_arg_check(c, at, a, what, 1, none));
    jval fmt = jv_arg_get(a, 0, NULL);
    TRY(jv_need_str(c, at, fmt, what));
    char pat[256], res[512];
    if (fmt.s.n >= sizeof pat) return jv_fail(c, at, "%s: the format is too long", what);
    memcpy(pat, fmt.s.p, fmt.s.n);
    pat[fmt.s.n] = 0;
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    size_t k = strftime(res, sizeof res, pat, &tm);
    return jv_mkstr(c, at, res, k, out);
}

static int global_range(ctx *c, const jnode *at, jinja_global id, const char *what, const jargs *a,
                        jval *out) {
    (void)id;
    TRY(jv_arg_check(c, at, a, what, 3, none));
    int64_t v[3] = {0, 0, 1};
    if (a->npos == 0) return jv_fail(c, at, "range expected at least 1 argument, got 0");
    for (size_t i = 0; i < a->npos; i++) TRY(jv_need_int(c, at, a->pos[i], what, &v[i]));
    int64_t start = a->npos == 1 ? 0 : v[0], stop = a->npos == 1 ? v[0] : v[1], step = v[2];
    if (step == 0) return jv_fail(c, at, "range() arg 3 must not be zero");
    jlist *l = jv_list_new(c, at, 4);
    if (!l) return -1;
    for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
        if (++c->steps > c->t->limits.max_steps)
            return jv_fail(c, at, "more than %zu loop iterations and calls (the limit)",
                           c->t->limits.max_steps);
        TRY(jv_list_push(c, at, l, mkint(i)));
        if (__builtin_add_overflow(i, step, &i)) break;
    }
    *out = mklist(l, false);
    return 0;
}

// namespace(...) and dict(...): a mapping from an optional mapping and keyword arguments
static int global_mapping(ctx *c, const jnode *at, jinja_global id, const char *what,
                          const jargs *a, jval *out) {
    if (a->npos > 1)
        return jv_fail(c, at, "%s takes at most 1 positional argument, got %zu", what, a->npos);
    jdict *d = jv_dict_new(c, at);
    if (!d) return -1;
    jval init = jv_arg_get(a, 0, NULL);
    if (init.t == JV_DICT || init.t == JV_NS) {
        for (size_t i = 0; i < init.d->n; i++)
            TRY(jv_dict_set(c, at, d, init.d->k[i], init.d->v[i]));
    } else if (init.t != JV_UNDEF) {
        return jv_fail(c, at, "%s: expected a mapping, got %s", what, jv_type_name(init));
    }
    for (size_t i = 0; i < a->nkw; i++)
        TRY(jv_dict_set(c, at, d, (jval){.t = JV_STR, .s = {a->kn[i], a->kl[i]}}, a->kv[i]));
    *out = (jval){.t = id == JG_DICT ? JV_DICT : JV_NS, .d = d};
    return 0;
}

#define GLOBAL_FN(id, name, fn) fn,
static global_fn *const globals[] = {JINJA_GLOBALS(GLOBAL_FN)};
static_assert(sizeof globals / sizeof *globals == JINJA_N_GLOBALS, "a global without its function");

// f is a JV_FUNC: its name is a global's (eval gives no other).
int jv_call_global(ctx *c, const jnode *at, jval f, const jargs *a, jval *out) {
    char what[64];
    snprintf(what, sizeof what, "%.*s()", (int)f.s.n, f.s.p);
    int id = jinja_name_find(jinja_global_names, JINJA_N_GLOBALS, f.s.p, f.s.n);
    if (id < 0) return jv_fail(c, at, "'%.*s' is undefined", (int)f.s.n, f.s.p);
    return globals[id](c, at, (jinja_global)id, what, a, out);
}
