// Helpers shared by the safetensors reader, folder loader and writer (not a public API).
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"

// Element count and byte size of a shape; -1 on a negative dimension or overflow.
int st_shape_numel(uint64_t *numel, uint64_t *bytes, const int64_t *shape, int ndim, ct_dtype t);

// "dir/name" in a malloc'd string (NULL when out of memory).
char *st_path_join(const char *dir, const char *name);

#define ST_SINGLE_NAME "model.safetensors"
#define ST_INDEX_NAME "model.safetensors.index.json"
