// Every op of the CPU table against a naive double-precision reference: forwards compared
// directly, backwards against central finite differences of the double reference forward.
//
// Tolerances: the ops compute in fp32 (with some double sums), so a forward is within a few
// fp32 ulps of the double result: rel L2 1e-6 (2e-6 for attention: two GEMMs and a softmax).
// Finite differences of a double function with h = 1e-6 are accurate to ~1e-9, so the backward
// tolerance (rel L2 1e-5) is set by the fp32 backward, not by the differencing.
#include <omp.h>
#include <string.h>

#include "check.h"
#include "fd_check.h"
#include "ops/cpu_kernels.h"
#include "ops/matmul_bf16_internal.h"
#include "ops/ops.h"

static const ct_ops *ops = &ct_ops_cpu;

// ---- matmul ---------------------------------------------------------------------------------

typedef struct mm_ctx {
    int N, C, OC, has_bias;
} mm_ctx;

static void ref_matmul(double *out, double *const *in, const void *vctx) {
    const mm_ctx *c = vctx;
    const double *x = in[0], *w = in[1], *b = in[2];
    for (int n = 0; n < c->N; n++) {
        for (int o = 0; o < c->OC; o++) {
            double s = c->has_bias ? b[o] : 0.0;
            for (int i = 0; i < c->C; i++) s += x[n * c->C + i] * w[o * c->C + i];
            out[n * c->OC + o] = s;
        }
    }
}

static void test_matmul(int N, int C, int OC, int has_bias) {
    mm_ctx ctx = {N, C, OC, has_bias};
    const size_t nx = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
    float *x = frand_array(nx, -1, 1), *w = frand_array(nw, -1, 1), *b = frand_array(OC, -1, 1);
    float *out = malloc(no * sizeof *out);
    ops->matmul_forward(out, x, w, has_bias ? b : NULL, N, C, OC);
    fd_problem p = {ref_matmul,
                    &ctx,
                    {to_double(x, nx), to_double(w, nw), to_double(b, OC)},
                    {nx, nw, (size_t)OC},
                    no};
    double *ref = malloc(no * sizeof *ref);
    ref_matmul(ref, p.in, &ctx);
    double e = rel_l2_fd(out, ref, no);
    CHECK(e < 1e-6, "matmul fwd N%d C%d OC%d bias%d: rel L2 %.3g", N, C, OC, has_bias, e);

    // Backward: parameter grads accumulate onto what is there, input grads are overwritten.
    float *R = frand_array(no, -1, 1), *dx = frand_array(nx, 5, 6);
    float *dw0 = frand_array(nw, -1, 1), *db0 = frand_array(OC, -1, 1);
    float *dw = malloc(nw * sizeof *dw), *db = malloc(OC * sizeof *db);
    memcpy(dw, dw0, nw * sizeof *dw);
    memcpy(db, db0, OC * sizeof *db);
    ops->matmul_backward(dx, dw, has_bias ? db : NULL, R, x, w, N, C, OC);
    for (size_t i = 0; i < nw; i++) dw[i] -= dw0[i];
    for (int i = 0; i < OC; i++) db[i] -= db0[i];
    double *Rd = to_double(R, no);
    char what[64];
    snprintf(what, sizeof what, "matmul bwd N%d C%d OC%d dinp", N, C, OC);
    check_grad(what, dx, &p, 0, Rd, 1, 1e-5);
    snprintf(what, sizeof what, "matmul bwd N%d C%d OC%d dweight", N, C, OC);
    check_grad(what, dw, &p, 1, Rd, 1, 1e-5);
    if (has_bias) {
        snprintf(what, sizeof what, "matmul bwd N%d C%d OC%d dbias", N, C, OC);
        check_grad(what, db, &p, 2, Rd, 1, 1e-5);
    } else {
        CHECK(check_max_abs(db, (float[64]){0}, OC) == 0, "matmul: dbias touched without bias");
    }
    // dinp NULL: only the weight gradient.
    float *dw2 = calloc(nw, sizeof *dw2);
    ops->matmul_backward(NULL, dw2, NULL, R, x, w, N, C, OC);
    CHECK(check_rel_l2(dw2, dw, nw) < 1e-6, "matmul bwd with dinp NULL differs");

    for (int i = 0; i < 3; i++) free(p.in[i]);
    free(x), free(w), free(b), free(out), free(ref), free(R), free(dx), free(dw0), free(db0);
    free(dw), free(db), free(Rd), free(dw2);
}

// ---- rmsnorm --------------------------------------------------------------------------------

typedef struct rn_ctx {
    int N, C;
    double eps;
} rn_ctx;

static void ref_rmsnorm(double *out, double *const *in, const void *vctx) {
    const rn_ctx *c = vctx;
    const double *x = in[0], *w = in[1];
    for (int n = 0; n < c->N; n++) {
        double ss = 0;
        for (int i = 0; i < c->C; i++) ss += x[n * c->C + i] * x[n * c->C + i];
        const double r = 1.0 / sqrt(ss / c->C + c->eps);
        for (int i = 0; i < c->C; i++) out[n * c->C + i] = w[i] * x[n * c->C + i] * r;
    }
}

static void test_rmsnorm(int N, int C) {
    rn_ctx ctx = {N, C, 1e-6};
    const size_t nx = (size_t)N * C;
    float *x = frand_array(nx, -2, 2), *w = frand_array(C, 0.5f, 1.5f);
    float *out = malloc(nx * sizeof *out), *rstd = malloc(N * sizeof *rstd);
    ops->rmsnorm_forward(out, rstd, x, w, N, C, 1e-6f);
    fd_problem p = {ref_rmsnorm, &ctx, {to_double(x, nx), to_double(w, C)}, {nx, (size_t)C}, nx};
    double *ref = malloc(nx * sizeof *ref);
    ref_rmsnorm(ref, p.in, &ctx);
    double e = rel_l2_fd(out, ref, nx);
    CHECK(e < 1e-6, "rmsnorm fwd N%d C%d: rel L2 %.3g", N, C, e);

    float *R = frand_array(nx, -1, 1), *dx = malloc(nx * sizeof *dx);
    float *dw0 = frand_array(C, -1, 1), *dw = malloc(C * sizeof *dw);
    memcpy(dw, dw0, C * sizeof *dw);
    ops->rmsnorm_backward(dx, dw, R, x, w, rstd, N, C);
    for (int i = 0; i < C; i++) dw[i] -= dw0[i];
    double *Rd = to_double(R, nx);
    char what[64];
    snprintf(what, sizeof what, "rmsnorm bwd N%d C%d dinp", N, C);
    check_grad(what, dx, &p, 0, Rd, 1, 1e-5);
    snprintf(what, sizeof what, "rmsnorm bwd N%d C%d dweight", N, C);
    check_grad(what, dw, &p, 1, Rd, 1, 1e-5);
    // dinp may alias dout (the model normalises q/k gradients in place).
    float *dw2 = calloc(C, sizeof *dw2);
    ops->rmsnorm_backward(R, dw2, R, x, w, rstd, N, C);
    CHECK(memcmp(R, dx, nx * sizeof *dx) == 0, "rmsnorm bwd in place differs");
    CHECK(check_rel_l2(dw2, dw, C) < 1e-6, "rmsnorm bwd in place: dweight differs");

    for (int i = 0; i < 2; i++) free(p.in[i]);
    free(x), free(w), free(out), free(rstd), free(ref), free(R), free(dx), free(dw0), free(dw);
    free(Rd), free(dw2);
}

// ---- rope -----------------------------------------------------------------------------------

typedef struct rope_ctx {
    int B, T, H, D;
    const double *cos, *sin; // (T, D/2)
} rope_ctx;

static void ref_rope(double *out, double *const *in, const void *vctx) {
    const rope_ctx *c = vctx;
    const int half = c->D / 2;
    for (int b = 0; b < c->B; b++)
        for (int t = 0; t < c->T; t++)
            for (int h = 0; h < c->H; h++) {
                const size_t base = (((size_t)b * c->T + t) * c->H + h) * c->D;
                const double *x = in[0] + base;
                for (int d = 0; d < c->D; d++) {
                    const int i = d % half;
                    const double co = c->cos[t * half + i], si = c->sin[t * half + i];
                    // rotate_half(x) = cat(-x2, x1)
                    const double rot = d < half ? -x[d + half] : x[d - half];
                    out[base + d] = x[d] * co + rot * si;
                }
            }
}

static void test_rope(int B, int T, int H, int D) {
    const int half = D / 2;
    float *cosf_t = malloc((size_t)T * half * sizeof(float));
    float *sinf_t = malloc((size_t)T * half * sizeof(float));
    for (int t = 0; t < T; t++)
        for (int i = 0; i < half; i++) {
            const float ang = (float)t / powf(10000.0f, (float)(2 * i) / (float)D);
            cosf_t[t * half + i] = cosf(ang);
            sinf_t[t * half + i] = sinf(ang);
        }
    double *cd = to_double(cosf_t, (size_t)T * half), *sd = to_double(sinf_t, (size_t)T * half);
    rope_ctx ctx = {B, T, H, D, cd, sd};
    const size_t n = (size_t)B * T * H * D;
    float *x = frand_array(n, -1, 1), *out = malloc(n * sizeof *out);
    ops->rope_forward(out, x, cosf_t, sinf_t, B, T, H, D);
    fd_problem p = {ref_rope, &ctx, {to_double(x, n)}, {n}, n};
    double *ref = malloc(n * sizeof *ref);
    ref_rope(ref, p.in, &ctx);
    const double e = rel_l2_fd(out, ref, n);
    CHECK(e < 1e-6, "rope fwd B%d T%d H%d D%d: rel L2 %.3g", B, T, H, D, e);
    // Position 0 is the identity.
    CHECK(memcmp(out, x, (size_t)H * D * sizeof *x) == 0, "rope at position 0 is not identity");
    // In place gives the same result.
    float *y = malloc(n * sizeof *y);
    memcpy(y, x, n * sizeof *y);
    ops->rope_forward(y, y, cosf_t, sinf_t, B, T, H, D);
    CHECK(memcmp(y, out, n * sizeof *y) == 0, "rope fwd in place differs");

    float *R = frand_array(n, -1, 1), *dx = malloc(n * sizeof *dx);
    ops->rope_backward(dx, R, cosf_t, sinf_t, B, T, H, D);
    double *Rd = to_double(R, n);
    char what[64];
    snprintf(what, sizeof what, "rope bwd B%d T%d H%d D%d", B, T, H, D);
    check_grad(what, dx, &p, 0, Rd, 1, 1e-5);
    ops->rope_backward(R, R, cosf_t, sinf_t, B, T, H, D);
    CHECK(memcmp(R, dx, n * sizeof *dx) == 0, "rope bwd in place differs");

    free(p.in[0]);
    free(cosf_t), free(sinf_t), free(cd), free(sd), free(x), free(out), free(ref), free(y);
    free(R), free(dx), free(Rd);
}

// ---- attention ------------------------------------------------------------------------------

typedef struct att_ctx {
    int B, T, NH, NKV, D;
    double *probs; // optional: the reference probabilities (B,NH,T,T), zeros above diagonal
} att_ctx;

static void ref_attention(double *out, double *const *in, const void *vctx) {
    const att_ctx *c = vctx;
    const double *q = in[0], *k = in[1], *v = in[2];
    const int T = c->T, D = c->D, rep = c->NH / c->NKV;
    const double scale = 1.0 / sqrt((double)D);
    double *s = malloc((size_t)T * sizeof *s);
    for (int b = 0; b < c->B; b++)
        for (int h = 0; h < c->NH; h++)
            for (int t = 0; t < T; t++) {
                const double *qt = q + (((size_t)b * T + t) * c->NH + h) * D;
                double m = -INFINITY, sum = 0;
                for (int j = 0; j <= t; j++) {
                    const double *kj = k + (((size_t)b * T + j) * c->NKV + h / rep) * D;
                    double dot = 0;
                    for (int d = 0; d < D; d++) dot += qt[d] * kj[d];
                    s[j] = dot * scale;
                    m = s[j] > m ? s[j] : m;
                }
                for (int j = 0; j <= t; j++) sum += (s[j] = exp(s[j] - m));
                double *o = out + (((size_t)b * T + t) * c->NH + h) * D;
                for (int d = 0; d < D; d++) o[d] = 0;
                for (int j = 0; j <= t; j++) {
                    const double pj = s[j] / sum;
                    const double *vj = v + (((size_t)b * T + j) * c->NKV + h / rep) * D;
                    for (int d = 0; d < D; d++) o[d] += pj * vj[d];
                    if (c->probs) c->probs[(((size_t)b * c->NH + h) * T + t) * T + j] = pj;
                }
                if (c->probs)
                    for (int j = t + 1; j < T; j++)
                        c->probs[(((size_t)b * c->NH + h) * T + t) * T + j] = 0;
            }
    free(s);
}

// stride > 1 samples the finite differences (long sequences).
static void test_attention(int B, int T, int NH, int NKV, int D, size_t stride) {
    const size_t nq = (size_t)B * T * NH * D, nkv = (size_t)B * T * NKV * D;
    const size_t np = ops->attention_state_floats(B, T, NH, NKV, D);
    const size_t ns = ops->attention_scratch_floats(B, T, NH, NKV, D);
    CHECK(np == (size_t)B * NH * T * T && ns == np, "attention state/scratch sizes %zu %zu", np,
          ns);
    // Scores of order 1 so the softmax is far from uniform.
    float *q = frand_array(nq, -1.5f, 1.5f), *k = frand_array(nkv, -1.5f, 1.5f);
    float *v = frand_array(nkv, -1, 1);
    float *out = malloc(nq * sizeof *out), *probs = malloc(np * sizeof *probs);
    ops->attention_forward(out, probs, q, k, v, B, T, NH, NKV, D);

    double *ref_probs = malloc(np * sizeof *ref_probs), *ref = malloc(nq * sizeof *ref);
    att_ctx ctx = {B, T, NH, NKV, D, ref_probs};
    fd_problem p = {ref_attention,
                    &ctx,
                    {to_double(q, nq), to_double(k, nkv), to_double(v, nkv)},
                    {nq, nkv, nkv},
                    nq};
    ref_attention(ref, p.in, &ctx);
    ctx.probs = NULL;
    char what[96];
    snprintf(what, sizeof what, "attention B%d T%d NH%d NKV%d D%d", B, T, NH, NKV, D);
    double e = rel_l2_fd(out, ref, nq);
    CHECK(e < 2e-6, "%s fwd: rel L2 %.3g", what, e);
    e = rel_l2_fd(probs, ref_probs, np);
    CHECK(e < 2e-6, "%s probs: rel L2 %.3g", what, e);
    int masked_ok = 1;
    for (size_t r = 0; r < (size_t)B * NH * T; r++)
        for (int j = (int)(r % T) + 1; j < T; j++) masked_ok &= probs[r * T + j] == 0.0f;
    CHECK(masked_ok, "%s: probabilities above the diagonal are not 0", what);

    float *R = frand_array(nq, -1, 1), *scratch = malloc(ns * sizeof *scratch);
    float *dq = frand_array(nq, 5, 6), *dk = frand_array(nkv, 5, 6), *dv = frand_array(nkv, 5, 6);
    ops->attention_backward(dq, dk, dv, scratch, R, out, probs, q, k, v, B, T, NH, NKV, D);
    double *Rd = to_double(R, nq);
    char w2[128];
    snprintf(w2, sizeof w2, "%s dq", what);
    check_grad(w2, dq, &p, 0, Rd, stride, 1e-5);
    snprintf(w2, sizeof w2, "%s dk", what);
    check_grad(w2, dk, &p, 1, Rd, stride, 1e-5);
    snprintf(w2, sizeof w2, "%s dv", what);
    check_grad(w2, dv, &p, 2, Rd, stride, 1e-5);

    // Bit-identical on a second run (kv gradients summed over heads in a fixed order).
    float *dq2 = malloc(nq * sizeof *dq2), *dk2 = malloc(nkv * sizeof *dk2);
    float *dv2 = malloc(nkv * sizeof *dv2);
    ops->attention_backward(dq2, dk2, dv2, scratch, R, out, probs, q, k, v, B, T, NH, NKV, D);
    CHECK(!memcmp(dq, dq2, nq * 4) && !memcmp(dk, dk2, nkv * 4) && !memcmp(dv, dv2, nkv * 4),
          "%s: backward not deterministic", what);

    for (int i = 0; i < 3; i++) free(p.in[i]);
    free(q), free(k), free(v), free(out), free(probs), free(ref_probs), free(ref), free(R);
    free(scratch), free(dq), free(dk), free(dv), free(Rd), free(dq2), free(dk2), free(dv2);
}

// ---- swiglu ---------------------------------------------------------------------------------

static void ref_swiglu(double *out, double *const *in, const void *vctx) {
    const size_t n = *(const size_t *)vctx;
    for (size_t i = 0; i < n; i++) out[i] = in[0][i] / (1.0 + exp(-in[0][i])) * in[1][i];
}

static void test_swiglu(size_t n) {
    float *g = frand_array(n, -6, 6), *u = frand_array(n, -2, 2), *out = malloc(n * sizeof *out);
    ops->swiglu_forward(out, g, u, (int64_t)n);
    fd_problem p = {ref_swiglu, &n, {to_double(g, n), to_double(u, n)}, {n, n}, n};
    double *ref = malloc(n * sizeof *ref);
    ref_swiglu(ref, p.in, &n);
    const double e = rel_l2_fd(out, ref, n);
    CHECK(e < 1e-6, "swiglu fwd n%zu: rel L2 %.3g", n, e);

    float *R = frand_array(n, -1, 1), *dg = malloc(n * sizeof *dg), *du = malloc(n * sizeof *du);
    ops->swiglu_backward(dg, du, R, g, u, (int64_t)n);
    double *Rd = to_double(R, n);
    check_grad("swiglu bwd dgate", dg, &p, 0, Rd, 1, 1e-5);
    check_grad("swiglu bwd dup", du, &p, 1, Rd, 1, 1e-5);
    // dgate may alias dout (the model reuses dh for dgate).
    float *du2 = malloc(n * sizeof *du2);
    ops->swiglu_backward(R, du2, R, g, u, (int64_t)n);
    CHECK(!memcmp(R, dg, n * 4) && !memcmp(du2, du, n * 4), "swiglu bwd in place differs");

    // Saturated gates: no NaN/inf where exp(-g) overflows.
    float ge[4] = {-100.0f, 100.0f, -88.0f, 89.0f}, ue[4] = {1, 1, 1, 1}, oe[4], dge[4], due[4];
    ops->swiglu_forward(oe, ge, ue, 4);
    ops->swiglu_backward(dge, due, ue, ge, ue, 4);
    int finite = 1;
    for (int i = 0; i < 4; i++) finite &= isfinite(oe[i]) && isfinite(dge[i]) && isfinite(due[i]);
    CHECK(finite && oe[1] == 100.0f && fabsf(oe[0]) < 1e-30f && dge[1] == 1.0f,
          "swiglu saturation: out %g %g dgate %g", oe[0], oe[1], dge[1]);

    for (int i = 0; i < 2; i++) free(p.in[i]);
    free(g), free(u), free(out), free(ref), free(R), free(dg), free(du), free(Rd), free(du2);
}

// ---- cross entropy --------------------------------------------------------------------------

typedef struct ce_ctx {
    int N, V;
    const int32_t *targets;
    double scale;
} ce_ctx;

// out[n] = scale * loss_n, so the FD objective with R = 1 is the scaled loss sum.
static void ref_ce(double *out, double *const *in, const void *vctx) {
    const ce_ctx *c = vctx;
    for (int n = 0; n < c->N; n++) {
        const double *x = in[0] + (size_t)n * c->V;
        if (c->targets[n] == -100) {
            out[n] = 0;
            continue;
        }
        double m = x[0], s = 0;
        for (int i = 1; i < c->V; i++) m = x[i] > m ? x[i] : m;
        for (int i = 0; i < c->V; i++) s += exp(x[i] - m);
        out[n] = c->scale * (log(s) + m - x[c->targets[n]]);
    }
}

static void test_cross_entropy(int N, int V, float spread) {
    int32_t *t = malloc(N * sizeof *t);
    for (int n = 0; n < N; n++) t[n] = (n * 7 + 3) % V;
    t[N / 2] = -100; // an ignored target
    const size_t nl = (size_t)N * V;
    float *x = frand_array(nl, -spread, spread), *loss = malloc(N * sizeof *loss);
    ops->cross_entropy_forward(loss, x, t, N, V);
    ce_ctx ctx = {N, V, t, 1.0};
    fd_problem p = {ref_ce, &ctx, {to_double(x, nl)}, {nl}, (size_t)N};
    double *ref = malloc(N * sizeof *ref);
    ref_ce(ref, p.in, &ctx);
    double e = rel_l2_fd(loss, ref, N);
    CHECK(e < 1e-6, "cross entropy fwd N%d V%d spread %g: rel L2 %.3g", N, V, spread, e);
    CHECK(loss[N / 2] == 0.0f, "ignored target has loss %g", loss[N / 2]);

    const float scale = 0.37f;
    ctx.scale = scale;
    double *ones = malloc(N * sizeof *ones);
    for (int n = 0; n < N; n++) ones[n] = 1.0;
    float *dx = malloc(nl * sizeof *dx);
    ops->cross_entropy_backward(dx, x, t, scale, N, V);
    char what[64];
    snprintf(what, sizeof what, "cross entropy bwd N%d V%d", N, V);
    check_grad(what, dx, &p, 0, ones, 1, 1e-5);
    int zero_row = 1;
    for (int i = 0; i < V; i++) zero_row &= dx[(size_t)(N / 2) * V + i] == 0.0f;
    CHECK(zero_row, "ignored target has a nonzero gradient row");
    // Both at once: the same bits, in place too.
    float *loss2 = malloc(N * sizeof *loss2), *dx2 = malloc(nl * sizeof *dx2);
    ops->cross_entropy_forward_backward(loss2, dx2, x, t, scale, NULL, N, V);
    CHECK(!memcmp(loss, loss2, N * sizeof *loss) && !memcmp(dx, dx2, nl * sizeof *dx),
          "cross entropy fwd+bwd differs from the two calls");
    // dlogits may alias logits.
    ops->cross_entropy_backward(x, x, t, scale, N, V);
    CHECK(memcmp(x, dx, nl * sizeof *dx) == 0, "cross entropy bwd in place differs");
    free(loss2), free(dx2);

    free(p.in[0]);
    free(t), free(x), free(loss), free(ref), free(ones), free(dx);
}

// The fp32 one-row product (decode's; rows_f32 with AVX-512, rows_f32_avx2 with AVX2): against
// a double product (rel L2 1e-6; measured 7.7e-8 to 1.3e-7 with AVX2), and the same bits on 1 and 3
// threads (each output one thread's sum; OpenBLAS's sgemv, used before, gave other bits).
static void test_matmul_one_row(int C, int OC) {
    float *w = frand_array((size_t)OC * C, -1, 1), *x = frand_array(C, -1, 1);
    float *row[2] = {malloc(OC * sizeof(float)), malloc(OC * sizeof(float))};
    double *ref = calloc(OC, sizeof *ref);
    for (int o = 0; o < OC; o++)
        for (int c = 0; c < C; c++) ref[o] += (double)w[(size_t)o * C + c] * x[c];
    for (int run = 0; run < 2; run++) {
        omp_set_num_threads(run == 0 ? 1 : 3);
        ops->matmul_forward(row[run], x, w, NULL, 1, C, OC);
    }
    omp_set_num_threads(2);
    printf("  matmul one-row %d x %d: rel L2 %.3g\n", C, OC, rel_l2_fd(row[0], ref, OC));
    CHECK(rel_l2_fd(row[0], ref, OC) < 1e-6, "matmul one-row %d x %d: rel L2 %.3g", C, OC,
          rel_l2_fd(row[0], ref, OC));
    CHECK(memcmp(row[0], row[1], OC * sizeof(float)) == 0, "matmul one-row %d x %d: 1 vs 3 threads",
          C, OC);
    free(w), free(x), free(row[0]), free(row[1]), free(ref);
}

// bf16 linear layers: the table's kernels (oneDNN's; the one-row product at N = 1) and the
// sgemm emulation (matmul_bf16_emulated.c) against a double product of the bf16-rounded operands.
// Both accumulate in fp32, so each is within fp32 summation error of it: rel L2 1e-6 (measured
// 3e-9 to 1.4e-7).
static void test_matmul_bf16(int N, int C, int OC) {
    cpu_kernels kernels = {0}; // the primitives' home: a backend's, here the test's own
    ct_ops bf16 = *ops;
    bf16.kernel_state = &kernels;
    const size_t nx = (size_t)N * C, nw = (size_t)OC * C, ny = (size_t)N * OC;
    float *x = frand_array(nx, -1, 1), *w = frand_array(nw, -1, 1), *dy = frand_array(ny, -1, 1);
    uint16_t *w16 = malloc(nw * 2), *x16 = malloc(nx * 2), *y16 = malloc(ny * 2);
    ops->round_to_bf16(w16, w, nw); // x, w and dy now hold bf16 values
    ops->round_to_bf16(x16, x, nx);
    ops->round_to_bf16(NULL, dy, ny);
    const size_t ns = bf16.matmul_bf16_scratch_floats(&bf16, N, C, OC, false);
    const size_t ne = mm_emulated_scratch_floats(N, C, OC);
    float *scratch = malloc((ns > ne ? ns : ne) * sizeof(float));
    double *ry = calloc(ny, sizeof *ry), *rdx = calloc(nx, sizeof *rdx), *rdw = calloc(nw, 8);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++)
            for (int c = 0; c < C; c++) {
                const double xv = x[n * C + c], wv = w[o * C + c], g = dy[n * OC + o];
                ry[n * OC + o] += xv * wv, rdx[n * C + c] += g * wv, rdw[o * C + c] += g * xv;
            }
    for (int emulated = 0; emulated < 2; emulated++) {
        const char *how = emulated ? "emulated" : N == 1 ? "one-row" : "oneDNN";
        float *y = calloc(ny, 4), *dx = calloc(nx, 4), *dw = calloc(nw, 4);
        if (emulated) {
            mm_emulated_forward(y, NULL, scratch, x, NULL, w16, N, C, OC);
            mm_emulated_forward(NULL, y16, scratch, NULL, x16, w16, N, C, OC);
            mm_emulated_backward(dx, dw, scratch, dy, NULL, NULL, x16, w16, N, C, OC);
        } else {
            bf16.matmul_bf16_forward(&bf16, y, NULL, scratch, x, NULL, w16, NULL, N, C, OC);
            bf16.matmul_bf16_forward(&bf16, NULL, y16, scratch, NULL, x16, w16, NULL, N, C, OC);
            bf16.matmul_bf16_backward(&bf16, dx, dw, NULL, scratch, dy, NULL, NULL, x16, w16, N, C,
                                      OC);
        }
        CHECK(rel_l2_fd(y, ry, ny) < 1e-6, "%s bf16 matmul fwd %dx%dx%d: %.3g", how, N, C, OC,
              rel_l2_fd(y, ry, ny));
        int off = 0; // the bf16 output: the fp32 one rounded, give or take one bf16 ulp
        for (size_t i = 0; i < ny; i++) off += abs((int)y16[i] - (int)f32_to_bf16(y[i])) > 1;
        CHECK(off == 0, "%s bf16 matmul bf16 output: %d values off by more than 1 ulp", how, off);
        CHECK(rel_l2_fd(dx, rdx, nx) < 1e-6 && rel_l2_fd(dw, rdw, nw) < 1e-6,
              "%s bf16 matmul bwd %dx%dx%d: dx %.3g dw %.3g", how, N, C, OC, rel_l2_fd(dx, rdx, nx),
              rel_l2_fd(dw, rdw, nw));
        free(y), free(dx), free(dw);
    }
    if (N == 1) { // each output one thread's sum, whichever row shares its loop (rows_fma_bf16)
        float *y[2] = {calloc(ny, 4), calloc(ny, 4)};
        for (int run = 0; run < 2; run++) {
            omp_set_num_threads(run == 0 ? 1 : 3);
            bf16.matmul_bf16_forward(&bf16, y[run], NULL, scratch, x, NULL, w16, NULL, N, C, OC);
        }
        omp_set_num_threads(2);
        CHECK(memcmp(y[0], y[1], ny * 4) == 0, "one-row bf16 matmul %dx%d: 1 vs 3 threads", C, OC);
        free(y[0]), free(y[1]);
    }
    free(x), free(w), free(dy), free(w16), free(x16), free(y16), free(scratch);
    free(ry), free(rdx), free(rdw);
    cpu_kernels_free(&kernels);
}

// The sgemm emulation's forward and input gradient (ctitan's tiles, matmul_bf16_emulated.c) give a
// token row the same bits whatever rows share the product and wherever it sits: rows [r0, r1)
// alone against the same rows of the whole product, bit for bit, on 1 and 3 threads. (OpenBLAS's
// AVX2 sgemm, which ran them before, differed in 14-563 of a row's 96 outputs.)
static void test_matmul_bf16_rows(int N, int C, int OC) {
    const size_t nx = (size_t)N * C, nw = (size_t)OC * C, ny = (size_t)N * OC;
    float *x = frand_array(nx, -1, 1), *w = frand_array(nw, -1, 1), *dy = frand_array(ny, -1, 1);
    uint16_t *w16 = malloc(nw * 2), *x16 = malloc(nx * 2);
    ops->round_to_bf16(w16, w, nw);
    ops->round_to_bf16(x16, x, nx);
    float *scratch = malloc(mm_emulated_scratch_floats(N, C, OC) * sizeof(float));
    float *y = malloc(ny * 4), *dx = malloc(nx * 4), *ys = malloc(ny * 4), *dxs = malloc(nx * 4);
    omp_set_num_threads(2);
    mm_emulated_forward(y, NULL, scratch, NULL, x16, w16, N, C, OC);
    mm_emulated_backward(dx, NULL, scratch, dy, NULL, NULL, x16, w16, N, C, OC);
    const int parts[][2] = {{0, N}, {3, 4}, {1, 14}, {5, N}, {N - 7, N}};
    for (int p = 0; p < 5; p++)
        for (int threads = 1; threads <= 3; threads += 2) {
            const int r0 = parts[p][0], n = parts[p][1] - r0;
            omp_set_num_threads(threads);
            mm_emulated_forward(ys, NULL, scratch, NULL, x16 + (size_t)r0 * C, w16, n, C, OC);
            mm_emulated_backward(dxs, NULL, scratch, dy + (size_t)r0 * OC, NULL, NULL,
                                 x16 + (size_t)r0 * C, w16, n, C, OC);
            CHECK(memcmp(ys, y + (size_t)r0 * OC, (size_t)n * OC * 4) == 0 &&
                      memcmp(dxs, dx + (size_t)r0 * C, (size_t)n * C * 4) == 0,
                  "emulated bf16 matmul %dx%dx%d: rows [%d, %d) alone on %d thread(s) differ from "
                  "the whole product's (fwd %d, dx %d)",
                  N, C, OC, r0, r0 + n, threads,
                  memcmp(ys, y + (size_t)r0 * OC, (size_t)n * OC * 4) != 0,
                  memcmp(dxs, dx + (size_t)r0 * C, (size_t)n * C * 4) != 0);
        }
    omp_set_num_threads(2);
    free(x), free(w), free(dy), free(w16), free(x16), free(scratch);
    free(y), free(dx), free(ys), free(dxs);
}

// attention_decode (one query row against a KV cache of T rows, GQA) against a double softmax
// attention: rel L2 3e-6 (measured 1.2e-7 to 2.2e-7). The cases cover the kernel's pairing of
// the query heads that share a kv head (rep 1, 3 and 4: a head left alone, two pairs), one and
// several 64-position chunks with a part-filled last one, odd chunk lengths (the bf16 products
// take positions in pairs), and both paths (NH a multiple of 16, rep dividing 16 and D of 32 with
// AVX-512, the portable loops otherwise). q, k and v hold bf16 values, as under bf16.
// attention_decode_bf16 (the cache in bf16) rounds as the flash kernel's bf16 forward: against
// the same arithmetic in double (scores bf16(bf16(q k) * bf16(scale)), each 64-position chunk's
// exp(s - m) rounded to bf16 before the products with v, its sum l unrounded), rel L2 2e-6
// (measured 4e-8 to 1.5e-7, both paths); against HF's eager attention under autocast (the
// normalised probabilities rounded to bf16: the same relative rounding of other values), rel L2
// 2e-2 (measured 2.0e-3 to 2.4e-3; fp32's attention is 1.7e-3 to 3.7e-3 from the kernel).
static double decode_scale_bf16(int D) {
    return bf16_to_f32(f32_to_bf16((float)(1.0 / sqrt((double)D))));
}

static void test_attention_decode(int NH, int NKV, int D, int T) {
    const size_t nq = (size_t)NH * D, nkv = (size_t)T * NKV * D;
    float *q = frand_array(nq, -2, 2), *k = frand_array(nkv, -1, 1), *v = frand_array(nkv, -1, 1);
    for (size_t i = 0; i < nq; i++) q[i] = bf16_to_f32(f32_to_bf16(q[i]));
    uint16_t *k16 = malloc(nkv * sizeof *k16), *v16 = malloc(nkv * sizeof *v16);
    for (size_t i = 0; i < nkv; i++) {
        k16[i] = f32_to_bf16(k[i]), k[i] = bf16_to_f32(k16[i]);
        v16[i] = f32_to_bf16(v[i]), v[i] = bf16_to_f32(v16[i]);
    }
    float *out = malloc(nq * sizeof *out), *out16 = malloc(nq * sizeof *out16);
    float *scratch = malloc(ops->attention_decode_scratch_floats(T, NH, D) * sizeof *scratch);
    // ref: fp32's; chunked: the bf16 kernel's arithmetic; hf: autocast's eager attention
    double *ref = calloc(nq, sizeof *ref), *chunked = calloc(nq, sizeof *chunked),
           *hf = calloc(nq, sizeof *hf), *p = malloc((size_t)T * sizeof *p),
           *sb = malloc((size_t)T * sizeof *sb);
    for (int h = 0; h < NH; h++) {
        const int kvh = h / (NH / NKV);
        double m = -INFINITY, mb = -INFINITY, sum = 0, sumb = 0;
        for (int j = 0; j < T; j++) {
            double dot = 0;
            for (int i = 0; i < D; i++)
                dot += (double)q[h * D + i] * k[((size_t)j * NKV + kvh) * D + i];
            p[j] = dot / sqrt((double)D), m = p[j] > m ? p[j] : m;
            sb[j] = bf16_to_f32(
                f32_to_bf16((float)(bf16_to_f32(f32_to_bf16((float)dot)) * decode_scale_bf16(D))));
            mb = sb[j] > mb ? sb[j] : mb;
        }
        for (int j = 0; j < T; j++) p[j] = exp(p[j] - m), sum += p[j], sumb += exp(sb[j] - mb);
        for (int j = 0; j < T; j++) {
            const double pb = bf16_to_f32(f32_to_bf16((float)(exp(sb[j] - mb) / sumb)));
            for (int i = 0; i < D; i++) {
                const double vv = v[((size_t)j * NKV + kvh) * D + i];
                ref[h * D + i] += p[j] / sum * vv;
                hf[h * D + i] += pb * vv;
            }
        }
        double L = 0; // the chunks: each chunk's o and l scaled by exp(m_c - mb)
        for (int j0 = 0; j0 < T; j0 += 64) {
            const int j1 = j0 + 64 < T ? j0 + 64 : T;
            double mc = -INFINITY;
            for (int j = j0; j < j1; j++) mc = sb[j] > mc ? sb[j] : mc;
            const double w = exp(mc - mb);
            for (int j = j0; j < j1; j++) {
                const double e = exp(sb[j] - mc), pb = bf16_to_f32(f32_to_bf16((float)e));
                L += w * e;
                for (int i = 0; i < D; i++)
                    chunked[h * D + i] += w * pb * v[((size_t)j * NKV + kvh) * D + i];
            }
        }
        for (int i = 0; i < D; i++) chunked[h * D + i] /= L;
    }
    ops->attention_decode(out, scratch, q, k, v, T, NH, NKV, D);
    const double e = rel_l2_fd(out, ref, nq);
    CHECK(e < 3e-6, "attention_decode NH %d NKV %d D %d T %d: rel L2 %.3g", NH, NKV, D, T, e);
    ops->attention_decode_bf16(out16, scratch, q, k16, v16, T, NH, NKV, D);
    const double e16 = rel_l2_fd(out16, chunked, nq), ehf = rel_l2_fd(out16, hf, nq);
    printf("  attention_decode_bf16 NH %d NKV %d D %d T %d: rel L2 %.3g against its arithmetic in "
           "double, %.3g against autocast's, %.3g against fp32's\n",
           NH, NKV, D, T, e16, ehf, rel_l2_fd(out16, ref, nq));
    CHECK(e16 < 2e-6, "attention_decode_bf16 NH %d NKV %d D %d T %d: rel L2 %.3g", NH, NKV, D, T,
          e16);
    CHECK(ehf < 2e-2, "attention_decode_bf16 NH %d NKV %d D %d T %d against autocast: rel L2 %.3g",
          NH, NKV, D, T, ehf);
    // The same bits on 1 and 3 threads (the chunks and their merge do not depend on the threads,
    // nor on which thread runs a chunk).
    float *again = malloc(nq * sizeof *again);
    for (int run = 0; run < 2; run++) {
        omp_set_num_threads(run == 0 ? 1 : 3);
        ops->attention_decode(again, scratch, q, k, v, T, NH, NKV, D);
        CHECK(memcmp(again, out, nq * sizeof *out) == 0, "attention_decode T %d: %d thread(s)", T,
              run == 0 ? 1 : 3);
        ops->attention_decode_bf16(again, scratch, q, k16, v16, T, NH, NKV, D);
        CHECK(memcmp(again, out16, nq * sizeof *out) == 0,
              "attention_decode_bf16 T %d: %d thread(s)", T, run == 0 ? 1 : 3);
    }
    omp_set_num_threads(2);
    free(again);
    free(q), free(k), free(v), free(k16), free(v16), free(out), free(out16), free(scratch);
    free(ref), free(chunked), free(hf), free(p), free(sb);
}

// The dense MLP's bf16 SwiGLU against torch's roundings computed here independently (every op in
// fp32 rounded to bf16, libm's exp): equal but where the kernels' vectorised exp (1 ulp of
// expf) tips a rounding, by one bf16 ulp: at most 1 in 1000 (measured: 0 of 2709).
static double r16d(double x) {
    return bf16_to_f32(f32_to_bf16((float)x));
}

static void test_swiglu_rows_bf16(int N, int F) {
    const size_t n = (size_t)N * F;
    float *x = frand_array(2 * n, -6, 6), *dh = frand_array(n, -1, 1);
    uint16_t *gu = malloc(2 * n * 2), *h = malloc(n * 2), *dgu = malloc(2 * n * 2);
    ops->f32_to_bf16(gu, x, 2 * n);
    ops->swiglu_rows_bf16_forward(h, gu, N, F);
    ops->swiglu_rows_bf16_backward(dgu, dh, gu, N, F);
    int off[3] = {0, 0, 0}, far = 0; // h, dgate, dup: elements not equal; far: more than 1 ulp
    for (int r = 0; r < N; r++)
        for (int f = 0; f < F; f++) {
            const size_t i = (size_t)r * 2 * F + f, j = i + F, k = (size_t)r * F + f;
            const double g = bf16_to_f32(gu[i]), u = bf16_to_f32(gu[j]), d = r16d(dh[k]);
            const double den = r16d(1.0 + r16d(expf((float)-g))), sg = r16d(1.0 / den);
            const double want[3] = {
                r16d(r16d(g / den) * u),
                r16d(r16d(r16d(d * u) * sg) * r16d(1.0 + r16d(g * r16d(1 - sg)))),
                r16d(d * r16d(g / den))};
            const uint16_t got[3] = {h[k], dgu[i], dgu[j]};
            for (int t = 0; t < 3; t++) {
                const int diff = abs((int)got[t] - (int)f32_to_bf16((float)want[t]));
                off[t] += diff != 0, far += diff > 1;
            }
        }
    printf("bf16 SwiGLU N%d F%d: %d, %d, %d of %zu differ from torch's roundings (h, dgate, dup)\n",
           N, F, off[0], off[1], off[2], n);
    CHECK(far == 0 && off[0] * 1000 <= (int)n && off[1] * 1000 <= (int)n && off[2] * 1000 <= (int)n,
          "bf16 SwiGLU N%d F%d: h %d, dgate %d, dup %d of %zu differ from torch's roundings (%d "
          "by more than 1 ulp)",
          N, F, off[0], off[1], off[2], n, far);
    // dgate_up may alias gate_up.
    ops->swiglu_rows_bf16_backward(gu, dh, gu, N, F);
    CHECK(memcmp(gu, dgu, 2 * n * 2) == 0, "bf16 SwiGLU backward in place differs");
    free(x), free(dh), free(gu), free(h), free(dgu);
}

// The bf16 head (bf16 mixed precision): the cross-entropy over bf16 logits is the fp32 one over
// their widened values, bit for bit, and its dlogits are the fp32 ones rounded to bf16.
static void test_cross_entropy_bf16(int N, int V, float spread) {
    int32_t *t = malloc(N * sizeof *t);
    for (int n = 0; n < N; n++) t[n] = (n * 5 + 1) % V;
    t[N - 1] = -100;
    const size_t nl = (size_t)N * V;
    float *x = frand_array(nl, -spread, spread), *loss = malloc(N * sizeof *loss);
    float *loss16 = malloc(N * sizeof *loss16), *dx = malloc(nl * sizeof *dx);
    uint16_t *x16 = malloc(nl * sizeof *x16), *dx16 = malloc(nl * sizeof *dx16);
    ops->round_to_bf16(x16, x, nl); // x now holds x16's values
    ops->cross_entropy_forward(loss, x, t, N, V);
    ops->cross_entropy_bf16_forward(loss16, x16, t, N, V);
    CHECK(memcmp(loss, loss16, N * sizeof *loss) == 0, "bf16 cross entropy fwd N%d V%d", N, V);
    ops->cross_entropy_backward(dx, x, t, 0.37f, N, V);
    ops->cross_entropy_bf16_backward(dx16, x16, t, 0.37f, N, V);
    int same = 1;
    for (size_t i = 0; i < nl; i++) same &= dx16[i] == f32_to_bf16(dx[i]);
    CHECK(same, "bf16 cross entropy bwd N%d V%d is not the fp32 one rounded", N, V);
    float *keep = malloc((size_t)omp_get_max_threads() * V * sizeof *keep);
    ops->cross_entropy_bf16_forward_backward(loss, x16, x16, t, 0.37f, keep, N, V); // in place
    free(keep);
    CHECK(!memcmp(x16, dx16, nl * sizeof *dx16) && !memcmp(loss, loss16, N * sizeof *loss),
          "bf16 cross entropy fwd+bwd in place differs from the two calls");
    free(t), free(x), free(loss), free(loss16), free(dx), free(x16), free(dx16);
}

// ---- embedding and add ----------------------------------------------------------------------

static void test_embedding(int N, int V, int C) {
    int32_t *ids = malloc(N * sizeof *ids);
    for (int n = 0; n < N; n++) ids[n] = (n * 5) % V; // repeats when N > V
    ids[N - 1] = ids[0];
    float *table = frand_array((size_t)V * C, -1, 1), *out = malloc((size_t)N * C * 4);
    ops->embedding_forward(out, ids, table, N, C);
    int same = 1;
    for (int n = 0; n < N; n++)
        same &= !memcmp(out + (size_t)n * C, table + (size_t)ids[n] * C, C * 4);
    CHECK(same, "embedding fwd is not a row gather");

    float *dout = frand_array((size_t)N * C, -1, 1), *dt = frand_array((size_t)V * C, -1, 1);
    double *ref = to_double(dt, (size_t)V * C);
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) ref[(size_t)ids[n] * C + c] += dout[(size_t)n * C + c];
    ops->embedding_backward(dt, dout, ids, N, C);
    const double e = rel_l2_fd(dt, ref, (size_t)V * C);
    CHECK(e < 1e-6, "embedding bwd N%d V%d C%d: rel L2 %.3g", N, V, C, e);
    free(ids), free(table), free(out), free(dout), free(dt), free(ref);
}

static void test_add(void) {
    float a[37], b[37], out[37];
    for (int i = 0; i < 37; i++) a[i] = frand(-1, 1), b[i] = frand(-1, 1);
    ops->add(out, a, b, 37);
    int ok = 1;
    for (int i = 0; i < 37; i++) ok &= out[i] == a[i] + b[i];
    ops->add(a, a, b, 37); // aliasing
    ok &= !memcmp(a, out, sizeof a);
    CHECK(ok, "add");
}

// Loops are split over rows (independent) or over column blocks that each sum their rows in
// order, so every OpenMP op gives the same bits on 1 thread as on 3; shapes are large enough
// to take the parallel branch (CPU_PAR_MIN).
enum { TI_N = 96, TI_C = 1040, TI_V = 700, TI_OC = 400, TI_H = 4, TI_D = 64, TI_T = 48 };
enum { TI_OUTPUTS = 10 };

static void thread_invariance_run(float *r[TI_OUTPUTS], const float *x, const float *w,
                                  const float *dy, const float *g, const float *u, const float *lg,
                                  const int32_t *ids, const int32_t *tg, const float *cs,
                                  const float *sn, const float *q) {
    const int N = TI_N, C = TI_C, V = TI_V;
    const size_t nc = (size_t)N * C;
    float *rstd = malloc(N * sizeof *rstd);
    ops->rmsnorm_forward(r[0], rstd, x, w, N, C, 1e-6f);
    ops->rmsnorm_backward(r[1], r[2], dy, x, w, rstd, N, C);
    ops->swiglu_forward(r[3], g, u, (int64_t)nc);
    ops->swiglu_backward(r[4], r[5], dy, g, u, (int64_t)nc);
    ops->cross_entropy_forward(r[6], lg, tg, N, V);
    ops->cross_entropy_backward(r[7], lg, tg, 0.5f, N, V);
    ops->embedding_backward(r[8], dy, ids, N, C);
    ops->rope_forward(r[9], q, cs, sn, 2, TI_T, TI_H, TI_D);
    free(rstd);
}

static void test_thread_invariance(void) {
    const int N = TI_N, C = TI_C, V = TI_V;
    const size_t nc = (size_t)N * C, nq = (size_t)2 * TI_T * TI_H * TI_D;
    const size_t sizes[TI_OUTPUTS] = {nc, nc, C, nc, nc, nc, N, (size_t)N * V, 50 * (size_t)C, nq};
    const char *names[TI_OUTPUTS] = {
        "rmsnorm fwd", "rmsnorm dinp",  "rmsnorm dweight",   "swiglu fwd",    "swiglu dgate",
        "swiglu dup",  "cross entropy", "cross entropy bwd", "embedding bwd", "rope"};
    float *x = frand_array(nc, -1, 1), *w = frand_array(C, 0.5f, 1.5f);
    float *dy = frand_array(nc, -1, 1), *g = frand_array(nc, -4, 4), *u = frand_array(nc, -1, 1);
    float *lg = frand_array((size_t)N * V, -5, 5), *q = frand_array(nq, -1, 1);
    float *cs = frand_array(TI_T * TI_D / 2, -1, 1), *sn = frand_array(TI_T * TI_D / 2, -1, 1);
    int32_t ids[TI_N], tg[TI_N];
    for (int n = 0; n < N; n++) ids[n] = (n * 13) % 50, tg[n] = n % 7 ? (n * 31) % V : -100;
    float *res[2][TI_OUTPUTS];
    for (int run = 0; run < 2; run++) {
        for (int i = 0; i < TI_OUTPUTS; i++) res[run][i] = calloc(sizes[i], sizeof(float));
        omp_set_num_threads(run == 0 ? 1 : 3);
        thread_invariance_run(res[run], x, w, dy, g, u, lg, ids, tg, cs, sn, q);
    }
    omp_set_num_threads(2);
    for (int i = 0; i < TI_OUTPUTS; i++) {
        CHECK(memcmp(res[0][i], res[1][i], sizes[i] * sizeof(float)) == 0,
              "%s: 1 vs 3 threads differ", names[i]);
        free(res[0][i]), free(res[1][i]);
    }
    // matmul's bias gradient (OpenMP) with BLAS for the rest: same bits on 1 or 3 threads.
    float *wt = frand_array((size_t)TI_OC * C, -1, 1),
          *dout = frand_array((size_t)N * TI_OC, -1, 1);
    float *db[2], *dw[2];
    for (int run = 0; run < 2; run++) {
        db[run] = calloc(TI_OC, sizeof(float));
        dw[run] = calloc((size_t)TI_OC * C, sizeof(float));
        omp_set_num_threads(run == 0 ? 1 : 3);
        ops->matmul_backward(NULL, dw[run], db[run], dout, x, wt, N, C, TI_OC);
    }
    omp_set_num_threads(2);
    CHECK(memcmp(db[0], db[1], TI_OC * sizeof(float)) == 0, "matmul dbias: 1 vs 3 threads");
    for (int run = 0; run < 2; run++) free(db[run]), free(dw[run]);
    free(x), free(w), free(dy), free(g), free(u), free(lg), free(q), free(cs), free(sn);
    free(wt), free(dout);
}

int main(void) {
    CHECK(ops->name && strcmp(ops->name, "cpu") == 0, "table name");
    test_matmul(7, 5, 3, 1);
    test_matmul(33, 17, 19, 0);
    test_matmul(1, 40, 35, 1); // one row; more than two column blocks of bias
    // N = 1 with AVX-512 (rows_f32): 64-element strides, then 16s and a masked tail (1000 = 15 x
    // 64 + 2 x 16 + 8), a tail alone (1183 = 18 x 64 + 31: 16 + 15), rows split over the
    // threads (both over CPU_PAR_MIN)
    test_matmul(1, 1000, 70, 1);
    test_matmul(1, 1183, 37, 0);
    test_rmsnorm(7, 13);
    test_rmsnorm(5, 37); // three column blocks for dweight
    test_rmsnorm(1, 4);
    test_rope(2, 5, 3, 6);
    test_rope(1, 1, 2, 4);               // T = 1
    test_attention(2, 5, 3, 3, 4, 1);    // GQA ratio 1
    test_attention(2, 7, 4, 2, 6, 1);    // ratio 2
    test_attention(1, 6, 6, 2, 8, 1);    // ratio 3
    test_attention(2, 1, 3, 1, 4, 1);    // T = 1
    test_attention(1, 5, 2, 2, 3, 1);    // odd head_dim
    test_attention(1, 300, 2, 1, 4, 37); // several 128-row blocks, partial last block
    test_swiglu(37);
    test_cross_entropy(5, 11, 3.0f);
    test_cross_entropy(3, 1000, 30.0f); // a wide row, large logits
    test_cross_entropy_bf16(4, 1537, 20.0f);
    test_matmul_bf16(7, 33, 5);
    test_swiglu_rows_bf16(9, 301);
    test_matmul_bf16(37, 64, 600); // several emulated weight blocks, a partial last one
    // whole and part tiles (45 = 7 x 6 + 3 rows; 600 = 2 x 256 + 5 x 16 + 8 outputs; 70 = 4 x
    // 16 + 6 input columns)
    test_matmul_bf16_rows(45, 70, 600);
    // N = 1, the decode's one-row product (rows_dpbf16 with AVX512-BF16): 128-element strides,
    // then whole 32s and a masked tail (1000 = 7 x 128 + 3 x 32 + 8), a tail alone (1183 = 9 x
    // 128 + 31), rows split over the threads (1000 x 70 is over CPU_PAR_MIN); with AVX2
    // (rows_fma_bf16) 32-element strides, a 16 and a scalar tail (1000 = 31 x 32 + 8, 1183 =
    // 36 x 32 + 16 + 15, 33 = 32 + 1)
    test_matmul_bf16(1, 1000, 70);
    // the fp32 one: whole strides then a tail of 8s (AVX2: 1000 = 31 x 32 + 8), a masked tail
    // (1183: AVX2 36 x 32 + 3 x 8 + 7, AVX-512 18 x 64 + 16 + 15), a tail alone (5); 3 threads
    // split the first two (over CPU_PAR_MIN)
    test_matmul_one_row(1000, 70);
    test_matmul_one_row(1183, 37);
    test_matmul_one_row(5, 3);
    // rows shared out in 128-row steps (cpu_rows_shared): 3 threads' shares of 333-334 rows, two
    // whole steps and a partial one each, taken by whichever thread is free
    test_matmul_one_row(96, 1001);
    test_matmul_bf16(1, 96, 1001);
    test_matmul_bf16(1, 1183, 37);
    test_matmul_bf16(1, 33, 5);
    // the vector path: rep 2 (Qwen3-0.6B/1.7B), 4 (4B/8B), 1, 8 and 16 (at AVX2's 8 lanes, rep 16
    // runs the portable loops)
    test_attention_decode(16, 8, 128, 64); // one whole chunk
    test_attention_decode(16, 8, 128, 612);
    test_attention_decode(32, 8, 128, 300); // five chunks, the last part-filled
    test_attention_decode(16, 16, 64, 130);
    test_attention_decode(16, 2, 32, 700);
    test_attention_decode(16, 1, 64, 65);
    test_attention_decode(16, 8, 96, 77);  // three 32-element blocks, an odd last chunk (13)
    test_attention_decode(16, 4, 160, 99); // blocks of 128 and then 32, an odd last chunk (35)
    // the portable loops: NH not a multiple of 16, rep 3, D not a multiple of 32 (with AVX2
    // NH 8 and D 48 run its 8 lanes: 16-element steps)
    test_attention_decode(6, 2, 128, 37);
    test_attention_decode(8, 2, 128, 300);
    test_attention_decode(16, 8, 48, 100);
    test_attention_decode(4, 4, 40, 17);
    test_attention_decode(6, 2, 40, 33);
    test_attention_decode(6, 3, 40, 129); // the portable loops over three chunks
    test_embedding(9, 4, 37);
    test_add();
    test_thread_invariance();
    return check_summary();
}
