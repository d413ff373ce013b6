// Errors carry context: file, tensor or key, expected vs found.
// Library functions return 0 on success and -1 on failure, filling a ct_error;
// only the CLI prints and exits.
#pragma once
#include <stdarg.h>

// One line, or several separated by '\n' (a config with several problems reports them all).
typedef struct ct_error {
    char msg[4096];
} ct_error;

// Sets err->msg (if err is non-NULL) and returns -1, so callers can `return ct_fail(...)`.
int ct_fail(ct_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int ct_vfail(ct_error *err, const char *fmt, va_list ap);
// Prepends "prefix: " to an existing message and returns -1 (adds outer context).
int ct_wrap(ct_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
