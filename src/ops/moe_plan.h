// What the MoE expert kernels share (moe_experts.c: fp32, moe_experts_bf16.c: bf16 mixed
// precision): the routing plan (token slots sorted by expert), the per-token combine and the
// grouped kernels' schedule over experts.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// Stored at the start of the kernels' state as int32 (same size as float): off[E+1] (expert e
// owns sorted rows [off[e], off[e+1])), perm[S] (sorted row -> slot n*K+k, tokens ascending
// within each expert), tpos[S] (token t's K sorted rows, ascending, i.e. in ascending expert
// order), and order[E] (experts by decreasing row count: only the schedule depends on it).
typedef struct moe_plan {
    int32_t *off, *perm, *tpos, *order;
} moe_plan;

static inline size_t moe_align16(size_t n) {
    return (n + 15) / 16 * 16;
}

size_t moe_plan_floats(int N, int E, int K);
moe_plan moe_plan_at(const float *state, int N, int E, int K);
void moe_plan_build(moe_plan p, const int32_t *expert, int N, int E, int K);

// out[t] = sum over t's sorted rows (ascending expert), starting from 0.0f, of scale * rows[r],
// scale = weight[slot] or 1 when weight is NULL.
void moe_combine_rows(float *out, const float *rows, const float *weight, moe_plan p, int N, int C,
                      int K);

// out[token of sorted row perm[i]] += rows[i] for i < n (perm: one expert's part of the plan's).
void moe_add_rows(float *out, const float *rows, const int32_t *perm, int n, int K, int C);

// Runs task(ctx, e, par) for every expert with rows: those too big to balance among `threads`
// one after another (par 1: the task may use all threads), the rest concurrently, one thread
// each (par 0). row_macs: multiply-adds per row of an expert's forward. With `blas`, OpenBLAS
// runs single-threaded during the concurrent part (`threads` is then its thread count, which the
// pthread build is given back after).
typedef void (*moe_expert_task)(const void *ctx, int e, int par);
void moe_run_experts(const moe_plan *p, int E, int S, int64_t row_macs, int threads, bool blas,
                     moe_expert_task task, const void *ctx);
