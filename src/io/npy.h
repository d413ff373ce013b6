// .npy token streams: 1-D integer arrays (uint16, int32, uint32, int64), little-endian, C order.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "io/atomic.h"

typedef struct npy_tokens {
    char *path;
    int fd;                    // npy_open: the open file, read range by range; else -1
    uint64_t data_off;         // where the tokens start in the file
    const unsigned char *data; // npy_parse: the tokens in the caller's buffer; else NULL
    char descr[8];             // "<u2", "<i4", "<u4", "<i8"
    size_t elem_size;
    uint64_t count;
} npy_tokens;

// Opens and validates the header (any other dtype, shape, byte order or Fortran order is an
// error) and checks the file's size against it. The tokens are not read: npy_read maps the
// pages of the range it is asked for, for that call only, so resident memory and address space
// do not grow with the file.
int npy_open(npy_tokens *t, const char *path, ct_error *err);
// Validates an in-memory .npy image (the same checks as npy_open; `name` is used in messages).
// t->data points into `buf`, which must outlive `t`. Used by fuzzing and tests.
int npy_parse(npy_tokens *t, const void *buf, size_t size, const char *name, ct_error *err);
void npy_close(npy_tokens *t);
// Copies tokens [start, start+n) as int32 (from the file through a mapping of those pages only,
// or from npy_parse's buffer). Values outside [0, vocab_size) are an error
// naming the file and index (vocab_size <= 0 disables the check).
int npy_read(int32_t *out, const npy_tokens *t, uint64_t start, size_t n, int64_t vocab_size,
             ct_error *err);
// Writes a 1-D array (descr "<u2", "<i4", "<u4" or "<i8") atomically, with the bytes of numpy's
// np.save; for tools and tests.
int npy_write(const char *path, const int64_t *values, size_t n, const char *descr, ct_error *err);

// The same file written as a stream, its length known only at the end (`ctitan tokenize`):
// open writes a header for 0 values, put appends (each value must fit descr), commit writes the
// header again with the count (numpy's header has room for any count, so its length stays)
// and renames the file into place; abort removes it. commit and abort free w either way.
typedef struct npy_writer {
    atomic_file f;
    char descr[8];
    size_t elem_size;
    int64_t min, max;
    uint64_t count;
    unsigned char buf[16384];
    size_t nbuf;
} npy_writer;
int npy_writer_open(npy_writer *w, const char *path, const char *descr, ct_error *err);
int npy_writer_put(npy_writer *w, const int64_t *values, size_t n, ct_error *err);
int npy_writer_commit(npy_writer *w, ct_error *err);
void npy_writer_abort(npy_writer *w);
