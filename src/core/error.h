// Errors carry context: file, tensor or key, expected vs found.
// Library functions return 0 on success and -1 on failure, filling a ct_error;
// only the CLI prints and exits.
#pragma once
#include <stdarg.h>
#include <stddef.h>

// One line, or several separated by '\n' (a config with several problems reports them all).
typedef struct ct_error {
    char msg[4096];
} ct_error;

// Sets err->msg (if err is non-NULL) and returns -1, so callers can `return ct_fail(...)`. The
// formatted text's control characters are escaped (ct_escape): a name read from a file cannot
// break the message's line or reach a terminal as a control sequence. A message's intentional
// line breaks are joined in after formatting (config_errors.c), and a message passed on whole is
// copied (`*err = other`) or wrapped, never formatted again.
int ct_fail(ct_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int ct_vfail(ct_error *err, const char *fmt, va_list ap);
// Prepends "prefix: " (escaped) to an existing message and returns -1 (adds outer context).
int ct_wrap(ct_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// Copies src to dst (cap bytes, NUL included) with bytes below 0x20 and DEL written as \n, \r, \t
// or \xHH; truncates before an escape that would not fit. Returns the length written.
size_t ct_escape(char *dst, size_t cap, const char *src);
