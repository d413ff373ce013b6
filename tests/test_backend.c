// The backends (src/backend/): the plain CPU one's buffers and views, and the guard itself: a
// guarded buffer is readable inside backend calls (buffer calls, and the bound table's kernels)
// and faults anywhere else, so tests/guard.sh's bit-identical runs mean no host code touched
// backend memory.
#include <signal.h>
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend/backend.h"
#include "check.h"
#include "ops/cpu_kernels.h"

// Runs fn(arg) in a forked child: true when the child finished it (exit 0), false when it died
// (a fault; under ASan, the sanitizer's report and exit).
static bool survives(void (*fn)(void *), void *arg) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        fn(arg);
        _exit(0);
    }
    int status;
    if (pid < 0 || waitpid(pid, &status, 0) != pid) return true;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

static void host_read(void *p) {
    volatile float x = *(volatile float *)p;
    (void)x;
}
static void host_write(void *p) {
    *(volatile float *)p = 1.0f;
}
static const float *direct_buf;
static void direct_kernel(void *arg) {
    double s;
    ct_ops_cpu.sum_squares(&s, direct_buf, *(size_t *)arg);
}

static void test_plain(void) {
    ct_backend *be = ct_backend_cpu();
    ct_error err = {0};
    float *p = be->alloc(be, 8 * sizeof(float), "test", &err);
    CHECK(p && p[0] == 0 && p[7] == 0, "zeroed host memory");
    const float in[3] = {1, 2, 3};
    float out[3] = {0};
    be->write(be, p + 1, in, sizeof in);
    be->read(be, out, p + 1, sizeof out);
    CHECK(out[0] == 1 && out[2] == 3 && p[1] == 1, "write then read");
    CHECK(be->view(be, p, 8 * sizeof(float), true, &err) == p, "a view is the buffer itself");
    be->free(be, p);
    CHECK(ct_backend_or_cpu(NULL) == be, "NULL means the plain backend");
}

static void test_guarded(void) {
    ct_backend *be = ct_backend_cpu_guarded();
    ct_error err = {0};
    const size_t n = 3000; // more than a page
    float *p = be->alloc(be, n * sizeof(float), "test", &err);
    CHECK(p != NULL, "alloc: %s", err.msg);
    if (!p) return;
    CHECK(!survives(host_read, p), "a host read of a guarded buffer faults");
    CHECK(!survives(host_write, p + n - 1), "a host write to its last element faults");

    float *in = malloc(n * sizeof *in), *out = calloc(n, sizeof *out);
    for (size_t i = 0; i < n; i++) in[i] = (float)i;
    be->write(be, p, in, n * sizeof *in);
    be->read(be, out, p, n * sizeof *out);
    CHECK(memcmp(in, out, n * sizeof *in) == 0, "write then read through the backend");
    float *view = be->view(be, p, n * sizeof(float), true, &err);
    CHECK(view && view != p && view[n - 1] == (float)(n - 1), "a filled host view is a copy");
    if (view) {
        view[5] = -1.0f;
        be->view_release(be, view, p, n * sizeof(float), true);
        be->read(be, out, p, n * sizeof *out);
        CHECK(out[5] == -1.0f, "a released view writes back");
    }
    be->zero(be, p, n * sizeof(float));
    be->read(be, out, p, n * sizeof *out);
    CHECK(out[0] == 0 && out[n - 1] == 0, "zero");

    // The bound table's kernels run with the buffers accessible; the raw kernel does not.
    ct_ops bound;
    CHECK(be->bind_ops(be, &bound, &ct_ops_cpu, &err) == 0, "bind: %s", err.msg);
    be->write(be, p, in, 4 * sizeof *in); // 0, 1, 2, 3
    double sq = 0;
    bound.sum_squares(&sq, p, 4);
    CHECK(sq == 14.0, "a bound kernel reads guarded memory: %g", sq);
    size_t four = 4;
    direct_buf = p;
    CHECK(!survives(direct_kernel, &four), "the unbound kernel on guarded memory faults");
    CHECK(!survives(host_read, p), "the buffer is guarded again after the calls");

    ct_ops other = ct_ops_cpu;
    other.add = NULL;
    CHECK(be->bind_ops(be, &bound, &other, &err) != 0 && strstr(err.msg, "one op table"),
          "a second, different table is refused: %s", err.msg);
    CHECK(be->bind_ops(be, &bound, &ct_ops_cpu, &err) == 0, "the same table again is fine");
    be->free(be, p);
    free(in);
    free(out);
}

// Large buffers are mappings of their own, however many: the table of them grows (it used to
// stop at 64 and quietly fall back to calloc, which commits the memory).
static void test_many_large(void) {
    ct_backend *be = ct_backend_cpu();
    ct_error err = {0};
    enum { N = 70 };
    const size_t bytes = (size_t)64 << 20;
    void *p[N];
    bool mapped = true;
    for (int i = 0; i < N; i++) {
        p[i] = be->alloc(be, bytes, "test", &err);
        mapped &= p[i] && (uintptr_t)p[i] % 4096 == 0;
    }
    CHECK(mapped, "70 buffers of 64 MiB are each a page-aligned mapping: %s", err.msg);
    float *last = p[N - 1];
    be->write(be, last, &(float){3.0f}, sizeof(float));
    CHECK(last[0] == 3.0f && last[bytes / sizeof(float) - 1] == 0, "the 70th is usable, zeroed");
    for (int i = 0; i < N; i++) be->free(be, p[i]);
}

// What a collective written by hand adds (FSDP's ring), and populate, on both backends.
static void test_accumulate(ct_backend *be) {
    ct_error err = {0};
    float *f = be->alloc(be, 4 * sizeof(float), "test", &err), hf[4] = {1, 2, 3, 4};
    uint16_t *h = be->alloc(be, 4 * sizeof(uint16_t), "test", &err), hh[4];
    float *src = be->alloc(be, 4 * sizeof(float), "test", &err);
    be->write(be, f, hf, sizeof hf);
    be->write(be, src, hf, sizeof hf);
    be->populate(be, f, 4 * sizeof(float));
    be->accumulate(be, f, CT_COMM_F32, src, CT_COMM_F32, 4);
    be->read(be, hf, f, sizeof hf);
    CHECK(hf[0] == 2 && hf[3] == 8, "%s: f32 += f32", be->name);
    for (int i = 0; i < 4; i++) hh[i] = f32_to_bf16(i == 0 ? 256.0f : 1.0f);
    be->write(be, h, hh, sizeof hh);
    be->accumulate(be, f, CT_COMM_F32, h, CT_COMM_BF16, 4);
    be->read(be, hf, f, sizeof hf);
    CHECK(hf[0] == 258 && hf[1] == 5, "%s: f32 += bf16", be->name);
    uint16_t one[4];
    for (int i = 0; i < 4; i++) one[i] = f32_to_bf16(1.0f);
    uint16_t *o = be->alloc(be, sizeof one, "test", &err);
    be->write(be, o, one, sizeof one);
    be->accumulate(be, h, CT_COMM_BF16, o, CT_COMM_BF16, 4);
    be->read(be, hh, h, sizeof hh);
    // 256 + 1 rounds to 256 in bf16 (8 bits of mantissa), as a bf16 reduction rounds.
    CHECK(bf16_to_f32(hh[0]) == 256.0f && bf16_to_f32(hh[1]) == 2.0f, "%s: bf16 += bf16, rounded",
          be->name);
    be->free(be, f), be->free(be, h), be->free(be, src), be->free(be, o);
}

// Each backend owns its kernels' state (the bf16 GEMMs' primitives per shape): a table bound to
// it carries it, the two backends' are apart, a table bound to none prepares nothing, and close
// frees it (a later plan makes it again).
static void test_kernel_state(void) {
    ct_backend *plain = ct_backend_cpu(), *guarded = ct_backend_cpu_guarded();
    ct_ops tp, tg;
    ct_error err = {0};
    CHECK(plain->bind_ops(plain, &tp, &ct_ops_cpu, &err) == 0 &&
              guarded->bind_ops(guarded, &tg, &ct_ops_cpu, &err) == 0,
          "bind: %s", err.msg);
    cpu_kernels *kp = tp.kernel_state, *kg = tg.kernel_state;
    CHECK(kp && kg && kp != kg && !ct_ops_cpu.kernel_state,
          "each backend binds its own kernel state; the built-in table has none");
    const size_t n = tp.matmul_bf16_scratch_floats(&tp, 8, 24, 40, false);
    const size_t shapes = kp->n_mm_shapes;
    CHECK(n != SIZE_MAX && shapes >= 1 && kg->n_mm_shapes == 0,
          "a shape planned on the plain backend is its own (%zu shapes; guarded %zu)", shapes,
          kg->n_mm_shapes);
    CHECK(ct_ops_cpu.matmul_bf16_scratch_floats(&ct_ops_cpu, 8, 24, 40, false) == n &&
              kp->n_mm_shapes == shapes,
          "a table bound to none answers the same size from a state of its own");
    plain->close(plain);
    CHECK(kp->n_mm_shapes == 0 && !kp->mm_shapes && !kp->engine && !kp->stream,
          "close frees the kernel state");
    CHECK(tp.matmul_bf16_scratch_floats(&tp, 8, 24, 40, false) == n && kp->n_mm_shapes == shapes,
          "after close, planning makes the state again");
}

int main(void) {
    test_kernel_state();
    test_plain();
    test_many_large();
    test_accumulate(ct_backend_cpu());
    test_accumulate(ct_backend_cpu_guarded());
    test_guarded();
    return check_summary();
}
