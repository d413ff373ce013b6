// A compute backend: where the model's tensors live and what runs on them. The model, the
// trainer, checkpoints and data parallelism reach tensor memory only through one: its buffers
// (allocate, zero, copy host <-> backend and within it, host views for I/O and communication)
// and the op table it runs (ops.h: every kernel, the optimizer's, the reductions and the
// initialisation among them). Host code never dereferences a backend pointer.
//
// Two backends exist: "cpu" (plain host memory; every view is the buffer itself, so the seam
// costs nothing) and "cpu-guarded" (--debug.guard_device_memory: the same kernels, but every
// buffer is mprotect(PROT_NONE) whenever control is outside a backend call, so host code that
// reads or writes backend memory directly crashes at once, where a GPU build would read a device
// pointer). A CUDA backend provides the same entries over cudaMalloc'd memory.
#pragma once
#include <stdbool.h>
#include <stddef.h>

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
    // accessible for the length of each call). `in` must outlive *out. The guarded backend runs
    // one table per process: binding a second, different one is an error.
    int (*bind_ops)(ct_backend *b, ct_ops *out, const ct_ops *in, ct_error *err);
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
