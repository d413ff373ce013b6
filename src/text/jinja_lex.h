// The lexer's tokens and the state the parser reads them from (jinja_lex.c, jinja_parse.c).
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "text/jinja_internal.h"

typedef enum {
    T_TEXT,
    T_BBEGIN,
    T_BEND,
    T_VBEGIN,
    T_VEND,
    T_NAME,
    T_STR,
    T_INT,
    T_FLOAT,
    T_OP,
    T_EOF
} ttype;

typedef struct {
    ttype t;
    size_t pos;
    const char *s; // text, name, op or the decoded string
    size_t n;
    int64_t ival;
    double fval;
} token;

typedef struct {
    jinja_template *t;
    ct_error *err;
    token *tok;
    size_t ntok, cap, i;
    int depth, loops;
} pstate;

#define FAIL(ps, pos, ...) jinja_fail_at((ps)->t, (pos), (ps)->err, __VA_ARGS__)

// Cuts ps->t->src into ps->tok (ps->ntok tokens, the last T_EOF), applying Jinja2's whitespace
// control with trim_blocks and lstrip_blocks. 0, or -1 with ps->err naming the position.
int jinja_lex(pstate *ps);
