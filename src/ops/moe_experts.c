// Mixture-of-experts SwiGLU experts (ct_ops moe_*): two implementations with one result order.
//
// Both follow HF's Qwen3MoeSparseMoeBlock: out[t] = 0.0f, then for each of t's experts in
// ascending id order out[t] += (weight * y_e) with the product rounded to fp32 first. The
// backward sums dx[t] in the same order. So the two differ only by how BLAS rounds differently
// shaped GEMMs.
//
//   loop     the reference, HF's eager per-expert loop: for each expert its tokens (ascending),
//            separate gate / up / down GEMMs, then added into out. Experts run one after
//            another, BLAS threads inside each GEMM.
//   grouped  the default: token slots sorted by expert once (a stable counting sort), all x rows
//            gathered in that order, one fused GEMM per expert against the contiguous (2F,C)
//            gate|up block, SwiGLU, one down GEMM, then a per-token combine. Small experts run
//            concurrently, one OpenMP thread and one single-threaded GEMM each; an expert too
//            big for that to balance runs alone with BLAS threads.
//
// Determinism: each expert's rows go through one GEMM call of a shape fixed by the routing,
// whichever thread runs it, and every expert's mode (concurrent or alone) depends on the
// routing and the BLAS thread count only. OpenBLAS rounds differently with a different number of
// its own threads, so results are bitwise reproducible for a fixed BLAS thread count and do not
// depend on the OpenMP thread count. (The bf16 variants, moe_experts_bf16.c, keep the plan, the
// order and the schedule; their GEMMs are oneDNN's on OpenMP threads, so theirs are reproducible
// for a fixed OpenMP thread count.)
//
// The per-layer state holds only what the backward needs (the plan and the gate/up outputs);
// the forward's workspace is the shared scratch, and the backward re-gathers x.
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "ops/moe_lora.h"
#include "ops/moe_plan.h"
#include "ops/ops.h"
#include "ops/ops_cpu.h"
#include "ops/vec_math.h"

// An expert runs alone with BLAS threads when it holds more than 1/nthreads of all slots (a
// concurrent schedule cannot balance it: with many cores one thread would carry the layer) and
// has at least this many multiply-adds per forward (3*F*C per row). Measured on the 2-core
// development machine, single GEMMs of the fused gate|up shape: 2 BLAS threads give 1.2x at
// ~2M multiply-adds, 1.4x from ~6M, 1.6-1.9x from ~75M. The bf16 kernels (moe_experts_bf16.c)
// share the schedule and this threshold.
#define MOE_ALONE_MIN_MACS ((int64_t)1 << 23)

// ---- the routing plan: slots sorted by expert (moe_plan.h) ---------------------------------

size_t moe_plan_floats(int N, int E, int K) {
    const size_t S = (size_t)N * K;
    return moe_align16((size_t)E + 1) + 2 * moe_align16(S) + moe_align16((size_t)E);
}

moe_plan moe_plan_at(const float *state, int N, int E, int K) {
    const size_t S = (size_t)N * K;
    int32_t *base = (int32_t *)state;
    moe_plan p;
    p.off = base;
    p.perm = p.off + moe_align16((size_t)E + 1);
    p.tpos = p.perm + moe_align16(S);
    p.order = p.tpos + moe_align16(S);
    return p;
}

void moe_plan_build(moe_plan p, const int32_t *expert, int N, int E, int K) {
    const int S = N * K;
    memset(p.off, 0, ((size_t)E + 1) * sizeof *p.off);
    for (int s = 0; s < S; s++) p.off[expert[s] + 1]++;
    for (int e = 0; e < E; e++) p.off[e + 1] += p.off[e];
    // off[e] serves as e's cursor, ending at e's end = (e+1)'s start; shifted back below.
    for (int s = 0; s < S; s++) p.perm[p.off[expert[s]]++] = s;
    for (int e = E; e > 0; e--) p.off[e] = p.off[e - 1];
    p.off[0] = 0;
    for (int r = 0; r < S; r++) p.tpos[p.perm[r]] = r;
    // A token's experts are distinct, so sorting its rows sorts its experts.
    for (int t = 0; t < N; t++) {
        int32_t *q = p.tpos + (size_t)t * K;
        for (int i = 1; i < K; i++) {
            const int32_t v = q[i];
            int j = i;
            for (; j > 0 && q[j - 1] > v; j--) q[j] = q[j - 1];
            q[j] = v;
        }
    }
    for (int e = 0; e < E; e++) {
        const int n = p.off[e + 1] - p.off[e];
        int j = e;
        for (; j > 0 && p.off[p.order[j - 1] + 1] - p.off[p.order[j - 1]] < n; j--)
            p.order[j] = p.order[j - 1];
        p.order[j] = e;
    }
}

// ---- shared pieces --------------------------------------------------------------------------
// The SwiGLU expressions are vec_math.h's swiglu_value / swiglu_grad, which the built-in swiglu
// uses too, so h and its gradients round alike in both implementations.

static double dot_d(const float *a, const float *b, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

// dst row r = src row of sorted row r's token, for sorted rows [r0, r1).
static void gather_rows(float *dst, const float *src, const int32_t *perm, int r0, int r1, int K,
                        int C) {
#pragma omp parallel for schedule(static) if ((int64_t)(r1 - r0) * C >= CPU_PAR_MIN)
    for (int r = r0; r < r1; r++)
        memcpy(dst + (size_t)(r - r0) * C, src + (size_t)(perm[r] / K) * C, (size_t)C * 4);
}

void moe_combine_rows(float *out, const float *rows, const float *weight, moe_plan p, int N, int C,
                      int K) {
#pragma omp parallel for schedule(static) if ((int64_t)N * K * C >= CPU_PAR_MIN)
    for (int t = 0; t < N; t++) {
        float *o = out + (size_t)t * C;
        for (int c = 0; c < C; c++) o[c] = 0.0f;
        for (int j = 0; j < K; j++) {
            const int r = p.tpos[(size_t)t * K + j];
            const float *y = rows + (size_t)r * C;
            if (weight) {
                const float wt = weight[p.perm[r]];
                for (int c = 0; c < C; c++) {
                    const float term = wt * y[c];
                    o[c] += term;
                }
            } else {
                for (int c = 0; c < C; c++) o[c] += y[c];
            }
        }
    }
}

void moe_add_rows(float *out, const float *rows, const int32_t *perm, int n, int K, int C) {
#pragma omp parallel for schedule(static) if ((int64_t)n * C >= CPU_PAR_MIN)
    for (int i = 0; i < n; i++) {
        float *o = out + (size_t)(perm[i] / K) * C;
        const float *g = rows + (size_t)i * C;
        for (int c = 0; c < C; c++) o[c] += g[c];
    }
}

// ---- loop (reference) -----------------------------------------------------------------------
// state: plan | gate (S,F) | up (S,F) in sorted-row order. scratch: forward x_e, y_e (N,C) |
// h_e (N,F); backward dout_e, x_e, dx_e (N,C) | u_e, h_e, dgate_e, dup_e (N,F).

size_t cpu_moe_loop_state_floats(int N, int C, int F, int E, int K) {
    (void)C;
    return moe_plan_floats(N, E, K) + 2 * moe_align16((size_t)N * K * F);
}

size_t cpu_moe_loop_scratch_floats(int N, int C, int F, int E, int K) {
    (void)E, (void)K;
    return 3 * moe_align16((size_t)N * C) + 4 * moe_align16((size_t)N * F);
}

void cpu_moe_loop_forward(float *out, float *state, float *scratch, const float *x,
                          const int32_t *expert, const float *weight, const float *w, int N, int C,
                          int F, int E, int K) {
    const size_t S = (size_t)N * K;
    moe_plan p = moe_plan_at(state, N, E, K);
    moe_plan_build(p, expert, N, E, K);
    float *gate = state + moe_plan_floats(N, E, K), *up = gate + moe_align16(S * F);
    float *xe = scratch, *ye = xe + moe_align16((size_t)N * C),
          *he = ye + moe_align16((size_t)N * C);
    memset(out, 0, (size_t)N * C * sizeof *out);
    for (int e = 0; e < E; e++) {
        const int r0 = p.off[e], n = p.off[e + 1] - r0;
        if (n == 0) continue;
        const float *wg = w + (size_t)e * 3 * F * C, *wu = wg + (size_t)F * C;
        const float *wd = wu + (size_t)F * C;
        float *ge = gate + (size_t)r0 * F, *ue = up + (size_t)r0 * F;
        gather_rows(xe, x, p.perm, r0, r0 + n, K, C);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, F, C, 1.0f, xe, C, wg, C, 0.0f, ge,
                    F);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, F, C, 1.0f, xe, C, wu, C, 0.0f, ue,
                    F);
        cpu_swiglu_forward(he, ge, ue, (int64_t)n * F);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, C, F, 1.0f, he, F, wd, F, 0.0f, ye,
                    C);
        // Experts in ascending order: each token's terms land in ascending expert order.
#pragma omp parallel for schedule(static) if ((int64_t)n * C >= CPU_PAR_MIN)
        for (int i = 0; i < n; i++) {
            const int slot = p.perm[r0 + i];
            const float wt = weight[slot];
            float *o = out + (size_t)(slot / K) * C;
            const float *y = ye + (size_t)i * C;
            for (int c = 0; c < C; c++) {
                const float term = wt * y[c];
                o[c] += term;
            }
        }
    }
}

void cpu_moe_loop_backward(float *dx, float *dweight, float *dw, float *scratch, const float *dout,
                           const float *state, const float *x, const int32_t *expert,
                           const float *weight, const float *w, int N, int C, int F, int E, int K) {
    (void)expert; // the forward's plan has it
    const size_t S = (size_t)N * K, NC = moe_align16((size_t)N * C),
                 NF = moe_align16((size_t)N * F);
    const moe_plan p = moe_plan_at(state, N, E, K);
    const float *gate = state + moe_plan_floats(N, E, K), *up = gate + moe_align16(S * F);
    float *de = scratch, *xe = de + NC, *dxe = xe + NC;
    float *ue = dxe + NC, *he = ue + NF, *dge = he + NF, *due = dge + NF;
    memset(dx, 0, (size_t)N * C * sizeof *dx);
    for (int e = 0; e < E; e++) {
        const int r0 = p.off[e], n = p.off[e + 1] - r0;
        if (n == 0) continue;
        const float *wg = w + (size_t)e * 3 * F * C, *wu = wg + (size_t)F * C;
        const float *wd = wu + (size_t)F * C;
        // dw NULL: frozen experts (LoRA's base), the input gradient only
        float *dwg = dw ? dw + (size_t)e * 3 * F * C : NULL, *dwu = dw ? dwg + (size_t)F * C : NULL;
        float *dwd = dw ? dwu + (size_t)F * C : NULL;
        const float *ge = gate + (size_t)r0 * F, *upe = up + (size_t)r0 * F;
        gather_rows(de, dout, p.perm, r0, r0 + n, K, C);
        gather_rows(xe, x, p.perm, r0, r0 + n, K, C);
        // U (n,F) = dout_e @ W_down: the gradient of h before the routing weight scales it.
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, F, C, 1.0f, de, C, wd, F, 0.0f,
                    ue, F);
        cpu_swiglu_forward(he, ge, upe, (int64_t)n * F);
#pragma omp parallel for schedule(static) if ((int64_t)n * (F + C) >= CPU_PAR_MIN)
        for (int i = 0; i < n; i++) {
            const int slot = p.perm[r0 + i];
            const float wt = weight[slot];
            float *u = ue + (size_t)i * F, *d = de + (size_t)i * C;
            dweight[slot] = (float)dot_d(u, he + (size_t)i * F, F);
            for (int f = 0; f < F; f++) u[f] = wt * u[f]; // dh
            for (int c = 0; c < C; c++) d[c] = wt * d[c]; // the gradient of y_e
        }
        cpu_swiglu_backward(dge, due, ue, ge, upe, (int64_t)n * F);
        if (dw) {
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, C, F, n, 1.0f, de, C, he, F, 1.0f,
                        dwd, F);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, F, C, n, 1.0f, dge, F, xe, C, 1.0f,
                        dwg, C);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, F, C, n, 1.0f, due, F, xe, C, 1.0f,
                        dwu, C);
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, C, F, 1.0f, dge, F, wg, C, 0.0f,
                    dxe, C);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, C, F, 1.0f, due, F, wu, C, 1.0f,
                    dxe, C);
        moe_add_rows(dx, dxe, p.perm + r0, n, K, C);
    }
}

// ---- grouped (default) ----------------------------------------------------------------------
// state: plan | gu (S,2F): each sorted row's gate outputs then up outputs, as the fused GEMM
// writes them. scratch, forward: xy (S,C): gathered x, then overwritten expert by expert with
// y | h (S,F); backward: a (S,C): gathered dout, scaled by the weight, then dx rows | b (S,C):
// gathered x | h (S,F) | dgu (S,2F): U in the gate half, then dgate | dup.

typedef struct grouped_args {
    moe_plan p;
    const float *x, *weight, *w, *dout;
    float *gu, *xy, *h;                     // forward
    float *a, *b, *hb, *dgu, *dweight, *dw; // backward
    const float *gus;                       // backward: the forward's gu
    moe_lora_ctx ml;                        // PEFT's LoRA on the experts (ml.lora NULL: none)
    int C, F, E, K;
    size_t S;
} grouped_args;

// ---- LoRA on the experts (ops.h's moe_lora_*; moe_lora.h has the layout and the masks) ------

// y (n rows, ldy apart) += the branch of module m of expert e on its input x (n, in).
static void expert_lora_forward(const grouped_args *g, int e, int m, int r0, int n, float *y,
                                int ldy, const float *x) {
    expert_lora a;
    if (!moe_expert_lora_at(&a, &g->ml, e, m, r0)) return;
    x = moe_expert_lora_dropout(&g->ml, &a, n, a.scratch, x); // the input gradient's rows: free
    cpu_lora_forward(y, NULL, ldy, a.u, moe_expert_lora_kernel_scratch(&g->ml, &a, n), x, a.A, a.B,
                     g->ml.lora->scale, false, n, a.in, g->ml.lora->r, a.out);
}

// The branch's backward for the output gradient dy (n rows, ldy apart) on input x (n, in) with
// u as saved (x dropped out, and x and u scaled where the caller folds a per-row factor into
// them): dA, dB +=; the input gradient, through the dropout mask, into dst (n rows, ldd apart),
// +=.
static void expert_lora_backward(const grouped_args *g, const expert_lora *a, int n, float *dst,
                                 int ldd, const float *dy, int ldy, const float *u,
                                 const float *x) {
    float *dxs = a->scratch;
    cpu_lora_backward_acc(dxs, a->dA, a->dB, moe_expert_lora_kernel_scratch(&g->ml, a, n), dy,
                          NULL, ldy, u, x, a->A, a->B, g->ml.lora->scale, false, n, a->in,
                          g->ml.lora->r, a->out, a->acc);
    moe_expert_lora_dropout(&g->ml, a, n, dxs, dxs);
    for (int i = 0; i < n; i++)
        for (int c = 0; c < a->in; c++) dst[(size_t)i * ldd + c] += dxs[(size_t)i * a->in + c];
}

static void grouped_forward_expert(const void *ctx, int e, int par) {
    const grouped_args *g = ctx;
    const int C = g->C, F = g->F, r0 = g->p.off[e], n = g->p.off[e + 1] - r0;
    const float *wgu = g->w + (size_t)e * 3 * F * C, *wd = wgu + (size_t)2 * F * C;
    float *gu = g->gu + (size_t)r0 * 2 * F, *xy = g->xy + (size_t)r0 * C;
    float *h = g->h + (size_t)r0 * F;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, 2 * F, C, 1.0f, xy, C, wgu, C, 0.0f, gu,
                2 * F);
    expert_lora_forward(g, e, 0, r0, n, gu, 2 * F, xy);
    expert_lora_forward(g, e, 1, r0, n, gu + F, 2 * F, xy);
#pragma omp parallel for schedule(static) if (par && (int64_t)n * F >= CPU_PAR_MIN)
    for (int i = 0; i < n; i++) {
        const float *gi = gu + (size_t)i * 2 * F, *ui = gi + F;
        float *hi = h + (size_t)i * F;
        for (int f = 0; f < F; f++) hi[f] = swiglu_value(gi[f], ui[f]);
    }
    // y overwrites the expert's gathered x, which the down GEMM no longer needs.
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, C, F, 1.0f, h, F, wd, F, 0.0f, xy, C);
    expert_lora_forward(g, e, 2, r0, n, xy, C, h);
}

static void grouped_backward_expert(const void *ctx, int e, int par) {
    const grouped_args *g = ctx;
    const int C = g->C, F = g->F, r0 = g->p.off[e], n = g->p.off[e + 1] - r0;
    const float *wgu = g->w + (size_t)e * 3 * F * C, *wd = wgu + (size_t)2 * F * C;
    // dw NULL: frozen experts (LoRA's base), the input gradient only
    float *dwgu = g->dw ? g->dw + (size_t)e * 3 * F * C : NULL;
    float *dwd = g->dw ? dwgu + (size_t)2 * F * C : NULL;
    const float *gu = g->gus + (size_t)r0 * 2 * F, *xe = g->b + (size_t)r0 * C;
    float *de = g->a + (size_t)r0 * C, *h = g->hb + (size_t)r0 * F;
    float *dgu = g->dgu + (size_t)r0 * 2 * F;
    // U (n,F) = dout_e @ W_down into the gate half of dgu.
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, F, C, 1.0f, de, C, wd, F, 0.0f, dgu,
                2 * F);
    expert_lora ad;
    if (moe_expert_lora_at(&ad, &g->ml, e, 2, r0)) {
        // down_proj's branch: U gets its input gradient for the unweighted dout, so that dweight
        // = U . h below counts the branch too; its dA and dB take y's gradient weight * dout,
        // folded into the inputs: h and u scaled per row by the weight.
        const int r = g->ml.lora->r;
        float *hw = ad.scratch + (size_t)n * moe_lora_widest(&g->ml),
              *uw = hw + (size_t)n * moe_lora_widest(&g->ml);
        for (int i = 0; i < n; i++) {
            const float *gi = gu + (size_t)i * 2 * F, *ui = gi + F;
            for (int f = 0; f < F; f++) hw[(size_t)i * F + f] = swiglu_value(gi[f], ui[f]);
        }
        moe_expert_lora_dropout(&g->ml, &ad, n, hw, hw);
        for (int i = 0; i < n; i++) {
            const float wt = g->weight[g->p.perm[r0 + i]];
            for (int f = 0; f < F; f++) hw[(size_t)i * F + f] *= wt;
            for (int k = 0; k < r; k++) uw[(size_t)i * r + k] = wt * ad.u[(size_t)i * r + k];
        }
        expert_lora_backward(g, &ad, n, dgu, 2 * F, de, C, uw, hw);
    }
#pragma omp parallel for schedule(static) if (par && (int64_t)n * (F + C) >= CPU_PAR_MIN)
    for (int i = 0; i < n; i++) {
        const int slot = g->p.perm[r0 + i];
        const float wt = g->weight[slot];
        const float *gi = gu + (size_t)i * 2 * F, *ui = gi + F;
        float *hi = h + (size_t)i * F, *dgi = dgu + (size_t)i * 2 * F, *d = de + (size_t)i * C;
        for (int f = 0; f < F; f++) hi[f] = swiglu_value(gi[f], ui[f]);
        g->dweight[slot] = (float)dot_d(dgi, hi, F);
        for (int f = 0; f < F; f++) {
            const float dh = wt * dgi[f];
            swiglu_grad(&dgi[f], &dgi[F + f], dh, gi[f], ui[f]);
        }
        for (int c = 0; c < C; c++) d[c] = wt * d[c]; // the gradient of y_e
    }
    if (g->dw) {
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, C, F, n, 1.0f, de, C, h, F, 1.0f, dwd,
                    F);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, 2 * F, C, n, 1.0f, dgu, 2 * F, xe, C,
                    1.0f, dwgu, C);
    }
    // dx_e (n,C) = dgu @ W_gate|up, into the dout rows (consumed by dW_down above).
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, C, 2 * F, 1.0f, dgu, 2 * F, wgu, C,
                0.0f, de, C);
    for (int m = 0; m < 2; m++) // gate_proj's and up_proj's branches on the gathered x
        if (moe_expert_lora_at(&ad, &g->ml, e, m, r0))
            expert_lora_backward(
                g, &ad, n, de, C, dgu + (size_t)m * F, 2 * F, ad.u,
                moe_expert_lora_dropout(&g->ml, &ad, n,
                                        ad.scratch + (size_t)n * moe_lora_widest(&g->ml), xe));
}

void moe_run_experts(const moe_plan *pp, int E, int S, int64_t row_macs, int threads, bool blas,
                     moe_expert_task task, const void *ctx) {
    const moe_plan p = *pp;
    // order is by decreasing size and "alone" only grows with size: the experts that run alone
    // come first, then the concurrent ones, then those without rows.
    int j = 0;
    for (; j < E; j++) {
        const int64_t n = p.off[p.order[j] + 1] - p.off[p.order[j]];
        if (!(threads > 1 && n * threads > S && n * row_macs >= MOE_ALONE_MIN_MACS)) break;
        task(ctx, p.order[j], 1);
    }
    const int first = j;
    int64_t small_macs = 0;
    for (; j < E && p.off[p.order[j] + 1] > p.off[p.order[j]]; j++)
        small_macs += (p.off[p.order[j] + 1] - p.off[p.order[j]]) * row_macs;
    const int end = j;
    if (end == first) return;
    // OpenBLAS's own threads (its pthread build) would each run a GEMM inside every thread of
    // the loop below: one thread each. Its OpenMP build runs single-threaded inside a parallel
    // region by itself, and there openblas_set_num_threads calls omp_set_num_threads: setting 1
    // would leave the loop on one thread.
    const bool own_threads = blas && openblas_get_parallel() != OPENBLAS_OPENMP;
    if (own_threads) openblas_set_num_threads(1);
        // Largest first: the dynamic schedule then approximates longest-processing-time-first.
#pragma omp parallel for schedule(dynamic, 1) if (end - first > 1 && small_macs >= CPU_PAR_MIN)
    for (int i = first; i < end; i++) task(ctx, p.order[i], 0);
    if (own_threads) openblas_set_num_threads(threads);
}

// Runs task(e) for every expert with rows: the big ones one after another with BLAS threads
// (and OpenMP inside their elementwise loops), the rest concurrently with single-threaded BLAS.
static void grouped_run(const grouped_args *g, moe_expert_task task, int E, int S) {
    moe_run_experts(&g->p, E, S, (int64_t)3 * g->F * g->C, openblas_get_num_threads(), true, task,
                    g);
}

size_t cpu_moe_grouped_state_floats(int N, int C, int F, int E, int K) {
    (void)C;
    return moe_plan_floats(N, E, K) + moe_align16((size_t)N * K * 2 * F);
}

size_t cpu_moe_grouped_scratch_floats(int N, int C, int F, int E, int K) {
    (void)E;
    const size_t S = (size_t)N * K;
    return 2 * moe_align16(S * C) + moe_align16(S * F) + moe_align16(S * 2 * F);
}

// What both directions set: the plan in the state, the inputs, the sizes.
static grouped_args grouped_args_of(const float *state, const float *x, const float *weight,
                                    const float *w, const ct_moe_lora *lora, int N, int C, int F,
                                    int E, int K) {
    const moe_plan p = moe_plan_at(state, N, E, K);
    return (grouped_args){.p = p,
                          .x = x,
                          .weight = weight,
                          .w = w,
                          .ml = {lora, p.perm, C, F, E, K, (size_t)N * K},
                          .C = C,
                          .F = F,
                          .E = E,
                          .K = K,
                          .S = (size_t)N * K};
}

static void grouped_forward(float *out, float *state, float *scratch, const float *x,
                            const int32_t *expert, const float *weight, const float *w,
                            const ct_moe_lora *lora, int N, int C, int F, int E, int K) {
    const size_t S = (size_t)N * K;
    grouped_args g = grouped_args_of(state, x, weight, w, lora, N, C, F, E, K);
    moe_plan_build(g.p, expert, N, E, K);
    g.gu = state + moe_plan_floats(N, E, K);
    g.xy = scratch;
    g.h = g.xy + moe_align16(S * C);
    gather_rows(g.xy, x, g.p.perm, 0, (int)S, K, C);
    grouped_run(&g, grouped_forward_expert, E, (int)S);
    moe_combine_rows(out, g.xy, weight, g.p, N, C, K);
}

void cpu_moe_grouped_forward(float *out, float *state, float *scratch, const float *x,
                             const int32_t *expert, const float *weight, const float *w, int N,
                             int C, int F, int E, int K) {
    grouped_forward(out, state, scratch, x, expert, weight, w, NULL, N, C, F, E, K);
}

void cpu_moe_grouped_lora_forward(float *out, float *state, float *scratch, const float *x,
                                  const int32_t *expert, const float *weight, const float *w,
                                  const ct_moe_lora *lora, int N, int C, int F, int E, int K) {
    grouped_forward(out, state, scratch, x, expert, weight, w, lora, N, C, F, E, K);
}

static void grouped_backward(float *dx, float *dweight, float *dw, float *scratch,
                             const float *dout, const float *state, const float *x,
                             const float *weight, const float *w, const ct_moe_lora *lora, int N,
                             int C, int F, int E, int K) {
    const size_t S = (size_t)N * K;
    grouped_args g = grouped_args_of(state, x, weight, w, lora, N, C, F, E, K);
    g.dout = dout, g.dweight = dweight, g.dw = dw;
    g.gus = state + moe_plan_floats(N, E, K);
    g.a = scratch;
    g.b = g.a + moe_align16(S * C);
    g.hb = g.b + moe_align16(S * C);
    g.dgu = g.hb + moe_align16(S * F);
    gather_rows(g.a, dout, g.p.perm, 0, (int)S, K, C);
    gather_rows(g.b, x, g.p.perm, 0, (int)S, K, C);
    grouped_run(&g, grouped_backward_expert, E, (int)S);
    moe_combine_rows(dx, g.a, NULL, g.p, N, C, K);
}

void cpu_moe_grouped_backward(float *dx, float *dweight, float *dw, float *scratch,
                              const float *dout, const float *state, const float *x,
                              const int32_t *expert, const float *weight, const float *w, int N,
                              int C, int F, int E, int K) {
    (void)expert; // the forward's plan has it
    grouped_backward(dx, dweight, dw, scratch, dout, state, x, weight, w, NULL, N, C, F, E, K);
}

void cpu_moe_grouped_lora_backward(float *dx, float *dweight, float *scratch, const float *dout,
                                   const float *state, const float *x, const int32_t *expert,
                                   const float *weight, const float *w, const ct_moe_lora *lora,
                                   int N, int C, int F, int E, int K) {
    (void)expert;
    grouped_backward(dx, dweight, NULL, scratch, dout, state, x, weight, w, lora, N, C, F, E, K);
}
