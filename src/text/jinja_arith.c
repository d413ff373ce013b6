// Arithmetic on values, with Python's rules (int overflow is an error).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "text/jinja_value.h"

int jv_arith(ctx *c, const jnode *at, int op, jval a, jval b, jval *out) {
    static const char *const names[] = {"+", "-", "*", "/", "//", "%", "**", "~"};
    if (op == JB_CONCAT) {
        jbuf buf = {0};
        if (jv_put_str(c, at, &buf, a, false) || jv_put_str(c, at, &buf, b, false)) {
            free(buf.p);
            return -1;
        }
        return jv_buf_take(c, at, &buf, out);
    }
    if (a.t == JV_UNDEF) return jv_undefined_error(c, at, a);
    if (b.t == JV_UNDEF) return jv_undefined_error(c, at, b);
    if (is_intlike(a) && is_intlike(b)) {
        int64_t x = as_int(a), y = as_int(b), r = 0;
        bool ovf = false;
        switch (op) {
        case JB_ADD:
            ovf = __builtin_add_overflow(x, y, &r);
            break;
        case JB_SUB:
            ovf = __builtin_sub_overflow(x, y, &r);
            break;
        case JB_MUL:
            ovf = __builtin_mul_overflow(x, y, &r);
            break;
        case JB_DIV:
            if (y == 0) return jv_fail(c, at, "division by zero");
            *out = mkfloat((double)x / (double)y);
            return 0;
        case JB_FLOORDIV:
        case JB_MOD:
            if (y == 0) return jv_fail(c, at, "integer division or modulo by zero");
            if (x == INT64_MIN && y == -1) {
                ovf = op == JB_FLOORDIV;
                r = 0;
                break;
            }
            r = op == JB_FLOORDIV ? x / y - ((x % y != 0) && ((x < 0) != (y < 0)))
                                  : ((x % y) + ((x % y != 0) && ((x < 0) != (y < 0)) ? y : 0));
            break;
        case JB_POW:
            if (y < 0) {
                if (x == 0) return jv_fail(c, at, "0 cannot be raised to a negative power");
                *out = mkfloat(pow((double)x, (double)y));
                return 0;
            }
            r = 1;
            for (int64_t k = 0; k < y && !ovf; k++) {
                ovf = __builtin_mul_overflow(r, x, &r);
                if (r == 0 || r == 1 || (r == -1 && x == -1)) {
                    if (r == -1 && ((y - k - 1) % 2)) r = 1;
                    break;
                }
            }
            break;
        }
        if (ovf) return jv_fail(c, at, "integer overflow in '%s' (beyond 64 bits)", names[op]);
        *out = mkint(r);
        return 0;
    }
    if (is_num(a) && is_num(b)) {
        double x = as_double(a), y = as_double(b), r = 0;
        switch (op) {
        case JB_ADD:
            r = x + y;
            break;
        case JB_SUB:
            r = x - y;
            break;
        case JB_MUL:
            r = x * y;
            break;
        case JB_DIV:
            if (y == 0) return jv_fail(c, at, "float division by zero");
            r = x / y;
            break;
        case JB_FLOORDIV:
        case JB_MOD: {
            if (y == 0) return jv_fail(c, at, "float modulo by zero");
            double m = fmod(x, y), div = (x - m) / y;
            if (m != 0) {
                if ((y < 0) != (m < 0)) m += y, div -= 1.0;
            } else {
                m = copysign(0.0, y);
            }
            double fl = floor(div);
            if (div != 0 && div - fl > 0.5) fl += 1.0;
            if (div == 0) fl = copysign(0.0, x / y);
            r = op == JB_MOD ? m : fl;
            break;
        }
        case JB_POW:
            if (x == 0 && y < 0) return jv_fail(c, at, "0.0 cannot be raised to a negative power");
            r = pow(x, y);
            break;
        }
        *out = mkfloat(r);
        return 0;
    }
    if (op == JB_ADD && a.t == JV_STR && b.t == JV_STR) {
        char *s = jv_alloc(c, at, a.s.n + b.s.n + 1);
        if (!s) return -1;
        memcpy(s, a.s.p, a.s.n);
        memcpy(s + a.s.n, b.s.p, b.s.n);
        *out = (jval){.t = JV_STR, .s = {s, a.s.n + b.s.n}};
        return 0;
    }
    if (op == JB_ADD && a.t == JV_LIST && b.t == JV_LIST && a.flag == b.flag) {
        jlist *l = jv_list_new(c, at, a.l->n + b.l->n);
        if (!l) return -1;
        for (size_t i = 0; i < a.l->n; i++) TRY(jv_list_push(c, at, l, a.l->v[i]));
        for (size_t i = 0; i < b.l->n; i++) TRY(jv_list_push(c, at, l, b.l->v[i]));
        *out = mklist(l, a.flag);
        return 0;
    }
    if (op == JB_MUL && (a.t == JV_STR || a.t == JV_LIST || b.t == JV_STR || b.t == JV_LIST) &&
        (is_intlike(a) || is_intlike(b))) {
        jval seq = is_intlike(a) ? b : a;
        int64_t k = as_int(is_intlike(a) ? a : b);
        if (k < 0) k = 0;
        size_t unit = seq.t == JV_STR ? seq.s.n : seq.l->n * sizeof(jval);
        if (unit && (uint64_t)k > c->t->limits.max_memory / unit)
            return jv_fail(c, at, "'*' would make more than %zu MiB",
                           c->t->limits.max_memory >> 20);
        if (seq.t == JV_STR) {
            char *s = jv_alloc(c, at, seq.s.n * (size_t)k + 1);
            if (!s) return -1;
            for (int64_t i = 0; i < k; i++) memcpy(s + (size_t)i * seq.s.n, seq.s.p, seq.s.n);
            *out = (jval){.t = JV_STR, .s = {s, seq.s.n * (size_t)k}};
            return 0;
        }
        jlist *l = jv_list_new(c, at, seq.l->n * (size_t)k);
        if (!l) return -1;
        for (int64_t i = 0; i < k; i++)
            for (size_t j = 0; j < seq.l->n; j++) TRY(jv_list_push(c, at, l, seq.l->v[j]));
        *out = mklist(l, seq.flag);
        return 0;
    }
    return jv_fail(c, at, "unsupported operand type(s) for %s: '%s' and '%s'", names[op],
                   jv_type_name(a), jv_type_name(b));
}
