// Jinja2's parser for the chat-template subset (see jinja.h), over jinja_lex.c's tokens: it
// follows Jinja2's grammar (jinja2/parser.py) and its operator precedences.
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja_lex.h"

static bool in_list(const char *const *list, const char *s, size_t n) {
    for (; *list; list++)
        if (strlen(*list) == n && memcmp(*list, s, n) == 0) return true;
    return false;
}

// ---- parser

#define MAX_PARSE_DEPTH 200

static token *cur(pstate *ps) {
    return &ps->tok[ps->i];
}
static bool is_op(const token *k, const char *op) {
    return k->t == T_OP && k->n == strlen(op) && memcmp(k->s, op, k->n) == 0;
}
static bool is_name(const token *k, const char *name) {
    return k->t == T_NAME && k->n == strlen(name) && memcmp(k->s, name, k->n) == 0;
}

static const char *describe(const token *k, char *buf, size_t cap) {
    switch (k->t) {
    case T_EOF:
        return "end of template";
    case T_TEXT:
        return "template text";
    case T_BBEGIN:
        return "'{%'";
    case T_VBEGIN:
        return "'{{'";
    case T_STR:
        return "a string";
    default:
        snprintf(buf, cap, "'%.*s'", (int)(k->n > 40 ? 40 : k->n), k->s);
        return buf;
    }
}

static int expected(pstate *ps, const char *what) {
    char buf[64];
    return FAIL(ps, cur(ps)->pos, "expected %s but found %s", what,
                describe(cur(ps), buf, sizeof buf));
}

static int expect_op(pstate *ps, const char *op) {
    if (!is_op(cur(ps), op)) {
        char w[16];
        snprintf(w, sizeof w, "'%s'", op);
        return expected(ps, w);
    }
    ps->i++;
    return 0;
}

static int expect_end(pstate *ps, ttype t) {
    if (cur(ps)->t != t) return expected(ps, t == T_BEND ? "'%}'" : "'}}'");
    ps->i++;
    return 0;
}

static jnode *new_node(pstate *ps, jnode_kind kind, size_t pos) {
    jnode *n = ja_alloc(&ps->t->arena, sizeof *n);
    if (!n) {
        FAIL(ps, pos, "out of memory");
        return NULL;
    }
    n->kind = kind;
    n->pos = pos;
    return n;
}

// A growable list of nodes (and optional keyword names), moved into the arena when done.
typedef struct {
    jnode **v;
    const char **names;
    size_t *lens;
    int *ops;
    size_t n, cap;
} nlist;

static int nl_push(pstate *ps, nlist *l, jnode *x, const char *name, size_t len, int op) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 8;
        jnode **v = ja_alloc(&ps->t->arena, cap * sizeof *v);
        const char **nm = ja_alloc(&ps->t->arena, cap * sizeof *nm);
        size_t *ln = ja_alloc(&ps->t->arena, cap * sizeof *ln);
        int *o = ja_alloc(&ps->t->arena, cap * sizeof *o);
        if (!v || !nm || !ln || !o) return FAIL(ps, cur(ps)->pos, "out of memory");
        if (l->n) {
            memcpy(v, l->v, l->n * sizeof *v);
            memcpy(nm, l->names, l->n * sizeof *nm);
            memcpy(ln, l->lens, l->n * sizeof *ln);
            memcpy(o, l->ops, l->n * sizeof *o);
        }
        l->v = v, l->names = nm, l->lens = ln, l->ops = o, l->cap = cap;
    }
    l->v[l->n] = x;
    l->names[l->n] = name;
    l->lens[l->n] = len;
    l->ops[l->n] = op;
    l->n++;
    return 0;
}

static void nl_store(jnode *n, const nlist *l) {
    n->kids = l->v;
    n->names = l->names;
    n->name_lens = l->lens;
    n->ops = l->ops;
    n->nkids = l->n;
}

static jnode *parse_expr(pstate *ps, bool with_cond);
static jnode *parse_unary(pstate *ps, bool with_filter);
static jnode *parse_primary(pstate *ps);
static jnode *parse_postfix(pstate *ps, jnode *node);

// Expressions separated by commas: a tuple unless it is one without a trailing comma.
static jnode *parse_tuple(pstate *ps, bool with_cond, bool parens) {
    size_t pos = cur(ps)->pos;
    nlist l = {0};
    bool comma = false;
    for (;;) {
        token *k = cur(ps);
        if (l.n &&
            (k->t == T_BEND || k->t == T_VEND || is_op(k, ")") || (!with_cond && is_name(k, "if"))))
            break;
        if (parens && l.n == 0 && is_op(k, ")")) break;
        jnode *e = parse_expr(ps, with_cond);
        if (!e || nl_push(ps, &l, e, NULL, 0, 0)) return NULL;
        if (!is_op(cur(ps), ",")) break;
        comma = true;
        ps->i++;
    }
    if (l.n == 1 && !comma) return l.v[0];
    jnode *t = new_node(ps, N_TUPLE, pos);
    if (t) nl_store(t, &l);
    return t;
}

static int parse_args(pstate *ps, jnode *n) {
    // at '('
    ps->i++;
    nlist l = {0};
    while (!is_op(cur(ps), ")")) {
        if (l.n && expect_op(ps, ",")) return -1;
        if (is_op(cur(ps), ")")) break;
        token *k = cur(ps);
        if (is_op(k, "*") || is_op(k, "**"))
            return FAIL(ps, k->pos, "unsupported: *args and **kwargs in a call");
        const char *name = NULL;
        size_t len = 0;
        if (k->t == T_NAME && is_op(&ps->tok[ps->i + 1], "=")) {
            name = k->s, len = k->n;
            ps->i += 2;
        } else if (l.n && l.names[l.n - 1]) {
            return FAIL(ps, k->pos, "a positional argument after a keyword argument");
        }
        jnode *e = parse_expr(ps, true);
        if (!e || nl_push(ps, &l, e, name, len, 0)) return -1;
    }
    ps->i++;
    nl_store(n, &l);
    return 0;
}

// node(...), at the '('.
static jnode *parse_call(pstate *ps, jnode *node) {
    jnode *n = new_node(ps, N_CALL, cur(ps)->pos);
    if (!n) return NULL;
    n->a = node;
    return parse_args(ps, n) ? NULL : n;
}

// The filter or test named at the cursor, applied to node; one we do not implement is an error.
static jnode *filter_or_test(pstate *ps, jnode_kind kind, jnode *node) {
    bool filter = kind == N_FILTER;
    token *f = cur(ps);
    if (f->t != T_NAME && (filter || (!is_op(f, "==") && !is_op(f, "!=")))) {
        expected(ps, filter ? "a filter name" : "a test name");
        return NULL;
    }
    int id = filter ? jinja_name_find(jinja_filter_names, JINJA_N_FILTERS, f->s, f->n)
                    : jinja_name_find(jinja_test_names, JINJA_N_TESTS, f->s, f->n);
    if (id < 0) {
        FAIL(ps, f->pos, "unsupported %s '%.*s'", filter ? "filter" : "test", (int)f->n, f->s);
        return NULL;
    }
    jnode *n = new_node(ps, kind, f->pos);
    if (!n) return NULL;
    ps->i++;
    n->a = node, n->str = f->s, n->len = f->n, n->ival = id;
    return n;
}

static jnode *parse_filter_expr(pstate *ps, jnode *node) {
    for (;;) {
        token *k = cur(ps);
        if (is_op(k, "|")) {
            ps->i++;
            jnode *n = filter_or_test(ps, N_FILTER, node);
            if (!n) return NULL;
            if (is_op(cur(ps), "(") && parse_args(ps, n)) return NULL;
            node = n;
        } else if (is_name(k, "is")) {
            ps->i++;
            bool neg = is_name(cur(ps), "not");
            if (neg) ps->i++;
            jnode *n = filter_or_test(ps, N_TEST, node);
            if (!n) return NULL;
            n->op = neg;
            token *a = cur(ps);
            if (is_op(a, "(")) {
                if (parse_args(ps, n)) return NULL;
            } else if ((a->t == T_NAME || a->t == T_STR || a->t == T_INT || a->t == T_FLOAT ||
                        is_op(a, "[") || is_op(a, "{")) &&
                       !is_name(a, "else") && !is_name(a, "or") && !is_name(a, "and") &&
                       !is_name(a, "if") && !is_name(a, "in") && !is_name(a, "not")) {
                if (is_name(a, "is")) {
                    FAIL(ps, a->pos, "tests cannot be chained with 'is'");
                    return NULL;
                }
                jnode *arg = parse_primary(ps);
                if (!arg || !(arg = parse_postfix(ps, arg))) return NULL;
                nlist l = {0};
                if (nl_push(ps, &l, arg, NULL, 0, 0)) return NULL;
                nl_store(n, &l);
            }
            node = n;
        } else if (is_op(k, "(")) {
            if (!(node = parse_call(ps, node))) return NULL;
        } else {
            return node;
        }
    }
}

static jnode *parse_postfix(pstate *ps, jnode *node) {
    for (;;) {
        token *k = cur(ps);
        if (is_op(k, ".")) {
            ps->i++;
            token *f = cur(ps);
            jnode *n;
            if (f->t == T_NAME) {
                if (!(n = new_node(ps, N_ATTR, f->pos))) return NULL;
                n->str = f->s, n->len = f->n;
            } else if (f->t == T_INT) {
                if (!(n = new_node(ps, N_ITEM, f->pos)) || !(n->b = new_node(ps, N_CONST, f->pos)))
                    return NULL;
                n->b->op = JC_INT, n->b->ival = f->ival;
            } else {
                expected(ps, "an attribute name");
                return NULL;
            }
            ps->i++;
            n->a = node;
            node = n;
        } else if (is_op(k, "[")) {
            ps->i++;
            jnode *parts[3] = {0};
            int np = 0;
            bool slice = false;
            for (;;) {
                token *t = cur(ps);
                if (is_op(t, ":")) {
                    slice = true;
                    if (++np > 2) {
                        FAIL(ps, t->pos, "a slice has at most three parts");
                        return NULL;
                    }
                    ps->i++;
                    continue;
                }
                if (is_op(t, "]")) break;
                if (parts[np]) {
                    expected(ps, "']'");
                    return NULL;
                }
                if (!(parts[np] = parse_expr(ps, true))) return NULL;
            }
            ps->i++;
            jnode *n = new_node(ps, slice ? N_SLICE : N_ITEM, k->pos);
            if (!n) return NULL;
            n->a = node;
            if (slice) {
                nlist l = {0};
                for (int j = 0; j < 3; j++)
                    if (nl_push(ps, &l, parts[j], NULL, 0, 0)) return NULL;
                nl_store(n, &l);
            } else if (!(n->b = parts[0])) {
                FAIL(ps, k->pos, "an empty subscript");
                return NULL;
            }
            node = n;
        } else if (is_op(k, "(")) {
            if (!(node = parse_call(ps, node))) return NULL;
        } else {
            return node;
        }
    }
}

static jnode *parse_primary(pstate *ps) {
    token *k = cur(ps);
    jnode *n = NULL;
    if (k->t == T_NAME) {
        static const char *const consts[] = {"true", "True", "false", "False",
                                             "none", "None", NULL};
        static const int kinds[] = {JC_TRUE, JC_TRUE, JC_FALSE, JC_FALSE, JC_NONE, JC_NONE};
        for (int j = 0; consts[j]; j++)
            if (is_name(k, consts[j])) {
                if (!(n = new_node(ps, N_CONST, k->pos))) return NULL;
                n->op = kinds[j];
            }
        if (!n) {
            if (!(n = new_node(ps, N_NAME, k->pos))) return NULL;
            n->str = k->s, n->len = k->n;
        }
        ps->i++;
    } else if (k->t == T_STR) {
        if (!(n = new_node(ps, N_CONST, k->pos))) return NULL;
        n->op = JC_STR, n->str = k->s, n->len = k->n;
        ps->i++;
        if (cur(ps)->t == T_STR) { // adjacent literals join, as in Python
            size_t total = n->len;
            for (size_t j = ps->i; ps->tok[j].t == T_STR; j++) total += ps->tok[j].n;
            char *s = ja_alloc(&ps->t->arena, total + 1);
            if (!s) {
                FAIL(ps, k->pos, "out of memory");
                return NULL;
            }
            memcpy(s, n->str, n->len);
            size_t at = n->len;
            for (; cur(ps)->t == T_STR; ps->i++) {
                memcpy(s + at, cur(ps)->s, cur(ps)->n);
                at += cur(ps)->n;
            }
            n->str = s, n->len = total;
        }
    } else if (k->t == T_INT || k->t == T_FLOAT) {
        if (!(n = new_node(ps, N_CONST, k->pos))) return NULL;
        n->op = k->t == T_INT ? JC_INT : JC_FLOAT, n->ival = k->ival, n->fval = k->fval;
        ps->i++;
    } else if (is_op(k, "(")) {
        ps->i++;
        if (!(n = parse_tuple(ps, true, true)) || expect_op(ps, ")")) return NULL;
    } else if (is_op(k, "[") || is_op(k, "{")) {
        bool dict = is_op(k, "{");
        const char *close = dict ? "}" : "]";
        ps->i++;
        if (!(n = new_node(ps, dict ? N_DICT : N_LIST, k->pos))) return NULL;
        nlist l = {0};
        while (!is_op(cur(ps), close)) {
            if (l.n && expect_op(ps, ",")) return NULL;
            if (is_op(cur(ps), close)) break;
            jnode *e = parse_expr(ps, true);
            if (!e || nl_push(ps, &l, e, NULL, 0, 0)) return NULL;
            if (dict) {
                if (expect_op(ps, ":") || !(e = parse_expr(ps, true)) ||
                    nl_push(ps, &l, e, NULL, 0, 0))
                    return NULL;
            }
        }
        ps->i++;
        nl_store(n, &l);
    } else {
        expected(ps, "an expression");
        return NULL;
    }
    return n;
}

static jnode *parse_unary(pstate *ps, bool with_filter) {
    token *k = cur(ps);
    jnode *node;
    if (++ps->depth > MAX_PARSE_DEPTH) {
        FAIL(ps, k->pos, "expression nested deeper than %d", MAX_PARSE_DEPTH);
        return NULL;
    }
    if (is_op(k, "-") || is_op(k, "+")) {
        ps->i++;
        if (!(node = new_node(ps, N_UNARY, k->pos)) || !(node->a = parse_unary(ps, false)))
            return NULL;
        node->op = k->s[0];
    } else if (!(node = parse_primary(ps))) {
        return NULL;
    }
    if (!(node = parse_postfix(ps, node))) return NULL;
    if (with_filter && !(node = parse_filter_expr(ps, node))) return NULL;
    ps->depth--;
    return node;
}

static jnode *binary(pstate *ps, int op, jnode *a, jnode *b, size_t pos) {
    jnode *n = new_node(ps, N_BINARY, pos);
    if (n) n->op = op, n->a = a, n->b = b;
    return n;
}

static jnode *parse_pow(pstate *ps) {
    jnode *left = parse_unary(ps, true);
    while (left && is_op(cur(ps), "**")) {
        size_t pos = cur(ps)->pos;
        ps->i++;
        jnode *right = parse_unary(ps, true);
        left = right ? binary(ps, JB_POW, left, right, pos) : NULL;
    }
    return left;
}

static jnode *parse_math2(pstate *ps) {
    jnode *left = parse_pow(ps);
    for (;;) {
        token *k = cur(ps);
        int op = is_op(k, "*")    ? JB_MUL
                 : is_op(k, "/")  ? JB_DIV
                 : is_op(k, "//") ? JB_FLOORDIV
                 : is_op(k, "%")  ? JB_MOD
                                  : -1;
        if (!left || op < 0) return left;
        ps->i++;
        jnode *right = parse_pow(ps);
        left = right ? binary(ps, op, left, right, k->pos) : NULL;
    }
}

static jnode *parse_concat(pstate *ps) {
    jnode *left = parse_math2(ps);
    while (left && is_op(cur(ps), "~")) {
        size_t pos = cur(ps)->pos;
        ps->i++;
        jnode *right = parse_math2(ps);
        left = right ? binary(ps, JB_CONCAT, left, right, pos) : NULL;
    }
    return left;
}

static jnode *parse_math1(pstate *ps) {
    jnode *left = parse_concat(ps);
    for (;;) {
        token *k = cur(ps);
        int op = is_op(k, "+") ? JB_ADD : is_op(k, "-") ? JB_SUB : -1;
        if (!left || op < 0) return left;
        ps->i++;
        jnode *right = parse_concat(ps);
        left = right ? binary(ps, op, left, right, k->pos) : NULL;
    }
}

static jnode *parse_compare(pstate *ps) {
    size_t pos = cur(ps)->pos;
    jnode *first = parse_math1(ps);
    if (!first) return NULL;
    nlist l = {0};
    for (;;) {
        token *k = cur(ps);
        int op = is_op(k, "==")     ? JO_EQ
                 : is_op(k, "!=")   ? JO_NE
                 : is_op(k, "<")    ? JO_LT
                 : is_op(k, "<=")   ? JO_LE
                 : is_op(k, ">")    ? JO_GT
                 : is_op(k, ">=")   ? JO_GE
                 : is_name(k, "in") ? JO_IN
                                    : -1;
        if (op < 0 && is_name(k, "not") && is_name(&ps->tok[ps->i + 1], "in")) {
            op = JO_NOTIN;
            ps->i++;
        }
        if (op < 0) break;
        ps->i++;
        jnode *e = parse_math1(ps);
        if (!e || nl_push(ps, &l, e, NULL, 0, op)) return NULL;
    }
    if (!l.n) return first;
    jnode *n = new_node(ps, N_COMPARE, pos);
    if (n) n->a = first, nl_store(n, &l);
    return n;
}

static jnode *parse_not(pstate *ps) {
    token *k = cur(ps);
    if (!is_name(k, "not")) return parse_compare(ps);
    ps->i++;
    if (++ps->depth > MAX_PARSE_DEPTH) {
        FAIL(ps, k->pos, "expression nested deeper than %d", MAX_PARSE_DEPTH);
        return NULL;
    }
    jnode *n = new_node(ps, N_UNARY, k->pos);
    if (!n || !(n->a = parse_not(ps))) return NULL;
    ps->depth--;
    n->op = '!';
    return n;
}

static jnode *parse_logic(pstate *ps, bool is_or) {
    jnode *left = is_or ? parse_logic(ps, false) : parse_not(ps);
    while (left && is_name(cur(ps), is_or ? "or" : "and")) {
        size_t pos = cur(ps)->pos;
        ps->i++;
        jnode *right = is_or ? parse_logic(ps, false) : parse_not(ps);
        jnode *n = right ? new_node(ps, is_or ? N_OR : N_AND, pos) : NULL;
        if (n) n->a = left, n->b = right;
        left = n;
    }
    return left;
}

static jnode *parse_expr(pstate *ps, bool with_cond) {
    if (++ps->depth > MAX_PARSE_DEPTH) {
        FAIL(ps, cur(ps)->pos, "expression nested deeper than %d", MAX_PARSE_DEPTH);
        return NULL;
    }
    jnode *e = parse_logic(ps, true);
    while (e && with_cond && is_name(cur(ps), "if")) {
        jnode *n = new_node(ps, N_COND, cur(ps)->pos);
        if (!n) return NULL;
        ps->i++;
        n->a = e;
        if (!(n->b = parse_logic(ps, true))) return NULL;
        if (is_name(cur(ps), "else")) {
            ps->i++;
            if (!(n->c = parse_expr(ps, true))) return NULL;
        }
        e = n;
    }
    ps->depth--;
    return e;
}

// ---- statements

static jnode *parse_body(pstate *ps, const char *const *ends, const char **found, size_t open_pos,
                         const char *opener);

// A name list "a" or "a, b" (for / set targets) into n->names.
static int parse_targets(pstate *ps, jnode *n) {
    const char *names[16];
    size_t lens[16], k = 0;
    for (;;) {
        token *t = cur(ps);
        if (t->t != T_NAME) return expected(ps, "a variable name");
        if (k == 16) return FAIL(ps, t->pos, "more than 16 names to unpack");
        names[k] = t->s, lens[k++] = t->n;
        ps->i++;
        if (!is_op(cur(ps), ",")) break;
        ps->i++;
    }
    n->names = ja_alloc(&ps->t->arena, k * sizeof *n->names);
    n->name_lens = ja_alloc(&ps->t->arena, k * sizeof *n->name_lens);
    if (!n->names || !n->name_lens) return FAIL(ps, n->pos, "out of memory");
    memcpy(n->names, names, k * sizeof *names);
    memcpy(n->name_lens, lens, k * sizeof *lens);
    n->nnames = k;
    return 0;
}

// After a body that ended at `found`: an {% else %} body up to the closer into n->c, then the
// closer's '%}'.
static jnode *parse_else(pstate *ps, jnode *n, const char *found, const char *closer, size_t pos,
                         const char *opener) {
    if (!strcmp(found, "else")) {
        const char *const ends[] = {closer, NULL};
        if (expect_end(ps, T_BEND) || !(n->c = parse_body(ps, ends, &found, pos, opener)))
            return NULL;
    }
    return expect_end(ps, T_BEND) ? NULL : n;
}

static jnode *parse_if(pstate *ps, size_t pos) {
    jnode *n = new_node(ps, N_IF, pos);
    if (!n || !(n->a = parse_expr(ps, true)) || expect_end(ps, T_BEND)) return NULL;
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    const char *found;
    size_t at = cur(ps)->pos;
    if (!(n->b = parse_body(ps, ends, &found, pos, "if"))) return NULL;
    if (!strcmp(found, "elif")) {
        jnode *body = new_node(ps, N_BODY, at);
        nlist l = {0};
        jnode *inner = body ? parse_if(ps, at) : NULL;
        if (!inner || nl_push(ps, &l, inner, NULL, 0, 0)) return NULL;
        nl_store(body, &l);
        n->c = body;
        return n;
    }
    return parse_else(ps, n, found, "endif", pos, "if");
}

static jnode *parse_for(pstate *ps, size_t pos) {
    jnode *n = new_node(ps, N_FOR, pos);
    if (!n || parse_targets(ps, n)) return NULL;
    if (!is_name(cur(ps), "in")) {
        expected(ps, "'in'");
        return NULL;
    }
    ps->i++;
    if (!(n->a = parse_tuple(ps, false, false))) return NULL;
    if (is_name(cur(ps), "if")) {
        ps->i++;
        if (!(n->d = parse_expr(ps, true))) return NULL;
    }
    if (is_name(cur(ps), "recursive")) {
        FAIL(ps, cur(ps)->pos, "unsupported: recursive for loops");
        return NULL;
    }
    if (expect_end(ps, T_BEND)) return NULL;
    static const char *const ends[] = {"else", "endfor", NULL};
    const char *found;
    ps->loops++;
    n->b = parse_body(ps, ends, &found, pos, "for");
    ps->loops--;
    if (!n->b) return NULL;
    return parse_else(ps, n, found, "endfor", pos, "for");
}

static jnode *parse_set(pstate *ps, size_t pos) {
    jnode *n = new_node(ps, N_SET, pos);
    if (!n || parse_targets(ps, n)) return NULL;
    if (n->nnames == 1 && is_op(cur(ps), ".")) { // ns.attr
        ps->i++;
        token *a = cur(ps);
        if (a->t != T_NAME) {
            expected(ps, "an attribute name");
            return NULL;
        }
        n->str = a->s, n->len = a->n;
        ps->i++;
    }
    if (is_op(cur(ps), "=")) {
        ps->i++;
        if (!(n->a = parse_tuple(ps, true, false)) || expect_end(ps, T_BEND)) return NULL;
        return n;
    }
    if (n->nnames != 1 || n->str) {
        expected(ps, "'='");
        return NULL;
    }
    if (is_op(cur(ps), "|")) {
        FAIL(ps, cur(ps)->pos, "unsupported: a filter on a block set");
        return NULL;
    }
    if (expect_end(ps, T_BEND)) return NULL;
    static const char *const ends[] = {"endset", NULL};
    const char *found;
    n->kind = N_SETBLOCK;
    if (!(n->b = parse_body(ps, ends, &found, pos, "set"))) return NULL;
    return expect_end(ps, T_BEND) ? NULL : n;
}

static jnode *parse_macro(pstate *ps, size_t pos) {
    jnode *n = new_node(ps, N_MACRO, pos);
    if (!n) return NULL;
    token *k = cur(ps);
    if (k->t != T_NAME) {
        expected(ps, "a macro name");
        return NULL;
    }
    n->str = k->s, n->len = k->n;
    ps->i++;
    if (expect_op(ps, "(")) return NULL;
    nlist l = {0};
    while (!is_op(cur(ps), ")")) {
        if (l.n && expect_op(ps, ",")) return NULL;
        token *p = cur(ps);
        if (p->t != T_NAME) {
            expected(ps, "a parameter name");
            return NULL;
        }
        ps->i++;
        jnode *def = NULL;
        if (is_op(cur(ps), "=")) {
            ps->i++;
            if (!(def = parse_expr(ps, true))) return NULL;
        } else if (l.n && l.v[l.n - 1]) {
            FAIL(ps, p->pos, "a parameter without a default after one with a default");
            return NULL;
        }
        if (nl_push(ps, &l, def, p->s, p->n, 0)) return NULL;
    }
    ps->i++;
    nl_store(n, &l);
    n->nnames = l.n;
    if (expect_end(ps, T_BEND)) return NULL;
    static const char *const ends[] = {"endmacro", NULL};
    const char *found;
    int loops = ps->loops;
    ps->loops = 0;
    n->b = parse_body(ps, ends, &found, pos, "macro");
    ps->loops = loops;
    if (!n->b || expect_end(ps, T_BEND)) return NULL;
    return n;
}

static jnode *parse_statement(pstate *ps, size_t pos) {
    token *k = cur(ps);
    if (k->t != T_NAME) {
        expected(ps, "a tag name");
        return NULL;
    }
    ps->i++;
    if (is_name(k, "if")) return parse_if(ps, pos);
    if (is_name(k, "for")) return parse_for(ps, pos);
    if (is_name(k, "set")) return parse_set(ps, pos);
    if (is_name(k, "macro")) return parse_macro(ps, pos);
    if (is_name(k, "break") || is_name(k, "continue")) {
        if (!ps->loops) {
            FAIL(ps, k->pos, "'%.*s' outside a for loop", (int)k->n, k->s);
            return NULL;
        }
        jnode *n = new_node(ps, is_name(k, "break") ? N_BREAK : N_CONTINUE, pos);
        return n && !expect_end(ps, T_BEND) ? n : NULL;
    }
    if (is_name(k, "generation")) { // transformers' assistant-mask tag: renders its body
        static const char *const ends[] = {"endgeneration", NULL};
        const char *found;
        jnode *b;
        if (expect_end(ps, T_BEND) || !(b = parse_body(ps, ends, &found, pos, "generation")) ||
            expect_end(ps, T_BEND))
            return NULL;
        return b;
    }
    static const char *const unsupported[] = {"include", "import",    "from", "extends",    "block",
                                              "call",    "filter",    "with", "autoescape", "do",
                                              "trans",   "pluralize", NULL};
    if (in_list(unsupported, k->s, k->n))
        FAIL(ps, k->pos, "unsupported tag '%.*s'", (int)k->n, k->s);
    else
        FAIL(ps, k->pos, "unknown tag '%.*s'", (int)(k->n > 40 ? 40 : k->n), k->s);
    return NULL;
}

// Statements up to a {% NAME %} with NAME in ends (*found, the cursor after NAME) or, with
// ends NULL, to the end of the template.
static jnode *parse_body(pstate *ps, const char *const *ends, const char **found, size_t open_pos,
                         const char *opener) {
    jnode *body = new_node(ps, N_BODY, cur(ps)->pos);
    if (!body) return NULL;
    if (++ps->depth > MAX_PARSE_DEPTH) {
        FAIL(ps, cur(ps)->pos, "blocks nested deeper than %d", MAX_PARSE_DEPTH);
        return NULL;
    }
    nlist l = {0};
    for (;;) {
        token *k = cur(ps);
        jnode *n = NULL;
        if (k->t == T_EOF) {
            if (ends) {
                char w[96];
                snprintf(w, sizeof w, "'%s'", ends[0]);
                for (int j = 1; ends[j]; j++)
                    snprintf(w + strlen(w), sizeof w - strlen(w), " or '%s'", ends[j]);
                size_t line, col;
                jinja_line_col(ps->t, open_pos, &line, &col);
                FAIL(ps, k->pos,
                     "unexpected end of template: expected %s to close the '%s' at %zu:%zu", w,
                     opener, line, col);
                return NULL;
            }
            break;
        }
        if (k->t == T_TEXT) {
            if (!(n = new_node(ps, N_TEXT, k->pos))) return NULL;
            n->str = k->s, n->len = k->n;
            ps->i++;
        } else if (k->t == T_VBEGIN) {
            ps->i++;
            if (!(n = new_node(ps, N_OUTPUT, k->pos)) || !(n->a = parse_tuple(ps, true, false)) ||
                expect_end(ps, T_VEND))
                return NULL;
        } else if (k->t == T_BBEGIN) {
            token *name = &ps->tok[ps->i + 1];
            for (int j = 0; ends && ends[j]; j++)
                if (is_name(name, ends[j])) {
                    *found = ends[j];
                    ps->i += 2;
                    nl_store(body, &l);
                    ps->depth--;
                    return body;
                }
            static const char *const closers[] = {"elif",   "else",          "endif",
                                                  "endfor", "endset",        "endmacro",
                                                  "endraw", "endgeneration", NULL};
            if (name->t == T_NAME && in_list(closers, name->s, name->n)) {
                FAIL(ps, name->pos, "unexpected '%.*s'%s%s%s", (int)name->n, name->s,
                     ends ? " inside '" : "", ends ? opener : "", ends ? "'" : "");
                return NULL;
            }
            ps->i++;
            if (!(n = parse_statement(ps, k->pos))) return NULL;
        } else {
            char buf[64];
            FAIL(ps, k->pos, "unexpected %s", describe(k, buf, sizeof buf));
            return NULL;
        }
        if (nl_push(ps, &l, n, NULL, 0, 0)) return NULL;
    }
    nl_store(body, &l);
    ps->depth--;
    return body;
}

int jinja_parse(jinja_template **out, const char *src, size_t len, const char *name,
                ct_error *err) {
    *out = NULL;
    jinja_template *t = calloc(1, sizeof *t);
    if (!t || !(t->src = malloc(len + 1))) {
        free(t);
        return ct_fail(err, "%s: out of memory", name);
    }
    // As Jinja2 reads a template: "\r\n" and "\r" become "\n", and one trailing newline goes
    // (keep_trailing_newline is off).
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            t->src[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            t->src[n++] = src[i];
        }
    }
    if (n && t->src[n - 1] == '\n') n--;
    t->src[n] = 0;
    t->len = n;
    snprintf(t->name, sizeof t->name, "%s", name ? name : "template");
    t->arena.cap = (size_t)1 << 40;
    t->limits = (jinja_limits){.max_output = (size_t)64 << 20,
                               .max_memory = (size_t)256 << 20,
                               .max_steps = 10000000,
                               .max_depth = 200};
    pstate ps = {.t = t, .err = err};
    int rc = jinja_lex(&ps);
    if (rc == 0) {
        t->root = parse_body(&ps, NULL, NULL, 0, NULL);
        if (!t->root) rc = -1;
    }
    free(ps.tok);
    if (rc) {
        jinja_free(t);
        return -1;
    }
    *out = t;
    return 0;
}

void jinja_free(jinja_template *t) {
    if (!t) return;
    ja_free(&t->arena);
    free(t->src);
    free(t);
}

void jinja_set_limits(jinja_template *t, const jinja_limits *l) {
    if (l->max_output) t->limits.max_output = l->max_output;
    if (l->max_memory) t->limits.max_memory = l->max_memory;
    if (l->max_steps) t->limits.max_steps = l->max_steps;
    if (l->max_depth) t->limits.max_depth = l->max_depth;
}
