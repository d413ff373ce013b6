// MoE load balancing, as one component: the routing statistics a step needs, their reduction
// over micro-batches and ranks, HF's load-balancing loss (load_balancing_loss_func) and its
// gradient into the routers, torchtitan's aux-loss-free expert bias, and the balance metric.
//
// The model produces raw per-forward statistics (m->moe_load, m->moe_prob, written by the
// router during qwen3_forward); this component reads them in one function only,
// moe_balance_collect. It writes model memory in two small functions only (moe_balance.c's
// set_router_aux_grad and add_expert_bias), so that a backend keeping those buffers in device
// memory changes these three and nothing else.
//
// Ranks: the component knows nothing of processes. The caller passes a sum over ranks
// (moe_balance_sum_fn; the trainer's calls dist_sum_array), so src/model/ does not depend on
// src/parallel/.
//
// Use per step: for each micro-batch, forward, moe_balance_collect, moe_balance_reduce,
// moe_balance_aux (and moe_balance_aux_grad when the aux is in the loss), backward; then, before
// the optimizer step, moe_balance_end_step. A single forward (verify) needs only collect, aux
// and aux_grad.
#pragma once
#include <stdbool.h>

#include "core/error.h"
#include "model/qwen3.h"

// buf[i] = the sum over every rank of its buf[i], for i < n, the same bits on every rank;
// scratch holds n * ranks doubles (the ranks passed to moe_balance_init). 0 or -1 with err set.
typedef int (*moe_balance_sum_fn)(void *ctx, double *buf, int n, double *scratch, ct_error *err);

typedef struct moe_balance {
    int n_sparse, E; // sparse layers and experts; 0 sparse layers: every call does nothing
    // The last collected micro-batch (over every rank once reduced), per sparse layer s and
    // expert e: stats[s*E + e] its top-K token counts (the load), stats[n + s*E + e] its summed
    // router probabilities, n = n_sparse * E; then stats[2n] the tokens they count per layer.
    double *stats;
    double *step_load; // (n) the step's loads, summed over its reduced micro-batches
    double *balance;   // (n_sparse) max load / mean load per layer of the last ended step
    double *scratch;   // for moe_balance_sum_fn: (2n + 1) * ranks
    float *dprob;      // (E) the aux gradient per router probability, before it goes to the model
    float *bias_delta; // (n) the expert-bias update, before it goes to the model
    // Optional: where the update goes instead of the model's expert_bias (FSDP, whose ranks
    // each hold a piece of the weights): add_bias(ctx, bias_delta), once per update.
    void (*add_bias)(void *ctx, const float *delta);
    void *add_bias_ctx;
} moe_balance;

// Sized for m's sparse layers and a reduction over `ranks` processes (1 without one). A dense
// model allocates nothing. moe_balance_free undoes it (also after a failed init, or on a
// zeroed struct).
int moe_balance_init(moe_balance *b, const qwen3_model *m, int ranks, ct_error *err);
void moe_balance_free(moe_balance *b);

// The one reader of the model's raw statistics: copies the last forward's m->moe_load,
// m->moe_prob and its token count (B*T) into b->stats.
void moe_balance_collect(moe_balance *b, const qwen3_model *m);
// Sums the collected statistics over the ranks (sum NULL: one process, nothing to sum), so
// they are the global micro-batch's, then adds its loads to the step's.
int moe_balance_reduce(moe_balance *b, moe_balance_sum_fn sum, void *ctx, ct_error *err);

// HF's load-balancing statistic over every sparse layer's router, from the collected
// statistics:
//   aux = E * sum_{j,e} f[j,e] * p[e] = E * sum_e load_e * prob_e / rows^2,
// load_e and prob_e summed over the sparse layers, rows = tokens * n_sparse. 0 when dense.
double moe_balance_aux(const moe_balance *b);
// Makes m's next qwen3_backward add the gradient of scale * aux (aux as moe_balance_aux
// computes it; it does not depend on prob) to the routers. scale 0 = none, the state after
// every backward.
void moe_balance_aux_grad(moe_balance *b, qwen3_model *m, float scale);

// Before each optimizer step: each sparse layer's load balance of the step (max load over mean
// load, 0 for a layer without tokens; see moe_balance_metric) and, with update_bias,
// torchtitan's auxiliary-loss-free load balancing: from the step's token counts, every
// expert_bias moves by delta - mean(delta), delta_e = coeff * sign(mean load - load_e), in
// fp32. Underloaded experts become likelier choices; the bias never changes the routing
// weights, only the choice. Then the step's loads start again from 0.
void moe_balance_end_step(moe_balance *b, qwen3_model *m, bool update_bias, float coeff);
// (n_sparse) the last ended step's max load / mean load per sparse layer.
const double *moe_balance_metric(const moe_balance *b);
