// The CPU backends. "cpu": host memory, every view the buffer itself, ops as given. "cpu-guarded"
// (--debug.guard_device_memory): each buffer is its own mmap, PROT_NONE except while a backend
// call runs (a buffer call below, or any kernel of the bound table, through the wrappers
// generated from the op list), so a host read or write of backend memory outside the seam
// faults at the instruction that made it.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend/backend.h"

// ---------------------------------------------------------------------------------------------
// Plain host memory.

// Buffers of 64 MiB and more are mappings of their own, made with MAP_NORESERVE: their pages
// cost memory only once touched, whatever the kernel's overcommit policy. FSDP's full-size
// buffers, of which only the units in use are ever touched, can then exceed the node's memory.
#define CPU_BIG_BYTES ((size_t)64 << 20)
static struct {
    void *p;
    size_t bytes;
} big[64];

static void *cpu_alloc(ct_backend *b, size_t bytes, const char *what, ct_error *err) {
    (void)b;
    for (int i = 0; bytes >= CPU_BIG_BYTES && i < 64; i++) {
        if (big[i].p) continue;
        void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) break;
        big[i].p = p;
        big[i].bytes = bytes;
        return p;
    }
    void *p = calloc(bytes ? bytes : 1, 1);
    if (!p) ct_fail(err, "out of memory for %s (%.2f GiB)", what, bytes / 1073741824.0);
    return p;
}
static void cpu_free(ct_backend *b, void *p) {
    (void)b;
    for (int i = 0; p && i < 64; i++)
        if (big[i].p == p) {
            munmap(p, big[i].bytes);
            big[i].p = NULL;
            return;
        }
    free(p);
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
    (void)b, (void)err;
    *out = *in;
    return 0;
}

// A backend of the functions named PREFIX_alloc, PREFIX_free, ... (write and read are copies).
#define CPU_BACKEND(label, prefix)                                                                 \
    {                                                                                              \
        .name = label, .alloc = prefix##_alloc, .free = prefix##_free, .zero = prefix##_zero,      \
        .discard = prefix##_discard, .write = prefix##_copy, .read = prefix##_copy,                \
        .copy = prefix##_copy, .view = prefix##_view, .view_release = prefix##_view_release,       \
        .bind_ops = prefix##_bind_ops                                                              \
    }

static ct_backend cpu = CPU_BACKEND("cpu", cpu);

ct_backend *ct_backend_cpu(void) {
    return &cpu;
}

// ---------------------------------------------------------------------------------------------
// Guarded: the regions, and how deep in backend calls control is (calls nest: a fused kernel
// calls the table's kernels). Calls come from one thread; kernels' OpenMP threads run inside.

typedef struct region {
    void *p;
    size_t bytes; // whole pages
} region;
static region *regions;
static int n_regions, cap_regions, depth;

static void protect_all(int prot) {
    for (int i = 0; i < n_regions; i++) mprotect(regions[i].p, regions[i].bytes, prot);
}
static void open_guard(void) {
    if (depth++ == 0) protect_all(PROT_READ | PROT_WRITE);
}
static void close_guard(void) {
    if (--depth == 0) protect_all(PROT_NONE);
}

static void *guarded_alloc(ct_backend *b, size_t bytes, const char *what, ct_error *err) {
    (void)b;
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const size_t rounded = (bytes + page - 1) / page * page + (bytes ? 0 : page);
    if (n_regions == cap_regions) {
        const int cap = cap_regions ? 2 * cap_regions : 64;
        region *grown = realloc(regions, (size_t)cap * sizeof *grown);
        if (!grown) {
            ct_fail(err, "out of memory for %s", what);
            return NULL;
        }
        regions = grown, cap_regions = cap;
    }
    void *p = mmap(NULL, rounded, depth ? PROT_READ | PROT_WRITE : PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        ct_fail(err, "out of memory for %s (%.2f GiB)", what, bytes / 1073741824.0);
        return NULL;
    }
    regions[n_regions++] = (region){p, rounded};
    return p;
}
static void guarded_free(ct_backend *b, void *p) {
    (void)b;
    for (int i = 0; p && i < n_regions; i++) {
        if (regions[i].p != p) continue;
        munmap(p, regions[i].bytes);
        regions[i] = regions[--n_regions];
        return;
    }
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
    (void)b;
    if (have_bound && memcmp(&bound, in, sizeof bound) != 0)
        return ct_fail(err, "the guarded backend runs one op table per process; a second, "
                            "different one was asked for");
    bound = *in, have_bound = true;
    *out = *in; // the size queries pass through: they touch no buffer
#define INSTALL(kind, field, ...)                                                                  \
    CT_OP_IF_TIMED_##kind(if (in->field) out->field = guarded_##field;)
    CT_OPS_LIST(INSTALL)
#undef INSTALL
    return 0;
}

static ct_backend guarded = CPU_BACKEND("cpu-guarded", guarded);

ct_backend *ct_backend_cpu_guarded(void) {
    return &guarded;
}
