// Tests: `x is name(args)`, one function per family of jinja_names.h's JINJA_TESTS.
#include <assert.h>
#include <stdio.h>

#include "text/jinja_value.h"

// v is the value tested, x the test's argument (undefined when it takes none).
typedef int test_fn(ctx *c, const jnode *at, jinja_test id, const char *what, jval v, jval x,
                    bool *out);

// What v is: no arguments, no errors.
static int test_type(ctx *c, const jnode *at, jinja_test id, const char *what, jval v, jval x,
                     bool *out) {
    (void)c, (void)at, (void)what, (void)x;
    switch (id) {
    case JT_DEFINED:
        *out = v.t != JV_UNDEF;
        break;
    case JT_UNDEFINED:
        *out = v.t == JV_UNDEF;
        break;
    case JT_NONE:
        *out = v.t == JV_NONE;
        break;
    case JT_STRING:
        *out = v.t == JV_STR;
        break;
    case JT_NUMBER:
        *out = is_num(v);
        break;
    case JT_INTEGER:
        *out = v.t == JV_INT;
        break;
    case JT_FLOAT:
        *out = v.t == JV_FLOAT;
        break;
    case JT_BOOLEAN:
        *out = v.t == JV_BOOL;
        break;
    case JT_TRUE:
        *out = v.t == JV_BOOL && v.b;
        break;
    case JT_FALSE:
        *out = v.t == JV_BOOL && !v.b;
        break;
    case JT_MAPPING:
        *out = v.t == JV_DICT;
        break;
    case JT_SEQUENCE:
        *out = v.t == JV_STR || v.t == JV_LIST || v.t == JV_DICT;
        break;
    case JT_ITERABLE:
        *out = v.t == JV_STR || v.t == JV_LIST || v.t == JV_DICT || v.t == JV_UNDEF;
        break;
    default: // JT_CALLABLE
        *out = v.t == JV_MACRO || v.t == JV_FUNC || v.t == JV_METHOD;
        break;
    }
    return 0;
}

// equalto, eq, ==, ne, !=
static int test_eq(ctx *c, const jnode *at, jinja_test id, const char *what, jval v, jval x,
                   bool *out) {
    (void)c, (void)at, (void)what;
    *out = jv_py_eq(v, x) != (id == JT_NE || id == JT_NE_OP);
    return 0;
}

static int test_sameas(ctx *c, const jnode *at, jinja_test id, const char *what, jval v, jval x,
                       bool *out) {
    (void)c, (void)at, (void)id, (void)what;
    *out = (v.t == x.t && (v.t == JV_NONE || v.t == JV_UNDEF || (v.t == JV_BOOL && v.b == x.b))) ||
           (v.t == x.t && v.t != JV_BOOL && v.t != JV_NONE && jv_py_eq(v, x));
    return 0;
}

// odd, even, divisibleby(d)
static int test_divisible(ctx *c, const jnode *at, jinja_test id, const char *what, jval v, jval x,
                          bool *out) {
    int64_t k, d = id == JT_DIVISIBLEBY ? 0 : 2;
    TRY(jv_need_int(c, at, v, what, &k));
    if (!d) TRY(jv_need_int(c, at, x, what, &d));
    if (d == 0) return jv_fail(c, at, "%s: division by zero", what);
    int64_t m = d == -1 ? 0 : k % d;
    *out = id == JT_ODD ? m != 0 : m == 0;
    return 0;
}

static int test_in(ctx *c, const jnode *at, jinja_test id, const char *what, jval v, jval x,
                   bool *out) {
    (void)id, (void)what;
    return jv_py_in(c, at, v, x, out);
}

// lower, upper: Python's str.islower/isupper (a cased character, and no other case).
static int test_case(ctx *c, const jnode *at, jinja_test id, const char *what, jval v, jval x,
                     bool *out) {
    (void)x;
    TRY(jv_need_str(c, at, v, what));
    jval t;
    TRY(jv_change_case(c, at, v, id == JT_LOWER ? CASE_LOWER : CASE_UPPER, &t));
    bool cased = false;
    for (size_t i = 0; i < v.s.n; i++)
        cased |= v.s.p[i] != t.s.p[i] || (unsigned char)v.s.p[i] >= 0x80;
    *out = jv_py_eq(v, t) && cased;
    return 0;
}

#define TEST_ENTRY(id, name, fn, nargs) {fn, nargs},
static const struct {
    test_fn *fn;
    size_t nargs;
} tests[] = {JINJA_TESTS(TEST_ENTRY)};
static_assert(sizeof tests / sizeof *tests == JINJA_N_TESTS, "a test without its function");

int jv_apply_test(ctx *c, const jnode *at, jinja_test id, jval v, const jargs *a, bool *out) {
    char what[64];
    snprintf(what, sizeof what, "test '%s'", jinja_test_names[id]);
    TRY(jv_arg_check(c, at, a, what, tests[id].nargs, NULL));
    return tests[id].fn(c, at, id, what, v, jv_arg_get(a, 0, NULL), out);
}
