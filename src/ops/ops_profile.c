#include "ops/ops_profile.h"

#include <time.h>

#include "core/clock.h"

typedef enum {
    P_EMBEDDING_FWD,
    P_EMBEDDING_BWD,
    P_ADD,
    P_MATMUL_FWD,
    P_MATMUL_BWD,
    P_RMSNORM_FWD,
    P_RMSNORM_BWD,
    P_ROPE_FWD,
    P_ROPE_BWD,
    P_ATTENTION_FWD,
    P_ATTENTION_BWD,
    P_SWIGLU_FWD,
    P_SWIGLU_BWD,
    P_MOE_FWD,
    P_MOE_BWD,
    P_CE_FWD,
    P_CE_BWD,
    P_ADD_RMSNORM_FWD,
    P_RMSNORM_ADD_BWD,
    P_QK_NORM_ROPE_FWD,
    P_QK_NORM_ROPE_BWD,
    P_SWIGLU_ROWS_FWD,
    P_SWIGLU_ROWS_BWD,
    P_N
} profiled;

static const char *const names[P_N][2] = {
    {"embedding", "forward"},     {"embedding", "backward"},     {"add", "-"},
    {"matmul", "forward"},        {"matmul", "backward"},        {"rmsnorm", "forward"},
    {"rmsnorm", "backward"},      {"rope_hf", "forward"},        {"rope_hf", "backward"},
    {"attention", "forward"},     {"attention", "backward"},     {"swiglu", "forward"},
    {"swiglu", "backward"},       {"moe_experts", "forward"},    {"moe_experts", "backward"},
    {"cross_entropy", "forward"}, {"cross_entropy", "backward"}, {"add+rmsnorm", "forward"},
    {"rmsnorm+add", "backward"},  {"qk_norm+rope", "forward"},   {"qk_norm+rope", "backward"},
    {"swiglu_rows", "forward"},   {"swiglu_rows", "backward"},
};

static ct_ops inner;
static double seconds[P_N];
static long long calls[P_N];

static void stop(profiled p, double t0) {
    seconds[p] += ct_now_s() - t0;
    calls[p]++;
}

// One timed wrapper per kernel: prof_<field> calls inner.<field>.
#define WRAP(field, p, PARAMS, ARGS)                                                               \
    static void prof_##field PARAMS {                                                              \
        const double t0 = ct_now_s();                                                              \
        inner.field ARGS;                                                                          \
        stop(p, t0);                                                                               \
    }

WRAP(embedding_forward, P_EMBEDDING_FWD,
     (float *out, const int32_t *ids, const float *table, int N, int C), (out, ids, table, N, C))
WRAP(embedding_backward, P_EMBEDDING_BWD,
     (float *dtable, const float *dout, const int32_t *ids, int N, int C),
     (dtable, dout, ids, N, C))
WRAP(add, P_ADD, (float *out, const float *a, const float *b, int64_t n), (out, a, b, n))
WRAP(matmul_forward, P_MATMUL_FWD,
     (float *out, const float *inp, const float *weight, const float *bias, int N, int C, int OC),
     (out, inp, weight, bias, N, C, OC))
WRAP(matmul_backward, P_MATMUL_BWD,
     (float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
      const float *weight, int N, int C, int OC),
     (dinp, dweight, dbias, dout, inp, weight, N, C, OC))
WRAP(rmsnorm_forward, P_RMSNORM_FWD,
     (float *out, float *rstd, const float *inp, const float *weight, int N, int C, float eps),
     (out, rstd, inp, weight, N, C, eps))
WRAP(rmsnorm_backward, P_RMSNORM_BWD,
     (float *dinp, float *dweight, const float *dout, const float *inp, const float *weight,
      const float *rstd, int N, int C),
     (dinp, dweight, dout, inp, weight, rstd, N, C))
WRAP(rope_forward, P_ROPE_FWD,
     (float *out, const float *inp, const float *cos, const float *sin, int B, int T, int H, int D),
     (out, inp, cos, sin, B, T, H, D))
WRAP(rope_backward, P_ROPE_BWD,
     (float *dinp, const float *dout, const float *cos, const float *sin, int B, int T, int H,
      int D),
     (dinp, dout, cos, sin, B, T, H, D))
WRAP(attention_forward, P_ATTENTION_FWD,
     (float *out, float *state, const float *q, const float *k, const float *v, int B, int T,
      int NH, int NKV, int D),
     (out, state, q, k, v, B, T, NH, NKV, D))
WRAP(attention_backward, P_ATTENTION_BWD,
     (float *dq, float *dk, float *dv, float *scratch, const float *dout, const float *out,
      const float *state, const float *q, const float *k, const float *v, int B, int T, int NH,
      int NKV, int D),
     (dq, dk, dv, scratch, dout, out, state, q, k, v, B, T, NH, NKV, D))
WRAP(swiglu_forward, P_SWIGLU_FWD, (float *out, const float *gate, const float *up, int64_t n),
     (out, gate, up, n))
WRAP(swiglu_backward, P_SWIGLU_BWD,
     (float *dgate, float *dup, const float *dout, const float *gate, const float *up, int64_t n),
     (dgate, dup, dout, gate, up, n))
WRAP(moe_forward, P_MOE_FWD,
     (float *out, float *state, float *scratch, const float *x, const int32_t *expert,
      const float *weight, const float *w, int N, int C, int F, int E, int K),
     (out, state, scratch, x, expert, weight, w, N, C, F, E, K))
WRAP(moe_backward, P_MOE_BWD,
     (float *dx, float *dweight, float *dw, float *scratch, const float *dout, const float *state,
      const float *x, const int32_t *expert, const float *weight, const float *w, int N, int C,
      int F, int E, int K),
     (dx, dweight, dw, scratch, dout, state, x, expert, weight, w, N, C, F, E, K))
WRAP(cross_entropy_forward, P_CE_FWD,
     (float *losses, const float *logits, const int32_t *targets, int N, int V),
     (losses, logits, targets, N, V))
WRAP(cross_entropy_backward, P_CE_BWD,
     (float *dlogits, const float *logits, const int32_t *targets, float scale, int N, int V),
     (dlogits, logits, targets, scale, N, V))

// A fused kernel is timed as one op: it runs against the untimed table, so a composite's inner
// calls are not counted a second time.
#define WRAP_FUSED(field, p, PARAMS, ARGS)                                                         \
    static void prof_##field PARAMS {                                                              \
        (void)ops;                                                                                 \
        const double t0 = ct_now_s();                                                              \
        inner.field ARGS;                                                                          \
        stop(p, t0);                                                                               \
    }

WRAP_FUSED(add_rmsnorm_forward, P_ADD_RMSNORM_FWD,
           (const ct_ops *ops, float *sum, float *out, float *rstd, const float *a, const float *b,
            const float *weight, int N, int C, float eps),
           (&inner, sum, out, rstd, a, b, weight, N, C, eps))
WRAP_FUSED(rmsnorm_backward_add, P_RMSNORM_ADD_BWD,
           (const ct_ops *ops, float *dresid, float *dweight, float *scratch, const float *dout,
            const float *inp, const float *weight, const float *rstd, int N, int C),
           (&inner, dresid, dweight, scratch, dout, inp, weight, rstd, N, C))
WRAP_FUSED(qk_norm_rope_forward, P_QK_NORM_ROPE_FWD,
           (const ct_ops *ops, float *qr, float *kr, float *v, float *q_rstd, float *k_rstd,
            float *scratch, const float *qkv, const float *q_norm, const float *k_norm,
            const float *cos, const float *sin, int B, int T, int NH, int NKV, int D, float eps),
           (&inner, qr, kr, v, q_rstd, k_rstd, scratch, qkv, q_norm, k_norm, cos, sin, B, T, NH,
            NKV, D, eps))
WRAP_FUSED(qk_norm_rope_backward, P_QK_NORM_ROPE_BWD,
           (const ct_ops *ops, float *dqkv, float *dq_norm, float *dk_norm, float *dqr, float *dkr,
            const float *dv, const float *qkv, const float *q_norm, const float *k_norm,
            const float *q_rstd, const float *k_rstd, const float *cos, const float *sin, int B,
            int T, int NH, int NKV, int D),
           (&inner, dqkv, dq_norm, dk_norm, dqr, dkr, dv, qkv, q_norm, k_norm, q_rstd, k_rstd, cos,
            sin, B, T, NH, NKV, D))
WRAP_FUSED(swiglu_rows_forward, P_SWIGLU_ROWS_FWD,
           (const ct_ops *ops, float *h, float *scratch, const float *gate_up, int N, int F),
           (&inner, h, scratch, gate_up, N, F))
WRAP_FUSED(swiglu_rows_backward, P_SWIGLU_ROWS_BWD,
           (const ct_ops *ops, float *dgate_up, float *scratch, const float *dh,
            const float *gate_up, int N, int F),
           (&inner, dgate_up, scratch, dh, gate_up, N, F))

void ops_profile_wrap(ct_ops *out, const ct_ops *in) {
    inner = *in;
    *out = *in; // the size queries pass through untimed
    out->embedding_forward = prof_embedding_forward;
    out->embedding_backward = prof_embedding_backward;
    out->add = prof_add;
    out->matmul_forward = prof_matmul_forward;
    out->matmul_backward = prof_matmul_backward;
    out->rmsnorm_forward = prof_rmsnorm_forward;
    out->rmsnorm_backward = prof_rmsnorm_backward;
    out->rope_forward = prof_rope_forward;
    out->rope_backward = prof_rope_backward;
    out->attention_forward = prof_attention_forward;
    out->attention_backward = prof_attention_backward;
    out->swiglu_forward = prof_swiglu_forward;
    out->swiglu_backward = prof_swiglu_backward;
    out->moe_forward = prof_moe_forward;
    out->moe_backward = prof_moe_backward;
    out->cross_entropy_forward = prof_cross_entropy_forward;
    out->cross_entropy_backward = prof_cross_entropy_backward;
    out->add_rmsnorm_forward = prof_add_rmsnorm_forward;
    out->rmsnorm_backward_add = prof_rmsnorm_backward_add;
    out->qk_norm_rope_forward = prof_qk_norm_rope_forward;
    out->qk_norm_rope_backward = prof_qk_norm_rope_backward;
    out->swiglu_rows_forward = prof_swiglu_rows_forward;
    out->swiglu_rows_backward = prof_swiglu_rows_backward;
    ops_profile_reset();
}

void ops_profile_reset(void) {
    for (int p = 0; p < P_N; p++) seconds[p] = 0, calls[p] = 0;
}

void ops_profile_print(FILE *f, double step_seconds, int steps) {
    if (steps < 1 || step_seconds <= 0) return;
    fprintf(f, "op profile: mean over %d step(s) of %.1f ms\n", steps, step_seconds * 1e3);
    fprintf(f, "  %-14s %-9s %9s %10s %7s\n", "op", "direction", "calls", "ms/step", "share");
    double covered = 0;
    for (int p = 0; p < P_N; p++) {
        if (!calls[p]) continue;
        const double ms = seconds[p] / steps * 1e3;
        covered += seconds[p] / steps;
        fprintf(f, "  %-14s %-9s %9.1f %10.2f %6.1f%%\n", names[p][0], names[p][1],
                (double)calls[p] / steps, ms, 100.0 * seconds[p] / steps / step_seconds);
    }
    const double rest = step_seconds - covered;
    fprintf(f, "  %-14s %-9s %9s %10.2f %6.1f%%  (routing, optimizer, data, comm)\n", "other", "-",
            "", rest * 1e3, 100.0 * rest / step_seconds);
}
