// Parity of plugin overrides with the built-in kernels (kernel_check.h).
//
// Each op has a setup that sizes one case and makes its inputs, and a forward and a backward
// call that run one side (0 = built-in table, 1 = plugin table) on that side's own buffers.
// Everything else - NaN / start values, comparing, timing, rows - is shared: a case lists the
// tensors each direction writes, and how each one starts (NaN, or a copy of `init`: the start
// of an accumulated gradient, or the input of an in-place call).
//
// Running the check in a forked child (what train, verify and check-kernels do) is
// kernel_check_isolate.c.
#include "plugin/kernel_check.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/clock.h"
#include "core/rng.h"
#include "plugin/kernel_check_internal.h"
#include "core/grow.h"

#define KC_MAX_T 256           // model case: at most this many tokens
#define KC_MAX_E 16            // model case: at most this many experts
#define KC_ACC_STD 0.5f        // accumulated gradients start from N(0, KC_ACC_STD)
#define KC_MAX_TENSORS 4       // per direction
#define KC_MAX_ALLOCS 32       // per case
#define KC_TIMED_RUNS 3        // best of, after one warm-up
#define KC_AWKWARD_NO_EXPERT 2 // the awkward MoE case routes no token to this expert

enum { FWD, BWD };
static const char *const dir_names[2] = {"forward", "backward"};

double kernel_check_tolerance(override_op op) {
    switch (op) {
    case OVERRIDE_ROPE_HF:
    case OVERRIDE_SWIGLU:
        return 1e-6;
    case OVERRIDE_RMSNORM:
    case OVERRIDE_CROSS_ENTROPY:
    case OVERRIDE_MATMUL:
        return 1e-5;
    case OVERRIDE_ATTENTION:
    case OVERRIDE_MOE_EXPERTS:
        return 1e-4;
    default:
        return 0.0;
    }
}

// ---- random inputs (core/rng.h's splitmix64 sequence; fixed seeds, so every run checks the
// same values) ---------------------------------------------------------------------------------

typedef struct kc_rng {
    uint64_t seed, next; // the sequence and its next draw
} kc_rng;

static double rng_uniform(kc_rng *g) { // [0, 1)
    return ct_splitmix64_uniform_at(g->seed, g->next++);
}

static int rng_int(kc_rng *g, int n) {
    return (int)(rng_uniform(g) * n);
}

// ---- one case --------------------------------------------------------------------------------

typedef struct kc_tensor {
    const char *name;
    float *buf[2];     // built-in side, plugin side
    const float *init; // start values; NULL: NaN (overwritten outputs)
    size_t n;
} kc_tensor;

typedef struct kc_case {
    bool model;   // the model case (else awkward)
    bool inplace; // alias where the model does (the model case only)
    const ct_ops *ops[2];
    // sizes: the op's own subset
    int N, C, OC, B, T, H, NKV, D, F, E, K, V;
    int64_t n;
    float eps, scale;
    // inputs, shared by both sides
    const float *x, *w, *bias, *cos, *sin, *q, *k, *v, *dout, *gate, *up, *rw;
    const int32_t *ids;
    float *state[2], *scratch[2]; // NaN-filled, so state a forward forgets to write fails
    kc_tensor t[2][KC_MAX_TENSORS];
    int nt[2];
    void *allocs[KC_MAX_ALLOCS];
    int n_allocs;
    bool oom;
} kc_case;

static void *kc_alloc(kc_case *k, size_t bytes) {
    void *p = k->n_allocs < KC_MAX_ALLOCS ? malloc(bytes ? bytes : 1) : NULL;
    if (!p) {
        k->oom = true;
        return NULL;
    }
    k->allocs[k->n_allocs++] = p;
    return p;
}

static void kc_release(kc_case *k) {
    for (int i = 0; i < k->n_allocs; i++) free(k->allocs[i]);
    k->n_allocs = 0;
}

static void fill_nan(float *p, size_t n) {
    for (size_t i = 0; i < n; i++) p[i] = NAN;
}

static float *kc_nan(kc_case *k, size_t n) {
    float *p = kc_alloc(k, n * sizeof *p);
    if (p) fill_nan(p, n);
    return p;
}

// N(mean, std), the sequence's next 2 * ceil(n / 2) draws.
static void fill_normal(float *p, size_t n, kc_rng *g, float mean, float std) {
    g->next += ct_rng_normal(p, n, mean, std, g->seed, g->next, CT_RNG_COUNTER);
}

static float *kc_normal(kc_case *k, kc_rng *g, size_t n, float mean, float std) {
    float *p = kc_alloc(k, n * sizeof *p);
    if (p) fill_normal(p, n, g, mean, std);
    return p;
}

// A tensor direction `d` writes, one buffer per side.
static void kc_out(kc_case *k, int d, const char *name, size_t n, const float *init) {
    kc_tensor *t = &k->t[d][k->nt[d]++];
    t->name = name;
    t->n = n;
    t->init = init;
    t->buf[0] = kc_alloc(k, n * sizeof(float));
    t->buf[1] = kc_alloc(k, n * sizeof(float));
}

static float *out_buf(const kc_case *k, int d, int i, int side) {
    return k->t[d][i].buf[side];
}

static void kc_reset(kc_case *k, int d, int side) {
    for (int i = 0; i < k->nt[d]; i++) {
        kc_tensor *t = &k->t[d][i];
        if (t->init)
            memcpy(t->buf[side], t->init, t->n * sizeof(float));
        else
            fill_nan(t->buf[side], t->n);
    }
}

static int model_tokens(const kernel_check_shape *sh) {
    return sh->T < KC_MAX_T ? sh->T : KC_MAX_T;
}

// ---- the ops: setup, forward, backward -------------------------------------------------------

static void setup_rmsnorm(kc_case *k, kc_rng *g, const kernel_check_shape *sh) {
    k->N = k->model ? model_tokens(sh) : 7;
    k->C = k->model ? sh->C : 37;
    k->eps = sh->eps;
    const size_t NC = (size_t)k->N * k->C;
    k->x = kc_normal(k, g, NC, 0.0f, 1.0f);
    k->w = kc_normal(k, g, (size_t)k->C, 1.0f, 0.1f);
    k->dout = kc_normal(k, g, NC, 0.0f, 1.0f);
    kc_out(k, FWD, "out", NC, NULL);
    kc_out(k, FWD, "rstd", (size_t)k->N, NULL);
    kc_out(k, BWD, "dinp", NC, k->inplace ? k->dout : NULL);
    kc_out(k, BWD, "dweight", (size_t)k->C, kc_normal(k, g, (size_t)k->C, 0.0f, KC_ACC_STD));
}

static void rmsnorm_fwd(kc_case *k, const ct_ops *o, int s) {
    o->rmsnorm_forward(out_buf(k, FWD, 0, s), out_buf(k, FWD, 1, s), k->x, k->w, k->N, k->C,
                       k->eps);
}

static void rmsnorm_bwd(kc_case *k, const ct_ops *o, int s) {
    float *dinp = out_buf(k, BWD, 0, s);
    o->rmsnorm_backward(dinp, out_buf(k, BWD, 1, s), k->inplace ? dinp : k->dout, k->x, k->w,
                        out_buf(k, FWD, 1, s), k->N, k->C);
}

// HF's tables: angle = t * theta^(-2i/D), i < D/2.
static float *rope_table(kc_case *k, double theta, bool sine) {
    const int h = k->D / 2;
    float *p = kc_alloc(k, (size_t)k->T * h * sizeof *p);
    for (int t = 0; p && t < k->T; t++) {
        for (int i = 0; i < h; i++) {
            const double a = t * pow(theta, -2.0 * i / k->D);
            p[(size_t)t * h + i] = (float)(sine ? sin(a) : cos(a));
        }
    }
    return p;
}

static void setup_rope(kc_case *k, kc_rng *g, const kernel_check_shape *sh) {
    k->B = k->model ? 1 : 2;
    k->T = k->model ? model_tokens(sh) : 5;
    k->H = k->model ? sh->NH : 3;
    k->D = k->model ? sh->D : 10; // D/2 = 5: odd tails
    const size_t n = (size_t)k->B * k->T * k->H * k->D;
    k->cos = rope_table(k, sh->rope_theta, false);
    k->sin = rope_table(k, sh->rope_theta, true);
    k->x = kc_normal(k, g, n, 0.0f, 1.0f);
    k->dout = kc_normal(k, g, n, 0.0f, 1.0f);
    kc_out(k, FWD, "out", n, k->inplace ? k->x : NULL);
    kc_out(k, BWD, "dinp", n, k->inplace ? k->dout : NULL);
}

static void rope_fwd(kc_case *k, const ct_ops *o, int s) {
    float *out = out_buf(k, FWD, 0, s);
    o->rope_forward(out, k->inplace ? out : k->x, k->cos, k->sin, k->B, k->T, k->H, k->D);
}

static void rope_bwd(kc_case *k, const ct_ops *o, int s) {
    float *dinp = out_buf(k, BWD, 0, s);
    o->rope_backward(dinp, k->inplace ? dinp : k->dout, k->cos, k->sin, k->B, k->T, k->H, k->D);
}

static void setup_attention(kc_case *k, kc_rng *g, const kernel_check_shape *sh) {
    k->B = k->model ? 1 : 2;
    k->T = k->model ? model_tokens(sh) : 13;
    k->H = k->model ? sh->NH : 6;
    k->NKV = k->model ? sh->NKV : 2; // GQA ratio 3
    k->D = k->model ? sh->D : 10;
    const size_t nq = (size_t)k->B * k->T * k->H * k->D, nkv = (size_t)k->B * k->T * k->NKV * k->D;
    k->q = kc_normal(k, g, nq, 0.0f, 1.0f);
    k->k = kc_normal(k, g, nkv, 0.0f, 1.0f);
    k->v = kc_normal(k, g, nkv, 0.0f, 1.0f);
    k->dout = kc_normal(k, g, nq, 0.0f, 1.0f);
    for (int s = 0; s < 2; s++) {
        const ct_ops *o = k->ops[s];
        k->state[s] = kc_nan(k, o->attention_state_floats(k->B, k->T, k->H, k->NKV, k->D));
        k->scratch[s] = kc_nan(k, o->attention_scratch_floats(k->B, k->T, k->H, k->NKV, k->D));
    }
    kc_out(k, FWD, "out", nq, NULL);
    kc_out(k, BWD, "dq", nq, NULL);
    kc_out(k, BWD, "dk", nkv, NULL);
    kc_out(k, BWD, "dv", nkv, NULL);
}

static void attention_fwd(kc_case *k, const ct_ops *o, int s) {
    o->attention_forward(out_buf(k, FWD, 0, s), k->state[s], k->q, k->k, k->v, k->B, k->T, k->H,
                         k->NKV, k->D);
}

static void attention_bwd(kc_case *k, const ct_ops *o, int s) {
    o->attention_backward(out_buf(k, BWD, 0, s), out_buf(k, BWD, 1, s), out_buf(k, BWD, 2, s),
                          k->scratch[s], k->dout, out_buf(k, FWD, 0, s), k->state[s], k->q, k->k,
                          k->v, k->B, k->T, k->H, k->NKV, k->D);
}

static void setup_swiglu(kc_case *k, kc_rng *g, const kernel_check_shape *sh) {
    k->n = k->model ? (int64_t)model_tokens(sh) * sh->F : 1001;
    const size_t n = (size_t)k->n;
    k->gate = kc_normal(k, g, n, 0.0f, 1.5f);
    k->up = kc_normal(k, g, n, 0.0f, 1.0f);
    k->dout = kc_normal(k, g, n, 0.0f, 1.0f);
    kc_out(k, FWD, "out", n, NULL);
    kc_out(k, BWD, "dgate", n, NULL);
    kc_out(k, BWD, "dup", n, NULL);
}

static void swiglu_fwd(kc_case *k, const ct_ops *o, int s) {
    o->swiglu_forward(out_buf(k, FWD, 0, s), k->gate, k->up, k->n);
}

static void swiglu_bwd(kc_case *k, const ct_ops *o, int s) {
    o->swiglu_backward(out_buf(k, BWD, 0, s), out_buf(k, BWD, 1, s), k->dout, k->gate, k->up, k->n);
}

static void setup_moe(kc_case *k, kc_rng *g, const kernel_check_shape *sh) {
    int skip = -1; // an expert no token goes to
    if (!k->model) {
        k->N = 9, k->C = 12, k->F = 10, k->E = 5, k->K = 2, skip = KC_AWKWARD_NO_EXPERT;
    } else if (sh->E > 0) {
        k->N = model_tokens(sh), k->C = sh->C, k->F = sh->FM;
        k->E = sh->E < KC_MAX_E ? sh->E : KC_MAX_E;
        k->K = sh->K < k->E ? sh->K : k->E;
    } else { // a dense model: a small MoE of its hidden size
        k->N = model_tokens(sh), k->C = sh->C, k->E = 8, k->K = 2;
        k->F = sh->F / 4 > 8 ? sh->F / 4 : 8;
    }
    const int N = k->N, C = k->C, F = k->F, E = k->E, K = k->K;
    const size_t S = (size_t)N * K, NC = (size_t)N * C, nw = (size_t)E * 3 * F * C;
    k->x = kc_normal(k, g, NC, 0.0f, 1.0f);
    float *w = kc_alloc(k, nw * sizeof *w);
    int32_t *ids = kc_alloc(k, S * sizeof *ids);
    float *rw = kc_alloc(k, S * sizeof *rw);
    k->dout = kc_normal(k, g, NC, 0.0f, 1.0f);
    if (k->oom) return;
    // gate and up (F,C) scaled by 1/sqrt(C), down (C,F) by 1/sqrt(F), as nn.Linear's init.
    const size_t FC = (size_t)F * C;
    for (int e = 0; e < E; e++) {
        fill_normal(w + e * 3 * FC, 2 * FC, g, 0.0f, (float)(1.0 / sqrt(C)));
        fill_normal(w + e * 3 * FC + 2 * FC, FC, g, 0.0f, (float)(1.0 / sqrt(F)));
    }
    // K distinct experts per token, in random (not ascending) order, routing weights that sum
    // to 1 as after top-k renormalisation.
    int cand[KC_MAX_E], nc = 0;
    for (int e = 0; e < E; e++)
        if (e != skip) cand[nc++] = e;
    for (int t = 0; t < N; t++) {
        double sum = 0;
        for (int j = 0; j < K; j++) {
            const int pick = j + rng_int(g, nc - j), tmp = cand[j];
            cand[j] = cand[pick], cand[pick] = tmp;
            ids[(size_t)t * K + j] = cand[j];
            rw[(size_t)t * K + j] = (float)(0.1 + 0.9 * rng_uniform(g));
            sum += rw[(size_t)t * K + j];
        }
        for (int j = 0; j < K; j++) rw[(size_t)t * K + j] = (float)(rw[(size_t)t * K + j] / sum);
    }
    k->w = w, k->ids = ids, k->rw = rw;
    for (int s = 0; s < 2; s++) {
        k->state[s] = kc_nan(k, k->ops[s]->moe_state_floats(N, C, F, E, K));
        k->scratch[s] = kc_nan(k, k->ops[s]->moe_scratch_floats(N, C, F, E, K));
    }
    kc_out(k, FWD, "out", NC, NULL);
    kc_out(k, BWD, "dx", NC, NULL);
    kc_out(k, BWD, "dweight", S, NULL);
    kc_out(k, BWD, "dw", nw, kc_normal(k, g, nw, 0.0f, KC_ACC_STD));
}

static void moe_fwd(kc_case *k, const ct_ops *o, int s) {
    o->moe_forward(out_buf(k, FWD, 0, s), k->state[s], k->scratch[s], k->x, k->ids, k->rw, k->w,
                   k->N, k->C, k->F, k->E, k->K);
}

static void moe_bwd(kc_case *k, const ct_ops *o, int s) {
    o->moe_backward(out_buf(k, BWD, 0, s), out_buf(k, BWD, 1, s), out_buf(k, BWD, 2, s),
                    k->scratch[s], k->dout, k->state[s], k->x, k->ids, k->rw, k->w, k->N, k->C,
                    k->F, k->E, k->K);
}

static void setup_cross_entropy(kc_case *k, kc_rng *g, const kernel_check_shape *sh) {
    k->N = k->model ? model_tokens(sh) : 5;
    k->V = k->model ? sh->V : 1001;
    k->scale = 1.0f / k->N; // the mean over tokens
    const size_t NV = (size_t)k->N * k->V;
    k->x = kc_normal(k, g, NV, 0.0f, 2.0f);
    int32_t *ids = kc_alloc(k, (size_t)k->N * sizeof *ids);
    if (k->oom) return;
    for (int i = 0; i < k->N; i++) ids[i] = rng_int(g, k->V);
    if (!k->model) ids[2] = -100; // ignored
    k->ids = ids;
    kc_out(k, FWD, "losses", (size_t)k->N, NULL);
    kc_out(k, BWD, "dlogits", NV, k->inplace ? k->x : NULL);
}

static void cross_entropy_fwd(kc_case *k, const ct_ops *o, int s) {
    o->cross_entropy_forward(out_buf(k, FWD, 0, s), k->x, k->ids, k->N, k->V);
}

static void cross_entropy_bwd(kc_case *k, const ct_ops *o, int s) {
    float *d = out_buf(k, BWD, 0, s);
    o->cross_entropy_backward(d, k->inplace ? d : k->x, k->ids, k->scale, k->N, k->V);
}

static void setup_matmul(kc_case *k, kc_rng *g, const kernel_check_shape *sh) {
    k->N = k->model ? model_tokens(sh) : 7;
    k->C = k->model ? sh->C : 13;
    k->OC = k->model ? sh->F : 5; // the model case: the C -> F projection, no bias
    const size_t NC = (size_t)k->N * k->C, W = (size_t)k->OC * k->C;
    k->x = kc_normal(k, g, NC, 0.0f, 1.0f);
    k->w = kc_normal(k, g, W, 0.0f, (float)(1.0 / sqrt(k->C)));
    k->bias = k->model ? NULL : kc_normal(k, g, (size_t)k->OC, 0.0f, 0.1f);
    k->dout = kc_normal(k, g, (size_t)k->N * k->OC, 0.0f, 1.0f);
    kc_out(k, FWD, "out", (size_t)k->N * k->OC, NULL);
    kc_out(k, BWD, "dinp", NC, NULL);
    kc_out(k, BWD, "dweight", W, kc_normal(k, g, W, 0.0f, KC_ACC_STD));
    if (!k->model)
        kc_out(k, BWD, "dbias", (size_t)k->OC, kc_normal(k, g, (size_t)k->OC, 0.0f, KC_ACC_STD));
}

static void matmul_fwd(kc_case *k, const ct_ops *o, int s) {
    o->matmul_forward(out_buf(k, FWD, 0, s), k->x, k->w, k->bias, k->N, k->C, k->OC);
}

static void matmul_bwd(kc_case *k, const ct_ops *o, int s) {
    o->matmul_backward(out_buf(k, BWD, 0, s), out_buf(k, BWD, 1, s),
                       k->bias ? out_buf(k, BWD, 2, s) : NULL, k->dout, k->x, k->w, k->N, k->C,
                       k->OC);
}

typedef void (*kc_call)(kc_case *k, const ct_ops *o, int side);

static const struct {
    void (*setup)(kc_case *k, kc_rng *g, const kernel_check_shape *sh);
    kc_call call[2];  // forward, backward
    bool saves_state; // a forward-only override's state feeds the built-in backward
} kc_ops[OVERRIDE_N_OPS] = {
    [OVERRIDE_RMSNORM] = {setup_rmsnorm, {rmsnorm_fwd, rmsnorm_bwd}, true},
    [OVERRIDE_ROPE_HF] = {setup_rope, {rope_fwd, rope_bwd}, false},
    [OVERRIDE_ATTENTION] = {setup_attention, {attention_fwd, attention_bwd}, true},
    [OVERRIDE_SWIGLU] = {setup_swiglu, {swiglu_fwd, swiglu_bwd}, false},
    [OVERRIDE_MOE_EXPERTS] = {setup_moe, {moe_fwd, moe_bwd}, true},
    [OVERRIDE_CROSS_ENTROPY] = {setup_cross_entropy, {cross_entropy_fwd, cross_entropy_bwd}, false},
    [OVERRIDE_MATMUL] = {setup_matmul, {matmul_fwd, matmul_bwd}, false},
};

// ---- compare, time, report -------------------------------------------------------------------

static void compare(kernel_check_row *row, const float *b, const float *p, size_t n) {
    double max_abs = 0, max_b = 0;
    for (size_t i = 0; i < n; i++) {
        const double bi = b[i], pi = p[i];
        if (!isfinite(bi)) { // only the same non-finite value matches
            if (!(bi == pi || (isnan(bi) && isnan(pi)))) max_abs = INFINITY;
            continue;
        }
        const double d = isfinite(pi) ? fabs(pi - bi) : INFINITY;
        if (d > max_abs) max_abs = d;
        if (fabs(bi) > max_b) max_b = fabs(bi);
    }
    row->max_abs = max_abs;
    row->max_rel = max_abs == 0 ? 0 : max_b > 0 ? max_abs / max_b : INFINITY;
    row->pass = row->max_rel <= row->tolerance;
}

// Built-in time / plugin time for direction d: one warm-up each, then the best of
// KC_TIMED_RUNS, the two sides alternating so that drift hits both. Resetting the outputs
// (and in-place inputs) is not timed.
static double speedup(kc_case *k, kc_call call, int d) {
    double best[2] = {INFINITY, INFINITY};
    for (int run = 0; run <= KC_TIMED_RUNS; run++) {
        for (int s = 0; s < 2; s++) {
            kc_reset(k, d, s);
            const double t0 = ct_now_s();
            call(k, k->ops[s], s);
            const double t = ct_now_s() - t0;
            if (run > 0 && t < best[s]) best[s] = t;
        }
    }
    return best[1] > 0 ? best[0] / best[1] : 0;
}

static int add_row(kernel_check_report *r, size_t *cap, kernel_check_row **out) {
    if (grow_to((void **)&r->rows, cap, (size_t)r->n_rows + 1, sizeof *r->rows) != 0) return -1;
    *out = &r->rows[r->n_rows++];
    memset(*out, 0, sizeof **out);
    return 0;
}

static int check_case(kernel_check_report *r, size_t *cap, override_op op, const override_entry *e,
                      kc_case *k, FILE *progress) {
    const char *name = override_op_name(op), *case_name = k->model ? "model" : "awkward";
    // A forward-only override of a stateless op runs the built-in backward on the same inputs:
    // nothing to compare.
    const int ndir = !e->forward_only || kc_ops[op].saves_state ? 2 : 1;
    for (int d = 0; d < ndir; d++) {
        if (progress) {
            fprintf(progress, "checking %s %s (%s)\n", name, dir_names[d], case_name);
            fflush(progress);
        }
        const kc_call call = kc_ops[op].call[d];
        for (int s = 0; s < 2; s++) {
            kc_reset(k, d, s);
            call(k, k->ops[s], s);
        }
        const int first = r->n_rows;
        for (int i = 0; i < k->nt[d]; i++) {
            const kc_tensor *t = &k->t[d][i];
            kernel_check_row *row;
            if (add_row(r, cap, &row) != 0) return -1;
            snprintf(row->op, sizeof row->op, "%s", name);
            snprintf(row->direction, sizeof row->direction, "%s", dir_names[d]);
            snprintf(row->tensor, sizeof row->tensor, "%s", t->name);
            snprintf(row->case_name, sizeof row->case_name, "%s", case_name);
            row->tolerance = kernel_check_tolerance(op);
            compare(row, t->buf[0], t->buf[1], t->n);
            r->passed = r->passed && row->pass;
        }
        // The backward of a forward-only override is the built-in's: not timed.
        if (k->model && (d == FWD || !e->forward_only)) {
            const double x = speedup(k, call, d);
            for (int i = first; i < r->n_rows; i++) r->rows[i].speedup = x;
        }
    }
    return 0;
}

int kernel_check_validate_shape(const kernel_check_shape *sh, ct_error *err) {
    if (sh->T < 1 || sh->C < 1 || sh->NH < 1 || sh->NKV < 1 || sh->NH % sh->NKV != 0 || sh->D < 2 ||
        sh->D % 2 != 0 || sh->F < 1 || sh->V < 1 || sh->E < 0 ||
        (sh->E > 0 && (sh->K < 1 || sh->K > sh->E || sh->FM < 1)) || !(sh->eps >= 0) ||
        !(sh->rope_theta > 0))
        return ct_fail(err,
                       "kernel check: bad model shape T=%d C=%d NH=%d NKV=%d D=%d F=%d V=%d E=%d "
                       "K=%d FM=%d eps=%g rope_theta=%g",
                       sh->T, sh->C, sh->NH, sh->NKV, sh->D, sh->F, sh->V, sh->E, sh->K, sh->FM,
                       sh->eps, sh->rope_theta);
    return 0;
}

int kernel_check_run(kernel_check_report *r, const override_set *s, const ct_ops *builtin,
                     const kernel_check_shape *shape, FILE *progress, ct_error *err) {
    memset(r, 0, sizeof *r);
    r->passed = true;
    if (kernel_check_validate_shape(shape, err) != 0) return -1;
    for (int op = 0; op < OVERRIDE_N_OPS; op++) {
        const override_entry *e = &s->ops[op];
        if (e->set && (!e->forward || (!e->forward_only && !e->backward)))
            return ct_fail(err, "kernel check: %s is registered without a %s kernel",
                           override_op_name((override_op)op), e->forward ? "backward" : "forward");
        if (e->set && e->forward_only && op == OVERRIDE_MOE_EXPERTS) // plugin.h forbids it
            return ct_fail(err, "kernel check: moe_experts cannot be overridden forward only");
    }
    ct_ops plugin;
    override_apply(&plugin, builtin, s);
    size_t cap = 0;
    for (int op = 0; op < OVERRIDE_N_OPS; op++) {
        const override_entry *e = &s->ops[op];
        if (!e->set) continue;
        for (int model = 1; model >= 0; model--) {
            kc_case k = {.model = model, .inplace = model, .ops = {builtin, &plugin}};
            kc_rng g = {.seed = 0x6B65726E656C00ull + (uint64_t)op * 2 + (uint64_t)model};
            kc_ops[op].setup(&k, &g, shape);
            const int rc = k.oom ? -1 : check_case(r, &cap, (override_op)op, e, &k, progress);
            kc_release(&k);
            if (rc != 0) {
                kernel_check_free(r);
                return ct_fail(err, "kernel check: out of memory for %s (%s case)",
                               override_op_name((override_op)op), model ? "model" : "awkward");
            }
        }
    }
    return 0;
}

void kernel_check_free(kernel_check_report *r) {
    free(r->rows);
    r->rows = NULL;
    r->n_rows = 0;
}

// ---- reports ---------------------------------------------------------------------------------

static void fmt_speedup(char *buf, size_t cap, double x) {
    if (x > 0)
        snprintf(buf, cap, "%.2fx", x);
    else
        snprintf(buf, cap, "-");
}

void kernel_check_print(const kernel_check_report *r, const override_set *s, FILE *f) {
    fprintf(f, "%-14s %-9s %-8s %-8s %9s %9s %9s  %-6s %s\n", "op", "direction", "tensor", "case",
            "max abs", "max rel", "tolerance", "result", "vs built-in");
    int failed = 0;
    for (int i = 0; i < r->n_rows; i++) {
        const kernel_check_row *row = &r->rows[i];
        if (s && (i == 0 || strcmp(row->op, r->rows[i - 1].op) != 0)) {
            for (int op = 0; op < OVERRIDE_N_OPS; op++) {
                const override_entry *e = &s->ops[op];
                if (!e->set || strcmp(override_op_name((override_op)op), row->op) != 0) continue;
                fprintf(f, "%s (%s) from %s\n", row->op,
                        e->forward_only ? "forward only" : "forward and backward",
                        e->lib >= 0 && e->lib < OVERRIDE_MAX_LIBS ? s->libs[e->lib] : "?");
            }
        }
        char sp[32];
        fmt_speedup(sp, sizeof sp, row->speedup);
        fprintf(f, "%-14s %-9s %-8s %-8s %9.1e %9.1e %9.0e  %-6s %s\n", row->op, row->direction,
                row->tensor, row->case_name, row->max_abs, row->max_rel, row->tolerance,
                row->pass ? "pass" : "FAIL", sp);
        failed += !row->pass;
    }
    if (r->crashed)
        fprintf(f, "kernel check: CRASHED: %s\n", r->crash);
    else if (failed)
        fprintf(f, "kernel check: FAILED: %d of %d rows out of tolerance\n", failed, r->n_rows);
    else
        fprintf(f, "kernel check: passed: %d rows within tolerance\n", r->n_rows);
}

static void add_number(cJSON *o, const char *key, double v) {
    if (isfinite(v))
        cJSON_AddNumberToObject(o, key, v);
    else
        cJSON_AddNullToObject(o, key);
}

void kernel_check_json(const kernel_check_report *r, FILE *f) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddBoolToObject(root, "passed", r->passed && !r->crashed);
    if (r->crashed)
        cJSON_AddStringToObject(root, "crashed", r->crash);
    else
        cJSON_AddNullToObject(root, "crashed");
    cJSON *rows = cJSON_AddArrayToObject(root, "rows");
    for (int i = 0; rows && i < r->n_rows; i++) {
        const kernel_check_row *row = &r->rows[i];
        cJSON *o = cJSON_CreateObject();
        if (!o) break;
        cJSON_AddItemToArray(rows, o);
        cJSON_AddStringToObject(o, "op", row->op);
        cJSON_AddStringToObject(o, "direction", row->direction);
        cJSON_AddStringToObject(o, "tensor", row->tensor);
        cJSON_AddStringToObject(o, "case", row->case_name);
        add_number(o, "max_abs", row->max_abs);
        add_number(o, "max_rel", row->max_rel);
        add_number(o, "tolerance", row->tolerance);
        cJSON_AddBoolToObject(o, "pass", row->pass);
        add_number(o, "speedup", row->speedup > 0 ? row->speedup : NAN); // null: not measured
    }
    char *text = cJSON_PrintUnformatted(root);
    if (text) fputs(text, f);
    cJSON_free(text);
    cJSON_Delete(root);
}

void kernel_check_first_failure(const kernel_check_report *r, char *buf, size_t cap) {
    if (cap == 0) return;
    buf[0] = '\0';
    if (r->crashed) {
        snprintf(buf, cap, "%s", r->crash);
        return;
    }
    for (int i = 0; i < r->n_rows; i++) {
        const kernel_check_row *row = &r->rows[i];
        if (row->pass) continue;
        snprintf(buf, cap, "%s %s %s (%s case): max abs %.1e, max rel %.1e > tolerance %.0e",
                 row->op, row->direction, row->tensor, row->case_name, row->max_abs, row->max_rel,
                 row->tolerance);
        return;
    }
}
