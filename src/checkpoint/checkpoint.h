// Checkpoints that resume bit for bit, written so that a crash at any moment leaves the previous
// one loadable, and the export of one as a Hugging Face folder.
//
// Layout: <root>/step-<N>/ (root = <job.dump_folder>/<checkpoint.folder>) holds
//   model.safetensors      F32, HF names (no lm_head.weight when tied), unless the model is in
//                          model shards (below)
//   config.json            HF; with model.safetensors it is a loadable HF folder
//   optimizer-<r>-of-<n>.safetensors (r, n: 5 digits)  one per shard: 1-D F32 "exp_avg" and
//                          "exp_avg_sq", the concatenation of the shard's flat ranges [lo, hi) of
//                          the layout of qwen3_model.param_mem (ascending, disjoint); __metadata__
//                          format "ctitan-optimizer-shard", numel, total and, for one range,
//                          offset, else ranges "lo:hi,lo:hi" (decimal strings). All the shards'
//                          ranges together tile [0, num_params), interleaved as they may be (an
//                          FSDP rank holds a piece of each unit); a shard may be empty.
//   model-<r>-of-<n>.safetensors  only for a sharded model (FSDP, where no rank holds it whole):
//                          1-D F32 "param" over shard r's ranges, metadata as above with format
//                          "ctitan-model-shard"; then there is no model.safetensors
//   config.toml            the run's effective config, as given to ckpt_save / ckpt_commit
//   state.json             train_state, format and ctitan version, every other file's byte size
//                          and XXH64, and the shards: format 3 (written when it can say the
//                          layout: model.safetensors, one range per optimizer shard, in order)
//                          "optimizer_shards": [{file, offset, numel}]; format 4 each shard's
//                          {file, ranges: [[lo, hi], ...]} and, for a sharded model,
//                          "model_shards" alike
// A save writes everything into step-<N>.tmp-<tag>/ (tag: the saving process's pid, rank 0's
// under data parallelism), fsyncs each file and the folder, renames it to step-<N> and fsyncs the
// root. Folders named step-*.tmp-* are never read, only cleaned up.
//
// Shards make a checkpoint independent of the number of ranks: N ranks each write what they
// own (ZeRO-1: a range of the moments; FSDP: a list of ranges of the parameters and moments),
// and M ranks each load any list of ranges, from whichever shards overlap it; a single process
// assembles a sharded model whole. No rank ever needs the whole model to save, load or export.
// This module knows nothing of MPI; a data-parallel save is, across ranks:
//   rank 0: ckpt_begin -> barrier -> every rank: ckpt_write_shard (ckpt_write_optimizer_shard)
//   -> gather the ckpt_shard_infos (and each rank's ranges) on rank 0 -> rank 0:
//   ckpt_commit_ranges (ckpt_commit), or ckpt_abandon if any rank failed.
//
// The optimizer is passed as plain moment buffers and the config as TOML text, so this module
// depends on neither the optimizer nor the config code.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/error.h"
#include "model/hf_adapter.h"
#include "model/qwen3.h"
#include "train/train_state.h"

// state.json "format"; a checkpoint of another format is not loaded (format 1 had one
// optimizer.safetensors with a tensor per parameter). Format 2 ordered a layer's attention
// biases q, k, v each after its weight rather than after all three (before the fused q|k|v
// projection): the same flat optimizer state unless the model has attention biases, so it is
// read for models without them.
// Format 3 is format 4's layout with one range per optimizer shard, in order, and the model in
// model.safetensors: still written for such a checkpoint (so earlier ctitans read it), and read.
#define CKPT_FORMAT 4
#define CKPT_FORMAT_RANGE 3
#define CKPT_FORMAT_UNFUSED 2

// Flat elements [lo, hi) of param_mem's layout (qwen3_range); lists of them are ascending and
// disjoint.
typedef qwen3_range ckpt_range;

// Things the caller should log (library code prints nothing): checkpoints skipped as corrupt or
// incomplete, stale temporary folders removed, old checkpoints pruned. Each message names the
// folder. Start zeroed; ckpt_notes_free releases it.
typedef struct ckpt_notes {
    char **msgs;
    int n;
} ckpt_notes;
void ckpt_notes_free(ckpt_notes *notes);

// out = "<root>/step-<step>". Fails only if it does not fit in cap.
int ckpt_step_path(char *out, size_t cap, const char *root, int64_t step, ct_error *err);

// One shard file as written, for state.json: its name (in the step folder), the elements it
// holds (numel; offset: where its first range starts, the only one of a one-range shard), the
// file's size and XXH64. Flat, so ranks can allgather it; the ranges travel separately.
typedef struct ckpt_shard_info {
    char file[64];
    uint64_t offset, numel, bytes, xxh64;
} ckpt_shard_info;

// out = "<root>/step-<step>.tmp-<tag>", the folder a save writes into. Fails only if it does not
// fit in cap.
int ckpt_tmp_path(char *out, size_t cap, const char *root, int64_t step, long tag, ct_error *err);

// Rank 0, before any shard is written: creates root (fsyncing its parent if new), removes
// leftovers of this exact temporary name (and of its ".old" companion), creates the folder.
int ckpt_begin(const char *root, int64_t step, long tag, ct_error *err);

// Every rank, after ckpt_begin: writes optimizer-<shard>-of-<n_shards>.safetensors into tmp (the
// folder of ckpt_tmp_path), fsynced. exp_avg and exp_avg_sq hold elements [offset, offset+numel)
// of the flat layout (may be NULL when numel is 0); total is the model's num_params. Refuses,
// writing nothing, a NaN or infinite moment (the error names its flat index). Fills *info.
int ckpt_write_optimizer_shard(const char *tmp, int shard, int n_shards, size_t offset,
                               size_t numel, size_t total, const float *exp_avg,
                               const float *exp_avg_sq, ckpt_shard_info *info, ct_error *err);

// Every rank, after ckpt_begin: writes shard `shard` of n_shards over the flat ranges
// ranges[0 .. n_ranges) (ascending, disjoint, within m->num_params): optimizer-<shard>-of-<n>
// from exp_avg and exp_avg_sq and, with params (NULL: the model is saved whole by the commit),
// model-<shard>-of-<n>, each buffer the concatenation over the ranges. Fsynced. m gives the
// layout and names only (qwen3_init_layout is enough). Refuses, writing nothing, a NaN or
// infinite value, naming the HF tensor and its element. Fills *opt_info and *model_info (may be
// NULL when params is NULL).
int ckpt_write_shard(const char *tmp, const qwen3_model *m, int shard, int n_shards,
                     const ckpt_range *ranges, int n_ranges, const float *params,
                     const float *exp_avg, const float *exp_avg_sq, ckpt_shard_info *opt_info,
                     ckpt_shard_info *model_info, ct_error *err);

// Rank 0, once every shard's info is gathered (shards[r] from rank r): checks the shards tile
// [0, m->num_params) in order and are in the folder with their sizes, refuses NaN or infinite
// parameters (naming the tensor), writes model.safetensors, config.json, config.toml and
// state.json into the folder of ckpt_tmp_path(root, st->step, tag), fsyncs it and renames it to
// step-<st->step> (a complete folder of the same step is replaced), then fsyncs root. On failure
// the temporary folder is removed and the previous checkpoints are untouched.
int ckpt_commit(const char *root, long tag, const qwen3_model *m, const ckpt_shard_info *shards,
                int n_shards, const train_state *st, const char *config_toml, ct_error *err);

// ckpt_commit for shards of any ranges: optim[r] (and model[r], when the model is in shards;
// NULL: model.safetensors is written from m, whose parameters must then be finite) were written
// by shard r over ranges[r][0 .. n_ranges[r]). Checks the names, sizes and that the union of
// all the shards' ranges tiles [0, m->num_params) (no gap, no overlap; errors name the files),
// then writes config.json (and model.safetensors unless model), config.toml and state.json and
// renames as ckpt_commit. With model shards, m gives the config and layout only.
int ckpt_commit_ranges(const char *root, long tag, const qwen3_model *m,
                       const ckpt_shard_info *optim, const ckpt_shard_info *model, int n_shards,
                       const ckpt_range *const *ranges, const int *n_ranges, const train_state *st,
                       const char *config_toml, ct_error *err);

// Best-effort removal of a save's temporary folder (a rank failed between begin and commit).
void ckpt_abandon(const char *root, int64_t step, long tag);

// Single process: ckpt_begin, one shard of everything, ckpt_commit, with tag = getpid().
// exp_avg and exp_avg_sq hold n == m->num_params floats each. config_toml is the effective
// config (may not be NULL). Refuses, writing nothing, if any parameter or moment is NaN or
// infinite (the error names the tensor and element).
int ckpt_save(const char *root, const qwen3_model *m, const float *exp_avg, const float *exp_avg_sq,
              size_t n, const train_state *st, const char *config_toml, ct_error *err);

// keep_latest_k > 0: among the step-<N> folders with N <= newest_step, keeps step-<newest_step>
// and the keep_latest_k - 1 newest others; deletes the older ones (each renamed to a temporary
// name first, so an interrupted delete never looks like a checkpoint). Folders of later steps
// are left alone. keep_latest_k <= 0 keeps all. Call after a successful ckpt_save or ckpt_commit.
int ckpt_prune(const char *root, int keep_latest_k, int64_t newest_step, ckpt_notes *notes,
               ct_error *err);

// Removes step-*.tmp-* folders that interrupted saves or prunes left behind, unless the process
// that made one is still running (another live run's save in progress). Call once at start.
// A missing root is not an error. notes (may be NULL) gets one line per folder removed.
int ckpt_clean_stale(const char *root, ckpt_notes *notes, ct_error *err);

// Checks one checkpoint folder without loading anything: state.json parses and has a format
// this reads, its step matches the folder name, each kind of shards tiles [0, total), every
// listed file exists with its size and XXH64, the safetensors files are valid and every shard's
// metadata (ranges, numel, total) and shapes agree with state.json. With m (may be NULL):
// model.safetensors matches the model's names, shapes and dtype F32, with nothing missing or
// extra (model shards: they hold m->num_params), and the shards cover m->num_params. st (may
// be NULL) gets the state.
int ckpt_verify(const char *dir, const qwen3_model *m, train_state *st, ct_error *err);

// Loads the checkpoint in `dir` into m (already built with the run's architecture; a sharded
// model is assembled whole from its shards), *st, and the moments: exp_avg and exp_avg_sq receive
// elements [offset, offset + numel) of the flat layout, read from whichever shards overlap that
// range (any range: the number of loading ranks need not be the number that saved). Both NULL with
// numel 0 loads the model only. *config_toml (if non-NULL) gets the saved config.toml text
// (malloc'd, the caller frees). state.json, model.safetensors and the shards read are verified as
// ckpt_verify does before anything is copied: on error, m and the moments are untouched.
int ckpt_load(const char *dir, qwen3_model *m, float *exp_avg, float *exp_avg_sq, size_t offset,
              size_t numel, train_state *st, char **config_toml, ct_error *err);

// Resume: loads the newest complete checkpoint under root, as ckpt_load. A corrupt or
// incomplete one is added to notes and skipped for the previous one. Every shard is verified,
// not only those read, so that ranks loading different ranges skip the same folders and agree
// on the checkpoint. A complete one that does not match the model (another architecture) is an
// error, not skipped. Returns 1 when loaded (dir_out gets its folder), 0 when root holds no
// loadable checkpoint, -1 on error.
int ckpt_resume(char *dir_out, size_t cap, qwen3_model *m, float *exp_avg, float *exp_avg_sq,
                size_t offset, size_t numel, train_state *st, char **config_toml, const char *root,
                ckpt_notes *notes, ct_error *err);

// ckpt_load for a rank that holds a list of ranges (ascending, disjoint) and never the whole
// model: params (NULL: skip) gets their parameters, concatenated in range order, from
// model.safetensors' HF tensors or the model shards that overlap them; exp_avg and exp_avg_sq
// (both NULL: skip) their moments from the optimizer shards that overlap them. Any layout, any
// number of saving ranks. m gives the layout only (qwen3_init_layout is enough). Verified as
// ckpt_load before anything is copied; on error nothing is written.
int ckpt_load_ranges(const char *dir, const qwen3_model *m, const ckpt_range *ranges, int n_ranges,
                     float *params, float *exp_avg, float *exp_avg_sq, train_state *st,
                     char **config_toml, ct_error *err);

// ckpt_resume for ckpt_load_ranges: the newest complete checkpoint under root, every shard
// verified (so that ranks with different ranges agree on the folder), corrupt ones into notes.
// Returns 1 when loaded (dir_out gets its folder), 0 when there is none, -1 on error.
int ckpt_resume_ranges(char *dir_out, size_t cap, const qwen3_model *m, const ckpt_range *ranges,
                       int n_ranges, float *params, float *exp_avg, float *exp_avg_sq,
                       train_state *st, char **config_toml, const char *root, ckpt_notes *notes,
                       ct_error *err);

// The newest complete checkpoint under root, checked as ckpt_verify does (against m, if
// non-NULL), skipping corrupt ones into notes. Returns 1 (dir_out and *st set, st may be NULL),
// 0 when there is none, -1 on error.
int ckpt_find_latest(char *dir_out, size_t cap, train_state *st, const char *root,
                     const qwen3_model *m, ckpt_notes *notes, ct_error *err);

// --- export (src/checkpoint/checkpoint_export.c)

// "float32" | "bfloat16" | "float16" (as checkpoint.export_dtype and torch_dtype spell them).
int ckpt_parse_dtype(ct_dtype *out, const char *name, ct_error *err);
// A shard size as HF's max_shard_size: bytes ("1000"), or an integer with a unit, decimal
// (KB, MB, GB, TB) or binary (KiB, MiB, GiB, TiB), case-insensitive. "0" = one file.
int ckpt_parse_size(uint64_t *bytes, const char *text, ct_error *err);
// The tokenizer folder of a run from its config.toml text: [model] tokenizer_path; when that is
// empty or absent, [model] hf_path if backend = "hf", else "assets/qwen3-tokenizer" (the
// config's defaults). A minimal lookup of string values, not a TOML parser.
void ckpt_tokenizer_dir(char *out, size_t cap, const char *config_toml);
// Writes an HF folder: config.json and the weights as dtype (F32, BF16, F16), sharded above
// max_shard_bytes (0 = one file) with an index, then copies the tokenizer files
// (tokenizer.json, tokenizer_config.json, and vocab.json, merges.txt, special_tokens_map.json
// when present) from tokenizer_dir (NULL = none), and its generation_config.json when present
// (HF's sampling defaults and stop tokens; for a run from an HF folder, tokenizer_dir is that
// folder). Returns the number of tokenizer files copied (0: no tokenizer.json, for the caller
// to warn about), or -1.
int ckpt_export_hf(const qwen3_model *m, const char *out_dir, ct_dtype dtype,
                   uint64_t max_shard_bytes, const char *tokenizer_dir, ct_error *err);
// ckpt_export_hf with the weights read through `read` (hf_save_folder_from: each tensor a chunk
// at a time, m the layout only): the same files, byte for byte. Tensor parallelism's export
// assembles each tensor from its ranks' slices as it is read.
int ckpt_export_hf_from(const qwen3_model *m, const char *out_dir, ct_dtype dtype,
                        uint64_t max_shard_bytes, const char *tokenizer_dir, hf_read_fn read,
                        void *ctx, ct_error *err);
// ckpt_export_hf of the checkpoint folder ckpt_dir, without the model in memory: the geometry
// from its config.json, the folder verified (every file, as ckpt_verify), then each HF tensor in
// save_pretrained's order read from model.safetensors or the model shards a chunk at a time as
// it is written. The same files, byte for byte, as ckpt_export_hf of the loaded model. Returns
// the number of tokenizer files copied, or -1. st and num_params (may be NULL) get the
// checkpoint's train_state and parameter count, for the caller's message.
int ckpt_export_hf_streaming(const char *ckpt_dir, const char *out_dir, ct_dtype dtype,
                             uint64_t max_shard_bytes, const char *tokenizer_dir, ct_error *err);
int ckpt_export_hf_streaming_info(const char *ckpt_dir, const char *out_dir, ct_dtype dtype,
                                  uint64_t max_shard_bytes, const char *tokenizer_dir,
                                  train_state *st, size_t *num_params, ct_error *err);
