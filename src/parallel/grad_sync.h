// Data-parallel gradient and parameter synchronisation over one flat fp32 buffer.
//
// The buffer is cut into buckets of about bucket_floats, at tensor boundaries where it can be
// (a tensor larger than a bucket is split), numbered from the END of the buffer, because the
// backward pass finalises gradients from the last parameters to the first. A bucket starts as
// soon as grad_sync_ready reports that everything from its first element on is final, so its
// communication overlaps the rest of the backward. Buckets start in the same order on every
// rank, which MPI requires and which makes the sums deterministic for a given rank count.
//
// Two modes:
//   replicate  all-reduce each bucket: every rank ends with the summed gradient everywhere and
//              steps the whole optimizer (DDP).
//   shard      ZeRO-1: rank r owns the contiguous range [shard_lo, shard_hi) of the buffer
//              (sizes differ by at most one element, so any size divides). Each bucket is
//              reduce-scattered, so rank r receives only the sum of its part; it steps the
//              optimizer for that part only, then grad_sync_gather_params all-gathers the
//              updated parameters by bucket.
// The caller scales the loss so that summing gradients gives the global mean.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "parallel/dist.h"

// The first element of rank r's shard of a buffer of n elements split over P ranks:
// floor(n * r / P), so shard sizes differ by at most one. Checkpoints cut the optimizer state
// the same way.
size_t grad_sync_shard_start(size_t n, int r, int P);

typedef enum grad_sync_mode { GRAD_SYNC_REPLICATE, GRAD_SYNC_SHARD } grad_sync_mode;

typedef struct grad_bucket {
    size_t lo, hi; // elements [lo, hi) of the buffer
} grad_bucket;

typedef struct grad_sync {
    dist *d;
    grad_sync_mode mode;
    ct_backend *be;        // whose collectives reduce and gather the buffers in place
    const ct_ops *ops;     // its table (the bf16 conversions)
    float *params, *grads; // backend memory
    uint16_t *bf16_grads;  // bf16 reduction: what goes out instead (n, on be), else NULL
    size_t n;
    size_t shard_lo, shard_hi; // this rank's optimizer range ([0, n) when replicating)
    size_t *shard_start;       // size+1 boundaries: rank r owns [shard_start[r], shard_start[r+1])
    grad_bucket *buckets;      // in launch order (descending offsets)
    int n_buckets;
    ct_request **reqs;    // one per bucket, NULL once completed
    int *counts, *displs; // (n_buckets, size): each rank's part of each bucket (shard mode)
    int next;             // the next bucket to start in this step
    double bytes;         // payload bytes of the reductions started (whole buckets), since init
} grad_sync;

// tensor_start: the first element of each tensor, ascending (tensor boundaries for bucketing).
// params and grads live on backend be (NULL: the plain CPU one), whose collectives reduce and
// gather them in place; ops is the table bound to be (NULL: ct_ops_cpu).
// bf16_reduce: gradients are summed in bf16 (training.mixed_precision_reduce), half the bytes,
// each addition rounded to bf16; the result returns to the fp32 gradient.
int grad_sync_init(grad_sync *s, dist *d, grad_sync_mode mode, ct_backend *be, const ct_ops *ops,
                   float *params, float *grads, size_t n, const size_t *tensor_start, int n_tensors,
                   size_t bucket_floats, bool bf16_reduce, ct_error *err);
void grad_sync_free(grad_sync *s);

// A new step: no bucket started yet.
void grad_sync_begin(grad_sync *s);
// Gradients of elements [from, n) are final: starts every bucket that lies inside, then drives
// the started ones one step further (MPI progresses non-blocking collectives only when called).
int grad_sync_ready(grad_sync *s, size_t from, ct_error *err);
// Starts what is left and waits: afterwards the summed gradient is in grads[shard_lo, shard_hi).
int grad_sync_finish(grad_sync *s, ct_error *err);
// shard mode: every rank's updated [shard_lo, shard_hi) of params reaches every rank.
// Nothing to do when replicating.
int grad_sync_gather_params(grad_sync *s, ct_error *err);
