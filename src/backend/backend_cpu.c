// The CPU backends. "cpu": host memory, every view the buffer itself, ops as given. "cpu-guarded"
// (--debug.guard_device_memory): each buffer is its own mmap, PROT_NONE except while a backend
// call runs (a buffer call below, or any kernel of the bound table, through the wrappers
// generated from the op list), or while a collective that touches it is in flight, so a host
// read or write of backend memory outside the seam faults at the instruction that made it. Both
// run their collectives on MPI (comm_mpi.c), on the buffers themselves. Their state (mappings,
// the guard's depth, the bf16 sum's MPI_Op, the kernels' state) is the backend object's
// (ct_backend.ctx).
#include <mpi.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/comm_mpi.h"
#include "core/dtype.h"
#include "core/grow.h"
#include "ops/cpu_kernels.h"

// A mapping of its own: a large buffer (plain) or any buffer (guarded).
typedef struct mapping {
    void *p;
    size_t bytes;
    int held; // guarded: collectives in flight that touch it (it stays accessible until they end)
} mapping;

// A CPU backend's state (ct_backend.ctx), in the backend object rather than in file statics.
typedef struct cpu_state {
    mapping *maps; // plain: the large buffers; guarded: every buffer, whole pages
    size_t n_maps, cap_maps;
    int depth;       // guarded: how deep in backend calls control is
    MPI_Op bf16_sum; // the bf16 sum of the collectives, made on first use
    // What the kernels of a table bound to this backend make once and reuse (the bf16 GEMMs'
    // oneDNN engine, stream and primitives per shape): bind_ops points the table's
    // kernel_state here, and close frees it.
    cpu_kernels kernels;
} cpu_state;

static cpu_state *state_of(ct_backend *b) {
    return b->ctx;
}

// Records a mapping; -1 (err names `what`) when out of memory.
static int maps_add(cpu_state *s, void *p, size_t bytes, const char *what, ct_error *err) {
    if (grow_to((void **)&s->maps, &s->cap_maps, s->n_maps + 1, sizeof *s->maps) != 0)
        return ct_fail(err, "out of memory for the table of buffers (adding %s)", what);
    s->maps[s->n_maps++] = (mapping){p, bytes, 0};
    return 0;
}

// The mapping holding p, or NULL.
static mapping *maps_find(cpu_state *s, const void *p) {
    for (size_t i = 0; i < s->n_maps; i++)
        if ((const char *)p >= (char *)s->maps[i].p &&
            (const char *)p < (char *)s->maps[i].p + s->maps[i].bytes)
            return &s->maps[i];
    return NULL;
}

// Unmaps and forgets the mapping starting at p: false when p is not one.
static bool maps_remove(cpu_state *s, void *p) {
    for (size_t i = 0; p && i < s->n_maps; i++) {
        if (s->maps[i].p != p) continue;
        munmap(p, s->maps[i].bytes);
        s->maps[i] = s->maps[--s->n_maps];
        return true;
    }
    return false;
}

// ---------------------------------------------------------------------------------------------
// Plain host memory.

// Buffers of 64 MiB and more are mappings of their own, made with MAP_NORESERVE: their pages
// cost memory only once touched, whatever the kernel's overcommit policy. FSDP's full-size
// buffers, of which only the units in use are ever touched, can then exceed the node's memory.
// There is no fallback: a large buffer that cannot be mapped is an error, not a calloc that
// would commit all of its memory.
#define CPU_BIG_BYTES ((size_t)64 << 20)

static void *cpu_alloc(ct_backend *b, size_t bytes, const char *what, ct_error *err) {
    if (bytes >= CPU_BIG_BYTES) {
        void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) {
            ct_fail(err, "could not map %.2f GiB for %s", bytes / 1073741824.0, what);
            return NULL;
        }
        if (maps_add(state_of(b), p, bytes, what, err) != 0) {
            munmap(p, bytes);
            return NULL;
        }
        return p;
    }
    void *p = calloc(bytes ? bytes : 1, 1);
    if (!p) ct_fail(err, "out of memory for %s (%.2f GiB)", what, bytes / 1073741824.0);
    return p;
}
static void cpu_free(ct_backend *b, void *p) {
    if (!maps_remove(state_of(b), p)) free(p);
}
static void cpu_zero(ct_backend *b, void *dst, size_t bytes) {
    (void)b;
    if (bytes) memset(dst, 0, bytes);
}
static void cpu_discard(ct_backend *b, void *dst, size_t bytes) {
    (void)b;
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), lo = (uintptr_t)dst;
    const uintptr_t hi = lo + bytes, in_lo = (lo + page - 1) / page * page,
                    in_hi = hi / page * page;
    if (in_hi <= in_lo || madvise((void *)in_lo, in_hi - in_lo, MADV_DONTNEED) != 0) {
        cpu_zero(b, dst, bytes);
        return;
    }
    cpu_zero(b, dst, in_lo - lo); // the partial pages at both ends are shared with neighbours
    cpu_zero(b, (void *)in_hi, hi - in_hi);
}
static void cpu_copy(ct_backend *b, void *dst, const void *src, size_t bytes) {
    (void)b;
    if (dst != src && bytes) memmove(dst, src, bytes);
}
static void *cpu_view(ct_backend *b, void *dev, size_t bytes, bool fill, ct_error *err) {
    (void)b, (void)bytes, (void)fill, (void)err;
    return dev;
}
static void cpu_view_release(ct_backend *b, void *host, void *dev, size_t bytes, bool write_back) {
    (void)b, (void)host, (void)dev, (void)bytes, (void)write_back;
}
static int cpu_bind_ops(ct_backend *b, ct_ops *out, const ct_ops *in, ct_error *err) {
    (void)err;
    *out = *in;
    out->kernel_state = &state_of(b)->kernels;
    return 0;
}
// The kernels' state goes; the buffers are their owners' to free, and the MPI_Op stays (MPI
// may be finalized already). A later bind starts a new state.
static void cpu_close(ct_backend *b) {
    cpu_kernels_free(&state_of(b)->kernels);
}

// Maps in the pages of [dst, dst + bytes) in one call (Linux 5.14's MADV_POPULATE_WRITE) rather
// than one page fault per 4 KiB page, which costs as much again as the writes themselves. Where
// the kernel lacks it, the writes fault the pages in as usual.
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
static void cpu_populate(ct_backend *b, void *dst, size_t bytes) {
    (void)b;
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t lo = (uintptr_t)dst / page * page,
                    hi = ((uintptr_t)dst + bytes + page - 1) / page * page;
    if (bytes) madvise((void *)lo, hi - lo, MADV_POPULATE_WRITE);
}

// Transparent huge pages are "madvise" on many distributions (Debian's default): asked for per
// range. A kernel without them leaves the 4 KiB pages, with the same contents.
static void cpu_mark_streamed(ct_backend *b, void *dst, size_t bytes) {
    (void)b;
    const uintptr_t huge = (uintptr_t)2 << 20;
    const uintptr_t lo = ((uintptr_t)dst + huge - 1) / huge * huge,
                    hi = ((uintptr_t)dst + bytes) / huge * huge;
    if (hi > lo) madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
}

static void cpu_accumulate(ct_backend *b, void *dst, ct_comm_type dst_type, const void *src,
                           ct_comm_type src_type, size_t n) {
    (void)b;
    if (dst_type == CT_COMM_BF16) { // bf16 += bf16, rounded as a bf16 reduction rounds
        uint16_t *d = dst;
        const uint16_t *x = src;
        for (size_t i = 0; i < n; i++) d[i] = f32_to_bf16(bf16_to_f32(d[i]) + bf16_to_f32(x[i]));
    } else if (src_type == CT_COMM_BF16) { // f32 += widened bf16
        float *d = dst;
        const uint16_t *x = src;
        for (size_t i = 0; i < n; i++) d[i] += bf16_to_f32(x[i]);
    } else {
        float *d = dst;
        const float *x = src;
        for (size_t i = 0; i < n; i++) d[i] += x[i];
    }
}

// The collectives: MPI on the buffers themselves (comm_mpi.c).
static int cpu_comm_allreduce(ct_backend *b, const ct_comm *c, void *buf, int count,
                              ct_comm_type type, ct_request **req, ct_error *err) {
    return mpi_allreduce(c, &state_of(b)->bf16_sum, buf, count, type, req, err);
}
static int cpu_comm_reduce_scatter(ct_backend *b, const ct_comm *c, void *buf, const int *counts,
                                   ct_comm_type type, ct_request **req, ct_error *err) {
    return mpi_reduce_scatter(c, &state_of(b)->bf16_sum, buf, counts, type, req, err);
}
static int cpu_comm_allgather(ct_backend *b, const ct_comm *c, void *buf, const int *counts,
                              const int *displs, ct_comm_type type, ct_request **req,
                              ct_error *err) {
    (void)b;
    return mpi_allgather(c, buf, counts, displs, type, req, err);
}
static int cpu_comm_send(ct_backend *b, const ct_comm *c, const void *buf, int count,
                         ct_comm_type type, int peer, int tag, ct_request **req, ct_error *err) {
    (void)b;
    return mpi_send(c, buf, count, type, peer, tag, req, err);
}
static int cpu_comm_recv(ct_backend *b, const ct_comm *c, void *buf, int count, ct_comm_type type,
                         int peer, int tag, ct_request **req, ct_error *err) {
    (void)b;
    return mpi_recv(c, buf, count, type, peer, tag, req, err);
}
static int cpu_comm_alltoall(ct_backend *b, const ct_comm *c, const void *send, const int *scounts,
                             const int *sdispls, void *recv, const int *rcounts, const int *rdispls,
                             ct_comm_type type, ct_request **req, ct_error *err) {
    (void)b;
    return mpi_alltoall(c, send, scounts, sdispls, recv, rcounts, rdispls, type, req, err);
}
static bool cpu_comm_test(ct_backend *b, ct_request **reqs, int n) {
    (void)b;
    return mpi_test(reqs, n);
}
static int cpu_comm_wait(ct_backend *b, ct_request **reqs, int n, double timeout_s,
                         const char *what, ct_error *err) {
    (void)b;
    return mpi_wait(reqs, n, timeout_s, what, err);
}

// A backend of the functions named PREFIX_alloc, PREFIX_free, ... (write and read are copies;
// test and wait are the same for both: completing a request runs its own release).
#define CPU_BACKEND(label, prefix, state)                                                          \
    {                                                                                              \
        .name = label, .alloc = prefix##_alloc, .free = prefix##_free, .zero = prefix##_zero,      \
        .discard = prefix##_discard, .write = prefix##_copy, .read = prefix##_copy,                \
        .copy = prefix##_copy, .view = prefix##_view, .view_release = prefix##_view_release,       \
        .bind_ops = prefix##_bind_ops, .populate = prefix##_populate,                              \
        .mark_streamed = prefix##_mark_streamed, .accumulate = prefix##_accumulate, .comm_allreduce = prefix##_comm_allreduce,              \
        .comm_reduce_scatter = prefix##_comm_reduce_scatter,                                       \
        .comm_allgather = prefix##_comm_allgather, .comm_send = prefix##_comm_send,                \
        .comm_recv = prefix##_comm_recv, .comm_alltoall = prefix##_comm_alltoall,                  \
        .comm_test = cpu_comm_test, .comm_wait = cpu_comm_wait, .close = cpu_close, .ctx = state   \
    }

static cpu_state cpu_st = {.bf16_sum = MPI_OP_NULL};
static ct_backend cpu = CPU_BACKEND("cpu", cpu, &cpu_st);

ct_backend *ct_backend_cpu(void) {
    return &cpu;
}

// ---------------------------------------------------------------------------------------------
// Guarded: every buffer a mapping of its own (whole pages), PROT_NONE except while control is
// inside a backend call (calls nest: a fused kernel calls the table's kernels) or while a
// collective that touches it is in flight (from its start to the test or wait that completes
// it). Calls come from one thread; kernels' OpenMP threads run inside.

static cpu_state guarded_st = {.bf16_sum = MPI_OP_NULL};

static void protect(mapping *m, int prot) {
    mprotect(m->p, m->bytes, prot);
}
// Entering a backend call makes every buffer accessible; leaving the outermost one closes all
// but those a collective in flight holds.
static void open_guard(void) {
    if (guarded_st.depth++ == 0)
        for (size_t i = 0; i < guarded_st.n_maps; i++)
            protect(&guarded_st.maps[i], PROT_READ | PROT_WRITE);
}
static void close_guard(void) {
    if (--guarded_st.depth == 0)
        for (size_t i = 0; i < guarded_st.n_maps; i++)
            if (!guarded_st.maps[i].held) protect(&guarded_st.maps[i], PROT_NONE);
}

static void *guarded_alloc(ct_backend *b, size_t bytes, const char *what, ct_error *err) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const size_t rounded = (bytes + page - 1) / page * page + (bytes ? 0 : page);
    void *p = mmap(NULL, rounded, guarded_st.depth ? PROT_READ | PROT_WRITE : PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        ct_fail(err, "out of memory for %s (%.2f GiB)", what, bytes / 1073741824.0);
        return NULL;
    }
    if (maps_add(state_of(b), p, rounded, what, err) != 0) {
        munmap(p, rounded);
        return NULL;
    }
    return p;
}
static void guarded_free(ct_backend *b, void *p) {
    maps_remove(state_of(b), p);
}

static void guarded_zero(ct_backend *b, void *dst, size_t bytes) {
    open_guard();
    cpu_zero(b, dst, bytes);
    close_guard();
}
static void guarded_discard(ct_backend *b, void *dst, size_t bytes) {
    open_guard();
    cpu_discard(b, dst, bytes);
    close_guard();
}
static void guarded_copy(ct_backend *b, void *dst, const void *src, size_t bytes) {
    open_guard();
    cpu_copy(b, dst, src, bytes);
    close_guard();
}
static void *guarded_view(ct_backend *b, void *dev, size_t bytes, bool fill, ct_error *err) {
    void *host = malloc(bytes ? bytes : 1);
    if (!host) {
        ct_fail(err, "out of memory for a host view of %zu bytes", bytes);
        return NULL;
    }
    if (fill) guarded_copy(b, host, dev, bytes);
    return host;
}
static void guarded_view_release(ct_backend *b, void *host, void *dev, size_t bytes,
                                 bool write_back) {
    if (!host) return;
    if (write_back) guarded_copy(b, dev, host, bytes);
    free(host);
}

static void guarded_populate(ct_backend *b, void *dst, size_t bytes) {
    open_guard();
    cpu_populate(b, dst, bytes);
    close_guard();
}
// Advice on the mapping, not an access: no guard to open.
static void guarded_mark_streamed(ct_backend *b, void *dst, size_t bytes) {
    cpu_mark_streamed(b, dst, bytes);
}
static void guarded_accumulate(ct_backend *b, void *dst, ct_comm_type dst_type, const void *src,
                               ct_comm_type src_type, size_t n) {
    open_guard();
    cpu_accumulate(b, dst, dst_type, src, src_type, n);
    close_guard();
}

// A collective holds the buffers it touches open, and only those, from its start (MPI may move
// data there already) to its completion; host memory that is no buffer (NULL here) needs
// nothing.
static void hold(const void *p) {
    mapping *m = p ? maps_find(&guarded_st, p) : NULL;
    if (m && m->held++ == 0 && !guarded_st.depth) protect(m, PROT_READ | PROT_WRITE);
}
static void unhold(const void *p) {
    mapping *m = p ? maps_find(&guarded_st, p) : NULL;
    if (m && --m->held == 0 && !guarded_st.depth) protect(m, PROT_NONE);
}
static void guarded_release(ct_request *r) {
    unhold(r->held[0]);
    unhold(r->held[1]);
}
// After a start: a collective in flight keeps a and b open until it completes; one that failed
// or completed at once closes them now.
static int holding(int rc, ct_request **req, void *a, void *b) {
    if (rc == 0 && *req) {
        (*req)->release = guarded_release;
        (*req)->held[0] = a, (*req)->held[1] = b;
    } else {
        unhold(a);
        unhold(b);
    }
    return rc;
}

static int guarded_comm_allreduce(ct_backend *b, const ct_comm *c, void *buf, int count,
                                  ct_comm_type type, ct_request **req, ct_error *err) {
    hold(buf);
    return holding(cpu_comm_allreduce(b, c, buf, count, type, req, err), req, buf, NULL);
}
static int guarded_comm_reduce_scatter(ct_backend *b, const ct_comm *c, void *buf,
                                       const int *counts, ct_comm_type type, ct_request **req,
                                       ct_error *err) {
    hold(buf);
    return holding(cpu_comm_reduce_scatter(b, c, buf, counts, type, req, err), req, buf, NULL);
}
static int guarded_comm_allgather(ct_backend *b, const ct_comm *c, void *buf, const int *counts,
                                  const int *displs, ct_comm_type type, ct_request **req,
                                  ct_error *err) {
    hold(buf);
    return holding(cpu_comm_allgather(b, c, buf, counts, displs, type, req, err), req, buf, NULL);
}
static int guarded_comm_send(ct_backend *b, const ct_comm *c, const void *buf, int count,
                             ct_comm_type type, int peer, int tag, ct_request **req,
                             ct_error *err) {
    hold(buf);
    return holding(cpu_comm_send(b, c, buf, count, type, peer, tag, req, err), req, (void *)buf,
                   NULL);
}
static int guarded_comm_recv(ct_backend *b, const ct_comm *c, void *buf, int count,
                             ct_comm_type type, int peer, int tag, ct_request **req,
                             ct_error *err) {
    hold(buf);
    return holding(cpu_comm_recv(b, c, buf, count, type, peer, tag, req, err), req, buf, NULL);
}
static int guarded_comm_alltoall(ct_backend *b, const ct_comm *c, const void *send,
                                 const int *scounts, const int *sdispls, void *recv,
                                 const int *rcounts, const int *rdispls, ct_comm_type type,
                                 ct_request **req, ct_error *err) {
    hold(send);
    hold(recv);
    return holding(
        cpu_comm_alltoall(b, c, send, scounts, sdispls, recv, rcounts, rdispls, type, req, err),
        req, (void *)send, recv);
}

// One wrapper per entry of the op list: guarded_<field> runs bound.<field> with the buffers
// accessible. A fused kernel runs against the bound table, whose kernels are unwrapped.
static ct_ops bound;
static bool have_bound;
#define WRAP(kind, field, type, cpu, need, op, dir, params, args) WRAP_##kind(field, params, args)
#define WRAP_PLUGIN(field, params, args)                                                           \
    static void guarded_##field params {                                                           \
        open_guard();                                                                              \
        bound.field args;                                                                          \
        close_guard();                                                                             \
    }
#define WRAP_OWN WRAP_PLUGIN
#define WRAP_FUSED(field, params, args)                                                            \
    static void guarded_##field params {                                                           \
        (void)ops;                                                                                 \
        open_guard();                                                                              \
        bound.field(&bound, CT_OP_UNPACK args);                                                    \
        close_guard();                                                                             \
    }
#define WRAP_PLUGIN_SIZE(field, params, args)
#define WRAP_OWN_SIZE(field, params, args)
CT_OPS_LIST(WRAP)

static int guarded_bind_ops(ct_backend *b, ct_ops *out, const ct_ops *in, ct_error *err) {
    ct_ops table = *in;
    table.kernel_state = &state_of(b)->kernels;
    if (have_bound && memcmp(&bound, &table, sizeof bound) != 0)
        return ct_fail(err, "the guarded backend runs one op table per process; a second, "
                            "different one was asked for");
    bound = table, have_bound = true;
    *out = table; // the size queries pass through: they touch no buffer
#define INSTALL(kind, field, ...)                                                                  \
    CT_OP_IF_TIMED_##kind(if (in->field) out->field = guarded_##field;)
    CT_OPS_LIST(INSTALL)
#undef INSTALL
    return 0;
}

static ct_backend guarded = CPU_BACKEND("cpu-guarded", guarded, &guarded_st);

ct_backend *ct_backend_cpu_guarded(void) {
    return &guarded;
}
