// Thin helpers over cJSON: read a whole file, and typed field access with errors that
// name the file and key.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cjson/cJSON.h>

#include "core/error.h"

// Reads a whole file into a NUL-terminated malloc'd buffer. max_bytes bounds the size.
int file_read_all(char **out, size_t *len, const char *path, size_t max_bytes, ct_error *err);
// Parses JSON text; on a syntax error, reports `what` and the byte offset.
int json_parse(cJSON **out, const char *text, size_t len, const char *what, ct_error *err);
int json_parse_file(cJSON **out, const char *path, ct_error *err);

// Typed getters. `required` false: a missing or null key leaves *out untouched and returns 0.
// A present key of the wrong type or out of range is an error naming `file` and `key`.
int json_get_int(int64_t *out, const cJSON *obj, const char *key, bool required, int64_t min,
                 int64_t max, const char *file, ct_error *err);
int json_get_double(double *out, const cJSON *obj, const char *key, bool required, const char *file,
                    ct_error *err);
int json_get_bool(bool *out, const cJSON *obj, const char *key, bool required, const char *file,
                  ct_error *err);
// Copies a string value into out[cap].
int json_get_string(char *out, size_t cap, const cJSON *obj, const char *key, bool required,
                    const char *file, ct_error *err);
// A number cJSON prints so that it reads back as the same double (%.17g): cJSON's own printing
// takes 15 digits whenever they read back within an epsilon, which loses the last bits a
// bit-for-bit comparison needs. Non-finite values become null. NULL when out of memory.
cJSON *json_exact_number(double x);
// A JSON number that is an exact non-negative integer below 2^53 (for offsets and shapes).
bool json_is_uint(const cJSON *item, uint64_t *out);
// "a string", "an array", ... for messages ("nothing" for NULL).
const char *json_type_name(const cJSON *item);
// The first member named `key` of the JSON object text[0..n), when its value is a string: *body
// and *len span the literal between its quotes, escapes still in (json_unescape decodes them).
// text must be JSON that cJSON accepted (cJSON_ParseWithLength) and `key` free of NUL; member
// names are compared after decoding their escapes, as cJSON does. False when there is none.
// With json_unescape this gives a string's exact bytes: cJSON's valuestring is a C string and
// ends at the first \u0000.
bool json_member_string(const char **body, size_t *len, const char *text, size_t n,
                        const char *key);
// Decodes the body of a JSON string literal (as json_member_string finds it) into out, which must
// hold n bytes (no escape decodes longer than it is written), and sets *out_n. \u0000 is a NUL
// byte like any other character, a surrogate pair one 4-byte character; other bytes are copied
// as they are. -1 for a \u without 4 hex digits (which cJSON reads as \u0000) or a '\' at the
// end.
int json_unescape(char *out, size_t *out_n, const char *body, size_t n);
// The one JSON string writer. s[0..n) (NUL bytes included) becomes a quoted literal: '"' and
// '\\' get a backslash, control characters become \u00XX, other bytes are copied. The flags
// turn on what Python's json.dumps does besides:
enum {
    JSON_SHORT = 1, // \b \f \n \r \t for those five control characters
    JSON_ASCII = 2, // ensure_ascii: DEL and non-ASCII as \uXXXX (UTF-16 pairs above U+FFFF);
                    // an ill-formed byte as \ufffd (callers validate UTF-8 first)
};
// A growable, NUL-terminated output buffer (free p when done).
typedef struct json_buf {
    char *p;
    size_t len, cap;
} json_buf;
// Appends the literal to b; -1 when out of memory (b is left as it was).
int json_quote(json_buf *b, const char *s, size_t n, unsigned flags);
// Writes the literal to f, for JSON printed with fprintf.
void json_write_string(FILE *f, const char *s, size_t n, unsigned flags);
