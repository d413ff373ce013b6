// safetensors files: a validated, mmap'd reader and an atomic writer; plus HF's sharded layout
// (model.safetensors.index.json with a weight_map).
//
// The format: 8-byte little-endian header length N, N bytes of JSON
// {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}},
// then the data region. Offsets are relative to the data region.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/error.h"

#define ST_MAX_DIMS 8
#define ST_MAX_HEADER (100u << 20) // 100 MB, as the reference implementation

typedef struct st_tensor {
    char *name;
    ct_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    uint64_t numel;
    uint64_t begin, end; // byte offsets within the data region
    const void *data;    // points into the mapping
    int file_index;      // which shard (st_set) it came from
} st_tensor;

typedef struct st_file {
    char *path;
    void *map;
    size_t map_size;
    uint64_t header_len;
    st_tensor *tensors; // sorted by name
    int n_tensors;
} st_file;

// mmaps and validates `path`. Every violation is an error naming the file (and tensor).
int st_open(st_file *f, const char *path, ct_error *err);
// Validates an in-memory image of a safetensors file (the same checks as st_open; `name` is used
// in messages). Tensor data points into `buf`, which must outlive `f`. Used by fuzzing and tests.
int st_parse(st_file *f, const void *buf, size_t size, const char *name, ct_error *err);
void st_close(st_file *f);
const st_tensor *st_file_find(const st_file *f, const char *name);
// Formats a shape as "[2, 3]" into buf[cap] (truncated if it does not fit); returns buf, so it
// can go straight into a message.
const char *st_shape_str(char *buf, size_t cap, const int64_t *shape, int ndim);

// Fills dst with elements [first, first + count) of a tensor being written (row-major): the
// source of a tensor that is not in memory, read piece by piece as the file is written.
typedef int (*st_fill_fn)(float *dst, uint64_t first, uint64_t count, void *ctx, ct_error *err);

// One tensor to write: fp32 data, converted to the output dtype on write. With fill (data
// NULL), the writer asks for the tensor a chunk at a time, so a file is written holding one
// chunk of it, never the whole tensor.
typedef struct st_entry {
    const char *name;
    const float *data;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    st_fill_fn fill;
    void *fill_ctx;
} st_entry;

// Writes one file atomically (temp file + rename). Keys sorted, __metadata__ {"format":"pt"},
// header padded with spaces so the data region starts 8-byte aligned. dtype: F32, BF16 or F16.
int st_write(const char *path, const st_entry *entries, int n, ct_dtype dtype, ct_error *err);

// Writes `dir`/model.safetensors when everything fits in max_shard_bytes (0 = no limit),
// otherwise model-0000K-of-0000N.safetensors shards plus model.safetensors.index.json
// ({"metadata": {"total_size": bytes}, "weight_map": {name: shard}}), like HF's save_pretrained.
// Tensors keep their given order across shards.
int st_write_folder(const char *dir, const st_entry *entries, int n, ct_dtype dtype,
                    uint64_t max_shard_bytes, ct_error *err);

// All tensors of a model folder: either one model.safetensors, or an index plus its shards.
// Also accepts a path to a single .safetensors file.
typedef struct st_set {
    st_file *files;
    int n_files;
    st_tensor **by_name; // sorted by name, pointing into files[*].tensors
    int n_tensors;
} st_set;

int st_set_open(st_set *s, const char *path, ct_error *err);
void st_set_close(st_set *s);
const st_tensor *st_set_find(const st_set *s, const char *name);
// Converts a tensor's data (F32, BF16, F16, F64) to fp32.
int st_tensor_to_f32(float *dst, const st_tensor *t, ct_error *err);
// The same for elements [first, first + count) of the tensor (row-major) only: a part of a
// tensor is read without touching the rest.
int st_tensor_range_to_f32(float *dst, const st_tensor *t, uint64_t first, uint64_t count,
                           ct_error *err);
