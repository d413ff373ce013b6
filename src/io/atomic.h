// Atomic file replacement: write to "<path>.tmp.<pid>" in the same directory, fsync, rename.
// Readers see either the old file or the complete new one, never a torn write.
#pragma once
#include <stddef.h>
#include <stdio.h>

#include "core/error.h"

typedef struct atomic_file {
    FILE *fp;
    char *path;
    char *tmp;
} atomic_file;

// Creates the temp file. On failure nothing is left behind.
int atomic_open(atomic_file *a, const char *path, ct_error *err);
int atomic_write(atomic_file *a, const void *buf, size_t n, ct_error *err);
// Flushes, fsyncs and renames over `path`; on failure removes the temp file. Frees `a` either way.
int atomic_commit(atomic_file *a, ct_error *err);
// Removes the temp file and frees `a` (after an error while writing).
void atomic_abort(atomic_file *a);
