// The CPU backends' collectives on MPI. Each is MPI's non-blocking call on the buffer itself
// (the CPU backends' memory is host memory), so the bits are MPI's: the same calls as before
// the backend owned them. A group without MPI (a world of one) completes every collective over
// its one rank at once.
#include "backend/comm_mpi.h"

#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/clock.h"
#include "core/dtype.h"

// How long a wait polls with sched_yield before it sleeps between polls, and the sleep.
static double wait_spin_s = 1.0;
static long wait_pause_ns = 1000000;

void ct_mpi_wait_oversubscribed(bool on) {
    wait_spin_s = on ? 1e-4 : 1.0;
    wait_pause_ns = on ? 50000 : 1000000;
}

int ct_mpi_wait(MPI_Request *reqs, int n, double timeout_s, int rank, const char *what,
                ct_error *err) {
    const double t0 = ct_now_s(), deadline = t0 + timeout_s;
    int done = 0;
    for (;;) {
        if (MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE) != MPI_SUCCESS)
            return ct_fail(err, "rank %d: MPI failed during %s", rank, what);
        if (done) return 0;
        const double t = ct_now_s();
        if (t > deadline)
            return ct_fail(err,
                           "rank %d: %s did not complete within %.0f s (comm timeout): another "
                           "rank died, hung or stopped early",
                           rank, what, timeout_s);
        // Open MPI moves data only inside MPI calls, so poll as MPI_Wait does, giving the core
        // to ranks that share it; after a second (a partner still computing or saving), poll
        // every millisecond instead of burning the core. Oversubscribed, the yields themselves
        // took the cores from the ranks being waited for: sleep after 0.1 ms, polling every
        // 50 us.
        if (t - t0 < wait_spin_s) {
            sched_yield();
        } else {
            struct timespec pause = {0, wait_pause_ns};
            nanosleep(&pause, NULL);
        }
    }
}

// MPI has no bf16: the element is a uint16 holding a bf16, and the sum rounds each addition to
// bf16, as a bf16 all-reduce does. Open MPI applies it in a fixed order for a given rank count
// and size, so the sums stay deterministic.
static void bf16_sum_fn(void *in, void *inout, int *len, MPI_Datatype *type) {
    (void)type;
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++) b[i] = f32_to_bf16(bf16_to_f32(a[i]) + bf16_to_f32(b[i]));
}

static MPI_Datatype mpi_type(ct_comm_type t) {
    return t == CT_COMM_F32 ? MPI_FLOAT : t == CT_COMM_BF16 ? MPI_UINT16_T : MPI_BYTE;
}

static int sum_op(MPI_Op *bf16_sum, ct_comm_type t, MPI_Op *op, ct_error *err) {
    if (t == CT_COMM_F32) {
        *op = MPI_SUM;
        return 0;
    }
    if (*bf16_sum == MPI_OP_NULL && MPI_Op_create(bf16_sum_fn, 1, bf16_sum) != MPI_SUCCESS) {
        *bf16_sum = MPI_OP_NULL;
        return ct_fail(err, "MPI refused the bf16 sum");
    }
    *op = *bf16_sum;
    return 0;
}

static MPI_Comm comm_of(const ct_comm *c) {
    return *(const MPI_Comm *)c->impl;
}

// A new request for a collective on c, or NULL (err set) when out of memory.
static ct_request *request_new(const ct_comm *c, ct_error *err) {
    ct_request *r = calloc(1, sizeof *r);
    if (!r) {
        ct_fail(err, "rank %d: out of memory for a collective", c->rank);
        return NULL;
    }
    r->mpi = MPI_REQUEST_NULL;
    r->rank = c->rank;
    return r;
}

// The tail of every start: MPI's return code `rc` for request r.
static int started(const ct_comm *c, ct_request *r, int rc, const char *what, ct_request **req,
                   ct_error *err) {
    if (rc != MPI_SUCCESS) {
        free(r);
        return ct_fail(err, "rank %d: MPI failed to start %s", c->rank, what);
    }
    *req = r;
    return 0;
}

int mpi_allreduce(const ct_comm *c, MPI_Op *bf16_sum, void *buf, int count, ct_comm_type type,
                  ct_request **req, ct_error *err) {
    *req = NULL;
    MPI_Op op = MPI_OP_NULL;
    if (type == CT_COMM_BYTE) return ct_fail(err, "a sum of bytes has no meaning");
    if (!c->impl) return 0; // one rank: the sum is its own values
    if (sum_op(bf16_sum, type, &op, err) != 0) return -1;
    ct_request *r = request_new(c, err);
    if (!r) return -1;
    int rc = MPI_Iallreduce(MPI_IN_PLACE, buf, count, mpi_type(type), op, comm_of(c), &r->mpi);
    return started(c, r, rc, "an all-reduce", req, err);
}

int mpi_reduce_scatter(const ct_comm *c, MPI_Op *bf16_sum, void *buf, const int *counts,
                       ct_comm_type type, ct_request **req, ct_error *err) {
    *req = NULL;
    MPI_Op op = MPI_OP_NULL;
    if (type == CT_COMM_BYTE) return ct_fail(err, "a sum of bytes has no meaning");
    if (!c->impl) return 0; // one rank: its block is the whole sum, already at buf's start
    if (sum_op(bf16_sum, type, &op, err) != 0) return -1;
    ct_request *r = request_new(c, err);
    if (!r) return -1;
    int rc =
        MPI_Ireduce_scatter(MPI_IN_PLACE, buf, counts, mpi_type(type), op, comm_of(c), &r->mpi);
    return started(c, r, rc, "a reduce-scatter", req, err);
}

int mpi_allgather(const ct_comm *c, void *buf, const int *counts, const int *displs,
                  ct_comm_type type, ct_request **req, ct_error *err) {
    *req = NULL;
    if (!c->impl) return 0; // one rank: its part is in place
    ct_request *r = request_new(c, err);
    if (!r) return -1;
    int rc = MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, counts, displs,
                             mpi_type(type), comm_of(c), &r->mpi);
    return started(c, r, rc, "an all-gather", req, err);
}

int mpi_send(const ct_comm *c, const void *buf, int count, ct_comm_type type, int peer, int tag,
             ct_request **req, ct_error *err) {
    *req = NULL;
    if (!c->impl) return ct_fail(err, "a send to rank %d in a world of one", peer);
    ct_request *r = request_new(c, err);
    if (!r) return -1;
    int rc = MPI_Isend(buf, count, mpi_type(type), peer, tag, comm_of(c), &r->mpi);
    return started(c, r, rc, "a send", req, err);
}

int mpi_recv(const ct_comm *c, void *buf, int count, ct_comm_type type, int peer, int tag,
             ct_request **req, ct_error *err) {
    *req = NULL;
    if (!c->impl) return ct_fail(err, "a receive from rank %d in a world of one", peer);
    ct_request *r = request_new(c, err);
    if (!r) return -1;
    int rc = MPI_Irecv(buf, count, mpi_type(type), peer, tag, comm_of(c), &r->mpi);
    return started(c, r, rc, "a receive", req, err);
}

int mpi_alltoall(const ct_comm *c, const void *send, const int *scounts, const int *sdispls,
                 void *recv, const int *rcounts, const int *rdispls, ct_comm_type type,
                 ct_request **req, ct_error *err) {
    *req = NULL;
    if (!c->impl) { // one rank: what it sends to itself
        const size_t e = ct_comm_type_size(type);
        if (scounts[0] != rcounts[0])
            return ct_fail(err, "an all-to-all sends %d elements to itself but receives %d",
                           scounts[0], rcounts[0]);
        memmove((char *)recv + (size_t)rdispls[0] * e, (const char *)send + (size_t)sdispls[0] * e,
                (size_t)scounts[0] * e);
        return 0;
    }
    ct_request *r = request_new(c, err);
    if (!r) return -1;
    const MPI_Datatype t = mpi_type(type);
    int rc =
        MPI_Ialltoallv(send, scounts, sdispls, t, recv, rcounts, rdispls, t, comm_of(c), &r->mpi);
    return started(c, r, rc, "an all-to-all", req, err);
}

// Completed requests: released (the guard closed), freed, their pointers NULL.
static void complete(ct_request **reqs, int n) {
    for (int i = 0; i < n; i++) {
        if (!reqs[i]) continue;
        if (reqs[i]->release) reqs[i]->release(reqs[i]);
        free(reqs[i]);
        reqs[i] = NULL;
    }
}

// The MPI requests of reqs (a completed one is MPI_REQUEST_NULL) into mpi (n slots).
static void mpi_requests(MPI_Request *mpi, ct_request **reqs, int n) {
    for (int i = 0; i < n; i++) mpi[i] = reqs[i] ? reqs[i]->mpi : MPI_REQUEST_NULL;
}

// Up to this many requests are tested from the stack; more (ZeRO-1's buckets) from the heap.
#define STACK_REQUESTS 16

bool mpi_test(ct_request **reqs, int n) {
    int live = 0;
    for (int i = 0; i < n; i++) live += reqs[i] != NULL;
    if (!live) return true; // (a world of one never calls MPI)
    MPI_Request stack[STACK_REQUESTS], *mpi = n <= STACK_REQUESTS ? stack : malloc(n * sizeof *mpi);
    if (!mpi) return false; // tried again at the next test or wait
    mpi_requests(mpi, reqs, n);
    int done = 0;
    MPI_Testall(n, mpi, &done, MPI_STATUSES_IGNORE);
    if (mpi != stack) free(mpi);
    if (done) complete(reqs, n);
    return done;
}

int mpi_wait(ct_request **reqs, int n, double timeout_s, const char *what, ct_error *err) {
    int rank = -1, live = 0;
    for (int i = 0; i < n; i++)
        if (reqs[i]) rank = reqs[i]->rank, live++;
    if (!live) return 0;
    MPI_Request stack[STACK_REQUESTS], *mpi = n <= STACK_REQUESTS ? stack : malloc(n * sizeof *mpi);
    if (!mpi) return ct_fail(err, "rank %d: out of memory waiting for %s", rank, what);
    mpi_requests(mpi, reqs, n);
    // MPI_Testall changes none of the copies until all completed: on a timeout the requests
    // stay as they were.
    int rc = ct_mpi_wait(mpi, n, timeout_s, rank, what, err);
    if (mpi != stack) free(mpi);
    if (rc == 0) complete(reqs, n);
    return rc;
}
