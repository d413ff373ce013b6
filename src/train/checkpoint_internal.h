// Helpers shared by the checkpoint files: file checksums and the filesystem steps that make
// a save crash-safe (fsync, rename, recursive delete, listing step folders).
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "core/xxh64.h"
#include "train/checkpoint.h"

// Size and XXH64 (core/xxh64.h, seed 0) of a whole file.
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

// ---- state.json (checkpoint_state.c)

// The files state.json lists besides the optimizer shards.
enum { CKPT_F_MODEL, CKPT_F_CONFIG_JSON, CKPT_F_CONFIG_TOML, CKPT_N_FILES };
extern const char *const ckpt_file_names[CKPT_N_FILES];
#define CKPT_MAX_SHARDS 99999                 // five digits in the file name
#define CKPT_JSON_MAX_UINT 9007199254740992.0 // 2^53: integers above lose precision in JSON

typedef struct ckpt_file_sum {
    char name[64];
    uint64_t bytes, xxh64;
} ckpt_file_sum;

// What state.json says.
typedef struct ckpt_state {
    train_state st;
    ckpt_file_sum files[CKPT_N_FILES];
    ckpt_shard_info *shards; // the optimizer shards, in order, tiling [0, total); malloc'd
    int n_shards;
    uint64_t total;
    int64_t format;    // the file's "format" (0 if it has none)
    bool other_format; // a format this ctitan does not read: an error, never skipped
} ckpt_state;

// "optimizer-<shard>-of-<n_shards>.safetensors", five digits each.
void ckpt_shard_name(char out[64], int shard, int n_shards);
// state.json's text (*text malloc'd, *len bytes ending in a newline), or an error naming
// `where` (a step or count beyond 2^53, out of memory).
int ckpt_state_text(char **text, size_t *len, const train_state *st,
                    const ckpt_file_sum files[CKPT_N_FILES], const ckpt_shard_info *shards,
                    int n_shards, const char *where, ct_error *err);
// Parses state.json's text: every key present with its type and range, shards named in order
// and tiling, every file listed with a size and an XXH64. -1 with an error naming `path`;
// then format and other_format are still set and nothing is left to free.
int ckpt_state_parse(ckpt_state *s, const char *text, size_t len, const char *path, ct_error *err);
void ckpt_state_free(ckpt_state *s);
