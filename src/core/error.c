#include "core/error.h"

#include <stdio.h>
#include <string.h>

int ct_vfail(ct_error *err, const char *fmt, va_list ap) {
    if (err) vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    return -1;
}

int ct_fail(ct_error *err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    ct_vfail(err, fmt, ap);
    va_end(ap);
    return -1;
}

int ct_wrap(ct_error *err, const char *fmt, ...) {
    if (!err) return -1;
    char prefix[512], old[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    // Truncation is acceptable here: the message is for people, and stays NUL-terminated.
    size_t n = strlen(prefix), cap = sizeof err->msg;
    if (n > cap - 3) n = cap - 3;
    memcpy(err->msg, prefix, n);
    memcpy(err->msg + n, ": ", 2);
    size_t rest = strnlen(old, cap - n - 3);
    memcpy(err->msg + n + 2, old, rest);
    err->msg[n + 2 + rest] = '\0';
    return -1;
}
