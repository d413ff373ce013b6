// LD_PRELOAD shim for tests: counts malloc, calloc, realloc and posix_memalign calls of the
// whole process (every thread) and prints "alloc_count: N" to stderr at exit. glibc's own
// __libc_* entries do the work, so nothing here allocates. Not for sanitizer builds, whose
// runtime replaces malloc itself.
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);

static atomic_long count;

void *malloc(size_t n) {
    atomic_fetch_add_explicit(&count, 1, memory_order_relaxed);
    return __libc_malloc(n);
}
void *calloc(size_t a, size_t b) {
    atomic_fetch_add_explicit(&count, 1, memory_order_relaxed);
    return __libc_calloc(a, b);
}
void *realloc(void *p, size_t n) {
    atomic_fetch_add_explicit(&count, 1, memory_order_relaxed);
    return __libc_realloc(p, n);
}
int posix_memalign(void **out, size_t align, size_t n) {
    atomic_fetch_add_explicit(&count, 1, memory_order_relaxed);
    *out = __libc_memalign(align, n);
    return *out || !n ? 0 : 12; // ENOMEM
}

__attribute__((destructor)) static void report(void) {
    char line[64];
    const int n = snprintf(line, sizeof line, "alloc_count: %ld\n", atomic_load(&count));
    if (write(2, line, (size_t)n) < 0) return;
}
