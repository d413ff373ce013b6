// The fused kernels (src/ops/fused.c) against the sequences of built-in ops they stand for, bit
// for bit (the model's losses must not change when it switches to them); the composites that
// ct_ops_fit_fusions installs when an op is replaced against the built-in fused kernels, bit for
// bit; 1 against 2 OpenMP threads; and silu's vectorised exp against double precision.
#include <omp.h>
#include <stdbool.h>
#include <string.h>

#include "check.h"
#include "ops/ops.h"
#include "ops/ops_cpu.h"

static const ct_ops *cpu = &ct_ops_cpu;

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static float *frand_array(size_t n, float lo, float hi) { // xorshift64*, uniform in [lo, hi)
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) {
        rng_state ^= rng_state >> 12;
        rng_state ^= rng_state << 25;
        rng_state ^= rng_state >> 27;
        const uint64_t r = rng_state * 0x2545F4914F6CDD1Dull;
        x[i] = lo + (hi - lo) * (float)((double)(r >> 11) / 9007199254740992.0);
    }
    return x;
}

static float *fcopy(const float *x, size_t n) {
    float *y = malloc(n * sizeof *y);
    memcpy(y, x, n * sizeof *y);
    return y;
}

// ---- outputs of one run, compared bitwise ----------------------------------------------------

enum { MAX_OUT = 8 };

typedef struct result {
    int n;
    const char *name[MAX_OUT];
    float *p[MAX_OUT];
    size_t len[MAX_OUT];
} result;

static float *out_buf(result *r, const char *name, size_t len) {
    r->name[r->n] = name;
    r->len[r->n] = len;
    r->p[r->n] = calloc(len ? len : 1, sizeof(float));
    return r->p[r->n++];
}

static float *out_copy(result *r, const char *name, const float *init, size_t len) {
    float *p = out_buf(r, name, len);
    memcpy(p, init, len * sizeof *p);
    return p;
}

static void expect_same(const char *what, const result *a, const result *b) {
    for (int i = 0; i < a->n; i++)
        CHECK(memcmp(a->p[i], b->p[i], a->len[i] * sizeof(float)) == 0, "%s: %s differs", what,
              a->name[i]);
}

static void result_free(result *r) {
    for (int i = 0; i < r->n; i++) free(r->p[i]);
}

// ---- a table whose rmsnorm, rope and swiglu are stand-ins for a plugin's ----------------------

static int wrapped_calls;

static void w_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int N,
                              int C, float eps) {
    wrapped_calls++;
    cpu_rmsnorm_forward(out, rstd, inp, weight, N, C, eps);
}

static void w_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                               const float *weight, const float *rstd, int N, int C) {
    wrapped_calls++;
    cpu_rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, C);
}

static void w_rope_forward(float *out, const float *inp, const float *cos, const float *sin, int B,
                           int T, int H, int D) {
    wrapped_calls++;
    cpu_rope_forward(out, inp, cos, sin, B, T, H, D);
}

static void w_rope_backward(float *dinp, const float *dout, const float *cos, const float *sin,
                            int B, int T, int H, int D) {
    wrapped_calls++;
    cpu_rope_backward(dinp, dout, cos, sin, B, T, H, D);
}

static void w_swiglu_forward(float *out, const float *gate, const float *up, int64_t n) {
    wrapped_calls++;
    cpu_swiglu_forward(out, gate, up, n);
}

static void w_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                              const float *up, int64_t n) {
    wrapped_calls++;
    cpu_swiglu_backward(dgate, dup, dout, gate, up, n);
}

static ct_ops wrapped;

static void test_fit_fusions(void) {
    CHECK(cpu->add_rmsnorm_forward == cpu_add_rmsnorm_forward &&
              cpu->rmsnorm_backward_add == cpu_rmsnorm_backward_add &&
              cpu->qk_norm_rope_forward == cpu_qk_norm_rope_forward &&
              cpu->qk_norm_rope_backward == cpu_qk_norm_rope_backward &&
              cpu->swiglu_rows_forward == cpu_swiglu_rows_forward &&
              cpu->swiglu_rows_backward == cpu_swiglu_rows_backward,
          "ct_ops_cpu's fused entries are the built-in kernels");
    ct_ops t = *cpu;
    t.add_rmsnorm_forward = NULL, t.swiglu_rows_backward = NULL;
    ct_ops_fit_fusions(&t);
    CHECK(!memcmp(&t, cpu, sizeof t), "fit on the built-in table gives the built-in table");

    // Only rope's forward replaced: only the entry that calls it becomes a composite.
    t.rope_forward = w_rope_forward;
    ct_ops_fit_fusions(&t);
    CHECK(t.qk_norm_rope_forward != cpu_qk_norm_rope_forward &&
              t.qk_norm_rope_backward == cpu_qk_norm_rope_backward &&
              t.add_rmsnorm_forward == cpu_add_rmsnorm_forward &&
              t.swiglu_rows_forward == cpu_swiglu_rows_forward && !t.swiglu_rows_scratch_floats,
          "rope_forward replaced: only qk_norm_rope_forward is a composite");

    wrapped = *cpu;
    wrapped.rmsnorm_forward = w_rmsnorm_forward;
    wrapped.rmsnorm_backward = w_rmsnorm_backward;
    wrapped.rope_forward = w_rope_forward;
    wrapped.rope_backward = w_rope_backward;
    wrapped.swiglu_forward = w_swiglu_forward;
    wrapped.swiglu_backward = w_swiglu_backward;
    ct_ops_fit_fusions(&wrapped);
    CHECK(wrapped.add_rmsnorm_forward != cpu_add_rmsnorm_forward &&
              wrapped.rmsnorm_backward_add != cpu_rmsnorm_backward_add &&
              wrapped.qk_norm_rope_forward != cpu_qk_norm_rope_forward &&
              wrapped.qk_norm_rope_backward != cpu_qk_norm_rope_backward &&
              wrapped.swiglu_rows_forward != cpu_swiglu_rows_forward &&
              wrapped.swiglu_rows_backward != cpu_swiglu_rows_backward &&
              wrapped.swiglu_rows_scratch_floats && wrapped.swiglu_rows_scratch_floats(3, 5) == 30,
          "all ops replaced: every fused entry is a composite, the swiglu one with scratch");
}

// Runs one case four ways: the unfused built-in sequence (t == NULL), the built-in fused kernel
// on 1 and on 2 threads, and the composite through the wrapped table; all must agree bitwise.
typedef void (*run_fn)(result *r, const ct_ops *t, const void *k);

static void check_case(const char *what, run_fn run, const void *k) {
    result ref = {0}, one = {0}, two = {0}, comp = {0};
    run(&ref, NULL, k);
    omp_set_num_threads(1);
    run(&one, cpu, k);
    omp_set_num_threads(2);
    run(&two, cpu, k);
    const int calls = wrapped_calls;
    run(&comp, &wrapped, k);
    CHECK(wrapped_calls > calls, "%s: the composite did not call the table", what);
    char buf[160];
    snprintf(buf, sizeof buf, "%s fused vs unfused", what);
    expect_same(buf, &two, &ref);
    snprintf(buf, sizeof buf, "%s fused 1 vs 2 threads", what);
    expect_same(buf, &one, &two);
    snprintf(buf, sizeof buf, "%s composite vs fused", what);
    expect_same(buf, &comp, &two);
    result_free(&ref), result_free(&one), result_free(&two), result_free(&comp);
}

// Rows n, n+1 (n % 3 == 0) made identical in x (each of the nx arrays, rows `xs` floats apart)
// with gradients +-1e10 times row n's in dy (rows `ds` apart): their terms cancel exactly in the
// norm weight's double sums, leaving the rows summed before them rounded off, so the result
// depends on the row order (per-thread partial sums, for one, would change it). Random values
// alone hardly ever show the order once the double sum is rounded to float.
static void make_cancelling(float *const *x, int nx, size_t xs, float *const *dy, int ndy,
                            size_t ds, int N) {
    for (int n = 0; n + 1 < N; n += 3) {
        for (int i = 0; i < nx; i++) memcpy(x[i] + (n + 1) * xs, x[i] + n * xs, xs * sizeof(float));
        for (int i = 0; i < ndy; i++) {
            float *d = dy[i] + n * ds;
            for (size_t c = 0; c < ds; c++) d[c] *= 1e10f, d[ds + c] = -d[c];
        }
    }
}

// ---- add + rmsnorm, rmsnorm backward + add ----------------------------------------------------

typedef struct norm_case {
    int N, C;
    bool alias; // sum written over a
    const float *a, *b, *w, *dout, *dres0, *dw0;
} norm_case;

static void run_norm(result *r, const ct_ops *t, const void *vk) {
    const norm_case *k = vk;
    const int N = k->N, C = k->C;
    const size_t nc = (size_t)N * C;
    float *a = fcopy(k->a, nc), *scratch = malloc(nc * sizeof *scratch);
    float *sum = k->alias ? a : out_buf(r, "sum", nc), *y = out_buf(r, "out", nc);
    float *rstd = out_buf(r, "rstd", N), *dres = out_copy(r, "dresid", k->dres0, nc);
    float *dw = out_copy(r, "dweight", k->dw0, C);
    if (!t) {
        cpu->add(sum, a, k->b, (int64_t)nc);
        cpu->rmsnorm_forward(y, rstd, sum, k->w, N, C, 1e-6f);
        cpu->rmsnorm_backward(scratch, dw, k->dout, sum, k->w, rstd, N, C);
        cpu->add(dres, dres, scratch, (int64_t)nc);
    } else {
        t->add_rmsnorm_forward(t, sum, y, rstd, a, k->b, k->w, N, C, 1e-6f);
        t->rmsnorm_backward_add(t, dres, dw, scratch, k->dout, sum, k->w, rstd, N, C);
    }
    if (k->alias) memcpy(out_buf(r, "sum (over a)", nc), a, nc * sizeof *a);
    free(a), free(scratch);
}

static void test_norm(int N, int C, bool alias, bool cancel) {
    const size_t nc = (size_t)N * C;
    float *a = frand_array(nc, -2, 2), *b = frand_array(nc, -2, 2), *w = frand_array(C, 0.5f, 1.5f);
    float *dout = frand_array(nc, -1, 1), *dres0 = frand_array(nc, -1, 1);
    float *dw0 = frand_array(C, -1, 1);
    if (cancel) make_cancelling((float *[]){a, b}, 2, C, &dout, 1, C, N);
    const norm_case k = {N, C, alias, a, b, w, dout, dres0, dw0};
    char what[80];
    snprintf(what, sizeof what, "add_rmsnorm N%d C%d%s%s", N, C, alias ? " in place" : "",
             cancel ? " cancelling" : "");
    check_case(what, run_norm, &k);
    free(a), free(b), free(w), free(dout), free(dres0), free(dw0);
}

// ---- q/k norm + rope --------------------------------------------------------------------------

typedef struct qk_case {
    int B, T, NH, NKV, D;
    const float *qkv, *qn, *kn, *cs, *sn, *dqr, *dkr, *dv, *dqn0, *dkn0;
} qk_case;

// dst (N, W) <- columns [off, off + W) of the N rows of src, `stride` apart; join is the inverse.
static void split(float *dst, const float *src, size_t stride, size_t off, int N, size_t W) {
    for (int n = 0; n < N; n++) memcpy(dst + n * W, src + n * stride + off, W * sizeof *dst);
}

static void join(float *dst, size_t stride, size_t off, const float *src, int N, size_t W) {
    for (int n = 0; n < N; n++) memcpy(dst + n * stride + off, src + n * W, W * sizeof *dst);
}

static void run_qk(result *r, const ct_ops *t, const void *vk) {
    const qk_case *k = vk;
    const int B = k->B, T = k->T, NH = k->NH, NKV = k->NKV, D = k->D, N = B * T;
    const size_t QW = (size_t)NH * D, KW = (size_t)NKV * D, QKV = QW + 2 * KW;
    float *qr = out_buf(r, "qr", N * QW), *kr = out_buf(r, "kr", N * KW);
    float *v = out_buf(r, "v", N * KW), *qrs = out_buf(r, "q_rstd", (size_t)N * NH);
    float *krs = out_buf(r, "k_rstd", (size_t)N * NKV), *dqkv = out_buf(r, "dqkv", N * QKV);
    float *dqn = out_copy(r, "dq_norm", k->dqn0, D), *dkn = out_copy(r, "dk_norm", k->dkn0, D);
    float *dq = fcopy(k->dqr, N * QW), *dk = fcopy(k->dkr, N * KW);
    if (!t) {
        // The model's unfused path: split, norm, rope in place; back: rope and norm in place, join.
        float *q = malloc(N * QW * sizeof *q), *kk = malloc(N * KW * sizeof *kk);
        split(q, k->qkv, QKV, 0, N, QW);
        split(kk, k->qkv, QKV, QW, N, KW);
        split(v, k->qkv, QKV, QW + KW, N, KW);
        cpu->rmsnorm_forward(qr, qrs, q, k->qn, N * NH, D, 1e-6f);
        cpu->rmsnorm_forward(kr, krs, kk, k->kn, N * NKV, D, 1e-6f);
        cpu->rope_forward(qr, qr, k->cs, k->sn, B, T, NH, D);
        cpu->rope_forward(kr, kr, k->cs, k->sn, B, T, NKV, D);
        cpu->rope_backward(dq, dq, k->cs, k->sn, B, T, NH, D);
        cpu->rope_backward(dk, dk, k->cs, k->sn, B, T, NKV, D);
        cpu->rmsnorm_backward(dq, dqn, dq, q, k->qn, qrs, N * NH, D);
        cpu->rmsnorm_backward(dk, dkn, dk, kk, k->kn, krs, N * NKV, D);
        join(dqkv, QKV, 0, dq, N, QW);
        join(dqkv, QKV, QW, dk, N, KW);
        join(dqkv, QKV, QW + KW, k->dv, N, KW);
        free(q), free(kk);
    } else {
        float *scratch = malloc(N * QW * sizeof *scratch);
        t->qk_norm_rope_forward(t, qr, kr, v, qrs, krs, scratch, k->qkv, k->qn, k->kn, k->cs, k->sn,
                                B, T, NH, NKV, D, 1e-6f);
        t->qk_norm_rope_backward(t, dqkv, dqn, dkn, dq, dk, k->dv, k->qkv, k->qn, k->kn, qrs, krs,
                                 k->cs, k->sn, B, T, NH, NKV, D);
        free(scratch);
    }
    free(dq), free(dk);
}

// cancel needs T = 1 (a pair of tokens must have the same rotation).
static void test_qk(int B, int T, int NH, int NKV, int D, bool cancel) {
    const int N = B * T;
    const size_t QW = (size_t)NH * D, KW = (size_t)NKV * D, QKV = QW + 2 * KW;
    float *qkv = frand_array(N * QKV, -3, 3), *qn = frand_array(D, 0.5f, 1.5f);
    float *kn = frand_array(D, 0.5f, 1.5f), *cs = frand_array((size_t)T * D / 2, -1, 1);
    float *sn = frand_array((size_t)T * D / 2, -1, 1), *dqr = frand_array(N * QW, -1, 1);
    float *dkr = frand_array(N * KW, -1, 1), *dv = frand_array(N * KW, -1, 1);
    float *dqn0 = frand_array(D, -1, 1), *dkn0 = frand_array(D, -1, 1);
    if (cancel) {
        make_cancelling(&qkv, 1, QKV, &dqr, 1, QW, N);
        make_cancelling(&qkv, 0, QKV, &dkr, 1, KW, N);
    }
    const qk_case k = {B, T, NH, NKV, D, qkv, qn, kn, cs, sn, dqr, dkr, dv, dqn0, dkn0};
    char what[80];
    snprintf(what, sizeof what, "qk_norm_rope B%d T%d NH%d NKV%d D%d%s", B, T, NH, NKV, D,
             cancel ? " cancelling" : "");
    check_case(what, run_qk, &k);
    free(qkv), free(qn), free(kn), free(cs), free(sn), free(dqr), free(dkr), free(dv);
    free(dqn0), free(dkn0);
}

// ---- swiglu over gate|up rows -----------------------------------------------------------------

typedef struct swiglu_case {
    int N, F;
    const float *gu, *dh;
} swiglu_case;

static void run_swiglu(result *r, const ct_ops *t, const void *vk) {
    const swiglu_case *k = vk;
    const int N = k->N, F = k->F;
    const size_t nf = (size_t)N * F;
    float *h = out_buf(r, "h", nf), *dgu = out_buf(r, "dgate_up", 2 * nf);
    if (!t) {
        float *g = calloc(nf, sizeof *g), *u = calloc(nf, sizeof *u);
        float *dg = malloc(nf * sizeof *dg), *du = malloc(nf * sizeof *du);
        split(g, k->gu, 2 * (size_t)F, 0, N, F);
        split(u, k->gu, 2 * (size_t)F, F, N, F);
        cpu->swiglu_forward(h, g, u, (int64_t)nf);
        cpu->swiglu_backward(dg, du, k->dh, g, u, (int64_t)nf);
        join(dgu, 2 * (size_t)F, 0, dg, N, F);
        join(dgu, 2 * (size_t)F, F, du, N, F);
        free(g), free(u), free(dg), free(du);
    } else {
        float *scratch = malloc(2 * nf * sizeof *scratch);
        t->swiglu_rows_forward(t, h, scratch, k->gu, N, F);
        t->swiglu_rows_backward(t, dgu, scratch, k->dh, k->gu, N, F);
        // In place, as the model calls it: the same bits.
        float *inplace = malloc(2 * nf * sizeof *inplace);
        memcpy(inplace, k->gu, 2 * nf * sizeof *inplace);
        t->swiglu_rows_backward(t, inplace, scratch, k->dh, inplace, N, F);
        CHECK(memcmp(inplace, dgu, 2 * nf * sizeof *inplace) == 0,
              "swiglu_rows_backward in place differs (N %d F %d)", N, F);
        free(scratch), free(inplace);
    }
}

static void test_swiglu_rows(int N, int F) {
    const size_t nf = (size_t)N * F;
    float *gu = frand_array(2 * nf, -8, 8), *dh = frand_array(nf, -1, 1);
    const float big[] = {90.0f, -90.0f, 1e4f, -1e4f, 0.0f, -88.5f, 88.5f};
    for (size_t i = 0; i < sizeof big / sizeof *big && i < 2 * nf; i++)
        gu[i * 7 % (2 * nf)] = big[i];
    const swiglu_case k = {N, F, gu, dh};
    char what[64];
    snprintf(what, sizeof what, "swiglu_rows N%d F%d", N, F);
    check_case(what, run_swiglu, &k);
    free(gu), free(dh);
}

// ---- silu with vexp against double -----------------------------------------------------------

// Forward: relative error 1e-6, or absolutely below 1e-36 (for g below about -88.4 silu is
// -0; |silu| < 6e-37 there). dgate = s (1 + g (1 - s)) crosses 0 near g = -1.28, so it is held
// to 1e-6 relative plus 2e-7 absolute.
static void test_silu_accuracy(void) {
    enum { NS = 19, N = 4096 + NS };
    static const float special[NS] = {0.0f,   -0.0f,  90.0f,  -90.0f, 1e4f,   -1e4f, 88.0f,
                                      -88.0f, 87.0f,  -87.0f, 88.5f,  -88.5f, 89.0f, -89.0f,
                                      20.0f,  -20.0f, 1e-3f,  -1e-3f, 3e38f};
    float *g = frand_array(N, -30, 30), *one = malloc(N * sizeof *one);
    memcpy(g, special, sizeof special);
    for (int i = 0; i < N; i++) one[i] = 1.0f;
    float *h = malloc(N * sizeof *h), *dg = malloc(N * sizeof *dg), *du = malloc(N * sizeof *du);
    cpu->swiglu_forward(h, g, one, N);
    cpu->swiglu_backward(dg, du, one, g, one, N);
    double worst_f = 0, worst_b = 0;
    int bad_f = 0, bad_b = 0, nonfinite = 0, dup_differs = 0;
    for (int i = 0; i < N; i++) {
        const double x = g[i], s = 1.0 / (1.0 + exp(-x)), silu = x * s;
        const double ds = s * (1.0 + x * (1.0 - s));
        const double ef = fabs(h[i] - silu), eb = fabs(dg[i] - ds);
        if (fabs(silu) > 1e-30 && ef / fabs(silu) > worst_f) worst_f = ef / fabs(silu);
        if (eb > worst_b) worst_b = eb;
        bad_f += !(ef <= 1e-6 * fabs(silu) + 1e-36);
        bad_b += !(eb <= 1e-6 * fabs(ds) + 2e-7);
        nonfinite += !isfinite(h[i]) || !isfinite(dg[i]) || !isfinite(du[i]);
        dup_differs += memcmp(&du[i], &h[i], sizeof *h) != 0;
    }
    CHECK(bad_f == 0 && nonfinite == 0, "silu: %d values off (worst rel %.3g), %d not finite",
          bad_f, worst_f, nonfinite);
    CHECK(bad_b == 0, "dsilu: %d values off (worst abs %.3g)", bad_b, worst_b);
    CHECK(dup_differs == 0, "swiglu backward's dup with dout = 1 is not silu(gate)");
    CHECK(h[2] == 90.0f && h[4] == 1e4f && h[3] == 0.0f && h[5] == 0.0f && h[18] == 3e38f,
          "silu saturation: %g %g %g %g %g", h[2], h[4], h[3], h[5], h[18]);
    printf("silu vs double: worst rel %.3g; dsilu worst abs %.3g\n", worst_f, worst_b);
    free(g), free(one), free(h), free(dg), free(du);
}

int main(void) {
    test_fit_fusions();
    test_norm(1, 40, false, false);
    test_norm(7, 512, true, false);
    test_norm(300, 512, false, false); // parallel branch (N*C >= CPU_PAR_MIN)
    test_norm(300, 40, true, false);
    test_norm(300, 512, false, true);
    test_qk(1, 1, 2, 2, 8, false);    // GQA ratio 1
    test_qk(1, 7, 4, 2, 64, false);   // ratio 2
    test_qk(7, 1, 3, 1, 96, false);   // ratio 3, T = 1
    test_qk(3, 100, 6, 2, 96, false); // N = 300 over 3 sequences: the parallel branch, t = n % T
    test_qk(2, 50, 4, 4, 64, false);
    test_qk(300, 1, 4, 2, 64, true);
    test_swiglu_rows(1, 4100);
    test_swiglu_rows(7, 37);
    test_swiglu_rows(300, 200);
    test_silu_accuracy();
    return check_summary();
}
