#include "parallel/grad_sync.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Buckets from the end of the buffer, DDP's way: whole tensors (last first) go into the open
// bucket until it holds at least cap elements; a tensor bigger than cap gets buckets of its own,
// cap-sized pieces cut from its end.
static int make_buckets(grad_sync *s, const size_t *tensor_start, int n_tensors, size_t cap,
                        ct_error *err) {
    int max = n_tensors + (int)(s->n / cap) + 1;
    s->buckets = calloc((size_t)max, sizeof *s->buckets);
    if (!s->buckets) return ct_fail(err, "out of memory for %d gradient buckets", max);
    size_t pos = s->n, end = s->n; // the open bucket is [pos, end)
    for (int t = n_tensors - 1; t >= 0; t--) {
        size_t lo = tensor_start[t];
        if (pos - lo > cap) {
            if (end > pos) s->buckets[s->n_buckets++] = (grad_bucket){pos, end};
            for (; pos - lo > cap; pos -= cap)
                s->buckets[s->n_buckets++] = (grad_bucket){pos - cap, pos};
            end = pos;
        }
        pos = lo;
        if (end - pos >= cap) {
            s->buckets[s->n_buckets++] = (grad_bucket){pos, end};
            end = pos;
        }
    }
    if (end > 0) s->buckets[s->n_buckets++] = (grad_bucket){0, end};
    return 0;
}

// Rank r's part of each bucket: [max(lo, start_r), min(hi, start_r+1)), as counts and
// displacements from the bucket's start. Non-blocking collectives read these arrays until they
// complete, so every bucket keeps its own.
static void bucket_parts(grad_sync *s) {
    int P = s->d->size;
    for (int i = 0; i < s->n_buckets; i++) {
        const grad_bucket *b = &s->buckets[i];
        for (int r = 0; r < P; r++) {
            size_t lo = s->shard_start[r] > b->lo ? s->shard_start[r] : b->lo;
            size_t hi = s->shard_start[r + 1] < b->hi ? s->shard_start[r + 1] : b->hi;
            s->counts[(size_t)i * P + r] = hi > lo ? (int)(hi - lo) : 0;
            s->displs[(size_t)i * P + r] = hi > lo ? (int)(lo - b->lo) : 0;
        }
    }
}

size_t grad_sync_shard_start(size_t n, int r, int P) {
    __extension__ unsigned __int128 x = (unsigned __int128)n * (unsigned)r;
    return (size_t)(x / (unsigned)P);
}

int grad_sync_init(grad_sync *s, dist *d, grad_sync_mode mode, ct_backend *be, const ct_ops *ops,
                   float *params, float *grads, size_t n, const size_t *tensor_start, int n_tensors,
                   size_t bucket_floats, bool bf16_reduce, ct_error *err) {
    memset(s, 0, sizeof *s);
    s->d = d;
    s->mode = mode;
    s->be = ct_backend_or_cpu(be);
    s->ops = ops ? ops : &ct_ops_cpu;
    s->params = params;
    s->grads = grads;
    s->n = n;
    // training.mixed_precision_reduce = "bfloat16": each bucket goes out as bf16 (half the
    // bytes) and comes back into the fp32 gradient.
    if (d->mpi && bf16_reduce &&
        !(s->bf16_grads = s->be->alloc(s->be, (n ? n : 1) * sizeof *s->bf16_grads,
                                       "the bf16 gradient reduction", err))) {
        grad_sync_free(s);
        return -1;
    }
    int P = d->size;
    // MPI counts are ints: a bucket never exceeds 2^30 elements.
    size_t cap = bucket_floats < 1 ? 1 : bucket_floats > (1u << 30) ? (1u << 30) : bucket_floats;
    s->shard_start = malloc(((size_t)P + 1) * sizeof *s->shard_start);
    if (!s->shard_start) {
        grad_sync_free(s);
        return ct_fail(err, "out of memory for the gradient sync tables");
    }
    for (int r = 0; r <= P; r++)
        s->shard_start[r] = mode == GRAD_SYNC_SHARD ? grad_sync_shard_start(n, r, P)
                            : r == P                ? n
                                                    : 0;
    s->shard_lo = mode == GRAD_SYNC_SHARD ? s->shard_start[d->rank] : 0;
    s->shard_hi = mode == GRAD_SYNC_SHARD ? s->shard_start[d->rank + 1] : n;
    if (make_buckets(s, tensor_start, n_tensors, cap, err) != 0) {
        grad_sync_free(s);
        return -1;
    }
    size_t parts = (size_t)s->n_buckets * P;
    s->reqs = calloc((size_t)s->n_buckets, sizeof *s->reqs);
    s->counts = malloc(parts * sizeof *s->counts);
    s->displs = malloc(parts * sizeof *s->displs);
    if (!s->reqs || !s->counts || !s->displs) {
        grad_sync_free(s);
        return ct_fail(err, "out of memory for the gradient sync requests");
    }
    bucket_parts(s);
    return 0;
}

void grad_sync_free(grad_sync *s) {
    if (s->be) s->be->free(s->be, s->bf16_grads);
    free(s->shard_start);
    free(s->counts);
    free(s->displs);
    free(s->buckets);
    free(s->reqs);
    memset(s, 0, sizeof *s);
}

void grad_sync_begin(grad_sync *s) {
    s->next = 0;
}

// Starting a non-blocking collective already moves data in Open MPI, so it counts as comm time.
static int start_bucket(grad_sync *s, int i, ct_error *err) {
    double t0 = dist_clock();
    const grad_bucket *b = &s->buckets[i];
    const ct_comm c = dist_comm(s->d);
    ct_backend *be = s->be;
    const int *counts = s->counts + (size_t)i * s->d->size;
    float *g = s->grads + b->lo;
    int count = (int)(b->hi - b->lo), rc;
    if (s->bf16_grads) {
        uint16_t *h = s->bf16_grads + b->lo;
        s->ops->f32_to_bf16(h, g, (size_t)count);
        rc = s->mode == GRAD_SYNC_REPLICATE
                 ? be->comm_allreduce(be, &c, h, count, CT_COMM_BF16, &s->reqs[i], err)
                 : be->comm_reduce_scatter(be, &c, h, counts, CT_COMM_BF16, &s->reqs[i], err);
    } else if (s->mode == GRAD_SYNC_REPLICATE) {
        rc = be->comm_allreduce(be, &c, g, count, CT_COMM_F32, &s->reqs[i], err);
    } else {
        // In place: the input is the whole bucket; this rank's sum lands at the bucket's start
        // and is moved to its own offset in grad_sync_finish.
        rc = be->comm_reduce_scatter(be, &c, g, counts, CT_COMM_F32, &s->reqs[i], err);
    }
    s->d->comm_s += dist_clock() - t0;
    s->bytes += (double)count * (s->bf16_grads ? 2 : 4);
    if (rc != 0)
        return ct_fail(err, "rank %d: MPI failed to start the reduction of gradient bucket %d",
                       s->d->rank, i);
    return 0;
}

int grad_sync_ready(grad_sync *s, size_t from, ct_error *err) {
    if (!s->d->mpi) return 0;
    while (s->next < s->n_buckets && s->buckets[s->next].lo >= from)
        if (start_bucket(s, s->next++, err) != 0) return -1;
    if (s->next > 0) dist_test_requests(s->d, s->be, s->reqs, s->next);
    return 0;
}

int grad_sync_finish(grad_sync *s, ct_error *err) {
    if (!s->d->mpi) return 0;
    if (grad_sync_ready(s, 0, err) != 0) return -1;
    char what[64];
    snprintf(what, sizeof what, "the gradient reduction (%d buckets)", s->n_buckets);
    if (dist_wait_requests(s->d, s->be, s->reqs, s->n_buckets, what, err) != 0) return -1;
    // Each bucket's sum for this rank: all of it when replicating; with ZeRO-1 this rank's part,
    // which the in-place reduce-scatter left at the bucket's start, moved to its own offset. A
    // bf16 reduction's part returns to fp32 on the way (only the part this rank keeps).
    for (int i = 0; i < s->n_buckets; i++) {
        const grad_bucket *b = &s->buckets[i];
        const size_t at = (size_t)i * s->d->size + s->d->rank;
        const bool shard = s->mode == GRAD_SYNC_SHARD;
        const size_t n = shard ? (size_t)s->counts[at] : b->hi - b->lo;
        float *to = s->grads + b->lo + (shard ? (size_t)s->displs[at] : 0);
        if (s->bf16_grads)
            s->ops->bf16_to_f32(to, s->bf16_grads + b->lo, n);
        else if (n && to != s->grads + b->lo)
            s->be->copy(s->be, to, s->grads + b->lo, n * sizeof(float));
    }
    return 0;
}

int grad_sync_gather_params(grad_sync *s, ct_error *err) {
    if (!s->d->mpi || s->mode != GRAD_SYNC_SHARD) return 0;
    double t0 = dist_clock();
    const ct_comm c = dist_comm(s->d);
    for (int i = 0; i < s->n_buckets; i++) {
        size_t at = (size_t)i * s->d->size;
        // In place: this rank's part is already at its displacement in the bucket.
        if (s->be->comm_allgather(s->be, &c, s->params + s->buckets[i].lo, s->counts + at,
                                  s->displs + at, CT_COMM_F32, &s->reqs[i], err) != 0)
            return ct_fail(err, "rank %d: MPI failed to start the gather of parameter bucket %d",
                           s->d->rank, i);
    }
    s->d->comm_s += dist_clock() - t0;
    char what[64];
    snprintf(what, sizeof what, "the parameter all-gather (%d buckets)", s->n_buckets);
    return dist_wait_requests(s->d, s->be, s->reqs, s->n_buckets, what, err);
}
