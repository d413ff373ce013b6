// What the trainer's files share: the run's state (trainer_setup.c, trainer_step.c,
// trainer_metrics.c, trainer.c: the loop; trainer_checkpoint.c: resume, save, the final
// export; strategy*.c: the data-parallel strategies).
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
#include "train/run_data.h"
#include "train/context_parallel.h"
#include "train/run_setup.h"
#include "train/strategy.h"
#include "train/trainer.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

// Everything one run holds. Buffers are allocated in trainer_setup; the step loop allocates
// nothing.
typedef struct trainer {
    const ct_config *cfg;
    FILE *log;        // rank 0: the caller's stream; other ranks: /dev/null (owned)
    dist *d;          // the data-parallel ranks (the world, or under TP the ranks of this TP rank)
    dist *world;      // every rank (t->d but under TP)
    int tp;           // parallelism.tensor_parallel_degree
    dist tp_group, dp_group; // under TP: this rank's TP group (tp innermost) and its DP group
    int cp;                  // parallelism.context_parallel_degree
    context_parallel cpx;    // under CP (cp > 1): its group and the model's hook
    int ep;                  // parallelism.expert_parallel_degree
    // The TP degree of each expert's projections: tp without EP, under EP its
    // expert_tensor_parallel_degree (1: experts whole, or tp: cut as a dense MLP, "ETP").
    int etp;
    // Under EP: this rank's EP group (ep consecutive data-parallel ranks; under TP with etp 1, ep
    // consecutive ranks of the world, under PP of the stage, TP groups whole) and the ranks holding
    // the same experts (one per EP group). Under etp = tp also the EP group's block: its ranks and
    // their TP peers, the ep x tp consecutive ranks of the world (under PP of the stage) that hold
    // one copy of every expert's slices (a checkpoint's writers, the export's group).
    dist ep_group, erep_group, eblock_group;
    // parallelism.pipeline_parallel_degree; under PP: the ranks of this data-parallel (and TP)
    // index (one per stage group, outermost) and this stage's ranks, which t->d is (under TP its
    // dp_group, split from them). Also the ranks of the first replica (pp x tp, pp x ep or under
    // EP x TP pp x ep x etp of them, pipeline rank outermost): a checkpoint's writers, one shard
    // each.
    int pp;
    dist pp_group, stage_group, pp_writers;
    strategy strat;   // replicate, ZeRO-1 or FSDP/HSDP (strategy.h)
    int shard_degree; // ranks of a shard group (the world for ZeRO-1)
    long save_tag;    // rank 0's pid: names the temporary folder every rank saves into
    run_setup setup;  // model config, kernels, trusted plugins, the op table, memory options
    qwen3_model model;
    adamw opt;
    adamw_hparams hp;
    lr_schedule_cfg sched;
    run_text text; // the tokenizer and chat template the data needs
    token_stream train_data, val_data;
    data_loader train_loader, val_loader;
    bool has_val;
    int B, T, accum;           // micro-batch, sequence length, micro-batches per step per rank
    int val_B;                 // validation's batch: the local batch (PP's micro-batches' whole)
    int global_batch;          // sequences per step over all ranks: accum * B * ranks
    // (accum*B, T): this rank's samples of the step; under CP, once sharded, (accum*B, T/cp)
    int32_t *inputs, *targets;
    int32_t *positions;        // (accum*B, T) under model.attn_mask_type = "block_causal"
    train_state state;
    char ckpt_root[4096];
    char *config_toml;    // the effective config, saved in every checkpoint
    uint64_t config_hash; // of the effective config, with the global batch resolved
    double flops_per_token, peak_gflops;
    bool peak_rechecked;  // a step ran above the cached peak, which was then measured again
    metrics_log metrics;
    moe_balance moe;  // MoE: the routing statistics, the aux loss, the expert bias
    bool aux_in_loss; // load_balance = hf and output_router_logits: the loss adds coef * aux
    bool aux_free;    // load_balance = aux_free: the expert bias moves before each step
    dist *moe_ranks;  // the ranks the routing statistics are summed over
    // The metrics row's load balance per sparse layer (max load / mean load): the model's, or
    // under PP every stage's, gathered (n_moe_metric layers).
    int n_moe_metric;
    const double *moe_metric;
} trainer;

// Micro-batch a (from 0) of this rank's samples of the step, as the model takes it.
qwen3_batch trainer_micro_batch(const trainer *t, int a);

static inline bool is_root(const trainer *t) {
    return (t->world ? t->world : t->d)->rank == 0;
}
// Under EP, the ranks holding one copy of every expert: the EP group, or under etp = tp its
// block (with the TP peers). A checkpoint's writers (shard q: block rank q), the export's group.
static inline dist *ep_block(trainer *t) {
    return t->etp > 1 ? &t->eblock_group : &t->ep_group;
}
// AdamW decays the tensor (buffers are not trained).
static inline bool trainer_param_decays(const trainer *t, const qwen3_param *p) {
    return !p->buffer &&
           (t->cfg->optimizer.decay_norms_and_embeddings || adamw_param_decays(p->name, p->ndim));
}

// trainer_setup.c: everything before the first step; trainer_free releases it (also after a
// failed setup).
int trainer_setup(trainer *t, const ct_config *c, FILE *log, ct_error *err);
void trainer_free(trainer *t);

// trainer_step.c
typedef struct step_result {
    double loss, grad_norm, lr, comm_s, comm_hidden_s;
    double ce, aux; // the loss's parts (MoE): cross-entropy, and the mean aux of the micro-batches
    bool skipped;
    bool no_tokens; // skipped because the step's samples train no token
} step_result;
int trainer_step(trainer *t, step_result *r, ct_error *err);
// After a micro-batch's backward (the trainer's loop, PP's schedule): 0, or -1 with err set when
// an expert-parallel exchange or the MoE statistics' sum over the ranks failed in it.
int trainer_micro_status(trainer *t, ct_error *err);
// debug.fault: true when `kind` hits this rank at `step` (from 1).
bool trainer_fault_at(const trainer *t, const char *kind, int64_t step);

// trainer_metrics.c: the validation loss (logged and in metrics.jsonl), and a metrics row.
int trainer_validate(trainer *t, ct_error *err);
void trainer_log_metrics(trainer *t, const step_result *r, double t_resume, double *t_log,
                         int64_t *steps_since_log, double comm_since_log[2], int64_t start_step,
                         int64_t skipped_total);
// At the end of a multi-rank run: rank 0's bytes per step of each kind of collective.
void trainer_log_comm_volume(trainer *t, int64_t steps);

// trainer_checkpoint.c. Returns 1 when resumed, 0 when there is nothing to resume, -1 on error.
int trainer_resume(trainer *t, ct_error *err);
int trainer_save_checkpoint(trainer *t, ct_error *err);
int trainer_export_final(trainer *t, ct_error *err);
// Prints the checkpoint notes to the log (rank 0's) and frees them.
void trainer_log_notes(trainer *t, ckpt_notes *notes);
