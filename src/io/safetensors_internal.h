// Helpers shared by the safetensors reader, folder loader and writer (not a public API).
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"

// Decodes one UTF-8 sequence at s[0..n); returns its length, or 0 if it is malformed
// (overlong, surrogate, beyond U+10FFFF or truncated).
size_t st_utf8_decode(uint32_t *cp, const unsigned char *s, size_t n);
// Returns the offset of the first invalid byte, or n if all of s[0..n) is valid UTF-8.
size_t st_utf8_check(const unsigned char *s, size_t n);
// Element count and byte size of a shape; -1 on a negative dimension or overflow.
int st_shape_numel(uint64_t *numel, uint64_t *bytes, const int64_t *shape, int ndim, ct_dtype t);

// "dir/name" in a malloc'd string (NULL when out of memory).
char *st_path_join(const char *dir, const char *name);

#define ST_SINGLE_NAME "model.safetensors"
#define ST_INDEX_NAME "model.safetensors.index.json"
