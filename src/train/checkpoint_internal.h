// Helpers shared by the checkpoint files: the XXH64 checksum and the filesystem steps that make
// a save crash-safe (fsync, rename, recursive delete, listing step folders).
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "train/checkpoint.h"

// XXH64 (Collet's xxHash, 64-bit), the published algorithm: XXH64("", 0) = 0xEF46DB3751D8E999.
uint64_t ckpt_xxh64(const void *data, size_t len, uint64_t seed);
// Size and XXH64 (seed 0) of a whole file.
int ckpt_hash_file(uint64_t *hash, uint64_t *size, const char *path, ct_error *err);

int ckpt_fsync_path(const char *path, bool is_dir, ct_error *err);
int ckpt_fsync_folder(const char *dir, ct_error *err); // its regular files, then itself
int ckpt_rmtree(const char *path, ct_error *err);      // rm -rf; a missing path is fine
int ckpt_write_text(const char *path, const char *text, size_t len, ct_error *err); // atomic

// "step-<digits>" -> step; false for anything else (temporary folders included).
bool ckpt_parse_step_name(const char *name, int64_t *step);
// "step-<digits>.tmp-<pid>[...]" -> pid; false for anything else.
bool ckpt_parse_tmp_name(const char *name, long *pid);
// The steps of root's step-<N> folders, newest first (*steps malloc'd; a missing root gives 0).
int ckpt_list_steps(int64_t **steps, int *n, const char *root, ct_error *err);

void ckpt_note(ckpt_notes *notes, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
