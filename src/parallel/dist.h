// The process group for data parallelism. Under a launcher (mpirun, srun) it is MPI_COMM_WORLD;
// otherwise a world of one that never touches MPI. Every collective is non-blocking underneath
// and every wait has a deadline, so a rank that died or hung becomes an error on the others
// instead of a hang. The model never sees this: only the trainer and grad_sync do.
//
// Collectives on backend memory are the backend's (backend.h's comm_* entries): a group is
// handed down to them as the opaque ct_comm that dist_comm makes, and their waits take the
// group's deadline here (dist_wait_requests). What dist runs itself on MPI is host values only:
// error agreement, sums of doubles, the checkpoint's checksums.
#pragma once
#include <mpi.h>
#include <stdbool.h>
#include <stddef.h>

#include "backend/backend.h"
#include "core/error.h"

typedef struct dist {
    MPI_Comm comm;              // MPI_COMM_WORLD, or a group's (dist_split)
    int rank, size;             // in comm
    int local_rank, local_size; // among the ranks on this node
    bool mpi;                   // MPI_Init was called (finalize it)
    double timeout_s;           // deadline of each wait; the trainer sets it per phase
    double comm_s;              // seconds spent in MPI calls and waits (the trainer resets it)
    // Set by dist_agree when it returned a failure that every rank saw: each rank can then exit
    // cleanly. Any other error on a rank of a multi-rank world must abort the job.
    bool failure_agreed;
    double *gathered; // size slots, for dist_sum and dist_agree (no allocation per step)
} dist;

// True when the environment says a launcher started this process as one of several
// (OMPI_COMM_WORLD_SIZE, PMIX_RANK, PMI_SIZE, SLURM_NTASKS > 1).
bool dist_launched(void);
// MPI_Init when launched (an error names the launcher's environment), else a world of one.
int dist_init(dist *d, ct_error *err);
void dist_finalize(dist *d);
// More threads than cores on this node: waits sleep after 0.1 ms instead of yielding for a
// second, so that waiting ranks leave the cores to the ranks they wait for.
void dist_wait_oversubscribed(bool on);
// A group of d's ranks: those passing the same color, ranked by key (MPI_Comm_split), with d's
// deadline. HSDP's shard and replica groups. Free it with dist_group_free, before finalizing d.
int dist_split(const dist *d, int color, int key, dist *group, ct_error *err);
void dist_group_free(dist *group);
// Ends every rank of the job at once (MPI_Abort); exit(code) for a world of one.
_Noreturn void dist_abort(dist *d, int code);

// Monotonic seconds, for adding the time of MPI calls made elsewhere to d->comm_s.
double dist_clock(void);

// Waits for n requests until d->timeout_s; `what` names the operation in the timeout error.
int dist_wait(dist *d, int n, MPI_Request *reqs, const char *what, ct_error *err);

// d's group as the backend's collectives take it (valid while d is).
ct_comm dist_comm(const dist *d);
// The backend's comm_test and comm_wait on n collectives of d's group, with d's deadline
// (timeout_s), their time added to d->comm_s.
bool dist_test_requests(dist *d, ct_backend *be, ct_request **reqs, int n);
int dist_wait_requests(dist *d, ct_backend *be, ct_request **reqs, int n, const char *what,
                       ct_error *err);

// Every rank's `bytes` bytes from `mine` into all[rank * bytes ...] (all == mine's content on
// each rank for its own slot).
int dist_allgather(dist *d, const void *mine, void *all, int bytes, const char *what,
                   ct_error *err);
int dist_bcast(dist *d, void *buf, size_t bytes, int root, const char *what, ct_error *err);
// The sum of one double per rank, added in rank order: the same bits on every rank, and the
// same bits for the same inputs in every run.
int dist_sum(dist *d, double mine, double *sum, const char *what, ct_error *err);
// buf[i] = the sum of every rank's buf[i], added in rank order; scratch holds n * size doubles.
int dist_sum_array(dist *d, double *buf, int n, double *scratch, const char *what, ct_error *err);

// Collective status check: every rank passes its own result (0 or -1 with err set). When any
// rank failed, every rank returns -1 with err = "rank R: <R's message>" for the lowest failing
// R, and d->failure_agreed is set. A timeout here is an ordinary (unagreed) error.
int dist_agree(dist *d, int local_rc, const char *what, ct_error *err);
