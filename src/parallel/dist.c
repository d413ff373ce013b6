#include "parallel/dist.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/comm_mpi.h"
#include "core/clock.h"

double dist_clock(void) {
    return ct_now_s();
}

static int env_int(const char *name, int fallback) {
    const char *s = getenv(name);
    return s && *s ? atoi(s) : fallback;
}

bool dist_launched(void) {
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_SIZE") ||
           env_int("SLURM_NTASKS", 1) > 1;
}

int dist_init(dist *d, ct_error *err) {
    memset(d, 0, sizeof *d);
    d->size = d->local_size = 1;
    d->timeout_s = 300;
    d->comm = MPI_COMM_NULL;
    if (!dist_launched()) return 0;
    int provided = 0;
    if (MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
        return ct_fail(err,
                       "MPI_Init failed under the launcher's environment (OMPI_COMM_WORLD_SIZE "
                       "/ PMIX_RANK / PMI_SIZE / SLURM_NTASKS)");
    d->mpi = true;
    d->comm = MPI_COMM_WORLD;
    // Errors come back as return codes, so a failing call turns into our error, not an abort.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &d->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &d->size);
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, d->rank, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &d->local_rank);
    MPI_Comm_size(node, &d->local_size);
    MPI_Comm_free(&node);
    d->gathered = malloc((size_t)d->size * sizeof *d->gathered);
    if (!d->gathered) return ct_fail(err, "rank %d: out of memory for %d ranks", d->rank, d->size);
    return 0;
}

void dist_wait_oversubscribed(bool on) {
    ct_mpi_wait_oversubscribed(on);
}

void dist_finalize(dist *d) {
    free(d->gathered);
    d->gathered = NULL;
    if (d->mpi) MPI_Finalize();
    d->mpi = false;
}

int dist_split(const dist *d, int color, int key, dist *group, ct_error *err) {
    *group = *d;
    group->gathered = NULL;
    group->comm_s = 0;
    if (!d->mpi) return 0;
    group->mpi = false; // until it is made: dist_group_free then has nothing to free
    if (MPI_Comm_split(d->comm, color, key, &group->comm) != MPI_SUCCESS)
        return ct_fail(err, "rank %d: MPI_Comm_split failed (color %d)", d->rank, color);
    group->mpi = true;
    MPI_Comm_set_errhandler(group->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(group->comm, &group->rank);
    MPI_Comm_size(group->comm, &group->size);
    group->gathered = malloc((size_t)group->size * sizeof *group->gathered);
    if (!group->gathered)
        return ct_fail(err, "rank %d: out of memory for a group of %d ranks", d->rank, group->size);
    return 0;
}

void dist_group_free(dist *group) {
    free(group->gathered);
    if (group->mpi) MPI_Comm_free(&group->comm);
    memset(group, 0, sizeof *group);
}

_Noreturn void dist_abort(dist *d, int code) {
    fflush(NULL);
    if (d->mpi) MPI_Abort(MPI_COMM_WORLD, code);
    exit(code);
}

int dist_wait(dist *d, int n, MPI_Request *reqs, const char *what, ct_error *err) {
    if (!d->mpi) return 0;
    const double t0 = ct_now_s();
    int rc = ct_mpi_wait(reqs, n, d->timeout_s, d->rank, what, err);
    d->comm_s += ct_now_s() - t0;
    return rc;
}

ct_comm dist_comm(const dist *d) {
    return (ct_comm){d->mpi ? &d->comm : NULL, d->rank, d->size};
}

bool dist_test_requests(dist *d, ct_backend *be, ct_request **reqs, int n) {
    const double t0 = ct_now_s();
    bool done = be->comm_test(be, reqs, n);
    d->comm_s += ct_now_s() - t0;
    return done;
}

int dist_wait_requests(dist *d, ct_backend *be, ct_request **reqs, int n, const char *what,
                       ct_error *err) {
    const double t0 = ct_now_s();
    int rc = be->comm_wait(be, reqs, n, d->timeout_s, what, err);
    d->comm_s += ct_now_s() - t0;
    return rc;
}

// The tail of every blocking collective: the non-blocking call returned `start_rc`.
static int finish(dist *d, int start_rc, MPI_Request *req, double t0, const char *what,
                  ct_error *err) {
    d->comm_s += ct_now_s() - t0;
    if (start_rc != MPI_SUCCESS)
        return ct_fail(err, "rank %d: MPI failed to start %s", d->rank, what);
    return dist_wait(d, 1, req, what, err);
}

int dist_allgather(dist *d, const void *mine, void *all, int bytes, const char *what,
                   ct_error *err) {
    if (!d->mpi) {
        memmove(all, mine, (size_t)bytes);
        return 0;
    }
    MPI_Request req;
    double t0 = ct_now_s();
    int rc = MPI_Iallgather(mine, bytes, MPI_BYTE, all, bytes, MPI_BYTE, d->comm, &req);
    return finish(d, rc, &req, t0, what, err);
}

int dist_bcast(dist *d, void *buf, size_t bytes, int root, const char *what, ct_error *err) {
    if (!d->mpi) return 0;
    // In pieces of at most 1 GiB: MPI counts are ints (a tensor of an exported model may pass
    // 2 GiB).
    const size_t piece = (size_t)1 << 30;
    for (size_t at = 0; at < bytes; at += piece) {
        MPI_Request req;
        double t0 = ct_now_s();
        const int n = (int)(bytes - at < piece ? bytes - at : piece);
        if (finish(d, MPI_Ibcast((char *)buf + at, n, MPI_BYTE, root, d->comm, &req), &req, t0,
                   what, err) != 0)
            return -1;
    }
    return 0;
}

int dist_sum(dist *d, double mine, double *sum, const char *what, ct_error *err) {
    if (!d->mpi) {
        *sum = mine;
        return 0;
    }
    int rc = dist_allgather(d, &mine, d->gathered, sizeof mine, what, err);
    double s = 0;
    for (int r = 0; r < d->size; r++) s += d->gathered[r];
    *sum = s;
    return rc;
}

int dist_sum_array(dist *d, double *buf, int n, double *scratch, const char *what, ct_error *err) {
    if (!d->mpi) return 0;
    if (dist_allgather(d, buf, scratch, n * (int)sizeof *buf, what, err) != 0) return -1;
    for (int i = 0; i < n; i++) {
        double s = 0;
        for (int r = 0; r < d->size; r++) s += scratch[(size_t)r * n + i];
        buf[i] = s;
    }
    return 0;
}

int dist_agree(dist *d, int local_rc, const char *what, ct_error *err) {
    if (!d->mpi) return local_rc;
    double mine = local_rc;
    if (dist_allgather(d, &mine, d->gathered, sizeof mine, what, err) != 0) return -1;
    int failed = -1;
    for (int r = 0; r < d->size && failed < 0; r++)
        if (d->gathered[r] != 0) failed = r;
    if (failed < 0) return 0;
    ct_error shared;
    if (d->rank == failed) shared = *err;
    if (dist_bcast(d, shared.msg, sizeof shared.msg, failed, what, err) != 0) return -1;
    shared.msg[sizeof shared.msg - 1] = '\0';
    // A failure an inner agreement (a group's) already named keeps its one "rank N: ".
    int named = 0;
    *err = shared;
    if (!(sscanf(shared.msg, "rank %*d: %n", &named) == 0 && named > 0))
        ct_wrap(err, "rank %d", failed);
    d->failure_agreed = true;
    return -1;
}
