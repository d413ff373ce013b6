// The evaluator for jinja_parse.c's tree: expressions, statements and jinja_render.
#include <stdio.h>
#include <stdlib.h>

#include "text/jinja_value.h"

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
        jvar *p = jv_alloc(c, at, cap * sizeof *p);
        if (!p) return -1;
        if (f->n) memcpy(p, f->v, f->n * sizeof *p);
        f->v = p;
        f->cap = cap;
    }
    f->v[f->n++] = (jvar){name, n, v};
    return 0;
}

// ---- evaluation

static int eval(ctx *c, const jnode *n, jframe *f, jval *out);
static int exec_body(ctx *c, const jnode *body, jframe *f, jbuf *b);

static int step(ctx *c, const jnode *at) {
    if (++c->steps > c->t->limits.max_steps)
        return jv_fail(c, at, "more than %zu loop iterations and calls (the limit)",
                       c->t->limits.max_steps);
    return 0;
}

static int eval_args(ctx *c, const jnode *n, jframe *f, jargs *a) {
    *a = (jargs){0};
    if (!n->nkids) return 0;
    a->pos = jv_alloc(c, n, n->nkids * sizeof *a->pos);
    a->kv = jv_alloc(c, n, n->nkids * sizeof *a->kv);
    a->kn = jv_alloc(c, n, n->nkids * sizeof *a->kn);
    a->kl = jv_alloc(c, n, n->nkids * sizeof *a->kl);
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
        return jv_fail(c, at, "macro calls nested deeper than %zu (the limit)",
                       c->t->limits.max_depth);
    TRY(step(c, at));
    if (a->npos > d->nkids)
        return jv_fail(c, at, "macro '%.*s' takes not more than %zu argument(s)", (int)d->len,
                       d->str, d->nkids);
    jframe *mf = jv_alloc(c, at, sizeof *mf);
    if (!mf) return -1;
    mf->parent = m->env;
    for (size_t i = 0; i < a->nkw; i++) {
        bool ok = false;
        for (size_t k = 0; k < d->nkids; k++)
            ok |= d->name_lens[k] == a->kl[i] && memcmp(d->names[k], a->kn[i], a->kl[i]) == 0;
        if (!ok)
            return jv_fail(c, at, "macro '%.*s' has no argument '%.*s'", (int)d->len, d->str,
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
    return jv_buf_take(c, at, &b, out);
}

static int call_value(ctx *c, const jnode *at, jval fn, const jargs *a, jval *out) {
    switch (fn.t) {
    case JV_MACRO:
        return call_macro(c, at, fn.m, a, out);
    case JV_FUNC:
        return jv_call_global(c, at, fn, a, out);
    case JV_METHOD:
        return jv_call_method(c, at, fn.bm, a, out);
    case JV_UNDEF:
        if (fn.flag)
            return jv_fail(c, at, "unsupported or unknown method '%.*s' (undefined)", (int)fn.s.n,
                           fn.s.p);
        return jv_fail(c, at, "'%.*s' is undefined", (int)fn.s.n, fn.s.p);
    default:
        return jv_fail(c, at, "'%s' object is not callable", jv_type_name(fn));
    }
}

static int eval_seq(ctx *c, const jnode *n, jframe *f, jval *out) {
    if (n->kind == N_DICT) {
        jdict *d = jv_dict_new(c, n);
        if (!d) return -1;
        for (size_t i = 0; i + 1 < n->nkids; i += 2) {
            jval k, v;
            TRY(eval(c, n->kids[i], f, &k));
            TRY(eval(c, n->kids[i + 1], f, &v));
            if (k.t == JV_LIST || k.t == JV_DICT || k.t == JV_NS)
                return jv_fail(c, n->kids[i], "unhashable type: '%s'", jv_type_name(k));
            TRY(jv_dict_set(c, n, d, k, v));
        }
        *out = (jval){.t = JV_DICT, .d = d};
        return 0;
    }
    jlist *l = jv_list_new(c, n, n->nkids);
    if (!l) return -1;
    for (size_t i = 0; i < n->nkids; i++) {
        jval v;
        TRY(eval(c, n->kids[i], f, &v));
        TRY(jv_list_push(c, n, l, v));
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
        else if (jinja_name_find(jinja_global_names, JINJA_N_GLOBALS, n->str, n->len) >= 0)
            *out = (jval){.t = JV_FUNC, .s = {n->str, n->len}};
        else
            *out = (jval){.t = JV_UNDEF, .s = {n->str, n->len}};
        return 0;
    }
    case N_ATTR:
        TRY(eval(c, n->a, f, &a));
        return jv_get_attr(c, n, a, n->str, n->len, out);
    case N_ITEM:
        TRY(eval(c, n->a, f, &a));
        TRY(eval(c, n->b, f, &b));
        return jv_get_item(c, n, a, b, out);
    case N_SLICE: {
        jval p[3] = {UNDEF, UNDEF, UNDEF};
        TRY(eval(c, n->a, f, &a));
        for (int i = 0; i < 3; i++)
            if (n->kids[i]) TRY(eval(c, n->kids[i], f, &p[i]));
        return jv_get_slice(c, n, a, p[0], p[1], p[2], out);
    }
    case N_CALL:
        TRY(eval(c, n->a, f, &a));
        TRY(eval_args(c, n, f, &args));
        return call_value(c, n, a, &args, out);
    case N_FILTER:
        TRY(eval(c, n->a, f, &a));
        TRY(eval_args(c, n, f, &args));
        return jv_apply_filter(c, n, (jinja_filter)n->ival, a, &args, out);
    case N_TEST: {
        bool r;
        TRY(eval(c, n->a, f, &a));
        TRY(eval_args(c, n, f, &args));
        TRY(jv_apply_test(c, n, (jinja_test)n->ival, a, &args, &r));
        *out = mkbool(r != (n->op != 0));
        return 0;
    }
    case N_UNARY:
        TRY(eval(c, n->a, f, &a));
        if (n->op == '!') {
            *out = mkbool(!jv_truthy(a));
            return 0;
        }
        if (a.t == JV_UNDEF) return jv_undefined_error(c, n, a);
        if (!is_num(a))
            return jv_fail(c, n, "bad operand type for unary %c: '%s'", n->op, jv_type_name(a));
        if (n->op == '+')
            *out = a.t == JV_BOOL ? mkint(a.b) : a;
        else if (a.t == JV_FLOAT)
            *out = mkfloat(-a.f);
        else if (as_int(a) == INT64_MIN)
            return jv_fail(c, n, "integer overflow in unary -");
        else
            *out = mkint(-as_int(a));
        return 0;
    case N_BINARY:
        TRY(eval(c, n->a, f, &a));
        TRY(eval(c, n->b, f, &b));
        return jv_arith(c, n, n->op, a, b, out);
    case N_AND:
    case N_OR:
        TRY(eval(c, n->a, f, &a));
        if (jv_truthy(a) == (n->kind == N_OR)) {
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
                r = jv_py_eq(a, b) == (op == JO_EQ);
            } else if (op == JO_IN || op == JO_NOTIN) {
                TRY(jv_py_in(c, n->kids[i], a, b, &r));
                if (op == JO_NOTIN) r = !r;
            } else {
                TRY(jv_py_cmp(c, n->kids[i], a, b, ops[op], &k));
                r = op == JO_LT ? k < 0 : op == JO_LE ? k <= 0 : op == JO_GT ? k > 0 : k >= 0;
            }
            a = b;
        }
        *out = mkbool(r);
        return 0;
    }
    case N_COND:
        TRY(eval(c, n->b, f, &b));
        if (jv_truthy(b)) return eval(c, n->a, f, out);
        if (n->c) return eval(c, n->c, f, out);
        *out = UNDEF;
        return 0;
    case N_LIST:
    case N_TUPLE:
    case N_DICT:
        return eval_seq(c, n, f, out);
    default:
        return jv_fail(c, n, "internal error: node %d is not an expression", (int)n->kind);
    }
}

// Binds a for/set target list to v (unpacking when there are several names).
static int bind(ctx *c, const jnode *n, jframe *f, jval v) {
    if (n->nnames == 1) return frame_set(c, n, f, n->names[0], n->name_lens[0], v);
    const jval *items;
    size_t k;
    TRY(jv_iter_items(c, n, v, &items, &k));
    if (k != n->nnames)
        return jv_fail(c, n,
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
        return jv_fail(c, n->a, "'%s' object is not iterable", jv_type_name(seq));
    const jval *items;
    size_t k;
    TRY(jv_iter_items(c, n->a, seq, &items, &k));
    jframe *lf = jv_alloc(c, n, sizeof *lf);
    if (!lf) return -1;
    lf->parent = f;
    if (n->d) { // {% for x in xs if cond %}: the loop sees only the items that pass
        jval *kept = jv_alloc(c, n, (k ? k : 1) * sizeof *kept);
        size_t m = 0;
        if (!kept) return -1;
        for (size_t i = 0; i < k; i++) {
            jval cond;
            TRY(step(c, n));
            TRY(bind(c, n, lf, items[i]));
            TRY(eval(c, n->d, lf, &cond));
            if (jv_truthy(cond)) kept[m++] = items[i];
        }
        items = kept, k = m;
    }
    jloop *lp = jv_alloc(c, n, sizeof *lp);
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
        TRY(jv_buf_take(c, n, &inner, &v));
        return frame_set(c, n, f, n->names[0], n->name_lens[0], v);
    }
    TRY(eval(c, n->a, f, &v));
    if (!n->str) return bind(c, n, f, v);
    jval *ns = frame_find(f, n->names[0], n->name_lens[0]);
    if (!ns || ns->t != JV_NS)
        return jv_fail(c, n, "cannot assign attribute on non-namespace object '%.*s'",
                       (int)n->name_lens[0], n->names[0]);
    return jv_dict_set(c, n, ns->d, (jval){.t = JV_STR, .s = {n->str, n->len}}, v);
}

static int exec_body(ctx *c, const jnode *body, jframe *f, jbuf *b) {
    for (size_t i = 0; i < body->nkids && !c->ctl; i++) {
        const jnode *n = body->kids[i];
        jval v;
        switch (n->kind) {
        case N_TEXT:
            TRY(jv_buf_put(c, n, b, n->str, n->len));
            break;
        case N_OUTPUT:
            TRY(eval(c, n->a, f, &v));
            TRY(jv_put_str(c, n, b, v, false));
            break;
        case N_IF:
            TRY(eval(c, n->a, f, &v));
            if (jv_truthy(v))
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
            jmacro *m = jv_alloc(c, n, sizeof *m);
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
            return jv_fail(c, n, "internal error: node %d is not a statement", (int)n->kind);
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
    jframe *root = jv_alloc(&c, NULL, sizeof *root);
    int rc = root ? 0 : -1;
    const cJSON *e;
    if (vars && rc == 0) {
        cJSON_ArrayForEach(e, vars) {
            jval v;
            if ((rc = jv_from_json(&c, e, &v, 0)) != 0) break;
            const char *k = e->string ? e->string : "";
            if ((rc = frame_set(&c, NULL, root, k, strlen(k), v)) != 0) break;
        }
    }
    jbuf b = {0};
    if (rc == 0) rc = exec_body(&c, t->root, root, &b);
    if (rc == 0 && !b.p) rc = jv_buf_put(&c, NULL, &b, "", 0);
    ja_free(&c.ar);
    if (rc) {
        free(b.p);
        return -1;
    }
    *out = b.p;
    if (out_len) *out_len = b.n;
    return 0;
}
