// The MoE experts under bf16 mixed precision (ct_ops moe_bf16_*): moe_experts.c's two
// implementations, loop and grouped, with their GEMMs in bf16 (oneDNN, fp32 accumulation), as
// torch.autocast("cpu", dtype=torch.bfloat16) runs HF's Qwen3MoeSparseMoeBlock:
//
//   forward   each expert's x rows in bf16 (x16: the model's saved bf16 copy of its input, as
//             autocast rounds x for each Linear); gate, up = x @ W^T rounded to bf16 (autocast's
//             Linear outputs); h = silu(gate) * up as torch computes it on bf16 tensors, every
//             step rounded (below); y = h @ W_down^T rounded to bf16; then out[t] = sum over t's
//             experts in ascending order of (weight * y), in fp32, as the fp32 kernels (HF's mul
//             by the fp32 routing weight and its fp32 index_add_). Given the same inputs it gave
//             torch 1.13's output bit for bit on a 64-token block (only a GEMM's other summation
//             order, tipping a rounding, can make them differ).
//   backward  every GEMM takes bf16-rounded inputs and accumulates in fp32: U = dout @ W_down
//             (dout rows rounded; U is the gradient of h before the routing weight scales it),
//             dh = bf16(weight * U), SwiGLU's backward every step rounded as torch's, dW_down +=
//             bf16(weight * dout)^T @ h (y's gradient, rounded as torch rounds a gradient
//             reaching a bf16 tensor), dW_gate|up += bf16(dgate | dup)^T @ x and dx =
//             bf16(dgate | dup) @ W_gate|up. The weight gradients go straight into the fp32
//             gradient (oneDNN's sum post-op) and dx stays fp32, as the linear layers' (torch
//             rounds each of these products to bf16 first; and it rounds weight * dout before
//             the GEMM that gives dh, where this rounds dout and scales after, so that U also
//             gives dweight = U . h, in double as the fp32 kernels, with no GEMM more).
//
// The weights are the model's bf16 copy (param_bf16: each expert's (2F,C) gate|up block then its
// (C,F) down, as in fp32). The state holds gate and up in bf16 (they are bf16 values), half of
// what the fp32 kernels keep; h is recomputed from them in the backward, x re-gathered.
//
// The GEMMs: tokens per expert change every step, so each product is a oneDNN matmul with one
// runtime dimension (the rows; for dW the reduction), the ten of them created once per (C, F) by
// the scratch size query when the model plans its buffers, and kept in the kernel state of the
// table's backend (cpu_kernels.h). oneDNN 2.6 runs them through its gemm
// driver (AVX512-BF16 where the CPU has it), which takes no scratchpad but allocates its packing
// buffers in each call (onednn.h). Measured on the development machine's Zen 4, single-threaded:
// 1.6-2.1x sgemm's speed from 64 rows per expert up, 1.3-2.1x at 32, 0.7-2.8x at 8 (2 threads:
// 2.9-6x from 32 rows). Since ctitan allocates nothing inside a step, that path is opt-in
// (CTITAN_BF16_MOE_GEMM=onednn); the default is the emulation: sgemm on the operands widened from
// bf16 (exact products, fp32 sums), the same products at sgemm's speed.
//
// Determinism: as in fp32, every expert's rows go through one call per product, of a shape fixed
// by the routing, and its mode (alone, with every OpenMP thread inside oneDNN, or concurrently on
// one thread: oneDNN runs single-threaded inside a parallel region) depends on the routing and
// the OpenMP thread count. So results are bitwise reproducible for a fixed OpenMP thread count,
// and may change with it.
#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/grow.h"
#include "ops/bf16_round.h"
#include "ops/moe_lora.h"
#include "ops/moe_plan.h"
#include "ops/onednn.h"
#include "ops/ops_cpu.h"
#include "ops/swiglu_bf16.h"
#include "ops/vec_math.h"

// ---- the GEMMs, per (C, F) ------------------------------------------------------------------

typedef enum {
    FWD_GU,    // gu (n,2F) bf16 = x (n,C) @ W_gate|up^T                    grouped
    FWD_G,     // g (n,F) bf16 = x (n,C) @ W^T, W gate or up                loop
    FWD_D,     // y (n,C) fp32 = h (n,F) @ W_down^T                         both
    BWD_U,     // U (n,F) fp32 = dout (n,C) @ W_down                        both
    BWD_DX_GU, // dx (n,C) = dgu (n,2F) @ W_gate|up                         grouped
    BWD_DX_G,  // dx (n,C) = dg (n,F) @ W_gate                              loop
    BWD_DX_G1, // dx (n,C) += du (n,F) @ W_up                               loop
    BWD_DW_D,  // dW_down (C,F) += d^T (C,n) @ h (n,F)                      both
    BWD_DW_GU, // dW_gate|up (2F,C) += dgu^T (2F,n) @ x (n,C)               grouped
    BWD_DW_G,  // dW (F,C) += dg^T (F,n) @ x (n,C), W gate or up            loop
    N_GEMMS
} gemm_kind;

typedef struct expert_gemms {
    int C, F;
    // Where oneDNN has no bf16 matmul (or CTITAN_BF16_GEMM=emulated; as the linear layers,
    // matmul_bf16.c), the same products on sgemm over the bf16 values widened to fp32; the
    // operands' descriptors (mm[k].op) say how.
    bool emulated;
    bool accumulate[N_GEMMS];
    onednn_rt_matmul mm[N_GEMMS];
} expert_gemms;

// The (C, F) shapes made so far are a kernel state's list that grows (cpu_kernels.moe_shapes).

static onednn_rt_operand opd(int64_t rows, int64_t cols, int64_t rs, int64_t cs,
                             dnnl_data_type_t t) {
    return (onednn_rt_operand){rows, cols, rs, cs, t};
}

static expert_gemms *find_shape(cpu_kernels *k, int C, int F) {
    for (size_t i = 0; k && i < k->n_moe_shapes; i++)
        if (k->moe_shapes[i].C == C && k->moe_shapes[i].F == F) return &k->moe_shapes[i];
    return NULL;
}

void moe_experts_bf16_free(cpu_kernels *k) {
    for (size_t i = 0; i < k->n_moe_shapes; i++)
        for (int g = 0; g < N_GEMMS; g++)
            if (k->moe_shapes[i].mm[g].prim) dnnl_primitive_destroy(k->moe_shapes[i].mm[g].prim);
    free(k->moe_shapes);
    k->moe_shapes = NULL, k->n_moe_shapes = k->cap_moe_shapes = 0;
}

static const expert_gemms *prepare(cpu_kernels *k, int C, int F) {
    expert_gemms *s = find_shape(k, C, F);
    if (s) return s;
    if (grow_to((void **)&k->moe_shapes, &k->cap_moe_shapes, k->n_moe_shapes + 1,
                sizeof *k->moe_shapes) != 0)
        return NULL;
    s = &k->moe_shapes[k->n_moe_shapes];
    *s = (expert_gemms){.C = C, .F = F};
    const dnnl_data_type_t b = dnnl_bf16, f = dnnl_f32;
    const int64_t R = DNNL_RUNTIME_DIM_VAL, G = 2 * (int64_t)F;
    const struct {
        onednn_rt_operand src, weights, dst;
        bool accumulate;
    } spec[N_GEMMS] = {
        [FWD_GU] = {opd(R, C, C, 1, b), opd(C, G, 1, C, b), opd(R, G, G, 1, b), false},
        [FWD_G] = {opd(R, C, C, 1, b), opd(C, F, 1, C, b), opd(R, F, F, 1, b), false},
        [FWD_D] = {opd(R, F, F, 1, b), opd(F, C, 1, F, b), opd(R, C, C, 1, f), false},
        [BWD_U] = {opd(R, C, C, 1, b), opd(C, F, F, 1, b), opd(R, F, F, 1, f), false},
        [BWD_DX_GU] = {opd(R, G, G, 1, b), opd(G, C, C, 1, b), opd(R, C, C, 1, f), false},
        [BWD_DX_G] = {opd(R, F, F, 1, b), opd(F, C, C, 1, b), opd(R, C, C, 1, f), false},
        [BWD_DX_G1] = {opd(R, F, F, 1, b), opd(F, C, C, 1, b), opd(R, C, C, 1, f), true},
        [BWD_DW_D] = {opd(C, R, 1, C, b), opd(R, F, F, 1, b), opd(C, F, F, 1, f), true},
        [BWD_DW_GU] = {opd(G, R, 1, G, b), opd(R, C, C, 1, b), opd(G, C, C, 1, f), true},
        [BWD_DW_G] = {opd(F, R, 1, F, b), opd(R, C, C, 1, b), opd(F, C, C, 1, f), true},
    };
    // oneDNN 2.6 runs runtime shapes only through its gemm driver, which allocates packing
    // buffers (100-300 KB) and its memory objects in every call. ctitan allocates nothing inside
    // a step, so the experts take the allocation-free emulation unless CTITAN_BF16_MOE_GEMM=onednn
    // opts in to oneDNN (measured 1.6-2.1x the emulation's GEMMs from 64 rows per expert).
    const char *opt_in = getenv("CTITAN_BF16_MOE_GEMM");
    s->emulated = matmul_bf16_emulated(k) || !opt_in || strcmp(opt_in, "onednn") != 0;
    for (int g = 0; g < N_GEMMS; g++) {
        s->accumulate[g] = spec[g].accumulate;
        if (s->emulated || onednn_rt_create(k, &s->mm[g], spec[g].src, spec[g].weights, spec[g].dst,
                                            spec[g].accumulate))
            s->emulated = true;
        s->mm[g].op[0] = spec[g].src, s->mm[g].op[1] = spec[g].weights;
        s->mm[g].op[2] = spec[g].dst;
    }
    k->n_moe_shapes++;
    return s;
}

// ---- the emulation: sgemm on the bf16 operands widened to fp32 (exact products, fp32 sums) ----

static int64_t dim(int64_t d, int64_t n) {
    return d == DNNL_RUNTIME_DIM_VAL ? n : d;
}

// Elements an operand spans in memory, with its runtime dimension n (stored row- or
// column-major: unit column or row stride).
static size_t extent(const onednn_rt_operand *o, int64_t n) {
    return (size_t)(o->cs == 1 ? dim(o->rows, n) * o->rs : dim(o->cols, n) * o->cs);
}

// Floats of emulation scratch for up to `rows` rows: each operand widened, and a bf16 result
// staged in fp32, for the largest of the GEMMs.
static size_t emulated_floats(const expert_gemms *s, size_t rows) {
    size_t most = 0;
    for (int k = 0; k < N_GEMMS; k++) {
        const onednn_rt_operand *o = s->mm[k].op;
        size_t n = extent(&o[0], (int64_t)rows) + extent(&o[1], (int64_t)rows);
        if (o[2].t == dnnl_bf16) n += extent(&o[2], (int64_t)rows);
        if (n > most) most = n;
    }
    return moe_align16(most);
}

static void widen(float *dst, const uint16_t *src, size_t n) {
#pragma omp parallel for simd schedule(static) if (n >= CPU_PAR_MIN)
    for (size_t i = 0; i < n; i++) dst[i] = bf16_value(src[i]);
}

static void emulated_gemm(const expert_gemms *s, gemm_kind k, int n, const uint16_t *src,
                          const uint16_t *weights, void *dst, float *scratch) {
    const onednn_rt_operand *a = &s->mm[k].op[0], *b = &s->mm[k].op[1], *d = &s->mm[k].op[2];
    const int64_t M = dim(a->rows, n), K = dim(a->cols, n), N = dim(b->cols, n);
    float *A = scratch, *B = A + extent(a, n), *D = B + extent(b, n);
    widen(A, src, extent(a, n));
    widen(B, weights, extent(b, n));
    float *out = d->t == dnnl_bf16 ? D : dst;
    cblas_sgemm(CblasRowMajor, a->cs == 1 ? CblasNoTrans : CblasTrans,
                b->cs == 1 ? CblasNoTrans : CblasTrans, (int)M, (int)N, (int)K, 1.0f, A,
                (int)(a->cs == 1 ? a->rs : a->cs), B, (int)(b->cs == 1 ? b->rs : b->cs),
                s->accumulate[k] ? 1.0f : 0.0f, out, (int)d->rs);
    if (d->t == dnnl_bf16) cpu_f32_to_bf16(dst, D, extent(d, n));
}

// The shape's GEMMs: created in the table's kernel state when the model planned its buffers.
static const expert_gemms *planned(const ct_ops *ops, int C, int F) {
    const expert_gemms *s = find_shape(cpu_kernels_of(ops), C, F);
    if (!s) {
        fprintf(stderr, "ctitan: internal error: the bf16 experts C %d F %d were not planned%s\n",
                C, F, cpu_kernels_of(ops) ? "" : " (the op table is bound to no backend)");
        abort();
    }
    return s;
}

// One of the GEMMs with n rows (dW: n terms). emu: the emulation's scratch (emulated_floats).
static void gemm(const expert_gemms *s, gemm_kind k, int n, const uint16_t *src,
                 const uint16_t *weights, void *dst, float *emu) {
    if (s->emulated)
        emulated_gemm(s, k, n, src, weights, dst, emu);
    else
        onednn_rt_run(&s->mm[k], n, src, weights, dst);
}

// ---- shared pieces --------------------------------------------------------------------------

// Floats holding n bf16 values, a multiple of 16 (64 bytes).
static size_t half_floats(size_t n) {
    return moe_align16((n + 1) / 2);
}

// dst row r (bf16) = src row of sorted row r's token, rounded, for sorted rows [r0, r1).
static void gather_rows_bf16(uint16_t *dst, const float *src, const int32_t *perm, int r0, int r1,
                             int K, int C) {
#pragma omp parallel for schedule(static) if ((int64_t)(r1 - r0) * C >= CPU_PAR_MIN)
    for (int r = r0; r < r1; r++) {
        const float *s = src + (size_t)(perm[r] / K) * C;
        uint16_t *d = dst + (size_t)(r - r0) * C;
        for (int c = 0; c < C; c++) d[c] = bf16_round(s[c]);
    }
}

// The same for rows already in bf16 (x: the model saves its bf16 copy).
static void gather_rows16(uint16_t *dst, const uint16_t *src, const int32_t *perm, int r0, int r1,
                          int K, int C) {
#pragma omp parallel for schedule(static) if ((int64_t)(r1 - r0) * C >= CPU_PAR_MIN)
    for (int r = r0; r < r1; r++)
        memcpy(dst + (size_t)(r - r0) * C, src + (size_t)(perm[r] / K) * C, (size_t)C * 2);
}

// y rows rounded to bf16 in place (the down GEMM's output, as autocast rounds it).
static void round_rows(float *y, int64_t n, int par) {
#pragma omp parallel for simd schedule(static) if (par && n >= CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) y[i] = bf16_value(bf16_round(y[i]));
}

// One sorted row's elementwise backward, between the U GEMM and the rest: h recomputed (bf16),
// *dweight = U . h, dg | du = bf16 of SwiGLU's backward of dh = wt * U, and d = bf16(wt * dout),
// the gradient of y. With LoRA on down_proj (grouped only): dh as given (bf16 values: the base's
// and the branch's gradients summed), and *dweight also counts the branch's term t of y, dout . t.
static void row_backward(uint16_t *h, uint16_t *dg, uint16_t *du, uint16_t *d, float *dweight,
                         const uint16_t *g, const uint16_t *u, const float *U, const float *dout,
                         float wt, int F, int C, const float *dh, const float *t) {
    swiglu_row(h, g, u, F);
    double s = 0;
    for (int f = 0; f < F; f++) s += (double)U[f] * bf16_value(h[f]);
    for (int c = 0; t && c < C; c++) s += (double)dout[c] * t[c];
    *dweight = (float)s;
    if (dh) // bf16(1 * dh) = dh: dh holds bf16 values
        swiglu_grad_row(dg, du, dh, 1.0f, g, u, F);
    else
        swiglu_grad_row(dg, du, U, wt, g, u, F);
    for (int c = 0; c < C; c++) d[c] = bf16_round(wt * dout[c]);
}

// The scratch of both implementations for `rows` rows (the loop: N, one expert at a time;
// grouped: S, all of them): forward x | h | y, backward dout then d | x | h | U | dgate|dup | dx.
typedef struct bf16_scratch {
    uint16_t *a; // (rows,C): x (forward), dout then bf16(weight * dout) (backward)
    uint16_t *b; // (rows,C): x (backward)
    uint16_t *h; // (rows,F)
    float *u;    // (rows,F): U
    uint16_t *g; // (rows,2F): dgate | dup (grouped: per row; loop: dgate rows, then dup rows)
    float *y;    // (rows,C): y (forward), dx rows (backward)
    float *e;    // the emulation's (emulated_floats; none with oneDNN)
} bf16_scratch;

static float *take(float *base, size_t *off, size_t n) {
    float *p = base ? base + *off : NULL;
    *off += n;
    return p;
}

static size_t scratch_layout(bf16_scratch *s, float *base, size_t rows, const expert_gemms *mm) {
    const int C = mm->C, F = mm->F;
    const size_t nc = half_floats(rows * C), nf = half_floats(rows * F);
    size_t off = 0;
    s->a = (uint16_t *)take(base, &off, nc);
    s->b = (uint16_t *)take(base, &off, nc);
    s->h = (uint16_t *)take(base, &off, nf);
    s->u = take(base, &off, moe_align16(rows * F));
    s->g = (uint16_t *)take(base, &off, half_floats(rows * 2 * F));
    s->y = take(base, &off, moe_align16(rows * C));
    s->e = take(base, &off, mm->emulated ? emulated_floats(mm, rows) : 0);
    return off;
}

// What the scratch size queries answer: SIZE_MAX when the GEMMs cannot be prepared.
static size_t scratch_floats(const ct_ops *ops, size_t rows, int C, int F) {
    cpu_kernels own, *k = cpu_kernels_or_own(ops, &own);
    const expert_gemms *mm = prepare(k, C, F);
    bf16_scratch s;
    const size_t n = mm ? scratch_layout(&s, NULL, rows, mm) : SIZE_MAX;
    if (k == &own) cpu_kernels_free(&own);
    return n;
}

// ---- loop -----------------------------------------------------------------------------------
// state: plan | gate (S,F) bf16 | up (S,F) bf16, in sorted-row order.

size_t cpu_moe_loop_bf16_state_floats(int N, int C, int F, int E, int K) {
    (void)C;
    return moe_plan_floats(N, E, K) + 2 * half_floats((size_t)N * K * F);
}

size_t cpu_moe_loop_bf16_scratch_floats(const ct_ops *ops, int N, int C, int F, int E, int K) {
    (void)E, (void)K;
    return scratch_floats(ops, (size_t)N, C, F);
}

void cpu_moe_loop_bf16_forward(const ct_ops *ops, float *out, float *state, float *scratch,
                               const uint16_t *x16, const int32_t *expert, const float *weight,
                               const uint16_t *w, int N, int C, int F, int E, int K) {
    const expert_gemms *mm = planned(ops, C, F);
    const size_t S = (size_t)N * K;
    moe_plan p = moe_plan_at(state, N, E, K);
    moe_plan_build(p, expert, N, E, K);
    uint16_t *gate = (uint16_t *)(state + moe_plan_floats(N, E, K));
    uint16_t *up = gate + 2 * half_floats(S * F);
    bf16_scratch s;
    scratch_layout(&s, scratch, (size_t)N, mm);
    memset(out, 0, (size_t)N * C * sizeof *out);
    for (int e = 0; e < E; e++) {
        const int r0 = p.off[e], n = p.off[e + 1] - r0;
        if (n == 0) continue;
        const uint16_t *wg = w + (size_t)e * 3 * F * C, *wu = wg + (size_t)F * C;
        const uint16_t *wd = wu + (size_t)F * C;
        uint16_t *ge = gate + (size_t)r0 * F, *ue = up + (size_t)r0 * F;
        gather_rows16(s.a, x16, p.perm, r0, r0 + n, K, C);
        gemm(mm, FWD_G, n, s.a, wg, ge, s.e);
        gemm(mm, FWD_G, n, s.a, wu, ue, s.e);
#pragma omp parallel for schedule(static) if ((int64_t)n * F >= CPU_PAR_MIN)
        for (int i = 0; i < n; i++)
            swiglu_row(s.h + (size_t)i * F, ge + (size_t)i * F, ue + (size_t)i * F, F);
        gemm(mm, FWD_D, n, s.h, wd, s.y, s.e);
        // Experts in ascending order: each token's terms land in ascending expert order.
#pragma omp parallel for schedule(static) if ((int64_t)n * C >= CPU_PAR_MIN)
        for (int i = 0; i < n; i++) {
            const int slot = p.perm[r0 + i];
            const float wt = weight[slot];
            float *o = out + (size_t)(slot / K) * C;
            const float *y = s.y + (size_t)i * C;
            for (int c = 0; c < C; c++) {
                const float term = wt * bf16_value(bf16_round(y[c]));
                o[c] += term;
            }
        }
    }
}

void cpu_moe_loop_bf16_backward(const ct_ops *ops, float *dx, float *dweight, float *dw,
                                float *scratch, const float *dout, const float *state,
                                const uint16_t *x16, const int32_t *expert, const float *weight,
                                const uint16_t *w, int N, int C, int F, int E, int K) {
    (void)expert; // the forward's plan has it
    const expert_gemms *mm = planned(ops, C, F);
    const size_t S = (size_t)N * K;
    const moe_plan p = moe_plan_at(state, N, E, K);
    const uint16_t *gate = (const uint16_t *)(state + moe_plan_floats(N, E, K));
    const uint16_t *up = gate + 2 * half_floats(S * F);
    bf16_scratch s;
    scratch_layout(&s, scratch, (size_t)N, mm);
    uint16_t *dg = s.g, *du = s.g + (size_t)N * F;
    memset(dx, 0, (size_t)N * C * sizeof *dx);
    for (int e = 0; e < E; e++) {
        const int r0 = p.off[e], n = p.off[e + 1] - r0;
        if (n == 0) continue;
        const uint16_t *wg = w + (size_t)e * 3 * F * C, *wu = wg + (size_t)F * C;
        const uint16_t *wd = wu + (size_t)F * C;
        // dw NULL: frozen experts (LoRA's base), the input gradient only
        float *dwg = dw ? dw + (size_t)e * 3 * F * C : NULL, *dwu = dw ? dwg + (size_t)F * C : NULL;
        float *dwd = dw ? dwu + (size_t)F * C : NULL;
        const uint16_t *ge = gate + (size_t)r0 * F, *ue = up + (size_t)r0 * F;
        gather_rows_bf16(s.a, dout, p.perm, r0, r0 + n, K, C);
        gather_rows16(s.b, x16, p.perm, r0, r0 + n, K, C);
        gemm(mm, BWD_U, n, s.a, wd, s.u, s.e);
#pragma omp parallel for schedule(static) if ((int64_t)n * (F + C) >= CPU_PAR_MIN)
        for (int i = 0; i < n; i++) {
            const int slot = p.perm[r0 + i];
            const size_t f = (size_t)i * F;
            row_backward(s.h + f, dg + f, du + f, s.a + (size_t)i * C, &dweight[slot], ge + f,
                         ue + f, s.u + f, dout + (size_t)(slot / K) * C, weight[slot], F, C, NULL,
                         NULL);
        }
        if (dw) {
            gemm(mm, BWD_DW_D, n, s.a, s.h, dwd, s.e);
            gemm(mm, BWD_DW_G, n, dg, s.b, dwg, s.e);
            gemm(mm, BWD_DW_G, n, du, s.b, dwu, s.e);
        }
        gemm(mm, BWD_DX_G, n, dg, wg, s.y, s.e);
        gemm(mm, BWD_DX_G1, n, du, wu, s.y, s.e);
        moe_add_rows(dx, s.y, p.perm + r0, n, K, C);
    }
}

// ---- grouped (default) ----------------------------------------------------------------------
// state: plan | gu (S,2F) bf16: each sorted row's gate outputs then up outputs, as the fused
// GEMM writes them. scratch: bf16_scratch for S rows, every row at its sorted position.

typedef struct grouped_args {
    const expert_gemms *mm;
    moe_plan p;
    const float *weight, *dout;
    const uint16_t *w;
    uint16_t *gu;       // forward: the state's
    const uint16_t *gs; // backward: the forward's gu
    bf16_scratch s;
    float *dweight, *dw;
    moe_lora_ctx ml; // PEFT's LoRA on the experts (ml.lora NULL: none)
    int C, F, K;
} grouped_args;

// ---- LoRA on the experts (moe_bf16_lora_*) ---------------------------------------------------
// PEFT's lora.Linear under torch.autocast on each adapted expert projection, as lora_forward /
// lora_backward's bf16 arithmetic (lora.c): the base output (bf16) plus the branch's rounded
// term, rounded; the branch's input is the projection's bf16 input (x, or h for down_proj)
// through its dropout. Backward: the output gradient is the bf16 one the base sees (dgate|dup,
// or y's bf16(weight * dout)), dA and dB get the rounded products, and the branch's input
// gradient (bf16, through the dropout mask) joins the base's: into dx (fp32, as the base's), or
// into dh before SwiGLU's backward, rounded as autograd sums two bf16 gradients.

// dst (n, in) fp32 = the bf16 rows x16 widened, through the branch's dropout.
static const float *lora_input16(const grouped_args *g, const expert_lora *a, int n, float *dst,
                                 const uint16_t *x16) {
    widen(dst, x16, (size_t)n * a->in);
    return moe_expert_lora_dropout(&g->ml, a, n, dst, dst);
}

// y (n rows, ldy apart; or y16, the bf16 block) += module m's branch of expert e on x16 (n, in).
static void lora_forward16(const grouped_args *g, int e, int m, int r0, int n, float *y,
                           uint16_t *y16, int ldy, const uint16_t *x16) {
    expert_lora a;
    if (!moe_expert_lora_at(&a, &g->ml, e, m, r0)) return;
    const ct_moe_lora *lo = g->ml.lora;
    const float *x = lora_input16(g, &a, n, a.scratch, x16); // the input gradient's rows: free
    cpu_lora_forward(y, y16, ldy, a.u, moe_expert_lora_kernel_scratch(&g->ml, &a, n), x, a.A, a.B,
                     lo->scale, true, n, a.in, lo->r, a.out);
}

// The branch's backward from the bf16 output gradient dy16 (n rows, ldy apart) on x16 (n, in):
// dA, dB +=; returns its input gradient (n, in), through the dropout mask, in bf16 values.
static float *lora_backward16(const grouped_args *g, const expert_lora *a, int n,
                              const uint16_t *dy16, int ldy, const uint16_t *x16) {
    const ct_moe_lora *lo = g->ml.lora;
    float *dxs = a->scratch, *xin = a->scratch + (size_t)n * moe_lora_widest(&g->ml);
    const float *x = lora_input16(g, a, n, xin, x16);
    cpu_lora_backward(dxs, a->dA, a->dB, moe_expert_lora_kernel_scratch(&g->ml, a, n), NULL, dy16,
                      ldy, a->u, x, a->A, a->B, lo->scale, true, n, a->in, lo->r, a->out);
    if (lo->dropout > 0.0f) { // dropout's backward on a bf16 gradient: rounded
        moe_expert_lora_dropout(&g->ml, a, n, dxs, dxs);
        round_rows(dxs, (int64_t)n * a->in, 0);
    }
    return dxs;
}

static void grouped_forward_expert(const void *ctx, int e, int par) {
    const grouped_args *g = ctx;
    const int C = g->C, F = g->F, r0 = g->p.off[e], n = g->p.off[e + 1] - r0;
    const uint16_t *wgu = g->w + (size_t)e * 3 * F * C, *wd = wgu + (size_t)2 * F * C;
    uint16_t *gu = g->gu + (size_t)r0 * 2 * F, *h = g->s.h + (size_t)r0 * F;
    const uint16_t *x = g->s.a + (size_t)r0 * C;
    float *y = g->s.y + (size_t)r0 * C;
    gemm(g->mm, FWD_GU, n, x, wgu, gu, g->s.e);
    lora_forward16(g, e, 0, r0, n, NULL, gu, 2 * F, x);
    lora_forward16(g, e, 1, r0, n, NULL, gu + F, 2 * F, x);
#pragma omp parallel for schedule(static) if (par && (int64_t)n * F >= CPU_PAR_MIN)
    for (int i = 0; i < n; i++) {
        const uint16_t *gi = gu + (size_t)i * 2 * F;
        swiglu_row(h + (size_t)i * F, gi, gi + F, F);
    }
    gemm(g->mm, FWD_D, n, h, wd, y, g->s.e);
    round_rows(y, (int64_t)n * C, par);
    lora_forward16(g, e, 2, r0, n, y, NULL, C, h);
}

// down_proj's branch in the backward, before the rows' elementwise part: h recomputed and y's
// gradient d = bf16(weight * dout) (row_backward writes both again, the same), the branch's
// backward from d on h, then *dh (n, F) = bf16(bf16(weight * U) + the branch's input gradient)
// and *t (n, C) = the branch's term of y as the forward added it (for dweight). NULL, NULL when
// down_proj is not adapted.
static void lora_down_backward(const grouped_args *g, int e, int r0, int n, const float *U,
                               float **dh, float **t) {
    expert_lora a;
    *dh = *t = NULL;
    if (!moe_expert_lora_at(&a, &g->ml, e, 2, r0)) return;
    const int C = g->C, F = g->F, K = g->K;
    const ct_moe_lora *lo = g->ml.lora;
    uint16_t *h = g->s.h + (size_t)r0 * F, *d = g->s.a + (size_t)r0 * C;
    const uint16_t *gu = g->gs + (size_t)r0 * 2 * F;
    for (int i = 0; i < n; i++) {
        const int slot = g->p.perm[r0 + i];
        const float wt = g->weight[slot], *dout = g->dout + (size_t)(slot / K) * C;
        swiglu_row(h + (size_t)i * F, gu + (size_t)i * 2 * F, gu + (size_t)i * 2 * F + F, F);
        for (int c = 0; c < C; c++) d[(size_t)i * C + c] = bf16_round(wt * dout[c]);
    }
    float *dxs = lora_backward16(g, &a, n, d, C, h);
    for (int i = 0; i < n; i++) {
        const float wt = g->weight[g->p.perm[r0 + i]];
        for (int f = 0; f < F; f++) {
            float *v = &dxs[(size_t)i * F + f];
            *v = bf16_value(bf16_round(bf16_value(bf16_round(wt * U[(size_t)i * F + f])) + *v));
        }
    }
    float *term = moe_expert_lora_kernel_scratch(&g->ml, &a, n); // free after the backward
    cpu_lora_term(term, term + (size_t)n * C, a.u, a.B, lo->scale, true, n, lo->r, C);
    *dh = dxs, *t = term;
}

static void grouped_backward_expert(const void *ctx, int e, int par) {
    const grouped_args *g = ctx;
    const int C = g->C, F = g->F, K = g->K, r0 = g->p.off[e], n = g->p.off[e + 1] - r0;
    const uint16_t *wgu = g->w + (size_t)e * 3 * F * C, *wd = wgu + (size_t)2 * F * C;
    // dw NULL: frozen experts (LoRA's base), the input gradient only
    float *dwgu = g->dw ? g->dw + (size_t)e * 3 * F * C : NULL;
    float *dwd = g->dw ? dwgu + (size_t)2 * F * C : NULL;
    const uint16_t *gu = g->gs + (size_t)r0 * 2 * F, *xe = g->s.b + (size_t)r0 * C;
    uint16_t *de = g->s.a + (size_t)r0 * C, *h = g->s.h + (size_t)r0 * F;
    uint16_t *dgu = g->s.g + (size_t)r0 * 2 * F;
    float *u = g->s.u + (size_t)r0 * F, *dxe = g->s.y + (size_t)r0 * C;
    gemm(g->mm, BWD_U, n, de, wd, u, g->s.e);
    float *dh, *t;
    lora_down_backward(g, e, r0, n, u, &dh, &t);
#pragma omp parallel for schedule(static) if (par && (int64_t)n * (F + C) >= CPU_PAR_MIN)
    for (int i = 0; i < n; i++) {
        const int slot = g->p.perm[r0 + i];
        const uint16_t *gi = gu + (size_t)i * 2 * F;
        uint16_t *dgi = dgu + (size_t)i * 2 * F;
        row_backward(h + (size_t)i * F, dgi, dgi + F, de + (size_t)i * C, &g->dweight[slot], gi,
                     gi + F, u + (size_t)i * F, g->dout + (size_t)(slot / K) * C, g->weight[slot],
                     F, C, dh ? dh + (size_t)i * F : NULL, t ? t + (size_t)i * C : NULL);
    }
    if (g->dw) {
        gemm(g->mm, BWD_DW_D, n, de, h, dwd, g->s.e);
        gemm(g->mm, BWD_DW_GU, n, dgu, xe, dwgu, g->s.e);
    }
    gemm(g->mm, BWD_DX_GU, n, dgu, wgu, dxe, g->s.e);
    expert_lora a;
    for (int m = 0; m < 2; m++) { // gate_proj's and up_proj's branches on the gathered x
        if (!moe_expert_lora_at(&a, &g->ml, e, m, r0)) continue;
        const float *dxs = lora_backward16(g, &a, n, dgu + (size_t)m * F, 2 * F, xe);
        for (size_t i = 0; i < (size_t)n * C; i++) dxe[i] += dxs[i];
    }
}

// oneDNN: moe_experts.c's schedule (OpenBLAS single-threaded in the concurrent part when LoRA's
// branches run sgemm there). Emulated: the experts one at a time, sgemm's threads inside (one
// emulation scratch).
static void grouped_run(const grouped_args *g, moe_expert_task task, int E, int S) {
    if (!g->mm->emulated) {
        moe_run_experts(&g->p, E, S, (int64_t)3 * g->F * g->C, omp_get_max_threads(),
                        g->ml.lora != NULL, task, g);
        return;
    }
    for (int e = 0; e < E; e++)
        if (g->p.off[e + 1] > g->p.off[e]) task(g, e, 1);
}

size_t cpu_moe_grouped_bf16_state_floats(int N, int C, int F, int E, int K) {
    (void)C;
    return moe_plan_floats(N, E, K) + half_floats((size_t)N * K * 2 * F);
}

size_t cpu_moe_grouped_bf16_scratch_floats(const ct_ops *ops, int N, int C, int F, int E, int K) {
    (void)E;
    return scratch_floats(ops, (size_t)N * K, C, F);
}

static grouped_args grouped_setup(const ct_ops *ops, float *scratch, const float *state,
                                  const float *weight, const uint16_t *w, const ct_moe_lora *lora,
                                  int N, int C, int F, int E, int K) {
    grouped_args g = {.mm = planned(ops, C, F),
                      .p = moe_plan_at(state, N, E, K),
                      .weight = weight,
                      .w = w,
                      .C = C,
                      .F = F,
                      .K = K};
    g.ml = (moe_lora_ctx){lora, g.p.perm, C, F, E, K, (size_t)N * K};
    scratch_layout(&g.s, scratch, (size_t)N * K, g.mm);
    return g;
}

static void grouped_forward(const ct_ops *ops, float *out, float *state, float *scratch,
                            const uint16_t *x16, const int32_t *expert, const float *weight,
                            const uint16_t *w, const ct_moe_lora *lora, int N, int C, int F, int E,
                            int K) {
    const int S = N * K;
    grouped_args g = grouped_setup(ops, scratch, state, weight, w, lora, N, C, F, E, K);
    moe_plan_build(g.p, expert, N, E, K);
    g.gu = (uint16_t *)(state + moe_plan_floats(N, E, K));
    gather_rows16(g.s.a, x16, g.p.perm, 0, S, K, C);
    grouped_run(&g, grouped_forward_expert, E, S);
    moe_combine_rows(out, g.s.y, weight, g.p, N, C, K);
}

void cpu_moe_grouped_bf16_forward(const ct_ops *ops, float *out, float *state, float *scratch,
                                  const uint16_t *x16, const int32_t *expert, const float *weight,
                                  const uint16_t *w, int N, int C, int F, int E, int K) {
    grouped_forward(ops, out, state, scratch, x16, expert, weight, w, NULL, N, C, F, E, K);
}

void cpu_moe_grouped_bf16_lora_forward(const ct_ops *ops, float *out, float *state, float *scratch,
                                       const uint16_t *x16, const int32_t *expert,
                                       const float *weight, const uint16_t *w,
                                       const ct_moe_lora *lora, int N, int C, int F, int E, int K) {
    grouped_forward(ops, out, state, scratch, x16, expert, weight, w, lora, N, C, F, E, K);
}

static void grouped_backward(const ct_ops *ops, float *dx, float *dweight, float *dw,
                             float *scratch, const float *dout, const float *state,
                             const uint16_t *x16, const float *weight, const uint16_t *w,
                             const ct_moe_lora *lora, int N, int C, int F, int E, int K) {
    const int S = N * K;
    grouped_args g = grouped_setup(ops, scratch, state, weight, w, lora, N, C, F, E, K);
    g.gs = (const uint16_t *)(state + moe_plan_floats(N, E, K));
    g.dout = dout;
    g.dweight = dweight;
    g.dw = dw;
    gather_rows_bf16(g.s.a, dout, g.p.perm, 0, S, K, C);
    gather_rows16(g.s.b, x16, g.p.perm, 0, S, K, C);
    grouped_run(&g, grouped_backward_expert, E, S);
    moe_combine_rows(dx, g.s.y, NULL, g.p, N, C, K);
}

void cpu_moe_grouped_bf16_backward(const ct_ops *ops, float *dx, float *dweight, float *dw,
                                   float *scratch, const float *dout, const float *state,
                                   const uint16_t *x16, const int32_t *expert, const float *weight,
                                   const uint16_t *w, int N, int C, int F, int E, int K) {
    (void)expert; // the forward's plan has it
    grouped_backward(ops, dx, dweight, dw, scratch, dout, state, x16, weight, w, NULL, N, C, F, E,
                     K);
}

void cpu_moe_grouped_bf16_lora_backward(const ct_ops *ops, float *dx, float *dweight,
                                        float *scratch, const float *dout, const float *state,
                                        const uint16_t *x16, const int32_t *expert,
                                        const float *weight, const uint16_t *w,
                                        const ct_moe_lora *lora, int N, int C, int F, int E,
                                        int K) {
    (void)expert; // the forward's plan has it
    grouped_backward(ops, dx, dweight, NULL, scratch, dout, state, x16, weight, w, lora, N, C, F, E,
                     K);
}
