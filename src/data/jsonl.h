// One document of a .jsonl file: a line holding a JSON object with a string "text" field.
#pragma once
#include <stddef.h>

#include "core/error.h"

// A buffer for texts with escapes, reused across lines (zero it first, jsonl_buf_free at the end).
typedef struct jsonl_buf {
    char *p;
    size_t cap;
} jsonl_buf;

// Parses line[0..n) and finds its "text" string (the first member of that name, as cJSON picks
// it). On success *text, *len are the string's exact bytes, NUL included (\u0000 is a character
// like any other): a pointer into `line` when the string has no escapes, else into buf. The
// error says what is wrong (invalid JSON, no "text" field, "text" not a string) without file or
// line: the caller adds them. The text is not checked for UTF-8: raw bytes in the line are
// passed on as they are.
int jsonl_text(const char **text, size_t *len, jsonl_buf *buf, const char *line, size_t n,
               ct_error *err);
void jsonl_buf_free(jsonl_buf *buf);
