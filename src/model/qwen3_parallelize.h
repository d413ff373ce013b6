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
    // Room for the next issues: QWEN3_SPLIT_EXPERT (expert parallelism: an expert's three
    // matrices on one rank), and a unit's pipeline stage. Tensor parallelism's cuts are below
    // (qwen3_tp_cut).
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

// Tensor parallelism (torchtitan's parallelize_qwen3 with sequence parallelism): how each HF
// tensor is cut over the tp ranks of a group. Rank r holds slice r of `dim`, of the length the
// local model's tensor has there (qwen3_tp_config): rows of the embedding and lm_head (its
// vocabulary rows; a tied head is the embedding, cut once), of q/k/v (weights and biases: its
// query heads and their kv heads) and gate/up; columns of o_proj and down_proj (their inputs).
// A MoE layer's experts (MoE without EP, torchtitan's TensorParallel style for GroupedExperts)
// are cut as the dense MLP: every expert's gate_proj/up_proj rows and down_proj columns, by the
// same names. Everything else (the norms, q_norm/k_norm, o_proj's bias, the router mlp.gate)
// is whole on every rank, its gradient summed over the group; the expert bias is a buffer,
// whole, updated alike on every rank from the same statistics.
// Under expert parallelism with expert_tensor_parallel_degree 1, the experts are none of these
// (QWEN3_TP_EXPERT, which the strategy assigns): an EP rank's experts whole, neither cut nor
// replicated over the TP group.
typedef enum qwen3_tp_cut {
    QWEN3_TP_WHOLE,
    QWEN3_TP_ROWS,
    QWEN3_TP_COLUMNS,
    QWEN3_TP_EXPERT
} qwen3_tp_cut;
qwen3_tp_cut qwen3_tp_cut_of(const char *name);

// The model rank r of tp holds: num_attention_heads, num_key_value_heads, intermediate_size and
// vocab_size divided by tp, and (MoE) moe_intermediate_size by etp (expert_tensor_parallel_degree:
// tp without EP, 1 when EP keeps the experts whole); head_dim, num_experts and the rest unchanged.
// Refuses, in one line naming both numbers, a count it does not divide.
int qwen3_tp_config(qwen3_config *local, const qwen3_config *global, int tp, int etp,
                    ct_error *err);
