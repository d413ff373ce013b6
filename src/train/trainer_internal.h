// What the trainer's files share: the run's state (trainer.c: setup, the step, the loop;
// trainer_checkpoint.c: resume, save, the final export).
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "data/dataset.h"
#include "text/chat.h"
#include "data/loader.h"
#include "parallel/fsdp.h"
#include "parallel/grad_sync.h"
#include "model/hf_adapter.h"
#include "model/moe_balance.h"
#include "optim/adamw.h"
#include "optim/lr_schedule.h"
#include "checkpoint/checkpoint.h"
#include "train/metrics.h"
#include "train/run_setup.h"
#include "train/trainer.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

// Everything one run holds. Buffers are allocated in trainer_setup; the step loop allocates
// nothing.
typedef struct trainer {
    const ct_config *cfg;
    FILE *log;          // rank 0: the caller's stream; other ranks: /dev/null (owned)
    dist *d;            // the ranks (a world of one without a launcher)
    grad_sync sync;     // gradient reduction and, with ZeRO-1, the parameter all-gather (not FSDP)
    bool shard;         // ZeRO-1: this rank's optimizer covers [sync.shard_lo, sync.shard_hi)
    bool fsdp_on;       // FSDP (parallelism.data_parallel_shard_mode = "fsdp", shard degree > 1)
    int shard_degree;   // ranks of a shard group (the world for ZeRO-1)
    fsdp fsdp;          // FSDP: the shards, the gathers and reduce-scatters (trainer_fsdp.c)
    float *expert_bias; // FSDP + MoE: every sparse layer's expert bias, whole (trainer_fsdp.c)
    long save_tag;      // rank 0's pid: names the temporary folder every rank saves into
    run_setup setup;    // model config, kernels, trusted plugins, the op table, memory options
    qwen3_model model;
    adamw opt;
    adamw_hparams hp;
    lr_schedule_cfg sched;
    tokenizer *tok;
    chat_template *chat; // the tokenizer folder's, when it has one
    token_stream train_data, val_data;
    data_loader train_loader, val_loader;
    bool has_val;
    int B, T, accum;           // micro-batch, sequence length, micro-batches per step per rank
    int global_batch;          // sequences per step over all ranks: accum * B * ranks
    int32_t *inputs, *targets; // (accum*B, T): this rank's samples of the step
    int32_t *positions;        // (accum*B, T) under model.attn_mask_type = "block_causal"
    train_state state;
    char ckpt_root[4096];
    char *config_toml;    // the effective config, saved in every checkpoint
    uint64_t config_hash; // of the effective config, with the global batch resolved
    double flops_per_token, peak_gflops;
    metrics_log metrics;
    moe_balance moe;  // MoE: the routing statistics, the aux loss, the expert bias
    bool aux_in_loss; // load_balance = hf and output_router_logits: the loss adds coef * aux
    bool aux_free;    // load_balance = aux_free: the expert bias moves before each step
} trainer;

static inline bool is_root(const trainer *t) {
    return t->d->rank == 0;
}
// Prints the checkpoint notes to the log (rank 0's) and frees them.
void trainer_log_notes(trainer *t, ckpt_notes *notes);
// debug.fault: true when `kind` hits this rank at `step` (from 1).
bool trainer_fault_at(const trainer *t, const char *kind, int64_t step);

// trainer_fsdp.c
// The memory estimate under FSDP: `mem`'s params, grads and optimizer become this rank's
// shards, plus the units in flight; logs the parts.
int trainer_fsdp_estimate(const trainer *t, run_memory *mem, ct_error *err);
// After the model and its activations are planned: the shards, the optimizer over them, the
// model's unit hook.
int trainer_fsdp_setup(trainer *t, ct_error *err);
int trainer_fsdp_init_random(trainer *t, uint64_t seed, ct_error *err);

// Shard rank s's pieces, the non-empty ones in order (at most qwen3_n_units): the ranges its
// checkpoint shard holds, in the shard buffer's order. Returns their count.
int trainer_fsdp_ranges(const trainer *t, int s, ckpt_range *out);
// Every sparse layer's expert bias as a range (at most num_hidden_layers), in layer order: the
// whole copy each rank keeps. Returns their count.
int trainer_fsdp_bias_ranges(const trainer *t, ckpt_range *out);

// Loads this rank's pieces and the whole expert biases from a checkpoint folder (moments NULL:
// the weights only; st may be NULL), or from a Hugging Face folder's ranges.
int trainer_fsdp_load(trainer *t, const char *dir, float *moments[2], train_state *st,
                      ct_error *err);
int trainer_fsdp_load_hf(trainer *t, hf_load_report *rep, const st_set *set, const char *from,
                         ct_error *err);

// trainer_checkpoint.c. Returns 1 when resumed, 0 when there is nothing to resume, -1 on error.
int trainer_resume(trainer *t, ct_error *err);
int trainer_save_checkpoint(trainer *t, ct_error *err);
int trainer_export_final(trainer *t, ct_error *err);
