// A compute backend: where the model's tensors live and what runs on them. The model, the
// trainer, checkpoints and data parallelism reach tensor memory only through one: its buffers
// (allocate, zero, copy host <-> backend and within it, host views for bulk I/O), its collectives
// and the op table it runs (ops.h: every kernel, the optimizer's, the reductions and the
// initialisation among them). Host code never dereferences a backend pointer.
//
// Two backends exist: "cpu" (plain host memory; every view is the buffer itself, so the seam
// costs nothing) and "cpu-guarded" (--debug.guard_device_memory: the same kernels, but every
// buffer is mprotect(PROT_NONE) whenever control is outside a backend call, so host code that
// reads or writes backend memory directly crashes at once, where a GPU build would read a device
// pointer). A CUDA backend provides the same entries over cudaMalloc'd memory.
//
// Communication is the backend's too: the collectives below read and write its buffers in
// place (MPI on the CPU backends, NCCL on a GPU one), on a group of ranks that parallel/dist.h
// hands down as an opaque ct_comm (comm.h). Nothing above the backend gives backend memory to
// MPI.
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "backend/comm.h"
#include "core/error.h"
#include "ops/ops.h"

typedef struct ct_backend ct_backend;
struct ct_backend {
    const char *name;
    // Buffers, in bytes. alloc returns zeroed memory, or NULL with err naming `what`.
    void *(*alloc)(ct_backend *b, size_t bytes, const char *what, ct_error *err);
    void (*free)(ct_backend *b, void *p);
    void (*zero)(ct_backend *b, void *dst, size_t bytes);
    // zero, and hand the memory back where the backend can (FSDP's gathered units between uses):
    // the plain CPU backend returns the whole pages inside [dst, dst + bytes) to the OS, which
    // maps zero pages back on the next touch, so unused parts of a buffer cost no memory.
    void (*discard)(ct_backend *b, void *dst, size_t bytes);
    // host -> backend, backend -> host, backend -> backend. Nothing happens when the two
    // pointers are the same (a view of a host-visible buffer is the buffer itself).
    void (*write)(ct_backend *b, void *dst, const void *host, size_t bytes);
    void (*read)(ct_backend *b, void *host, const void *src, size_t bytes);
    void (*copy)(ct_backend *b, void *dst, const void *src, size_t bytes);
    // A host view of `bytes` of backend memory at dev: dev itself where the host may address it,
    // else host memory, filled with dev's contents when `fill`. view_release frees it, after
    // writing it back to dev when `write_back`. NULL (err set) when out of memory.
    void *(*view)(ct_backend *b, void *dev, size_t bytes, bool fill, ct_error *err);
    void (*view_release)(ct_backend *b, void *host, void *dev, size_t bytes, bool write_back);
    // *out = the table `in` as this backend runs it (the guarded backend makes its buffers
    // accessible for the length of each call), with out->kernel_state this backend's kernel
    // state: what the kernels make once and reuse (the CPU's bf16 GEMM primitives per shape,
    // oneDNN's engine and stream; ops/cpu_kernels.h), which each backend object owns. `in` must
    // outlive *out. The guarded backend runs one table per process: binding a second, different
    // one is an error.
    int (*bind_ops)(ct_backend *b, ct_ops *out, const ct_ops *in, ct_error *err);
    // [dst, dst + bytes) is about to be written whole: the plain CPU backend maps its pages in
    // with one call rather than one fault per page (FSDP's gathers). The contents do not change.
    void (*populate)(ct_backend *b, void *dst, size_t bytes);
    // [dst, dst + bytes), not yet touched, will be written whole and then read whole again and
    // again (the weights a decode streams every token; a trained model's weights, gradients and
    // AdamW moments every step): the plain CPU backend maps it on 2 MiB pages where the kernel
    // allows (MADV_HUGEPAGE), so the reads miss the TLB far less often and the first touch
    // takes one fault per 2 MiB, not per 4 KiB. Not for buffers used in part on purpose: a huge
    // page maps 2 MiB at its first touch.
    void (*mark_streamed)(ct_backend *b, void *dst, size_t bytes);
    // dst(n) += src(n), what a collective written by hand adds (FSDP's reduce-scatter ring), in
    // dst's type: F32 += F32, BF16 += BF16 (each addition rounded to bf16), F32 += BF16 (src
    // widened, exact). Elementwise, so the order of the elements does not matter.
    void (*accumulate)(ct_backend *b, void *dst, ct_comm_type dst_type, const void *src,
                       ct_comm_type src_type, size_t n);

    // Collectives on the ranks of c, over backend memory, each non-blocking: it starts, and
    // *req is the collective in flight (NULL: it completed at once), which comm_test or
    // comm_wait completes. The buffers, counts and displacements stay in use until then. Counts
    // and displacements are elements of `type` (ints, as MPI's). 0, or -1 with err set and
    // nothing in flight. Every rank of c calls the same collectives in the same order.
    //   allreduce       buf(count) = the sum over the ranks of their buf.
    //   reduce_scatter  buf holds the ranks' blocks back to back (counts[r] elements for rank
    //                   r); this rank's block of the sum lands at buf's start.
    //   allgather       buf + displs[r] receives rank r's counts[r] elements; this rank's own
    //                   are already in place there.
    //   send, recv      count elements to / from rank `peer` of c, matched by `tag`.
    //   alltoall        send + sdispls[r] (scounts[r] elements) goes to rank r, and
    //                   recv + rdispls[r] receives rcounts[r] from rank r; send and recv apart.
    int (*comm_allreduce)(ct_backend *b, const ct_comm *c, void *buf, int count, ct_comm_type type,
                          ct_request **req, ct_error *err);
    int (*comm_reduce_scatter)(ct_backend *b, const ct_comm *c, void *buf, const int *counts,
                               ct_comm_type type, ct_request **req, ct_error *err);
    int (*comm_allgather)(ct_backend *b, const ct_comm *c, void *buf, const int *counts,
                          const int *displs, ct_comm_type type, ct_request **req, ct_error *err);
    int (*comm_send)(ct_backend *b, const ct_comm *c, const void *buf, int count, ct_comm_type type,
                     int peer, int tag, ct_request **req, ct_error *err);
    int (*comm_recv)(ct_backend *b, const ct_comm *c, void *buf, int count, ct_comm_type type,
                     int peer, int tag, ct_request **req, ct_error *err);
    int (*comm_alltoall)(ct_backend *b, const ct_comm *c, const void *send, const int *scounts,
                         const int *sdispls, void *recv, const int *rcounts, const int *rdispls,
                         ct_comm_type type, ct_request **req, ct_error *err);
    // One round of progress on n collectives (MPI moves data only inside its calls): true when
    // all of them completed, which sets every pointer to NULL; else none is completed.
    bool (*comm_test)(ct_backend *b, ct_request **reqs, int n);
    // Waits for n collectives, for at most timeout_s seconds: a rank that died or hung becomes
    // an error naming `what` (the collectives then stay in flight: the run ends).
    int (*comm_wait)(ct_backend *b, ct_request **reqs, int n, double timeout_s, const char *what,
                     ct_error *err);
    // Frees the kernel state (after the last call of a table bound to it; a later bind starts
    // a new one). Buffers are freed by their owners before.
    void (*close)(ct_backend *b);
    void *ctx; // the backend's own state: its mappings, its guard, its communication's, its
               // kernels'
};

// The plain CPU backend (the default everywhere a backend may be NULL).
ct_backend *ct_backend_cpu(void);
// The guarded CPU backend: one per process. Slow (two mprotect calls per buffer per kernel call):
// tests only.
ct_backend *ct_backend_cpu_guarded(void);
// b, or the plain CPU backend when b is NULL.
static inline ct_backend *ct_backend_or_cpu(ct_backend *b) {
    return b ? b : ct_backend_cpu();
}
