// Data-parallel strategies behind one interface: replicate (DDP), ZeRO-1, FSDP/HSDP. The step
// (trainer_step.c) calls these and nothing else to synchronise; the model meets a strategy only
// through its unit hook; the tensors' units and splits come from the model's parallelize plan
// (model/qwen3_parallelize.h). A new mode (TP, CP, EP, PP) is one more strategy_vt and its
// plan entries.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "checkpoint/checkpoint.h"
#include "core/error.h"
#include "model/hf_adapter.h"
#include "model/qwen3_parallelize.h"
#include "parallel/fsdp.h"
#include "parallel/grad_sync.h"
#include "train/run_setup.h"
#include "train/train_state.h"

typedef struct trainer trainer;

// The buffers this rank's optimizer steps: the fp32 weights, their gradients and (when the same
// pass refreshes it) their bf16 copy.
typedef struct strategy_shard {
    float *params, *grads;
    uint16_t *bf16; // NULL: after_update refreshes the copy, or there is none
} strategy_shard;

typedef struct strategy_vt {
    // The "parallel:" line's words for the mode, and the note after the optimizer's size on
    // the memory line.
    void (*describe)(const trainer *t, char *buf, size_t size);
    const char *memory_note;
    bool optimizer_sharded; // AdamW's moments are this rank's 1/N (the memory estimate)
    // The memory estimate's own parts (NULL: none): mem's parameters, gradients and optimizer
    // become this rank's; logs them.
    int (*estimate)(const trainer *t, run_memory *mem, ct_error *err);
    // After the model and its activations are planned: the plan, the synchronisation, the
    // optimizer over this rank's shard, the model's unit hook.
    int (*setup)(trainer *t, ct_error *err);
    void (*free)(trainer *t);
    // The weights' first values: a seeded init, a checkpoint whose model is in shards, a
    // Hugging Face folder (every rank the same weights; each keeps what its shard holds); then
    // weights_ready, after any of them or a resume.
    int (*init_random)(trainer *t, uint64_t seed, ct_error *err);
    int (*load_sharded)(trainer *t, const char *dir, ct_error *err);
    int (*load_hf)(trainer *t, hf_load_report *rep, const st_set *set, const char *from,
                   ct_error *err);
    void (*weights_ready)(trainer *t);
    // A step: the gradients start at zero; a micro-batch begins (`last`: its backward makes
    // the gradients final); the model's unit hook (ctx: the trainer) sees every unit's events.
    void (*begin_step)(trainer *t);
    void (*begin_micro)(trainer *t, bool last);
    void (*unit_ready)(void *ctx, int unit, int event);
    // After the last backward: the reductions are done (the gradients are final).
    int (*grads_final)(trainer *t, ct_error *err);
    // The summed gradient's sum of squares over every rank's shard.
    int (*grad_sq)(trainer *t, double *sq, ct_error *err);
    // The buffers this rank's optimizer indexes (from its base).
    strategy_shard (*shard)(trainer *t);
    // After the optimizer stepped the shard: the weights the model reads are current.
    int (*after_update)(trainer *t, ct_error *err);
    // After a forward without backward (validation): what a unit kept for its backward goes.
    void (*after_eval)(trainer *t);
    // Communication seconds of the step beyond dist's own count: exposed and hidden.
    void (*take_comm)(trainer *t, double *exposed, double *hidden);
} strategy_vt;

extern const strategy_vt strategy_replicate, strategy_zero1, strategy_fsdp;

// One run's strategy and its state.
typedef struct strategy {
    const strategy_vt *vt;
    qwen3_parallel_plan plan; // the model's (after setup)
    grad_sync sync;           // replicate, ZeRO-1: buckets, and ZeRO-1's parameter gather
    bool overlap;             // replicate, ZeRO-1: reduce during this micro-batch's backward
    fsdp fsdp;                // FSDP: the shards, the gathers and reduce-scatters
    // FSDP: the plan's QWEN3_SPLIT_WHOLE tensors (the MoE expert biases), whole, back to back in
    // plan order.
    float *whole;
} strategy;

// FSDP: shard rank s's pieces, the non-empty ones in order (at most the plan's units): the
// ranges its checkpoint shard holds, in the shard buffer's order. Returns their count.
int strategy_fsdp_ranges(const trainer *t, int s, ckpt_range *out);
// FSDP: loads this rank's pieces and the whole tensors from a checkpoint folder (moments NULL:
// the weights only; st may be NULL).
int strategy_fsdp_load(trainer *t, const char *dir, float *moments[2], train_state *st,
                       ct_error *err);
