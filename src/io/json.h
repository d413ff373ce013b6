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
// A JSON number that is an exact non-negative integer below 2^53 (for offsets and shapes).
bool json_is_uint(const cJSON *item, uint64_t *out);
// "a string", "an array", ... for messages ("nothing" for NULL).
const char *json_type_name(const cJSON *item);
// Writes s as a JSON string literal (quoted; '"', '\\' and control characters escaped), for
// JSON printed with fprintf.
void json_write_string(FILE *f, const char *s);
