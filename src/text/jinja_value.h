// The evaluator's values and the helpers its files share (jinja_value.c, jinja_repr.c,
// jinja_strings.c, jinja_access.c, jinja_arith.c, jinja_tests.c, jinja_filters.c,
// jinja_methods.c, jinja_eval.c): Python's semantics for the values a chat template meets
// (jinja.h). Values live in an arena freed when jinja_render returns.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cjson/cJSON.h>

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
    int id; // its jinja_method; -1: a Python method that is not supported
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

// tojson's options (jv_put_json).
typedef struct {
    int indent; // -1: none
    jval item_sep, key_sep;
} json_opts;

// The case mappings of jv_change_case: str.upper/lower/capitalize/title, and Jinja's title
// filter (a word starts only after whitespace or one of - ( { [ <, not after any uncased
// character as in str.title).
typedef enum { CASE_UPPER, CASE_LOWER, CASE_CAPITALIZE, CASE_TITLE, CASE_JINJA_TITLE } case_op;

static inline jval mkbool(bool b) {
    return (jval){.t = JV_BOOL, .b = b};
}
static inline jval mkint(int64_t i) {
    return (jval){.t = JV_INT, .i = i};
}
static inline jval mkfloat(double f) {
    return (jval){.t = JV_FLOAT, .f = f};
}
static inline jval cstr(const char *s) {
    return (jval){.t = JV_STR, .s = {s, strlen(s)}};
}
static inline bool is_num(jval v) {
    return v.t == JV_BOOL || v.t == JV_INT || v.t == JV_FLOAT;
}
static inline bool is_intlike(jval v) {
    return v.t == JV_BOOL || v.t == JV_INT;
}
static inline int64_t as_int(jval v) {
    return v.t == JV_BOOL ? v.b : v.i;
}
static inline double as_double(jval v) {
    return v.t == JV_FLOAT ? v.f : (double)as_int(v);
}
static inline jval mklist(jlist *l, bool tuple) {
    return (jval){.t = JV_LIST, .flag = tuple, .l = l};
}

// "name:LINE:COL: " + the message (jinja_fail_at) into the render's error; returns -1.
int jv_fail(ctx *c, const jnode *at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

// jinja_value.c
void *jv_alloc(ctx *c, const jnode *at, size_t n);
int jv_mkstr(ctx *c, const jnode *at, const char *p, size_t n, jval *out);
int jv_buf_put(ctx *c, const jnode *at, jbuf *b, const char *p, size_t n);
int jv_buf_puts(ctx *c, const jnode *at, jbuf *b, const char *s);
int jv_buf_take(ctx *c, const jnode *at, jbuf *b, jval *out);
jlist *jv_list_new(ctx *c, const jnode *at, size_t cap);
int jv_list_push(ctx *c, const jnode *at, jlist *l, jval v);
jdict *jv_dict_new(ctx *c, const jnode *at);
jval *jv_dict_find(const jdict *d, jval key);
jval *jv_dict_find_str(const jdict *d, const char *s, size_t n);
int jv_dict_set(ctx *c, const jnode *at, jdict *d, jval key, jval v);
int jv_from_json(ctx *c, const cJSON *j, jval *out, int level);
bool jv_truthy(jval v);
bool jv_py_eq(jval a, jval b);
int jv_undefined_error(ctx *c, const jnode *at, jval v);
int jv_py_cmp(ctx *c, const jnode *at, jval a, jval b, const char *op, int *r);
bool jv_str_find(const char *h, size_t hn, const char *nd, size_t nn, size_t from, size_t *at);
int jv_py_in(ctx *c, const jnode *at, jval x, jval seq, bool *r);
jval jv_arg_get(const jargs *a, size_t idx, const char *name);
int jv_arg_check(ctx *c, const jnode *at, const jargs *a, const char *what, size_t maxpos,
                 const char *const *names);
int jv_need_str(ctx *c, const jnode *at, jval v, const char *what);
int jv_need_int(ctx *c, const jnode *at, jval v, const char *what, int64_t *out);

// jinja_repr.c
const char *jv_type_name(jval v);
int jv_put_str(ctx *c, const jnode *at, jbuf *b, jval v, bool repr);
int jv_to_string(ctx *c, const jnode *at, jval v, jval *out);
int jv_put_json(ctx *c, const jnode *at, jbuf *b, jval v, const json_opts *o, int level);

// jinja_strings.c
int jv_cp_index(ctx *c, const jnode *at, const char *s, size_t len, size_t **offs, size_t *n);
int jv_change_case(ctx *c, const jnode *at, jval s, case_op op, jval *out);
jval jv_py_strip(jval s, jval chars, bool left, bool right);
int jv_py_split(ctx *c, const jnode *at, jval s, jval sep, int64_t maxsplit, jval *out);
int jv_py_replace(ctx *c, const jnode *at, jval s, jval old, jval rep, int64_t count, jval *out);
int jv_iter_items(ctx *c, const jnode *at, jval v, const jval **items, size_t *n);
int jv_py_len(ctx *c, const jnode *at, jval v, int64_t *n);

// jinja_access.c
int jv_get_attr(ctx *c, const jnode *at, jval obj, const char *s, size_t n, jval *out);
int jv_get_slice(ctx *c, const jnode *at, jval obj, jval lo, jval hi, jval st, jval *out);
int jv_get_item(ctx *c, const jnode *at, jval obj, jval key, jval *out);

// jinja_arith.c
int jv_arith(ctx *c, const jnode *at, int op, jval a, jval b, jval *out);

// jinja_tests.c
int jv_apply_test(ctx *c, const jnode *at, jinja_test id, jval v, const jargs *a, bool *out);

// jinja_filters.c
int jv_apply_filter(ctx *c, const jnode *at, jinja_filter id, jval v, const jargs *a, jval *out);

// jinja_methods.c
int jv_call_method(ctx *c, const jnode *at, const jmethod *m, const jargs *a, jval *out);
int jv_call_global(ctx *c, const jnode *at, jval f, const jargs *a, jval *out);
// The method `name` of a value of this type, or -1.
int jv_method_find(jtype type, const char *s, size_t n);
