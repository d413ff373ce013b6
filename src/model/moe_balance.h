// MoE load balancing, as one component: the routing statistics a step needs, their reduction
// over micro-batches and ranks, HF's load-balancing loss (load_balancing_loss_func) and its
// gradient into the routers, torchtitan's aux-loss-free expert bias, and the balance metric.
//
// The caller attaches it to a model once (moe_balance_init). From then on the model asks it:
// each forward's routers write their raw statistics into the component's buffers (load, prob,
// on the model's backend: the forward zeroes them through moe_balance_forward_begin), and each
// backward, before its first gradient, has the component reduce them
// (moe_balance_backward_begin: read, summed over the ranks, added to the step's loads) and
// takes from it the aux gradient per router probability. A forward without a backward
// (validation) counts nothing. The component writes model memory in one small function only,
// add_expert_bias, so that a backend keeping the weights in device memory changes it and
// collect (the read of load and prob) and nothing else.
//
// Ranks: the component knows nothing of processes. The caller passes a sum over ranks
// (moe_balance_sum_fn; the trainer's calls dist_sum_array), so src/model/ does not depend on
// src/parallel/.
//
// Use per step: for each micro-batch, forward and backward, then moe_balance_aux (the aux of
// that micro-batch, over every rank) and moe_balance_status (a failed sum); before the optimizer
// step, moe_balance_end_step. A single forward and backward (verify) needs only aux.
#pragma once
#include <stdbool.h>

#include "core/error.h"
#include "model/qwen3.h"

// buf[i] = the sum over every rank of its buf[i], for i < n, the same bits on every rank;
// scratch holds n * ranks doubles (the ranks passed to moe_balance_init). 0 or -1 with err set.
typedef int (*moe_balance_sum_fn)(void *ctx, double *buf, int n, double *scratch, ct_error *err);

typedef struct moe_balance {
    int n_sparse, E; // sparse layers and experts; 0 sparse layers: every call does nothing
    qwen3_model *m;  // the model it is attached to
    // The routers' raw statistics of the model's last forward, on its backend, per sparse layer
    // s (in layer order) and expert e: load[s*E + e] counts the tokens whose top K include e,
    // prob[s*E + e] sums the router probability of e over the tokens. The forward zeroes them
    // and each sparse layer's moe_route_stats adds its tokens; tokens is their count (B*T).
    double *load, *prob;
    double tokens;
    moe_balance_sum_fn sum; // the sum over ranks (NULL: one process)
    void *sum_ctx;
    // The aux loss's weight in the loss the backward differentiates (coef / accumulation steps
    // when the aux is in the loss; 0: no aux gradient).
    float aux_scale;
    int failed; // a backward's sum over ranks failed: err says why (moe_balance_status)
    ct_error err;
    // The last collected micro-batch (over every rank once reduced), per sparse layer s and
    // expert e: stats[s*E + e] its top-K token counts (the load), stats[n + s*E + e] its summed
    // router probabilities, n = n_sparse * E; then stats[2n] the tokens they count per layer.
    double *stats;
    double *step_load; // (n) the step's loads, summed over its reduced micro-batches
    double *balance;   // (n_sparse) max load / mean load per layer of the last ended step
    double *scratch;   // for moe_balance_sum_fn: (2n + 1) * ranks
    float *dprob;      // (E) the aux gradient per router probability, before it goes to the model
    double *sums;       // (MOE_SUMS(E)) the last reduced micro-batch's, over its sparse layers
    float *bias_delta; // (n) the expert-bias update, before it goes to the model
    // Optional: where the update goes instead of the model's expert_bias (FSDP, whose ranks
    // each hold a piece of the weights): add_bias(ctx, bias_delta), once per update.
    void (*add_bias)(void *ctx, const float *delta);
    void *add_bias_ctx;
    // moe_balance_sets: n_sets pairs of load and prob buffers (set 0 the init's); load and prob
    // are the pair moe_balance_use_set chose. 0: one pair.
    int n_sets;
    double **set_load, **set_prob;
    // Pipeline parallelism, where a stage's model holds some of the sparse layers: the whole
    // model's sums of the next backward's micro-batch (MOE_SUMS(E) doubles, every stage's and
    // rank's, moe_balance_add_sums; NULL: this model's own), for its aux gradient and aux.
    const double *whole;
} moe_balance;

// The routing statistics summed over sparse layers (HF's load_balancing_loss_func concatenates
// every layer's router logits): per expert e, sums[e] the top-K counts and sums[E + e] the
// router probabilities; sums[2E] the rows they count (tokens times layers).
#define MOE_SUMS(E) (2 * (size_t)(E) + 1)
// HF's aux of such sums: E * sum_e sums[e] * sums[E + e] / rows^2 (0 without rows).
double moe_balance_aux_of(int E, const double *sums);

// Sized for m's sparse layers and a reduction over `ranks` processes through `sum` (NULL: one
// process), and attached to m (m->balance): from its next forward on, m counts its routing
// statistics here, and its backwards add the gradient of aux_scale * aux (0: none). A dense
// model allocates nothing and attaches nothing. moe_balance_free detaches and frees it (also
// after a failed init, or on a zeroed struct); call it before qwen3_free.
int moe_balance_init(moe_balance *b, qwen3_model *m, int ranks, moe_balance_sum_fn sum,
                     void *sum_ctx, float aux_scale, ct_error *err);
void moe_balance_free(moe_balance *b);
// Pipeline parallelism (the model's activation sets, qwen3_plan_sets): n pairs of the raw
// statistics (n <= 1 or dense: nothing), so each micro-batch in flight keeps its forward's until
// its backward reduces them; moe_balance_use_set(b, j) makes pair j the one the next forward
// zeroes and fills and the next backward reads.
int moe_balance_sets(moe_balance *b, int n, ct_error *err);
void moe_balance_use_set(moe_balance *b, int j);

// The model's side (qwen3.c). Before a forward's routers run: zeroes load and prob, for a
// forward of `tokens` tokens.
void moe_balance_forward_begin(moe_balance *b, int64_t tokens);
// Before a backward's first gradient: reads the last forward's statistics, sums them over the
// ranks (so they are the global micro-batch's), adds its loads to the step's, and returns the
// aux gradient per router probability (E floats, host memory) for the routers' backward, or
// NULL when there is none (aux_scale 0, no tokens, or the sum failed: see moe_balance_status).
const float *moe_balance_backward_begin(moe_balance *b);
// After a forward that has no backward (eval): reduces its statistics as a backward would, so
// moe_balance_aux gives that forward's aux. 0, or -1 and err set when the sum over ranks failed.
int moe_balance_forward_end(moe_balance *b, ct_error *err);
// 0, or -1 and err set when a backward's sum over ranks failed (the failure is then cleared).
int moe_balance_status(moe_balance *b, ct_error *err);

// Pipeline parallelism: adds the last forward's statistics (this rank's, before any sum over
// ranks), summed over this model's sparse layers, to sums (MOE_SUMS(E) doubles). Nothing when
// the model is dense.
void moe_balance_add_sums(moe_balance *b, double *sums);
// HF's load-balancing statistic over every sparse layer's router, from the statistics the last
// backward reduced (or b->whole's):
//   aux = E * sum_{j,e} f[j,e] * p[e] = E * sum_e load_e * prob_e / rows^2,
// load_e and prob_e summed over the sparse layers, rows = tokens * n_sparse. 0 when dense.
double moe_balance_aux(const moe_balance *b);
// Before each optimizer step: each sparse layer's load balance of the step (max load over mean
// load, 0 for a layer without tokens; see moe_balance_metric) and, with update_bias,
// torchtitan's auxiliary-loss-free load balancing: from the step's token counts, every
// expert_bias moves by delta - mean(delta), delta_e = coeff * sign(mean load - load_e), in
// fp32. Underloaded experts become likelier choices; the bias never changes the routing
// weights, only the choice. Then the step's loads start again from 0.
void moe_balance_end_step(moe_balance *b, bool update_bias, float coeff);
// (n_sparse) the last ended step's max load / mean load per sparse layer.
const double *moe_balance_metric(const moe_balance *b);
