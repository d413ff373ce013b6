// The model's parallelize plan, as torchtitan's parallelize_qwen3: for each tensor of the
// parameter buffer, the unit it belongs to and how a strategy may split it. The trainer's
// strategies (src/train/strategy.h) read this plan and never the model's tensor names.
//
// Units: the embedding (0), layer l (1 + l), the head (L + 1: the final norm, and lm_head when
// untied; a tied head reads unit 0). Each is a contiguous range of param_mem; they tile it in
// order. The model's unit_hook reports them (qwen3.h).
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "core/error.h"
#include "model/qwen3.h"

typedef enum qwen3_split {
    // Cut evenly with the rest of its unit over a shard group (FSDP, ZeRO-1).
    QWEN3_SPLIT_SHARD,
    // A buffer (the MoE expert bias): every rank keeps it whole and in fp32, as FSDP2 keeps
    // buffers; it enters the unit's gathered weights when the unit runs.
    QWEN3_SPLIT_WHOLE,
    // Room for the next issues: QWEN3_SPLIT_COLUMN / QWEN3_SPLIT_ROW (tensor parallelism: q, k,
    // v, gate, up by output rows; o, down by input columns), QWEN3_SPLIT_EXPERT (expert
    // parallelism: an expert's three matrices on one rank), and a unit's pipeline stage.
} qwen3_split;

typedef struct qwen3_plan_tensor {
    size_t lo, hi; // its elements of param_mem
    int unit;
    qwen3_split split;
} qwen3_plan_tensor;

typedef struct qwen3_parallel_plan {
    int n_units;
    size_t *unit_lo, *unit_hi; // unit u is elements [unit_lo[u], unit_hi[u])
    bool tied;                 // the head's unit (the last) reads unit 0's embedding
    int n_tensors;             // the model's params order; 0 for a plan of the config only
    qwen3_plan_tensor *tensors;
    size_t n_whole; // floats of the QWEN3_SPLIT_WHOLE tensors together (in plan order)
} qwen3_parallel_plan;

// The plan of a model (m != NULL), or only its units from the config (m NULL, before the model
// exists: the memory estimate).
int qwen3_parallelize(qwen3_parallel_plan *p, const qwen3_config *cfg, const qwen3_model *m,
                      ct_error *err);
void qwen3_parallel_plan_free(qwen3_parallel_plan *p);
