#include "ops/ops_profile.h"

#include <time.h>

#include "core/clock.h"

// One row per timed entry of the op list (the size queries pass through untimed), in its order.
#define TIMED_ENUM(kind, field, ...) CT_OP_IF_TIMED_##kind(P_##field, )
typedef enum { CT_OPS_LIST(TIMED_ENUM) P_N } profiled;
#undef TIMED_ENUM

#define DIR_forward "forward"
#define DIR_backward "backward"
#define DIR_none "-"
#define DIR_both "fwd+bwd"
static const char *const names[P_N][2] = {
#define TIMED_NAME(kind, field, type, cpu, need, op, dir, ...)                                     \
    CT_OP_IF_TIMED_##kind([P_##field] = {op, DIR_##dir}, )
    CT_OPS_LIST(TIMED_NAME)
#undef TIMED_NAME
};

static ct_ops inner;
static double seconds[P_N];
static long long calls[P_N];

static void stop(profiled p, double t0) {
    seconds[p] += ct_now_s() - t0;
    calls[p]++;
}

// One timed wrapper per timed entry: prof_<field> calls inner.<field>. A fused kernel is timed
// as one op: it runs against the untimed table, so a composite's inner calls are not counted a
// second time.
#define WRAP(kind, field, type, cpu, need, op, dir, params, args) WRAP_##kind(field, params, args)
#define WRAP_PLUGIN(field, params, args)                                                           \
    static void prof_##field params {                                                              \
        const double t0 = ct_now_s();                                                              \
        inner.field args;                                                                          \
        stop(P_##field, t0);                                                                       \
    }
#define WRAP_OWN WRAP_PLUGIN
#define WRAP_FUSED(field, params, args)                                                            \
    static void prof_##field params {                                                              \
        (void)ops;                                                                                 \
        const double t0 = ct_now_s();                                                              \
        inner.field(&inner, CT_OP_UNPACK args);                                                    \
        stop(P_##field, t0);                                                                       \
    }
#define WRAP_PLUGIN_SIZE(field, params, args)
#define WRAP_OWN_SIZE(field, params, args)
CT_OPS_LIST(WRAP)

void ops_profile_wrap(ct_ops *out, const ct_ops *in) {
    inner = *in;
    *out = *in; // the size queries pass through untimed
#define INSTALL(kind, field, ...) CT_OP_IF_TIMED_##kind(out->field = prof_##field;)
    CT_OPS_LIST(INSTALL)
#undef INSTALL
    ops_profile_reset();
}
void ops_profile_reset(void) {
    for (int p = 0; p < P_N; p++) seconds[p] = 0, calls[p] = 0;
}

void ops_profile_print(FILE *f, double step_seconds, int steps) {
    if (steps < 1 || step_seconds <= 0) return;
    fprintf(f, "op profile: mean over %d step(s) of %.1f ms\n", steps, step_seconds * 1e3);
    fprintf(f, "  %-18s %-9s %9s %10s %7s\n", "op", "direction", "calls", "ms/step", "share");
    double covered = 0;
    for (int p = 0; p < P_N; p++) {
        if (!calls[p]) continue;
        const double ms = seconds[p] / steps * 1e3;
        covered += seconds[p] / steps;
        fprintf(f, "  %-18s %-9s %9.1f %10.2f %6.1f%%\n", names[p][0], names[p][1],
                (double)calls[p] / steps, ms, 100.0 * seconds[p] / steps / step_seconds);
    }
    const double rest = step_seconds - covered;
    fprintf(f, "  %-18s %-9s %9s %10.2f %6.1f%%  (data, communication, host work)\n", "other", "-",
            "", rest * 1e3, 100.0 * rest / step_seconds);
}
