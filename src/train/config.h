// The training configuration: torchtitan's sections and key names, read from an optional TOML
// file and `--section.key=value` / `--section.key value` command-line overrides.
//
// One key table (config.c) drives loading, printing, --help, hashing and "did you mean"
// suggestions, so a key exists in exactly one place. Precedence: defaults < TOML file <
// command line. Every error names where the value came from (FILE:LINE or the command-line
// option) and the key.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/error.h"

#define CT_CONFIG_PATH_MAX 1024
#define CT_CONFIG_NAME_MAX 64

typedef struct ct_config_job {
    char dump_folder[CT_CONFIG_PATH_MAX]; // every output of the run goes under it
    char description[256];
} ct_config_job;

typedef struct ct_config_model {
    // torchtitan's model.name: "qwen3", or "transformers_modeling_backend" (= backend "hf" on
    // hf_transformers.model); config_compat.c resolves it.
    char name[CT_CONFIG_NAME_MAX];
    // torchtitan's folder of HF assets: the tokenizer, and the weights initial_load_in_hf loads.
    char hf_assets_path[CT_CONFIG_PATH_MAX];
    char backend[CT_CONFIG_NAME_MAX]; // "native" (a flavor) | "hf" (a Hugging Face folder)
    char flavor[CT_CONFIG_NAME_MAX];  // native flavor name: "debugmodel", "0.6B", ...
    char hf_path[CT_CONFIG_PATH_MAX]; // backend=hf: folder with config.json + safetensors
    // Folder with tokenizer.json. Resolved at load: hf_path for backend=hf, else
    // "assets/qwen3-tokenizer", unless given.
    char tokenizer_path[CT_CONFIG_PATH_MAX];
    // Overrides of the flavor's architecture (native only); 0 = keep the flavor's value.
    int n_layers, dim, n_heads, n_kv_heads, head_dim, ffn_dim, vocab_size, max_seq_len;
    int tie_embeddings; // -1 = the flavor's, 0 = untied, 1 = tied
    // MoE flavors' overrides likewise (0 = the flavor's).
    int num_experts, num_experts_per_tok, moe_intermediate_size;
    char moe_impl[CT_CONFIG_NAME_MAX];       // expert kernel: "grouped" | "loop"
    char attn_backend[CT_CONFIG_NAME_MAX];   // "auto" (= "flash") | "sdpa" | "flash"
    char attn_mask_type[CT_CONFIG_NAME_MAX]; // "causal" | "block_causal" (packed documents)
    char load_balance[CT_CONFIG_NAME_MAX];   // "hf" (aux loss) | "aux_free" (expert bias) | "none"
    double load_balance_coeff;               // aux_free: the expert-bias step
    double router_aux_loss_coef;             // -1 = the model config's; else >= 0
    int output_router_logits;                // -1 = the model config's, 0 = off, 1 = on
} ct_config_model;

typedef struct ct_config_training {
    char dataset[CT_CONFIG_NAME_MAX];      // torchtitan's data set name; only names it here
    char dataset_path[CT_CONFIG_PATH_MAX]; // .txt, .jsonl, .npy or a folder of them
    int local_batch_size;
    int global_batch_size; // -1 = local_batch_size * data-parallel degree (no accumulation)
    int seq_len;
    int steps;
    double max_norm; // global grad-norm clip; 0 = off
    bool shuffle;
    int max_skipped_steps; // non-finite steps in a row before the run stops with an error
    bool allow_overcommit; // train even when the memory estimate exceeds available memory
    char mixed_precision_param[CT_CONFIG_NAME_MAX];  // "float32" | "bfloat16" (the GEMMs)
    char mixed_precision_reduce[CT_CONFIG_NAME_MAX]; // "float32" | "bfloat16" (the DP sums)
    int loss_chunk_tokens; // the loss head in chunks of this many tokens; 0 = whole; -1 = auto
    char train_on[CT_CONFIG_NAME_MAX]; // conversations: "assistant" | "all" tokens trained
} ct_config_training;

typedef struct ct_config_optimizer {
    char name[CT_CONFIG_NAME_MAX]; // "AdamW"
    double lr, beta1, beta2, eps, weight_decay;
    // true: every parameter decays (torchtitan); false: 1-D norm weights, biases and the
    // embedding are excluded.
    bool decay_norms_and_embeddings;
} ct_config_optimizer;

typedef struct ct_config_lr_scheduler {
    int warmup_steps; // lr factor (step+1)/warmup_steps while step < warmup_steps
    // Decay over the last round(decay_ratio*steps) steps; NAN (unset) = every step after the
    // warmup, as torchtitan.
    double decay_ratio;
    char decay_type[CT_CONFIG_NAME_MAX]; // "linear" | "sqrt" | "cosine"
    double min_lr_factor;                // the factor decay ends at
} ct_config_lr_scheduler;

typedef struct ct_config_checkpoint {
    bool enable;
    char folder[CT_CONFIG_PATH_MAX]; // relative to job.dump_folder
    int interval;                    // save every `interval` steps
    int keep_latest_k;               // 0 = keep all
    char initial_load_path[CT_CONFIG_PATH_MAX];
    bool initial_load_in_hf;               // initial_load_path is a Hugging Face folder
    bool last_save_in_hf;                  // the final save is an HF export in export_dtype
    bool last_save_model_only;             // torchtitan's: the final save holds the model only (=
                                           // last_save_in_hf)
    char export_dtype[CT_CONFIG_NAME_MAX]; // "float32" | "bfloat16" | "float16"
} ct_config_checkpoint;

typedef struct ct_config_metrics {
    int log_freq;
    double peak_gflops; // per-worker peak for MFU; 0 = measure an sgemm once at start
} ct_config_metrics;

typedef struct ct_config_validation {
    bool enable;
    char dataset[CT_CONFIG_NAME_MAX]; // torchtitan's data set name, as training.dataset
    char dataset_path[CT_CONFIG_PATH_MAX];
    int freq;  // validate every `freq` steps
    int steps; // batches per validation; -1 = the whole split
} ct_config_validation;

typedef struct ct_config_debug {
    int64_t seed;                   // weights init and data shuffle
    char fault[CT_CONFIG_NAME_MAX]; // injected failure for tests:
                                    // none|bad_token|nan|exit|hang|weights
    int fault_rank, fault_step;     // where (rank) and when (1-based step) it happens
    bool profile_ops;               // time every op call; print a per-op table at the end
    bool guard_device_memory;       // the guarded CPU backend (tests only)
} ct_config_debug;

// Data parallelism over the ranks of mpirun/srun. shard * replicate = ranks.
typedef struct ct_config_parallelism {
    int data_parallel_shard_degree;     // ranks sharing the model (FSDP) or its optimizer state
    int data_parallel_replicate_degree; // groups holding a full replica (DDP; HSDP with sharding)
    int tensor_parallel_degree;         // ranks of a TP group (innermost), with SP and loss parallel
    int context_parallel_degree;        // ranks of a CP group (inside dp, outside tp): ring attention
    char context_parallel_rotate_method[CT_CONFIG_NAME_MAX]; // "allgather" | "alltoall"
    int expert_parallel_degree;         // ranks splitting the experts (EP), out of the DP ranks
    int expert_tensor_parallel_degree;  // TP inside an expert under EP: 1
    int pipeline_parallel_degree;       // pipeline stages' ranks (outermost)
    char pipeline_parallel_schedule[CT_CONFIG_NAME_MAX]; // 1F1B | GPipe | Interleaved1F1B
    int pipeline_parallel_microbatch_size;               // sequences per micro-batch
    int pipeline_parallel_layers_per_stage;              // 0: the stages' count decides
    int pipeline_parallel_first_stage_less_layers;       // the embedding's share (1)
    int pipeline_parallel_last_stage_less_layers;        // the head's share (1)
    char module_fqns_per_model_part[1024]; // stages' modules: ';' between stages, ',' inside
    char data_parallel_shard_mode[CT_CONFIG_NAME_MAX];   // "fsdp" | "zero1"
    char fsdp_reshard_after_forward[CT_CONFIG_NAME_MAX]; // "default" | "always" | "never"
    int threads_per_rank; // OpenMP and BLAS threads; 0 = OMP_NUM_THREADS, else cores / ranks
} ct_config_parallelism;

// Collectives (torchtitan's [comm] keys, plus ctitan's bucketing and overlap).
typedef struct ct_config_comm {
    double init_timeout_seconds;       // start-up: loading, first agreement
    double train_timeout_seconds;      // any wait inside a training step
    double checkpoint_timeout_seconds; // waits around a checkpoint save or export
    double bucket_cap_mb;              // gradient bucket size, as DDP's bucket_cap_mb
    bool overlap;                      // reduce buckets during the backward
} ct_config_comm;

// torchtitan's [activation_checkpoint]: recompute layer forwards in the backward.
typedef struct ct_config_activation_checkpoint {
    char mode[CT_CONFIG_NAME_MAX];                // "none" | "full" | "selective"
    char selective_ac_option[CT_CONFIG_NAME_MAX]; // selective: every k-th layer, k as text
} ct_config_activation_checkpoint;

// PEFT's LoRA (model/lora.h), in PEFT's words. On when rank > 0: the base is frozen and the
// adapter is what trains (README "LoRA").
typedef struct ct_config_lora {
    int rank;                   // PEFT's r; 0: no LoRA
    double alpha;               // lora_alpha
    double dropout;             // lora_dropout
    char target_modules[512];   // comma-separated module names, or "all-linear"
    bool use_rslora;            // scaling alpha / sqrt(r)
    char adapter_path[CT_CONFIG_PATH_MAX]; // a PEFT adapter folder to start from
} ct_config_lora;

typedef struct ct_config_override {
    // Plugins (include/ctitan/plugin.h) whose kernels replace built-in ops, comma-separated.
    char imports[4096];
    bool allow_mismatch; // use overrides that fail the parity check (with a loud warning)
} ct_config_override;

// torchtitan's Transformers-backend section: model is the HF folder to train (backend "hf").
typedef struct ct_config_hf_transformers {
    char model[CT_CONFIG_PATH_MAX];
} ct_config_hf_transformers;

typedef struct ct_config {
    ct_config_job job;
    ct_config_model model;
    ct_config_hf_transformers hf_transformers;
    ct_config_training training;
    ct_config_optimizer optimizer;
    ct_config_lr_scheduler lr_scheduler;
    ct_config_checkpoint checkpoint;
    ct_config_metrics metrics;
    ct_config_validation validation;
    ct_config_debug debug;
    ct_config_parallelism parallelism;
    ct_config_comm comm;
    ct_config_activation_checkpoint activation_checkpoint;
    ct_config_lora lora;
    ct_config_override override;
} ct_config;

// Every key's default. The struct is zeroed first, so two configs with equal values compare
// equal with memcmp.
void config_defaults(ct_config *c);

// Defaults, then the TOML file, then the command line. The file is argv's `--config FILE` (or
// `--config=FILE`, anywhere in argv) if present, else toml_path_or_NULL. argv holds the words
// after the subcommand; every other word must be `--section.key=value` or `--section.key value`
// (a boolean key alone means true). Ends with config_validate's checks, whose messages then say
// where the offending value came from.
//
// Every problem of the file and the command line is reported at once, one line each (err->msg
// holds them separated by '\n'), before the cross-key checks run. `--config NAME` without a
// path finds configs/NAME.toml (in the working folder, then beside the ctitan binary);
// `--job.config_file` is torchtitan's name for `--config`.
int config_load(ct_config *c, const char *toml_path_or_NULL, int argc, char **argv, ct_error *err);

// What a load accepted but ignored: torchtitan keys that have no effect in ctitan.
typedef struct config_notes {
    int n_no_effect;
    char no_effect[2048]; // "profiling.enable_profiling, compile.enable, ..."
} config_notes;
// config_load that also fills notes.
int config_load_noted(ct_config *c, config_notes *notes, const char *toml_path_or_NULL, int argc,
                      char **argv, ct_error *err);

// What a subcommand takes of the key table. train and check-kernels take every key (and
// --config FILE); verify and generate take the keys they name. A key keeps the table's default,
// checks and messages whichever command takes it, so no command declares a key of its own.
typedef struct config_use {
    const char *command;     // "verify": named in messages
    const char *const *keys; // the "section.key" names taken; NULL: every key, and --config
    int n_keys;
    // Keys the command line must give ("verify needs --model.hf_path").
    const char *const *required;
    int n_required;
    const char *required_msg; // the message when one is missing (NULL: "verify needs --KEY")
    const char *const *own;   // the command's own options ("prompt"), offered as suggestions
    int n_own;
    bool needs_data; // training.dataset_path must be set (train; check-kernels reads no data)
    // The values the command fixes (verify: model.backend "hf"), set after the defaults and
    // before the command line; NULL: none. ctx is passed back.
    int (*fix)(ct_config *c, void *ctx, ct_error *err);
    void *ctx;
} config_use;
// config_use's designated initializers from arrays: .keys and .n_keys, .required and .n_required.
#define CONFIG_USE_KEYS(a) .keys = (a), .n_keys = (int)(sizeof(a) / sizeof *(a))
#define CONFIG_USE_REQUIRED(a) .required = (a), .n_required = (int)(sizeof(a) / sizeof *(a))
// What train takes: every key, --config, and training.dataset_path.
extern const config_use config_use_train;
// config_load_noted for the command `u` describes.
int config_load_use(ct_config *c, config_notes *notes, const config_use *u,
                    const char *toml_path_or_NULL, int argc, char **argv, ct_error *err);
// Whether `u` takes the key "section.key".
bool config_use_takes(const config_use *u, const char *full_name);

// Cross-key checks that need no model: choices, ranges, global_batch_size a multiple of
// local_batch_size * data-parallel degree, decay_ratio in [0,1], warmup + decay steps <= steps,
// backend=hf needs hf_path, training.dataset_path set (train's checks), ...
int config_validate(const ct_config *c, ct_error *err);
// [lora] as the model takes it (the target list parsed, the values checked); lora.rank > 0.
struct lora_config;
int config_lora(struct lora_config *lc, const ct_config *c, ct_error *err);
// A LoRA run's base as its adapter_config.json names it (base_model_name_or_path): the
// initial_load_path, else the HF folder (backend=hf), else the flavor's name.
void config_lora_base_name(char *out, size_t cap, const ct_config *c);

// The full effective config, every key, as TOML that config_load reads back to an equal struct.
// Returns -1 if the stream reports a write error.
int config_write_toml(const ct_config *c, FILE *f);
// Only the keys whose values differ from the defaults, as TOML (what the log shows).
int config_write_changed(const ct_config *c, FILE *f);
// The hashed keys whose values differ, as "section.key OLD -> NEW, ..." in out; returns how many.
int config_describe_changes(char *out, size_t cap, const ct_config *old, const ct_config *now);
// config_write_toml into `path`, atomically (temp file, fsync, rename).
int config_save(const ct_config *c, const char *path, ct_error *err);

// FNV-1a 64 over the keys that change the math: model.*, training.* except steps and the
// run-control keys (max_skipped_steps, allow_overcommit), optimizer.*, lr_scheduler.*,
// debug.seed. A resume under a different hash trains a different run.
uint64_t config_hash(const ct_config *c);

// `ctitan train --help`: every key with its type, default and help.
void config_print_help(FILE *f);

// activation_checkpoint as the model takes it (qwen3_model.ac_every): 0 for "none", 1 for
// "full", k for "selective" with selective_ac_option k (validated by config_validate).
int config_ac_every(const ct_config *c);
// Whether activation_checkpoint is "selective" with selective_ac_option "op" (qwen3_memory_opts
// .ac_op: every layer recomputes its elementwise ops); config_ac_every is then 0.
bool config_ac_op(const ct_config *c);

// training.loss_chunk_tokens as qwen3_memory_opts.loss_chunk takes it for `tokens` rows per
// micro-batch (0: whole). Auto (-1): the fewest equal chunks of at most 256 MiB of logits, or
// 64 MiB with activation checkpointing (a run that trades time for memory gets the smaller
// head too: no slower at seq 2048, about 10% slower at seq 256 on the 2-core dev machine).
int config_loss_chunk(const ct_config *c, int vocab_size, int tokens);

// The key table, for callers that list or look up keys.
typedef enum config_type {
    CONFIG_STR,
    CONFIG_INT,   // int
    CONFIG_INT64, // int64_t
    CONFIG_FLOAT, // double
    CONFIG_BOOL,
    CONFIG_TRISTATE, // int -1/0/1, written as "auto"/false/true
    CONFIG_LIST,     // char[]: comma-separated; TOML also takes an array of strings
} config_type;

typedef struct config_key {
    const char *section, *key;
    config_type type;
    size_t offset, size; // where the value lives in ct_config, and its size (string capacity)
    const char *def;     // the default, as a command-line value; "" for a float: unset (NAN)
    const char *choices; // CONFIG_STR: allowed values separated by '|', or NULL for any
    bool hashed;         // part of config_hash
    const char *help;
} config_key;

const config_key *config_keys(int *n);
// A float key that may be left unset (its default is ""; torchtitan's None): NAN holds "unset",
// "" or "none" on the command line set it, config.toml writes it as a comment.
bool config_key_optional(const config_key *k);
// The key "section.key", or NULL.
const config_key *config_find_key(const char *full_name);
