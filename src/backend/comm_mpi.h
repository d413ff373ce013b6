// The CPU backends' collectives, on MPI (backend.h's comm_* entries; comm.h's types). Internal
// to src/backend/, except ct_mpi_wait, the one deadline-bounded wait that parallel/dist.c's own
// small collectives (host values: sums of doubles, error agreement) share.
#pragma once
#include <mpi.h>
#include <stdbool.h>

#include "backend/comm.h"
#include "core/error.h"

struct ct_request {
    MPI_Request mpi;
    int rank; // in its group, for the errors
    // Called once the collective completed, before the request is freed (the guarded backend
    // closes the buffers it held open); NULL: nothing to do.
    void (*release)(struct ct_request *r);
    void *held[2]; // release's: the buffers the collective touches
};

// Waits for n MPI requests for at most timeout_s seconds, polling as MPI_Wait does but yielding
// the core (ranks may share one), then every millisecond after the first second. A timeout or
// an MPI failure is an error naming `what` and this rank.
int ct_mpi_wait(MPI_Request *reqs, int n, double timeout_s, int rank, const char *what,
                ct_error *err);
// More threads than cores on this node (ranks x threads per rank): waits sleep after 0.1 ms of
// polling, every 50 us, instead of yielding for a second (process-wide).
void ct_mpi_wait_oversubscribed(bool on);

// The collectives of backend.h on MPI. bf16_sum: where the bf16 sum's MPI_Op is kept (made on
// first use; the backend object owns it).
int mpi_allreduce(const ct_comm *c, MPI_Op *bf16_sum, void *buf, int count, ct_comm_type type,
                  ct_request **req, ct_error *err);
int mpi_reduce_scatter(const ct_comm *c, MPI_Op *bf16_sum, void *buf, const int *counts,
                       ct_comm_type type, ct_request **req, ct_error *err);
int mpi_allgather(const ct_comm *c, void *buf, const int *counts, const int *displs,
                  ct_comm_type type, ct_request **req, ct_error *err);
int mpi_send(const ct_comm *c, const void *buf, int count, ct_comm_type type, int peer, int tag,
             ct_request **req, ct_error *err);
int mpi_recv(const ct_comm *c, void *buf, int count, ct_comm_type type, int peer, int tag,
             ct_request **req, ct_error *err);
int mpi_alltoall(const ct_comm *c, const void *send, const int *scounts, const int *sdispls,
                 void *recv, const int *rcounts, const int *rdispls, ct_comm_type type,
                 ct_request **req, ct_error *err);
bool mpi_test(ct_request **reqs, int n);
int mpi_wait(ct_request **reqs, int n, double timeout_s, const char *what, ct_error *err);
