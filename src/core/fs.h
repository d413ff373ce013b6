// The filesystem steps several formats and the trainer share: mkdir -p and read-only file
// access with errors that name the path. Core knows only the OS.
#pragma once
#include <stddef.h>

#include "core/error.h"

// mkdir -p: creates `dir` and its missing parents; an existing folder is fine, an existing
// non-folder is an error.
int fs_mkdirs(const char *dir, ct_error *err);

// Opens `path` read-only after checking it is a regular file; *size is its size in bytes.
// The caller closes *fd.
int fs_open_regular(int *fd, size_t *size, const char *path, ct_error *err);

// Maps the whole of `path` read-only (private). A 0-byte file cannot be mapped: it gives
// *map == NULL and *size == 0, which callers treat as an empty buffer.
int fs_map_readonly(void **map, size_t *size, const char *path, ct_error *err);
void fs_unmap(void *map, size_t size); // NULL is fine
// Bytes of a read-only file mapping already read and not needed again soon: the whole pages
// inside [p, p + bytes) leave this process's memory (the page cache keeps them; a later read
// maps them back), so that streaming through a large file holds only what is in use.
void fs_release_read(const void *p, size_t bytes);
