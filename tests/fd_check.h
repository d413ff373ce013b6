// Shared by the op tests: a small deterministic RNG, and gradients checked against central
// finite differences of a double-precision reference forward.
#pragma once
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "check.h"

static uint64_t fd_rng_state = 0x1234567887654321ull;

static float frand(float lo, float hi) { // xorshift64*, uniform in [lo, hi)
    fd_rng_state ^= fd_rng_state >> 12;
    fd_rng_state ^= fd_rng_state << 25;
    fd_rng_state ^= fd_rng_state >> 27;
    const uint64_t r = fd_rng_state * 0x2545F4914F6CDD1Dull;
    return lo + (hi - lo) * (float)((double)(r >> 11) / 9007199254740992.0);
}

static float *frand_array(size_t n, float lo, float hi) {
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = frand(lo, hi);
    return x;
}

static double *to_double(const float *x, size_t n) {
    double *y = malloc(n * sizeof *y);
    for (size_t i = 0; i < n; i++) y[i] = x[i];
    return y;
}

// ||a - b|| / ||b|| in double (an all-zero b compares against 1e-15).
static double rel_l2_fd(const float *a, const double *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = (double)a[i] - b[i];
        num += d * d;
        den += b[i] * b[i];
    }
    return sqrt(num) / (den > 1e-30 ? sqrt(den) : 1e-15);
}

// A reference forward maps double inputs in[0..3] to out.
typedef void (*ref_fn)(double *out, double *const *in, const void *ctx);

typedef struct fd_problem {
    ref_fn fwd;
    const void *ctx;
    double *in[4];
    size_t in_n[4];
    size_t out_n;
} fd_problem;

static double fd_objective(const fd_problem *p, const double *R, double *out) {
    p->fwd(out, p->in, p->ctx);
    double s = 0;
    for (size_t i = 0; i < p->out_n; i++) s += out[i] * R[i];
    return s;
}

// Checks `got`, an op's gradient of sum(out * R) w.r.t. in[which]: every `stride`-th element by
// central differences (h = 1e-6), the others copied from `got` so the rel L2 sees only the
// sampled ones.
static void check_grad(const char *what, const float *got, const fd_problem *p, int which,
                       const double *R, size_t stride, double tol) {
    const double h = 1e-6;
    double *g = malloc(p->in_n[which] * sizeof *g), *out = malloc(p->out_n * sizeof *out);
    double *x = p->in[which];
    for (size_t i = 0; i < p->in_n[which]; i++) {
        if (i % stride != 0) {
            g[i] = got[i];
            continue;
        }
        const double x0 = x[i];
        x[i] = x0 + h;
        const double fp = fd_objective(p, R, out);
        x[i] = x0 - h;
        const double fm = fd_objective(p, R, out);
        x[i] = x0;
        g[i] = (fp - fm) / (2 * h);
    }
    const double e = rel_l2_fd(got, g, p->in_n[which]);
    CHECK(e < tol, "%s: gradient rel L2 %.3g >= %.3g", what, e, tol);
    free(g), free(out);
}
