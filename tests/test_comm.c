// The backend's collectives (backend.h's comm_* entries) on both CPU backends: all-reduce (fp32
// and bf16), reduce-scatter, all-gather, send/recv and all-to-all, each started non-blocking and
// completed by a test or a wait, checked against sums worked out from the ranks' inputs. The
// guarded backend must hold exactly the buffers a collective touches open while it is in flight,
// and close them when it completes. A wait past its deadline is a named error, and the
// collective can still complete afterwards.
//
// Alone (ctest's `comm`) it runs as a world of one, where the collectives over one rank
// complete at once; tests/comm_mpi.sh runs it under mpirun -np 2 and -np 4.
#include <errno.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "check.h"
#include "parallel/dist.h"

static dist d;
static int probe[2]; // a pipe: write() from a buffer says whether the host may read it

// Whether host code may read p now (write(2) reports EFAULT instead of faulting).
static bool readable(const void *p) {
    char sink[4];
    ssize_t n = write(probe[1], p, 4);
    if (n == 4) (void)!read(probe[0], sink, 4);
    return n == 4;
}

static float *alloc_f(ct_backend *be, size_t n) {
    ct_error err;
    float *p = be->alloc(be, n * sizeof(float), "test", &err);
    CHECK(p != NULL, "alloc: %s", err.msg);
    return p;
}

static void put(ct_backend *be, void *dst, const void *src, size_t bytes) {
    be->write(be, dst, src, bytes);
}

static int wait1(ct_backend *be, ct_request **req, const char *what) {
    ct_error err = {0};
    int rc = dist_wait_requests(&d, be, req, 1, what, &err);
    CHECK(rc == 0 && !*req, "%s: %s", what, err.msg);
    return rc;
}

static void test_allreduce(ct_backend *be, const char *name) {
    const int P = d.size, r = d.rank, n = 1000;
    const ct_comm c = dist_comm(&d);
    float *buf = alloc_f(be, n), *other = alloc_f(be, 8), host[1000];
    for (int i = 0; i < n; i++) host[i] = (float)(r + 1) + (float)i;
    put(be, buf, host, sizeof host);
    ct_request *req = NULL;
    ct_error err;
    CHECK(be->comm_allreduce(be, &c, buf, n, CT_COMM_F32, &req, &err) == 0, "%s: %s", name,
          err.msg);
    if (strcmp(be->name, "cpu-guarded") == 0 && req) {
        CHECK(readable(buf), "%s: a buffer in flight is open", name);
        CHECK(!readable(other), "%s: a buffer no collective touches stays closed", name);
    }
    wait1(be, &req, "the all-reduce");
    if (strcmp(be->name, "cpu-guarded") == 0)
        CHECK(!readable(buf), "%s: the buffer is closed again once the all-reduce completed", name);
    be->read(be, host, buf, sizeof host);
    bool ok = true;
    for (int i = 0; i < n; i++) ok &= host[i] == (float)(P * (P + 1) / 2) + (float)(P * i);
    CHECK(ok, "%s: all-reduce sums: host[1] = %g", name, host[1]);

    // bf16: 1 + 1/256 per rank is exact in bf16; the sums of up to 4 ranks round as bf16 adds.
    uint16_t *h = be->alloc(be, 64 * sizeof *h, "test", &err), hh[64];
    for (int i = 0; i < 64; i++) hh[i] = f32_to_bf16((float)(i + r));
    put(be, h, hh, sizeof hh);
    CHECK(be->comm_allreduce(be, &c, h, 64, CT_COMM_BF16, &req, &err) == 0, "%s: bf16: %s", name,
          err.msg);
    wait1(be, &req, "the bf16 all-reduce");
    be->read(be, hh, h, sizeof hh);
    ok = true;
    for (int i = 0; i < 64; i++) {
        float want = 0;
        for (int q = 0; q < P; q++) want = bf16_to_f32(f32_to_bf16(want + (float)(i + q)));
        ok &= bf16_to_f32(hh[i]) == want;
    }
    CHECK(ok, "%s: bf16 all-reduce sums", name);
    be->free(be, h);
    be->free(be, buf);
    be->free(be, other);
}

// Rank q's block has q + 1 elements; element k of rank q's input is (q + 1) * (k + 1).
static void test_reduce_scatter(ct_backend *be, const char *name) {
    const int P = d.size, r = d.rank;
    const ct_comm c = dist_comm(&d);
    int counts[8], total = 0, at = 0;
    for (int q = 0; q < P; q++) counts[q] = q + 1, total += q + 1;
    for (int q = 0; q < r; q++) at += counts[q];
    float *buf = alloc_f(be, (size_t)total), host[64];
    for (int k = 0; k < total; k++) host[k] = (float)((r + 1) * (k + 1));
    put(be, buf, host, (size_t)total * sizeof(float));
    ct_request *req = NULL;
    ct_error err;
    CHECK(be->comm_reduce_scatter(be, &c, buf, counts, CT_COMM_F32, &req, &err) == 0, "%s: %s",
          name, err.msg);
    wait1(be, &req, "the reduce-scatter");
    be->read(be, host, buf, (size_t)counts[r] * sizeof(float));
    bool ok = true;
    for (int k = 0; k < counts[r]; k++) ok &= host[k] == (float)((at + k + 1) * P * (P + 1) / 2);
    CHECK(ok, "%s: this rank's block of the sum at the buffer's start: %g", name, host[0]);
    be->free(be, buf);
}

// Rank q owns q + 2 elements at displacement 10 q, valued 100 q + k.
static void test_allgather(ct_backend *be, const char *name) {
    const int P = d.size, r = d.rank;
    const ct_comm c = dist_comm(&d);
    int counts[8], displs[8];
    for (int q = 0; q < P; q++) counts[q] = q + 2, displs[q] = 10 * q;
    float *buf = alloc_f(be, (size_t)10 * P), host[80] = {0};
    for (int k = 0; k < counts[r]; k++) host[displs[r] + k] = (float)(100 * r + k);
    put(be, buf, host, (size_t)10 * P * sizeof(float));
    ct_request *req = NULL;
    ct_error err;
    CHECK(be->comm_allgather(be, &c, buf, counts, displs, CT_COMM_F32, &req, &err) == 0, "%s: %s",
          name, err.msg);
    // Completed by tests alone, as FSDP's prefetched gathers are.
    while (!dist_test_requests(&d, be, &req, 1)) {
    }
    CHECK(!req, "%s: a completed test clears the request", name);
    be->read(be, host, buf, (size_t)10 * P * sizeof(float));
    bool ok = true;
    for (int q = 0; q < P; q++)
        for (int k = 0; k < counts[q]; k++) ok &= host[displs[q] + k] == (float)(100 * q + k);
    CHECK(ok, "%s: every rank's part in place", name);
    be->free(be, buf);
}

// A ring: each rank sends 5 elements to the next and receives from the previous.
static void test_send_recv(ct_backend *be, const char *name) {
    const int P = d.size, r = d.rank;
    const ct_comm c = dist_comm(&d);
    ct_request *req[2] = {NULL, NULL};
    ct_error err;
    float *out = alloc_f(be, 5), *in = alloc_f(be, 5), host[5];
    if (P == 1) {
        CHECK(be->comm_send(be, &c, out, 5, CT_COMM_F32, 0, 1, &req[0], &err) != 0 &&
                  strstr(err.msg, "world of one"),
              "%s: a send in a world of one is an error: %s", name, err.msg);
    } else {
        for (int k = 0; k < 5; k++) host[k] = (float)(10 * r + k);
        put(be, out, host, sizeof host);
        CHECK(be->comm_send(be, &c, out, 5, CT_COMM_F32, (r + 1) % P, 3, &req[0], &err) == 0 &&
                  be->comm_recv(be, &c, in, 5, CT_COMM_F32, (r + P - 1) % P, 3, &req[1], &err) == 0,
              "%s: %s", name, err.msg);
        CHECK(dist_wait_requests(&d, be, req, 2, "the ring", &err) == 0, "%s: %s", name, err.msg);
        be->read(be, host, in, sizeof host);
        const int left = (r + P - 1) % P;
        CHECK(host[0] == (float)(10 * left) && host[4] == (float)(10 * left + 4),
              "%s: received the left neighbour's values: %g", name, host[0]);
    }
    be->free(be, out);
    be->free(be, in);
}

// Rank r sends q + 1 elements to rank q, valued 1000 r + 10 q + k; it receives r + 1 from each.
static void test_alltoall(ct_backend *be, const char *name) {
    const int P = d.size, r = d.rank;
    const ct_comm c = dist_comm(&d);
    int sc[8], sd[8], rc[8], rd[8], ns = 0, nr = 0;
    for (int q = 0; q < P; q++) {
        sc[q] = q + 1, sd[q] = ns, ns += sc[q];
        rc[q] = r + 1, rd[q] = nr, nr += rc[q];
    }
    float *send = alloc_f(be, (size_t)ns), *recv = alloc_f(be, (size_t)nr), host[64];
    for (int q = 0; q < P; q++)
        for (int k = 0; k < sc[q]; k++) host[sd[q] + k] = (float)(1000 * r + 10 * q + k);
    put(be, send, host, (size_t)ns * sizeof(float));
    ct_request *req = NULL;
    ct_error err;
    CHECK(be->comm_alltoall(be, &c, send, sc, sd, recv, rc, rd, CT_COMM_F32, &req, &err) == 0,
          "%s: %s", name, err.msg);
    if (strcmp(be->name, "cpu-guarded") == 0 && req)
        CHECK(readable(send) && readable(recv), "%s: both buffers open in flight", name);
    wait1(be, &req, "the all-to-all");
    if (strcmp(be->name, "cpu-guarded") == 0)
        CHECK(!readable(send) && !readable(recv), "%s: both closed after", name);
    be->read(be, host, recv, (size_t)nr * sizeof(float));
    bool ok = true;
    for (int q = 0; q < P; q++)
        for (int k = 0; k < rc[q]; k++) ok &= host[rd[q] + k] == (float)(1000 * q + 10 * r + k);
    CHECK(ok, "%s: every rank's block for this rank", name);
    be->free(be, send);
    be->free(be, recv);
}

// Rank 0 waits for a message rank 1 sends late: the first wait's deadline passes (a named
// error), and a second wait completes it.
static void test_deadline(ct_backend *be, const char *name) {
    if (d.size < 2 || d.rank > 1) return;
    const ct_comm c = dist_comm(&d);
    float *buf = alloc_f(be, 4);
    ct_request *req = NULL;
    ct_error err = {0};
    if (d.rank == 0) {
        CHECK(be->comm_recv(be, &c, buf, 4, CT_COMM_F32, 1, 9, &req, &err) == 0, "%s", err.msg);
        CHECK(be->comm_wait(be, &req, 1, 0.2, "the late message", &err) != 0 && req &&
                  strstr(err.msg, "the late message did not complete within"),
              "%s: a deadline is a named error: %s", name, err.msg);
        CHECK(be->comm_wait(be, &req, 1, 60, "the late message", &err) == 0 && !req,
              "%s: and the message still arrives: %s", name, err.msg);
    } else {
        struct timespec pause = {0, 600000000};
        nanosleep(&pause, NULL);
        CHECK(be->comm_send(be, &c, buf, 4, CT_COMM_F32, 0, 9, &req, &err) == 0, "%s", err.msg);
        wait1(be, &req, "the late send");
    }
    be->free(be, buf);
}

int main(void) {
    ct_error err;
    if (dist_init(&d, &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    d.timeout_s = 60;
    if (pipe(probe) != 0) return 1;
    ct_backend *backends[2] = {ct_backend_cpu(), ct_backend_cpu_guarded()};
    for (int i = 0; i < 2; i++) {
        ct_backend *be = backends[i];
        char name[64];
        snprintf(name, sizeof name, "%s, rank %d of %d", be->name, d.rank, d.size);
        test_allreduce(be, name);
        test_reduce_scatter(be, name);
        test_allgather(be, name);
        test_send_recv(be, name);
        test_alltoall(be, name);
        test_deadline(be, name);
    }
    int rc = check_summary();
    if (rc != 0) ct_fail(&err, "checks failed");
    int all = dist_agree(&d, rc == 0 ? 0 : -1, "the checks", &err);
    dist_finalize(&d);
    return all == 0 ? rc : 1;
}
