// Helpers shared by the checkpoint files (checkpoint_save.c, checkpoint_verify.c,
// checkpoint_load.c, checkpoint_fs.c, checkpoint_state.c): file checksums, the filesystem steps
// that make a save crash-safe (fsync, rename, recursive delete, listing step folders), state.json,
// and the checked view of a folder that verify and load share.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/error.h"
#include "core/xxh64.h"
#include "io/safetensors.h"
#include "checkpoint/checkpoint.h"

#define CKPT_STATE_NAME "state.json"
#define CKPT_STATE_MAX_BYTES (16u << 20)
#define CKPT_SHARD_FORMAT "ctitan-optimizer-shard"   // an optimizer shard's __metadata__ format
#define CKPT_MODEL_SHARD_FORMAT "ctitan-model-shard" // a model shard's

// out = "<dir>/<name>"; fails only if it does not fit in cap.
static inline int ckpt_join(char *out, size_t cap, const char *dir, const char *name,
                            ct_error *err) {
    int n = snprintf(out, cap, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= cap) return ct_fail(err, "%s/%s: path too long", dir, name);
    return 0;
}

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

// The files state.json lists besides the shards (model.safetensors only when the model is not
// in shards).
enum { CKPT_F_MODEL, CKPT_F_CONFIG_JSON, CKPT_F_CONFIG_TOML, CKPT_N_FILES };
extern const char *const ckpt_file_names[CKPT_N_FILES];
#define CKPT_MAX_SHARDS 99999                 // five digits in the file name
#define CKPT_JSON_MAX_UINT 9007199254740992.0 // 2^53: integers above lose precision in JSON

typedef struct ckpt_file_sum {
    char name[64];
    uint64_t bytes, xxh64;
} ckpt_file_sum;

// The shards of one kind (optimizer or model), in shard order, each with its flat ranges.
typedef struct ckpt_shard_list {
    ckpt_shard_info *info; // [n]: file, bytes, xxh64; numel = the elements of its ranges
    ckpt_range *ranges;    // every shard's ranges, shard after shard, each ascending
    int *first;            // [n + 1]: shard i's are ranges[first[i] .. first[i + 1])
    int n;
} ckpt_shard_list;

// list = n shards, shard i with info[i] and ranges[i][0 .. n_ranges[i]) (copied; malloc'd).
int ckpt_shard_list_make(ckpt_shard_list *list, const ckpt_shard_info *info, int n,
                         const ckpt_range *const *ranges, const int *n_ranges, ct_error *err);
void ckpt_shard_list_free(ckpt_shard_list *list);
// The list is whole: n in 1..CKPT_MAX_SHARDS, shard i named name(i, n), each shard's ranges
// ascending and disjoint, its numel their size, and all the shards' ranges together tiling
// [0, total) (interleaving allowed). The error names `where` and the files concerned.
int ckpt_shard_list_check(const ckpt_shard_list *list, bool model, uint64_t total,
                          const char *where, ct_error *err);
// want is ascending and disjoint within [0, total); else an error naming `where`.
int ckpt_check_ranges(const ckpt_range *want, int n_want, uint64_t total, const char *where,
                      ct_error *err);
// The sum of the list's range sizes (what it must tile), or UINT64_MAX past 2^53.
uint64_t ckpt_shard_list_total(const ckpt_shard_list *list);
// "lo:hi,lo:hi" (decimal), a shard's __metadata__ "ranges"; malloc'd, NULL when out of memory.
char *ckpt_ranges_text(const ckpt_range *r, int n);

// What state.json says.
typedef struct ckpt_state {
    train_state st;
    ckpt_file_sum files[CKPT_N_FILES]; // [CKPT_F_MODEL] unused when the model is in shards
    ckpt_shard_list optim;             // the optimizer shards; malloc'd
    ckpt_shard_list model;             // the model shards (n 0: model.safetensors); malloc'd
    uint64_t total;                    // the elements both lists tile
    int64_t format;                    // the file's "format" (0 if it has none)
    bool other_format; // a format this ctitan does not read: an error, never skipped
} ckpt_state;

// "optimizer-<shard>-of-<n_shards>.safetensors", five digits each.
void ckpt_shard_name(char out[64], int shard, int n_shards);
// "model-<shard>-of-<n_shards>.safetensors", five digits each.
void ckpt_model_shard_name(char out[64], int shard, int n_shards);
// state.json's text (*text malloc'd, *len bytes ending in a newline), or an error naming
// `where` (a step or count beyond 2^53, out of memory). model (may be NULL or empty: the model
// is model.safetensors, files[CKPT_F_MODEL]). Format 3 (one {offset, numel} per optimizer
// shard) when the layout is one it can say, so such a checkpoint is what earlier ctitans wrote;
// else format 4 (each shard's "ranges", and "model_shards").
int ckpt_state_text(char **text, size_t *len, const train_state *st,
                    const ckpt_file_sum files[CKPT_N_FILES], const ckpt_shard_list *optim,
                    const ckpt_shard_list *model, const char *where, ct_error *err);
// Parses state.json's text: every key present with its type and range, shards named in order
// and tiling, every file listed with a size and an XXH64. -1 with an error naming `path`;
// then format and other_format are still set and nothing is left to free.
int ckpt_state_parse(ckpt_state *s, const char *text, size_t len, const char *path, ct_error *err);
void ckpt_state_free(ckpt_state *s);

// ---- a checkpoint folder, checked (checkpoint_verify.c; checkpoint_load.c copies from it)

// Internal return code: the folder is corrupt or incomplete (skip it for an older one), as
// opposed to -1, a failure that must stop the caller (a checkpoint of another architecture,
// out of memory, bad arguments).
#define CKPT_CORRUPT (-2)

typedef struct ckpt_view {
    const char *dir;
    ckpt_state s;     // state.json
    st_file model;    // model.safetensors, open (mmap'd) after ckpt_view_open, unless in shards
    st_file *optim;   // [s.optim.n]; one with a path is open and checked
    st_file *mshards; // [s.model.n]; the same
} ckpt_view;

// Integrity of state.json and the files other than the shards: 0, CKPT_CORRUPT, or -1. On 0
// model.safetensors (if the model is not in shards) is open; on error the view is closed.
int ckpt_view_open(ckpt_view *v, const char *dir, ct_error *err);
void ckpt_view_close(ckpt_view *v);
// The model matches m (else -1: another architecture); with `moments`, the shards cover its
// parameters (else CKPT_CORRUPT: the model matched, so state.json's shard list is wrong).
int ckpt_view_match(const ckpt_view *v, const qwen3_model *m, bool moments, ct_error *err);
// Opens and checks the shards of one kind (model: the model shards, else the optimizer's) that
// overlap the ascending ranges want[0 .. n_want), or all of them.
int ckpt_check_shards(ckpt_view *v, bool model, bool all, const ckpt_range *want, int n_want,
                      ct_error *err);
// Copies the parameters of the ranges want (concatenated into dst) from the checked view:
// model.safetensors' tensors (m's layout) or the model shards overlapping them (checked).
void ckpt_view_copy_params(float *dst, const ckpt_view *v, const qwen3_model *m,
                           const ckpt_range *want, int n_want);
// The same for the moments, from the checked optimizer shards.
void ckpt_view_copy_moments(float *exp_avg, float *exp_avg_sq, const ckpt_view *v,
                            const ckpt_range *want, int n_want);

// Walks root's checkpoints newest first. try(dir) returns 0 (done: this one), CKPT_CORRUPT (note
// it and go on) or -1. Returns 1, 0 (none) or -1.
typedef int (*ckpt_try_fn)(const char *dir, void *ctx, ct_error *err);
int ckpt_walk_newest(char *dir_out, size_t cap, const char *root, ckpt_try_fn try, void *ctx,
                     ckpt_notes *notes, ct_error *err);
