// The bf16 MoE expert kernels (moe_experts_bf16.c, the table's moe_bf16_* of both
// implementations) against a double-precision reference on the same bf16-rounded inputs that
// rounds to bf16 where the kernels do (torch autocast's points): x, the weights' bf16 copy,
// gate, up, every step of SiLU, h and y in the forward; dout (for U), dh, weight * dout and every
// step of SiLU's backward in the backward.
// What is left is the kernels' fp32 accumulation against double, and the bf16 roundings it
// tips over (one bf16 ulp, 2^-8 relative, on an occasional element), so the tolerances are
// relative L2 norms near 10x the worst measured (beside each constant).
//
// Also: loop vs grouped, a second run bit for bit, one expert without tokens (its dW exactly
// untouched), the state and scratch within the sizes the kernels ask for, the bf16 state at most
// half the fp32 one's gate/up part, and a large skewed routing where one expert runs alone with
// every thread while the others run concurrently. All of it twice: with oneDNN's bf16 GEMMs, and
// (rerunning itself with CTITAN_BF16_GEMM=emulated) with their sgemm emulation.
#include <math.h>
#include <omp.h>
#include <string.h>

#include "check.h"
#include "core/rng.h"
#include "ops/bf16_round.h"
#include "ops/cpu_kernels.h"
#include "ops/moe_plan.h"
#include "ops/ops.h"
#include "ops/ops_cpu.h"

#define TOL_FWD 7e-4  // out: measured 6.9e-5
#define TOL_DX 1e-4   // dx: measured 1.1e-5
#define TOL_DW 1e-4   // dW (gate, up, down): measured 1.1e-5
#define TOL_DWT 2e-5  // dweight (routing weights): measured 1.6e-6
#define TOL_IMPL 2e-6 // loop vs grouped, each output: measured 1.4e-7

static uint64_t draws; // uniforms of one splitmix64 sequence, in order

static float uniform(float lo, float hi) {
    return lo + (hi - lo) * (float)ct_splitmix64_uniform_at(0x5DEECE66Dull, draws++);
}

static float *uniforms(size_t n, float lo, float hi) {
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = uniform(lo, hi);
    return x;
}

static double bfv(double v) { // v rounded to fp32, then to bf16
    return bf16_value(bf16_round((float)v));
}

// silu as torch computes it on a bf16 tensor: every step rounded to bf16.
static double silu_bf(double g) {
    return bfv(g / bfv(1 + bfv(exp(-g))));
}

typedef struct problem {
    int N, C, F, E, K;
    int32_t *expert;
    float *weight, *x, *w, *dout, *dw0;
    uint16_t *w16, *x16; // the bf16 copies the kernels take
} problem;

// K distinct experts per token (never `skip`, when >= 0), weights in [0.1, 1).
static problem make_problem(int N, int C, int F, int E, int K, int skip, int hot, int hot_pct) {
    problem p = {.N = N, .C = C, .F = F, .E = E, .K = K};
    const size_t nk = (size_t)N * K, nw = (size_t)E * 3 * F * C;
    p.expert = malloc(nk * sizeof *p.expert);
    p.weight = uniforms(nk, 0.1f, 1.0f);
    int *order = malloc((size_t)E * sizeof *order);
    for (int t = 0; t < N; t++) {
        for (int e = 0; e < E; e++) order[e] = e;
        int taken = 0;
        if (hot >= 0 && uniform(0, 100) < hot_pct) p.expert[(size_t)t * K + taken++] = hot;
        for (int e = E - 1; taken < K; e--) { // a partial Fisher-Yates shuffle
            const int j = (int)uniform(0, (float)(e + 1)) % (e + 1), v = order[j];
            order[j] = order[e], order[e] = v;
            bool dup = v == skip;
            for (int k = 0; k < taken; k++) dup |= p.expert[(size_t)t * K + k] == v;
            if (!dup) p.expert[(size_t)t * K + taken++] = v;
        }
    }
    free(order);
    p.x = uniforms((size_t)N * C, -1, 1);
    p.w = uniforms(nw, -0.3f, 0.3f);
    p.dout = uniforms((size_t)N * C, -1, 1);
    p.dw0 = uniforms(nw, -1, 1);
    p.w16 = malloc(nw * sizeof *p.w16);
    for (size_t i = 0; i < nw; i++) p.w16[i] = bf16_round(p.w[i]);
    p.x16 = malloc((size_t)N * C * sizeof *p.x16);
    for (size_t i = 0; i < (size_t)N * C; i++) p.x16[i] = bf16_round(p.x[i]);
    return p;
}

static void free_problem(problem *p) {
    free(p->expert), free(p->weight), free(p->x), free(p->w), free(p->dout), free(p->dw0);
    free(p->w16), free(p->x16);
}

typedef struct outputs {
    double *out, *dx, *dweight, *dw; // dw: the increment
} outputs;

static void free_outputs(outputs *o) {
    free(o->out), free(o->dx), free(o->dweight), free(o->dw);
}

// The reference, token by token and expert by expert, in double.
static outputs reference(const problem *p) {
    const int N = p->N, C = p->C, F = p->F, K = p->K;
    outputs r = {calloc((size_t)N * C, 8), calloc((size_t)N * C, 8), calloc((size_t)N * K, 8),
                 calloc((size_t)p->E * 3 * F * C, 8)};
    double *xb = malloc((size_t)C * 8), *g = malloc((size_t)F * 8), *u = malloc((size_t)F * 8);
    double *h = malloc((size_t)F * 8), *dg = malloc((size_t)F * 8), *du = malloc((size_t)F * 8);
    for (int t = 0; t < N; t++) {
        for (int c = 0; c < C; c++) xb[c] = bfv(p->x[(size_t)t * C + c]);
        for (int k = 0; k < K; k++) {
            const int e = p->expert[(size_t)t * K + k];
            const float wt = p->weight[(size_t)t * K + k];
            const uint16_t *wg = p->w16 + (size_t)e * 3 * F * C, *wu = wg + (size_t)F * C;
            const uint16_t *wd = wu + (size_t)F * C;
            double *dwg = r.dw + (size_t)e * 3 * F * C, *dwu = dwg + (size_t)F * C;
            double *dwd = dwu + (size_t)F * C;
            for (int f = 0; f < F; f++) {
                double sg = 0, su = 0;
                for (int c = 0; c < C; c++) {
                    sg += bf16_value(wg[(size_t)f * C + c]) * xb[c];
                    su += bf16_value(wu[(size_t)f * C + c]) * xb[c];
                }
                g[f] = bfv(sg), u[f] = bfv(su);
                h[f] = bfv(silu_bf(g[f]) * u[f]);
            }
            const float *d = p->dout + (size_t)t * C;
            double dweight = 0;
            for (int c = 0; c < C; c++) {
                double y = 0;
                for (int f = 0; f < F; f++) y += bf16_value(wd[(size_t)c * F + f]) * h[f];
                r.out[(size_t)t * C + c] += wt * bfv(y);
            }
            for (int f = 0; f < F; f++) {
                double U = 0;
                for (int c = 0; c < C; c++) U += bfv(d[c]) * bf16_value(wd[(size_t)c * F + f]);
                dweight += U * h[f];
                // torch's bf16 SiLU backward, every step rounded (the kernel's comment)
                const double s = bfv(1 / bfv(1 + bfv(exp(-g[f])))), dh = bfv(wt * U);
                dg[f] = bfv(bfv(bfv(dh * u[f]) * s) * bfv(1 + bfv(g[f] * bfv(1 - s))));
                du[f] = bfv(dh * silu_bf(g[f]));
            }
            r.dweight[(size_t)t * K + k] = dweight;
            for (int c = 0; c < C; c++) {
                const double dy = bfv(wt * d[c]); // rounded from the fp32 product, as the kernel
                double dxc = 0;
                for (int f = 0; f < F; f++) {
                    dwd[(size_t)c * F + f] += dy * h[f];
                    dwg[(size_t)f * C + c] += dg[f] * xb[c];
                    dwu[(size_t)f * C + c] += du[f] * xb[c];
                    dxc += dg[f] * bf16_value(wg[(size_t)f * C + c]) +
                           du[f] * bf16_value(wu[(size_t)f * C + c]);
                }
                r.dx[(size_t)t * C + c] += dxc;
            }
        }
    }
    free(xb), free(g), free(u), free(h), free(dg), free(du);
    return r;
}

typedef struct result {
    float *out, *dx, *dweight, *dw; // dw: after the backward (dw0 + the increment)
} result;

static void free_result(result *r) {
    free(r->out), free(r->dx), free(r->dweight), free(r->dw);
}

static result run(const ct_ops *ops, const char *name, const problem *p) {
    const int N = p->N, C = p->C, F = p->F, E = p->E, K = p->K;
    const size_t ns = ops->moe_bf16_state_floats(N, C, F, E, K);
    const size_t nsc = ops->moe_bf16_scratch_floats(ops, N, C, F, E, K);
    const size_t nw = (size_t)E * 3 * F * C;
    CHECK(nsc != SIZE_MAX, "%s: oneDNN could not make the bf16 expert GEMMs", name);
    float *state = check_guarded(ns), *scratch = check_guarded(nsc);
    result r = {malloc((size_t)N * C * 4), malloc((size_t)N * C * 4), malloc((size_t)N * K * 4),
                malloc(nw * 4)};
    memcpy(r.dw, p->dw0, nw * 4);
    ops->moe_bf16_forward(ops, r.out, state, scratch, p->x16, p->expert, p->weight, p->w16, N, C, F,
                          E, K);
    ops->moe_bf16_backward(ops, r.dx, r.dweight, r.dw, scratch, p->dout, state, p->x16, p->expert,
                           p->weight, p->w16, N, C, F, E, K);
    CHECK(check_guard_ok(state, ns) && check_guard_ok(scratch, nsc),
          "%s N%d C%d F%d E%d K%d: wrote past its state (%zu) or scratch (%zu)", name, N, C, F, E,
          K, ns, nsc);
    free(state), free(scratch);
    return r;
}

static double rel_l2_d(const float *a, const double *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) num += (a[i] - b[i]) * (a[i] - b[i]), den += b[i] * b[i];
    return sqrt(num / (den > 0 ? den : 1));
}

static double worst[5]; // out, dx, dw, dweight, loop vs grouped: the largest seen, printed

static void note(int i, double e) {
    if (e > worst[i]) worst[i] = e;
}

static ct_ops ops_loop, ops_grouped;
static cpu_kernels kernels; // both tables' kernel state, as two tables bound to one backend

// skip >= 0: that expert gets no token. hot >= 0: hot_pct% of the tokens choose it first.
static void test_case(int N, int C, int F, int E, int K, int skip, int hot, int hot_pct) {
    problem p = make_problem(N, C, F, E, K, skip, hot, hot_pct);
    const size_t nx = (size_t)N * C, nk = (size_t)N * K, nw = (size_t)E * 3 * F * C;
    outputs ref = reference(&p);
    const ct_ops *impl[2] = {&ops_loop, &ops_grouped};
    const char *names[2] = {"loop", "grouped"};
    result r[2];
    for (int i = 0; i < 2; i++) {
        r[i] = run(impl[i], names[i], &p);
        float *inc = malloc(nw * 4);
        for (size_t j = 0; j < nw; j++) inc[j] = r[i].dw[j] - p.dw0[j];
        const double eo = rel_l2_d(r[i].out, ref.out, nx), ex = rel_l2_d(r[i].dx, ref.dx, nx);
        const double ew = rel_l2_d(inc, ref.dw, nw), ek = rel_l2_d(r[i].dweight, ref.dweight, nk);
        note(0, eo), note(1, ex), note(2, ew), note(3, ek);
        CHECK(eo < TOL_FWD && ex < TOL_DX && ew < TOL_DW && ek < TOL_DWT,
              "bf16 %s N%d C%d F%d E%d K%d vs reference: out %.3g dx %.3g dW %.3g dweight %.3g",
              names[i], N, C, F, E, K, eo, ex, ew, ek);
        if (skip >= 0)
            CHECK(!memcmp(r[i].dw + (size_t)skip * 3 * F * C, p.dw0 + (size_t)skip * 3 * F * C,
                          (size_t)3 * F * C * 4),
                  "bf16 %s: expert %d without tokens changed its dW", names[i], skip);
        free(inc);
    }
    const double d[4] = {check_rel_l2(r[0].out, r[1].out, nx), check_rel_l2(r[0].dx, r[1].dx, nx),
                         check_rel_l2(r[0].dw, r[1].dw, nw),
                         check_rel_l2(r[0].dweight, r[1].dweight, nk)};
    for (int i = 0; i < 4; i++) {
        note(4, d[i]);
        CHECK(d[i] < TOL_IMPL, "bf16 loop vs grouped N%d C%d F%d E%d K%d: output %d rel L2 %.3g", N,
              C, F, E, K, i, d[i]);
    }
    // Bitwise reproducible for a fixed thread count, and (reported) across thread counts.
    for (int i = 0; i < 2; i++) {
        result again = run(impl[i], names[i], &p);
        CHECK(!memcmp(again.out, r[i].out, nx * 4) && !memcmp(again.dx, r[i].dx, nx * 4) &&
                  !memcmp(again.dw, r[i].dw, nw * 4) &&
                  !memcmp(again.dweight, r[i].dweight, nk * 4),
              "bf16 %s N%d C%d F%d E%d K%d: a second run differs", names[i], N, C, F, E, K);
        free_result(&again);
        omp_set_num_threads(1);
        result one = run(impl[i], names[i], &p);
        omp_set_num_threads(2);
        printf("bf16 %-7s N%d C%d F%d E%d K%d: 1 vs 2 threads bitwise equal: out %d dx %d dW %d\n",
               names[i], N, C, F, E, K, !memcmp(one.out, r[i].out, nx * 4),
               !memcmp(one.dx, r[i].dx, nx * 4), !memcmp(one.dw, r[i].dw, nw * 4));
        free_result(&one);
    }
    // The saved state: gate|up in bf16, half of the fp32 kernels' (the plan aside).
    const size_t plan = moe_plan_floats(N, E, K);
    for (int i = 0; i < 2; i++) {
        const size_t s16 = impl[i]->moe_bf16_state_floats(N, C, F, E, K) - plan;
        const size_t s32 = impl[i]->moe_state_floats(N, C, F, E, K) - plan;
        CHECK(s16 <= s32 / 2 + 16, "bf16 %s: state %zu floats beside fp32's %zu", names[i], s16,
              s32);
    }
    free_result(&r[0]), free_result(&r[1]), free_outputs(&ref), free_problem(&p);
}

int main(int argc, char **argv) {
    (void)argc;
    const bool emulated = getenv("CTITAN_BF16_GEMM") != NULL;
    if (!emulated) setenv("CTITAN_BF16_MOE_GEMM", "onednn", 1); // opt in (the default emulates)
    omp_set_num_threads(2);
    CHECK(ct_ops_with_moe_impl(&ops_loop, &ct_ops_cpu, "loop") == 0 &&
              ct_ops_with_moe_impl(&ops_grouped, &ct_ops_cpu, "grouped") == 0 &&
              ops_grouped.moe_bf16_forward == ct_ops_cpu.moe_bf16_forward &&
              ops_loop.moe_bf16_forward != ops_grouped.moe_bf16_forward,
          "moe_impl: the bf16 expert kernels");
    ops_loop.kernel_state = ops_grouped.kernel_state = &kernels;
    test_case(37, 48, 40, 8, 2, 3, -1, 0);  // odd sizes, an expert without tokens
    test_case(1, 16, 8, 4, 1, -1, -1, 0);   // one token
    test_case(24, 33, 17, 4, 4, -1, -1, 0); // K = E
    test_case(64, 64, 96, 16, 8, -1, -1, 0);
    // 512 slots, 70% on one expert: it runs alone with 2 threads, the rest concurrently.
    test_case(512, 128, 128, 8, 1, -1, 5, 70);
    printf("%s: worst rel L2 vs reference: out %.2g dx %.2g dW %.2g dweight %.2g; loop vs grouped "
           "%.2g\n",
           emulated ? "emulated" : "oneDNN", worst[0], worst[1], worst[2], worst[3], worst[4]);
    // The emulation (what a CPU without oneDNN's bf16 matmul runs: sgemm on the widened bf16
    // values), held to the same bounds, in a second process: the choice is made once per kernel
    // state, and this process's is made.
    if (!emulated) {
        char cmd[4200];
        snprintf(cmd, sizeof cmd, "CTITAN_BF16_GEMM=emulated '%s'", argv[0]);
        const int rc = system(cmd);
        CHECK(rc == 0, "the run with CTITAN_BF16_GEMM=emulated failed (%d)", rc);
    } else {
        CHECK(cpu_matmul_bf16_emulated(&ops_grouped),
              "CTITAN_BF16_GEMM=emulated: the bf16 GEMMs use oneDNN");
    }
    cpu_kernels_free(&kernels);
    return check_summary();
}
