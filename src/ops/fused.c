// Fused elementwise kernels: each computes what a short sequence of table ops computes (add then
// rmsnorm; rope, rmsnorm and the q|k|v split; ...) in one pass over memory instead of several.
// The contract is bit equality with the built-in sequence, so every expression below is the
// unfused kernel's, in its order, and each value that sequence stores as a float is a float
// here too (the build is ISO C11: no FMA contraction). The composites run the same sequences
// through the table, for when a plugin replaces one of the ops.
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "ops/ops.h"
#include "ops/ops_cpu.h"
#include "ops/rmsnorm_rows.h"
#include "ops/vec_math.h"

// ---- add + rmsnorm ----------------------------------------------------------------------------

CPU_SIMD_CLONES
static void add_rmsnorm_row(float *s, float *y, float *rstd, const float *a, const float *b,
                            const float *w, int C, float eps) {
#pragma omp simd
    for (int c = 0; c < C; c++) s[c] = a[c] + b[c];
    const float r = rmsnorm_row_rstd(s, C, eps);
#pragma omp simd
    for (int c = 0; c < C; c++) y[c] = w[c] * (s[c] * r);
    *rstd = r;
}

void cpu_add_rmsnorm_forward(const ct_ops *ops, float *sum, float *out, float *rstd, const float *a,
                             const float *b, const float *weight, int N, int C, float eps) {
    (void)ops;
#pragma omp parallel for schedule(static) if ((int64_t)N * C >= CPU_PAR_MIN)
    for (int n = 0; n < N; n++) {
        const size_t o = (size_t)n * C;
        add_rmsnorm_row(sum + o, out + o, rstd + n, a + o, b + o, weight, C, eps);
    }
}

// ---- rmsnorm backward + add -------------------------------------------------------------------

CPU_SIMD_CLONES
static void rmsnorm_backward_add_row(float *dr, const float *dy, const float *x, const float *w,
                                     float r, int C) {
    const float m = rmsnorm_row_gxhat_mean(dy, x, w, r, C);
#pragma omp simd
    for (int c = 0; c < C; c++) {
        const float dx = r * (w[c] * dy[c] - (x[c] * r) * m);
        dr[c] = dr[c] + dx;
    }
}

void cpu_rmsnorm_backward_add(const ct_ops *ops, float *dresid, float *dweight, float *scratch,
                              const float *dout, const float *inp, const float *weight,
                              const float *rstd, int N, int C) {
    (void)ops, (void)scratch;
    cpu_rmsnorm_dweight(dweight, dout, inp, rstd, N, 1, (size_t)C, C);
#pragma omp parallel for schedule(static) if ((int64_t)N * C >= CPU_PAR_MIN)
    for (int n = 0; n < N; n++) {
        const size_t o = (size_t)n * C;
        rmsnorm_backward_add_row(dresid + o, dout + o, inp + o, weight, rstd[n], C);
    }
}

// ---- q/k norm + rope --------------------------------------------------------------------------

// One head: y = rope(w * (x * r)), the normalised pair rounded to float and then rotated as
// rope_rotate does (sign +1). An odd D's last element is not rotated (rope leaves it).
static inline void norm_rope_head(float *y, float *rstd, const float *x, const float *w,
                                  const float *cs, const float *sn, int D, float eps) {
    const float r = rmsnorm_row_rstd(x, D, eps);
    const int half = D / 2;
#pragma omp simd
    for (int i = 0; i < half; i++) {
        const float x1 = w[i] * (x[i] * r), x2 = w[i + half] * (x[i + half] * r), si = sn[i];
        y[i] = x1 * cs[i] - x2 * si;
        y[i + half] = x2 * cs[i] + x1 * si;
    }
    if (D & 1) y[D - 1] = w[D - 1] * (x[D - 1] * r);
    *rstd = r;
}

// One token: its q and k heads normalised and rotated, v copied; row is its qkv row.
CPU_SIMD_CLONES
static void qk_forward_token(float *qr, float *kr, float *v, float *q_rstd, float *k_rstd,
                             const float *row, const float *qw, const float *kw, const float *cs,
                             const float *sn, int NH, int NKV, int D, float eps) {
    for (int h = 0; h < NH; h++)
        norm_rope_head(qr + (size_t)h * D, q_rstd + h, row + (size_t)h * D, qw, cs, sn, D, eps);
    const float *k = row + (size_t)NH * D;
    for (int h = 0; h < NKV; h++)
        norm_rope_head(kr + (size_t)h * D, k_rstd + h, k + (size_t)h * D, kw, cs, sn, D, eps);
    memcpy(v, k + (size_t)NKV * D, (size_t)NKV * D * sizeof *v);
}

void cpu_qk_norm_rope_forward(const ct_ops *ops, float *qr, float *kr, float *v, float *q_rstd,
                              float *k_rstd, float *scratch, const float *qkv, const float *q_norm,
                              const float *k_norm, const float *cos, const float *sin, int B, int T,
                              int NH, int NKV, int D, float eps) {
    (void)ops, (void)scratch;
    const int N = B * T, half = D / 2;
    const size_t QKV = (size_t)(NH + 2 * NKV) * D;
#pragma omp parallel for schedule(static) if ((int64_t)N * QKV >= CPU_PAR_MIN)
    for (int n = 0; n < N; n++) {
        const int t = n % T;
        qk_forward_token(qr + (size_t)n * NH * D, kr + (size_t)n * NKV * D, v + (size_t)n * NKV * D,
                         q_rstd + (size_t)n * NH, k_rstd + (size_t)n * NKV, qkv + n * QKV, q_norm,
                         k_norm, cos + (size_t)t * half, sin + (size_t)t * half, NH, NKV, D, eps);
    }
}

// One head backward: dy (the gradient of the rotated output) is rotated back in place as
// rope_rotate does (sign -1), then dx is rmsnorm's input gradient against the pre-norm x.
static inline void norm_rope_head_backward(float *dx, float *dy, const float *x, const float *w,
                                           float r, const float *cs, const float *sn, int D) {
    const int half = D / 2;
#pragma omp simd
    for (int i = 0; i < half; i++) {
        const float x1 = dy[i], x2 = dy[i + half], si = -sn[i];
        dy[i] = x1 * cs[i] - x2 * si;
        dy[i + half] = x2 * cs[i] + x1 * si;
    }
    const float m = rmsnorm_row_gxhat_mean(dy, x, w, r, D);
#pragma omp simd
    for (int c = 0; c < D; c++) dx[c] = r * (w[c] * dy[c] - (x[c] * r) * m);
}

// One token: drow is its dqkv row, row its qkv row; dq, dk its (rotated back in place) gradients.
CPU_SIMD_CLONES
static void qk_backward_token(float *drow, float *dq, float *dk, const float *dv, const float *row,
                              const float *qw, const float *kw, const float *q_rstd,
                              const float *k_rstd, const float *cs, const float *sn, int NH,
                              int NKV, int D) {
    for (int h = 0; h < NH; h++) {
        const size_t o = (size_t)h * D;
        norm_rope_head_backward(drow + o, dq + o, row + o, qw, q_rstd[h], cs, sn, D);
    }
    const size_t ko = (size_t)NH * D;
    for (int h = 0; h < NKV; h++) {
        const size_t o = (size_t)h * D;
        norm_rope_head_backward(drow + ko + o, dk + o, row + ko + o, kw, k_rstd[h], cs, sn, D);
    }
    memcpy(drow + ko + (size_t)NKV * D, dv, (size_t)NKV * D * sizeof *dv);
}

void cpu_qk_norm_rope_backward(const ct_ops *ops, float *dqkv, float *dq_norm, float *dk_norm,
                               float *dqr, float *dkr, const float *dv, const float *qkv,
                               const float *q_norm, const float *k_norm, const float *q_rstd,
                               const float *k_rstd, const float *cos, const float *sin, int B,
                               int T, int NH, int NKV, int D) {
    (void)ops;
    const int N = B * T, half = D / 2;
    const size_t QKV = (size_t)(NH + 2 * NKV) * D;
#pragma omp parallel for schedule(static) if ((int64_t)N * QKV >= CPU_PAR_MIN)
    for (int n = 0; n < N; n++) {
        const int t = n % T;
        qk_backward_token(dqkv + n * QKV, dqr + (size_t)n * NH * D, dkr + (size_t)n * NKV * D,
                          dv + (size_t)n * NKV * D, qkv + n * QKV, q_norm, k_norm,
                          q_rstd + (size_t)n * NH, k_rstd + (size_t)n * NKV, cos + (size_t)t * half,
                          sin + (size_t)t * half, NH, NKV, D);
    }
    // The norm weights' gradients from the rotated-back dqr, dkr: rows in rmsnorm_backward's
    // order over (N*NH, D) and (N*NKV, D).
    cpu_rmsnorm_dweight(dq_norm, dqr, qkv, q_rstd, N, NH, QKV, D);
    cpu_rmsnorm_dweight(dk_norm, dkr, qkv + (size_t)NH * D, k_rstd, N, NKV, QKV, D);
}

// ---- swiglu over gate|up rows -----------------------------------------------------------------

CPU_SIMD_CLONES
static void swiglu_row_forward(float *h, const float *gu, int F) {
    const float *u = gu + F;
#pragma omp simd
    for (int f = 0; f < F; f++) h[f] = swiglu_value(gu[f], u[f]);
}

// swiglu.c's backward expressions; dgate into dgu[0:F], dup into dgu[F:2F].
CPU_SIMD_CLONES
static void swiglu_row_backward(float *dgu, const float *dh, const float *gu, int F) {
#pragma omp simd
    for (int f = 0; f < F; f++) {
        swiglu_grad(&dgu[f], &dgu[F + f], dh[f], gu[f], gu[F + f]);
    }
}

void cpu_swiglu_rows_forward(const ct_ops *ops, float *h, float *scratch, const float *gate_up,
                             int N, int F) {
    (void)ops, (void)scratch;
#pragma omp parallel for schedule(static) if ((int64_t)N * F >= CPU_PAR_MIN)
    for (int n = 0; n < N; n++)
        swiglu_row_forward(h + (size_t)n * F, gate_up + (size_t)n * 2 * F, F);
}

void cpu_swiglu_rows_backward(const ct_ops *ops, float *dgate_up, float *scratch, const float *dh,
                              const float *gate_up, int N, int F) {
    (void)ops, (void)scratch;
#pragma omp parallel for schedule(static) if ((int64_t)N * F >= CPU_PAR_MIN)
    for (int n = 0; n < N; n++) {
        const size_t o = (size_t)n * 2 * F;
        swiglu_row_backward(dgate_up + o, dh + (size_t)n * F, gate_up + o, F);
    }
}

// ---- composites: the same sequences through the table -----------------------------------------
// The ops are called one at a time from this thread (plugin.h), and only in place where
// plugin.h allows it (rope, rmsnorm_backward, add).

// dst (N, W) = columns [0, W) of the N rows of src, `stride` floats apart.
static void gather_rows(float *dst, const float *src, size_t stride, int N, size_t W) {
#pragma omp parallel for schedule(static) if ((int64_t)N * (int64_t)W >= CPU_PAR_MIN)
    for (int n = 0; n < N; n++) memcpy(dst + n * W, src + n * stride, W * sizeof *dst);
}

static void composite_add_rmsnorm_forward(const ct_ops *ops, float *sum, float *out, float *rstd,
                                          const float *a, const float *b, const float *weight,
                                          int N, int C, float eps) {
    ops->add(sum, a, b, (int64_t)N * C);
    ops->rmsnorm_forward(out, rstd, sum, weight, N, C, eps);
}

static void composite_rmsnorm_backward_add(const ct_ops *ops, float *dresid, float *dweight,
                                           float *scratch, const float *dout, const float *inp,
                                           const float *weight, const float *rstd, int N, int C) {
    ops->rmsnorm_backward(scratch, dweight, dout, inp, weight, rstd, N, C);
    ops->add(dresid, dresid, scratch, (int64_t)N * C);
}

// rmsnorm_forward may not run in place, so q (then k) is first copied out of qkv into scratch.
static void composite_qk_norm_rope_forward(const ct_ops *ops, float *qr, float *kr, float *v,
                                           float *q_rstd, float *k_rstd, float *scratch,
                                           const float *qkv, const float *q_norm,
                                           const float *k_norm, const float *cos, const float *sin,
                                           int B, int T, int NH, int NKV, int D, float eps) {
    const int N = B * T;
    const size_t QKV = (size_t)(NH + 2 * NKV) * D, QW = (size_t)NH * D, KW = (size_t)NKV * D;
    gather_rows(scratch, qkv, QKV, N, QW);
    ops->rmsnorm_forward(qr, q_rstd, scratch, q_norm, N * NH, D, eps);
    ops->rope_forward(qr, qr, cos, sin, B, T, NH, D);
    gather_rows(scratch, qkv + QW, QKV, N, KW);
    ops->rmsnorm_forward(kr, k_rstd, scratch, k_norm, N * NKV, D, eps);
    ops->rope_forward(kr, kr, cos, sin, B, T, NKV, D);
    gather_rows(v, qkv + QW + KW, QKV, N, KW);
}

// dqkv is the scratch for the contiguous pre-norm q (then k) until the gradients are
// interleaved into it.
static void composite_qk_norm_rope_backward(const ct_ops *ops, float *dqkv, float *dq_norm,
                                            float *dk_norm, float *dqr, float *dkr, const float *dv,
                                            const float *qkv, const float *q_norm,
                                            const float *k_norm, const float *q_rstd,
                                            const float *k_rstd, const float *cos, const float *sin,
                                            int B, int T, int NH, int NKV, int D) {
    const int N = B * T;
    const size_t QKV = (size_t)(NH + 2 * NKV) * D, QW = (size_t)NH * D, KW = (size_t)NKV * D;
    ops->rope_backward(dqr, dqr, cos, sin, B, T, NH, D);
    ops->rope_backward(dkr, dkr, cos, sin, B, T, NKV, D);
    gather_rows(dqkv, qkv, QKV, N, QW);
    ops->rmsnorm_backward(dqr, dq_norm, dqr, dqkv, q_norm, q_rstd, N * NH, D);
    gather_rows(dqkv, qkv + QW, QKV, N, KW);
    ops->rmsnorm_backward(dkr, dk_norm, dkr, dqkv, k_norm, k_rstd, N * NKV, D);
#pragma omp parallel for schedule(static) if ((int64_t)N * QKV >= CPU_PAR_MIN)
    for (int n = 0; n < N; n++) {
        float *d = dqkv + n * QKV;
        memcpy(d, dqr + n * QW, QW * sizeof *d);
        memcpy(d + QW, dkr + n * KW, KW * sizeof *d);
        memcpy(d + QW + KW, dv + n * KW, KW * sizeof *d);
    }
}

// Copies the gate and up halves of each (2F) row apart: gate (N,F) then up (N,F).
static void split_rows(float *gate, float *up, const float *gate_up, int N, int F) {
    for (int n = 0; n < N; n++) {
        memcpy(gate + (size_t)n * F, gate_up + (size_t)n * 2 * F, (size_t)F * sizeof(float));
        memcpy(up + (size_t)n * F, gate_up + (size_t)n * 2 * F + F, (size_t)F * sizeof(float));
    }
}

static void composite_swiglu_rows_forward(const ct_ops *ops, float *h, float *scratch,
                                          const float *gate_up, int N, int F) {
    const size_t nf = (size_t)N * F;
    split_rows(scratch, scratch + nf, gate_up, N, F);
    ops->swiglu_forward(h, scratch, scratch + nf, (int64_t)nf);
}

// dgate_up's two halves take the contiguous dgate and dup, then the rows are interleaved
// through the scratch.
static void composite_swiglu_rows_backward(const ct_ops *ops, float *dgate_up, float *scratch,
                                           const float *dh, const float *gate_up, int N, int F) {
    const size_t nf = (size_t)N * F;
    split_rows(scratch, scratch + nf, gate_up, N, F);
    ops->swiglu_backward(dgate_up, dgate_up + nf, dh, scratch, scratch + nf, (int64_t)nf);
    for (int n = 0; n < N; n++) {
        memcpy(scratch + (size_t)n * 2 * F, dgate_up + (size_t)n * F, (size_t)F * sizeof(float));
        memcpy(scratch + (size_t)n * 2 * F + F, dgate_up + nf + (size_t)n * F,
               (size_t)F * sizeof(float));
    }
    memcpy(dgate_up, scratch, 2 * nf * sizeof(float));
}

static size_t composite_swiglu_rows_scratch_floats(int N, int F) {
    return (size_t)N * 2 * F;
}

void ct_ops_fit_fusions(ct_ops *ops) {
    const bool add = ops->add == cpu_add;
    const bool norm_f = ops->rmsnorm_forward == cpu_rmsnorm_forward;
    const bool norm_b = ops->rmsnorm_backward == cpu_rmsnorm_backward;
    const bool rope_f = ops->rope_forward == cpu_rope_forward;
    const bool rope_b = ops->rope_backward == cpu_rope_backward;
    // Each entry on its own, so a forward-only override keeps the built-in fused backwards.
    ops->add_rmsnorm_forward =
        add && norm_f ? cpu_add_rmsnorm_forward : composite_add_rmsnorm_forward;
    ops->rmsnorm_backward_add =
        add && norm_b ? cpu_rmsnorm_backward_add : composite_rmsnorm_backward_add;
    ops->qk_norm_rope_forward =
        norm_f && rope_f ? cpu_qk_norm_rope_forward : composite_qk_norm_rope_forward;
    ops->qk_norm_rope_backward =
        norm_b && rope_b ? cpu_qk_norm_rope_backward : composite_qk_norm_rope_backward;
    ops->swiglu_rows_forward = ops->swiglu_forward == cpu_swiglu_forward
                                   ? cpu_swiglu_rows_forward
                                   : composite_swiglu_rows_forward;
    ops->swiglu_rows_backward = ops->swiglu_backward == cpu_swiglu_backward
                                    ? cpu_swiglu_rows_backward
                                    : composite_swiglu_rows_backward;
    const bool swiglu_composite = ops->swiglu_rows_forward == composite_swiglu_rows_forward ||
                                  ops->swiglu_rows_backward == composite_swiglu_rows_backward;
    ops->swiglu_rows_scratch_floats =
        swiglu_composite ? composite_swiglu_rows_scratch_floats : NULL;
}
