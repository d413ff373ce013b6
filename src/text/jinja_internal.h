// Shared by the parser (jinja_parse.c) and the evaluator (jinja_eval.c): the syntax tree and an
// arena for it and for the values made while rendering.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "text/jinja.h"
#include "text/jinja_names.h"

// Bump allocator; everything is freed at once. Allocation fails (NULL) past cap bytes in all.
typedef struct jarena {
    struct jchunk *head;
    size_t total, cap;
} jarena;
void *ja_alloc(jarena *a, size_t n); // zeroed
void ja_free(jarena *a);

typedef enum {
    // statements
    N_BODY,     // kids: statements in order
    N_TEXT,     // str/len
    N_OUTPUT,   // a: expression
    N_IF,       // a: cond, b: body, c: else (a body, or nothing)
    N_FOR,      // names/nnames: targets, a: iterable, b: body, c: else, d: filter
    N_SET,      // names/nnames: targets (or str: ns name + attr), a: value
    N_SETBLOCK, // names[0]: target, b: body
    N_MACRO,    // str: name, names: parameters, kids: defaults (NULL: none), b: body
    N_BREAK,
    N_CONTINUE,
    // expressions
    N_CONST,  // op: JC_*, ival / fval / str
    N_NAME,   // str
    N_ATTR,   // a: object, str: attribute
    N_ITEM,   // a: object, b: key
    N_SLICE,  // a: object, kids[0..2]: start, stop, step (each may be NULL)
    N_CALL,   // a: callee, kids: arguments, names: keyword names (NULL: positional)
    N_FILTER, // a: value, str: filter, ival: its jinja_filter, kids/names: arguments
    N_TEST,   // a: value, str: test, ival: its jinja_test, kids: arguments, op: 1 when negated
    N_UNARY,  // op: '-', '+', '!' (not), a: operand
    N_BINARY, // op: JB_*, a, b
    N_AND,
    N_OR,
    N_COMPARE, // a: first operand, kids: the others, ops: one per kid
    N_COND,    // a: then, b: cond, c: else (may be NULL)
    N_LIST,    // kids
    N_TUPLE,   // kids
    N_DICT,    // kids: key, value, key, value, ...
} jnode_kind;

enum { JC_NONE, JC_TRUE, JC_FALSE, JC_INT, JC_FLOAT, JC_STR };
enum { JB_ADD, JB_SUB, JB_MUL, JB_DIV, JB_FLOORDIV, JB_MOD, JB_POW, JB_CONCAT };
enum { JO_EQ, JO_NE, JO_LT, JO_LE, JO_GT, JO_GE, JO_IN, JO_NOTIN };

typedef struct jnode {
    jnode_kind kind;
    int op;
    size_t pos; // byte offset in the source (for messages)
    const char *str;
    size_t len;
    int64_t ival;
    double fval;
    struct jnode *a, *b, *c, *d;
    struct jnode **kids;
    const char **names; // with N_CALL/N_FILTER: one per kid, NULL for a positional argument
    size_t *name_lens;
    int *ops;
    size_t nkids, nnames;
} jnode;

struct jinja_template {
    jarena arena;
    char *src; // a copy; the tree points into it
    size_t len;
    char name[128];
    jnode *root;
    jinja_limits limits;
};

void jinja_line_col(const jinja_template *t, size_t pos, size_t *line, size_t *col);
// "name:LINE:COL: " + the message, into err; returns -1.
int jinja_fail_at(const jinja_template *t, size_t pos, ct_error *err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

// Python's str.isspace for a code point; the length of the whitespace run at the start (or, with
// backward, the end) of s[0..n).
bool jinja_py_space(uint32_t c);
size_t jinja_space_run(const char *s, size_t n, bool backward);
