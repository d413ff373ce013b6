// Context parallelism (torchtitan's context_parallel_degree) for the trainer: the CP groups of
// the mesh, the sequence's headtail sharding of a step's samples, and the model's qwen3_cp hook
// with the backend's collectives on the group (the model never sees MPI). The data-parallel
// strategy runs over every rank (t->d): FSDP shards over dp_shard x cp, and the loss's token
// count and the gradients are summed over all ranks, each CP rank holding its own tokens.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "core/error.h"
#include "model/qwen3.h"
#include "parallel/dist.h"

typedef struct trainer trainer;

typedef struct context_parallel {
    dist group; // this rank's CP group: ranks [k*cp, (k+1)*cp) of t->d (under TP, its TP column)
    qwen3_cp hook;
    ct_error err; // the first failure of a collective the hook ran (reported after the step)
    bool failed;
    ct_request *req[8]; // the ring's transfers started and not yet waited for
    int n_req;
    double bytes; // payload this rank sent to the other ranks of its group since setup
} context_parallel;

// The data-parallel rank and degree: the ranks of a CP group read the same samples.
int cp_dp_rank(const trainer *t);
int cp_dp_size(const trainer *t);
// Before the strategy: the group, and the refusals (each one line): seq_len % (2 cp tp), the
// sdpa kernel. Under TP the group is of the data-parallel ranks t->d (the mesh's dp, cp, tp
// order: one TP rank's column), so a CP group's ranks hold the same TP slice.
int cp_setup(trainer *t, ct_error *err);
// After cp_setup succeeded on every rank (a collective): the group.
int cp_split(trainer *t, ct_error *err);
// After qwen3_plan: the model's hook.
int cp_attach(trainer *t, ct_error *err);
void cp_free(trainer *t);
// n samples of T tokens each (T the sequence length) at x, in place: each becomes this rank's
// two chunks (T / cp tokens: chunk rank, then chunk 2 cp - 1 - rank), back to back.
void cp_shard(const trainer *t, int32_t *x, int n);
// A step begins: no failure yet. After its backward: the first failure, if any; the seconds the
// ring spent in its collectives since the last call.
void cp_begin_step(trainer *t);
int cp_status(trainer *t, ct_error *err);
double cp_take_comm(trainer *t);
