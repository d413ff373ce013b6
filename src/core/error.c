#include "core/error.h"

#include <stdio.h>
#include <string.h>

size_t ct_escape(char *dst, size_t cap, const char *src) {
    size_t n = 0;
    if (!cap) return 0;
    for (const unsigned char *p = (const unsigned char *)src; *p; p++) {
        char e[5];
        size_t k = 1;
        if (*p >= 0x20 && *p != 0x7f)
            e[0] = (char)*p;
        else if (*p == '\n' || *p == '\r' || *p == '\t')
            e[0] = '\\', e[1] = *p == '\n' ? 'n' : *p == '\r' ? 'r' : 't', k = 2;
        else
            k = (size_t)snprintf(e, sizeof e, "\\x%02x", *p);
        if (n + k >= cap) break; // truncated, never inside an escape
        memcpy(dst + n, e, k);
        n += k;
    }
    dst[n] = '\0';
    return n;
}

int ct_vfail(ct_error *err, const char *fmt, va_list ap) {
    if (!err) return -1;
    char raw[sizeof err->msg];
    vsnprintf(raw, sizeof raw, fmt, ap);
    ct_escape(err->msg, sizeof err->msg, raw);
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
    char raw[512], prefix[512], old[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    ct_escape(prefix, sizeof prefix, raw);
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
