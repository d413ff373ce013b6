// Fully sharded data parallelism (FSDP, ZeRO-3), as torchtitan applies FSDP2: the parameters,
// their gradients and the optimizer state are split over the S ranks of a shard group, unit by
// unit (the embedding, each decoder layer, the head), and a unit's weights exist whole only while
// it runs.
//
// Each unit [lo, hi) of the flat parameter buffer is cut evenly: shard rank s owns the piece
// [lo + floor(len*s/S), lo + floor(len*(s+1)/S)). A rank keeps its pieces, in unit order, in one
// shard buffer (the fp32 master weights, their gradients, and under bf16 gathers their bf16
// copy); the optimizer steps those only. The full-size buffers the model reads (param_mem,
// grad_mem, param_bf16) hold only the units in use: on the plain CPU backend every other page is
// handed back to the OS (ct_backend.discard), so they cost no memory.
//
// The model calls these around every unit (through its unit_hook):
//   forward    gather the unit (all-gather of the pieces; waiting for the prefetch started one
//              unit earlier) and start gathering the next; free it after, unless
//              reshard_after_forward says keep it (the head always stays for its backward under
//              "default", as FSDP2's root does; "never" keeps every unit; "always" none)
//   backward   gather again (unless kept) and prefetch the unit before it; once its gradients
//              are final, free the weights and reduce-scatter the gradients, each rank adding
//              its piece's sum into its shard gradient (every micro-batch, as FSDP2 does); at
//              most one reduce-scatter is in flight, so gradients of at most two units exist.
// A tied head reads the embedding: its unit gathers unit 0 as well, and the embedding's
// gradient is reduced only after the embedding's own backward.
// HSDP: with R > 1 replica groups, fsdp_finish all-reduces the shard gradient across the R
// ranks holding the same shard.
// Expert parallelism beside FSDP (torchtitan's dp2ep, its "efsdp" mesh): with expert_degree
// ep > 1 the shard group's consecutive runs of ep ranks are EP groups, and the units marked
// expert (a layer's own experts, which differ between the ranks of an EP group) are cut over the
// S/ep ranks holding the same experts (shard rank s with s % ep alike) instead of all S. The
// replica all-reduce covers both kinds.
// A frozen model (LoRA's base) is sharded and gathered the same way but has no gradients:
// nothing is reduced and there is no gradient shard. Held in bf16 only (its matrices in
// param_bf16 alone, qwen3_init_frozen), its shard and its gathers are param_bf16's, never
// widened, and param_mem (the fp32 tensors: norms, biases, a few KiB a layer) stays whole on
// every rank.
// Every collective is the backend's (backend.h's comm_* entries, on the buffers themselves: the
// guarded backend holds exactly those open while one is in flight) and runs on the group's
// communicator in the same order on every rank, with the group's deadline
// (dist_wait_requests), so runs are deterministic for a given layout of ranks. The model knows
// none of this: it only calls the hook.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "parallel/dist.h"

typedef enum fsdp_reshard {
    FSDP_RESHARD_DEFAULT,
    FSDP_RESHARD_ALWAYS,
    FSDP_RESHARD_NEVER
} fsdp_reshard;

// "default" | "always" | "never" (parallelism.fsdp_reshard_after_forward).
int fsdp_reshard_parse(fsdp_reshard *out, const char *name, ct_error *err);

typedef struct fsdp_unit {
    size_t lo, hi;             // its elements of the full buffers
    size_t piece_lo, piece_hi; // this rank's piece of it
    size_t at;                 // where the piece sits in the shard buffers
    dist *g;                   // the group it is cut over: shard, or (an expert unit) eshard
    int *counts, *displs;      // (g's size) every group rank's piece, from lo (MPI's ints)
    bool gathered;             // the full buffers hold its weights
    bool gathering;            // a gather is in flight: gather_req, started at gather_t0
    ct_request *gather_req;
    double gather_t0;
} fsdp_unit;

typedef struct fsdp_opts {
    int shard_degree, replicate_degree; // S and R, S * R = the world's size
    fsdp_reshard reshard;
    bool bf16_params; // gather bf16 weights (MixedPrecisionPolicy param_dtype = bfloat16)
    bool bf16_reduce; // reduce bf16 gradients (reduce_dtype = bfloat16)
    int expert_degree;         // ep (0 or 1: none): the EP groups inside the shard group
    const bool *expert_units;  // (n_units, NULL: none) the units cut over eshard
    bool frozen;               // no gradients (grads NULL); with bf16_params, held in bf16 only
} fsdp_opts;

typedef struct fsdp {
    dist *world;         // its deadline (the trainer's, per phase) is the groups' too
    dist shard, replica; // the shard group (S ranks) and the replica group (R ranks)
    dist eshard;         // expert_degree > 1: the S/ep shard ranks holding the same experts
    fsdp_opts o;
    ct_backend *be;
    const ct_ops *ops;
    float *params, *grads; // the model's full-size buffers (param_mem, grad_mem)
    uint16_t *params_bf16; // the model's param_bf16 (bf16 gathers), else NULL
    uint16_t *grads_bf16;  // full-size staging of a bf16 reduce-scatter, else NULL
    size_t n;              // floats in the full buffers
    fsdp_unit *units;
    int n_units;
    bool tied; // the head's unit (the last) reads unit 0
    size_t n_shard;
    float *shard_params, *shard_grads; // this rank's pieces, concatenated
    uint16_t *shard_bf16;              // bf16_params: their bf16 copy (the optimizer writes it)
    // The reduce-scatter in flight (one at a time): its unit or -1, the ring's step, its send and
    // receive, one piece (on the backend) to receive into, when it started.
    int reducing, ring_step;
    ct_request *ring_req[2];
    float *ring_recv;
    uint16_t *ring_recv16;
    double reduce_t0;
    // Seconds from each collective's start to its completion, summed since fsdp_take_comm: less
    // the seconds blocked in MPI, what ran behind compute.
    double busy_s;
    // Payload bytes of the collectives started since fsdp_init (each counted as its whole
    // buffer: a unit's gathered weights, a unit's gradients reduce-scattered, the shard's
    // gradients all-reduced over the replicas), for the volume benchmarks (bench/parallel.py).
    double gather_bytes, reduce_bytes, replica_bytes;
    // Pipeline parallelism: a micro-batch before the stage's last. Its units' gradients
    // accumulate whole in the full buffer and the units stay gathered after the backward; the
    // last micro-batch's backward reduce-scatters the sum (FSDP2 under PyTorch's pipelining:
    // set_requires_gradient_sync and set_reshard_after_backward only for the last).
    bool no_sync;
    // The first failure inside the hook (which cannot return it): every later collective is
    // skipped, and fsdp_finish returns it.
    int failed;
    ct_error err;
} fsdp;

// units: n_units ranges [lo[u], hi[u]) tiling [0, n) in order. params, grads (NULL when
// o->frozen; and params_bf16 when o->bf16_params) are full-size buffers of n elements on be, ops
// its bound table. The shard buffers are allocated zeroed, on be (a frozen bf16 model's shard is
// shard_bf16 alone).
int fsdp_init(fsdp *f, dist *world, const fsdp_opts *o, ct_backend *be, const ct_ops *ops,
              float *params, float *grads, uint16_t *params_bf16, size_t n, const size_t *lo,
              const size_t *hi, int n_units, bool tied, ct_error *err);
void fsdp_free(fsdp *f);

// Group rank s's piece of unit u, of its group's ranks: [*lo, *hi) (for checkpoints: every
// rank's ranges).
void fsdp_piece(const fsdp *f, int u, int s, size_t *lo, size_t *hi);

// The four moments of unit u (the model's unit_hook calls them through the trainer): before its
// forward, after it, before its backward, and once its gradients are final.
void fsdp_forward(fsdp *f, int u);
void fsdp_forward_done(fsdp *f, int u);
void fsdp_backward(fsdp *f, int u);
void fsdp_backward_done(fsdp *f, int u);

// Copies this rank's piece of unit u from the full buffer (where a load or init put the unit;
// a frozen bf16 model's bf16 one) into the shard, then frees the unit.
void fsdp_take(fsdp *f, int u);
// Frees every gathered unit (after a validation forward, which leaves the head gathered).
void fsdp_reshard_all(fsdp *f);
// After the shard's weights changed (a load, an optimizer step): refreshes their bf16 copy when
// gathering bf16 (unless `bf16_done`: the optimizer wrote it) and frees every gathered unit, so
// the next use gathers the new values.
void fsdp_weights_changed(fsdp *f, bool bf16_done);
// A new step: the shard gradient is zeroed.
void fsdp_begin_step(fsdp *f);
// After the last backward of a step: waits for the reduce-scatters, then (HSDP) all-reduces the
// shard gradient across the replicas. Returns the hook's first failure, if any.
int fsdp_finish(fsdp *f, ct_error *err);
// What FSDP holds beyond the shard at the worst moment of a step, in bytes: the gathered units'
// weights and the units' gradients not yet reduced, replaying the hooks' events and policy on
// the units' sizes (the memory estimate before a run).
double fsdp_peak_gathered_bytes(const size_t *lo, const size_t *hi, int n_units, const fsdp_opts *o,
                                bool tied);
// Seconds blocked in the groups' collectives and seconds of communication hidden behind compute
// since the last call (which resets both).
void fsdp_take_comm(fsdp *f, double *exposed, double *hidden);
