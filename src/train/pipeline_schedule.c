// Pipeline parallelism's plan as data: schedule names, the stages' split, each rank's actions.
#include "train/pipeline_schedule.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const struct {
    const char *name;
    int kind; // -1: torchtitan's, not implemented here
} SCHEDULES[] = {
    {"1F1B", PP_1F1B},
    {"GPipe", PP_GPIPE},
    {"Interleaved1F1B", PP_INTERLEAVED_1F1B},
    {"LoopedBFS", -1},
    {"InterleavedZeroBubble", -1},
    {"ZBVZeroBubble", -1},
};

int pp_schedule_parse(const char *name, pp_schedule_kind *kind, ct_error *err) {
    for (size_t i = 0; i < sizeof SCHEDULES / sizeof SCHEDULES[0]; i++) {
        if (strcasecmp(name, SCHEDULES[i].name) != 0) continue;
        if (SCHEDULES[i].kind < 0)
            return ct_fail(err,
                           "parallelism.pipeline_parallel_schedule = \"%s\": torchtitan's %s is not "
                           "implemented here; expected one of " PP_SCHEDULES,
                           name, SCHEDULES[i].name);
        *kind = (pp_schedule_kind)SCHEDULES[i].kind;
        return 0;
    }
    return ct_fail(err,
                   "parallelism.pipeline_parallel_schedule = \"%s\": expected one of " PP_SCHEDULES
                   " (case-insensitive)",
                   name);
}

int pp_schedule_stages_per_rank(pp_schedule_kind kind) {
    return kind == PP_INTERLEAVED_1F1B ? 2 : 1;
}

// torchtitan's generate_llm_fqn_per_model_part: n layers plus the embedding's and the head's
// weights spread over S stages, the first `extra` stages one more; the last takes the layers
// left.
static int default_split(pp_stage *st, int S, int n, int first_less, int last_less,
                         ct_error *err) {
    const int eff = n + first_less + last_less, per = eff / S, extra = eff % S;
    if (S > eff || per == 0)
        return ct_fail(err,
                       "parallelism.pipeline_parallel_degree: %d stages need at least %d layers "
                       "(the embedding and head count %d and %d); the model has %d",
                       S, S - first_less - last_less, first_less, last_less, n);
    if (first_less > per || last_less > per)
        return ct_fail(err,
                       "parallelism.pipeline_parallel_first_stage_less_layers (%d) and "
                       "last_stage_less_layers (%d) must not exceed the %d layers per stage",
                       first_less, last_less, per);
    int cur = 0;
    for (int s = 0; s < S; s++) {
        const int want = per + (s < extra) - (s == 0 ? first_less : 0);
        st[s] = (pp_stage){.embed = s == 0, .head = s == S - 1, .lo = cur};
        cur = s == S - 1 ? n : cur + want < n ? cur + want : n;
        st[s].hi = cur;
    }
    return 0;
}

// module_fqns_per_model_part: names in order, each stage's contiguous.
static int fqn_split(pp_stage *st, int max, int *S, int n, const char *fqns, ct_error *err) {
    const char *key = "parallelism.module_fqns_per_model_part";
    int s = 0, next = 0; // the stage being read, the next decoder layer expected
    bool embed = false, norm = false, output = false;
    for (const char *p = fqns; *p;) {
        if (s >= max) return ct_fail(err, "%s: more than %d stages", key, max);
        st[s] = (pp_stage){.lo = next, .hi = next};
        for (;;) {
            const size_t len = strcspn(p, ",;");
            char name[64];
            snprintf(name, sizeof name, "%.*s", (int)(len < 63 ? len : 63), p);
            int l = -1, used = 0;
            if (strcmp(name, "tok_embeddings") == 0 && s == 0 && next == 0 && !embed) {
                embed = st[s].embed = true;
            } else if (sscanf(name, "layers.%d%n", &l, &used) == 1 && name[used] == 0 &&
                       l == next && !norm && !output) {
                st[s].hi = ++next;
            } else if (strcmp(name, "norm") == 0 && next == n && !norm) {
                norm = true;
            } else if (strcmp(name, "output") == 0 && norm && !output) {
                output = st[s].head = true;
            } else {
                return ct_fail(err,
                               "%s: \"%s\" in stage %d: expected tok_embeddings (first), then "
                               "layers.0 .. layers.%d in order, then norm and output (last, in "
                               "one stage)",
                               key, name, s, n - 1);
            }
            p += len;
            if (*p == ',') p++;
            if (*p == ';' || !*p) break;
        }
        if (*p == ';') p++;
        s++;
    }
    if (!embed || !norm || !output || next != n)
        return ct_fail(err,
                       "%s: the stages hold %s%d of %d layers%s%s: expected every module once",
                       key, embed ? "" : "no tok_embeddings, ", next, n, norm ? "" : ", no norm",
                       output ? "" : ", no output");
    *S = s;
    return 0;
}

int pp_split(pp_stage *stages, int max, int *n_stages, int n_layers, int pp, pp_schedule_kind kind,
             int layers_per_stage, int first_less, int last_less, const char *fqns,
             ct_error *err) {
    int S = 0;
    if (fqns && *fqns) {
        if (fqn_split(stages, max, &S, n_layers, fqns, err) != 0) return -1;
    } else {
        S = layers_per_stage > 0
                ? (n_layers + first_less + last_less + layers_per_stage - 1) / layers_per_stage
                : pp * pp_schedule_stages_per_rank(kind);
        if (S > max)
            return ct_fail(err, "parallelism.pipeline_parallel_layers_per_stage = %d: %d stages; "
                                "at most %d",
                           layers_per_stage, S, max);
        if (default_split(stages, S, n_layers, first_less, last_less, err) != 0) return -1;
    }
    if (S % pp != 0 || (pp_schedule_stages_per_rank(kind) == 1 && S != pp))
        return ct_fail(err,
                       "parallelism.pipeline_parallel_degree = %d: %d stages (%s) for a schedule "
                       "that places %s",
                       pp, S, fqns && *fqns ? "module_fqns_per_model_part" : "the layers' split",
                       pp_schedule_stages_per_rank(kind) == 1 ? "one stage per rank"
                                                              : "a multiple of the ranks");
    for (int s = 0; s < S; s++)
        if (stages[s].hi == stages[s].lo)
            return ct_fail(err,
                           "parallelism.pipeline_parallel_degree = %d: stage %d of %d gets no "
                           "decoder layer (the model has %d): too few layers for the stages",
                           pp, s, S, n_layers);
    *n_stages = S;
    return 0;
}

// Single-stage schedules. GPipe: every forward, then every backward, in micro-batch order.
// 1F1B: stage s warms up with min(m, S - s) forwards, then alternates a backward and a forward,
// then the backwards left.
static int single_actions(pp_schedule_kind kind, int s, int S, int m, pp_action *out) {
    int n = 0, f = 0, b = 0;
    const int warm = kind == PP_GPIPE ? m : (S - s < m ? S - s : m);
    while (f < warm) out[n++] = (pp_action){s, false, f++};
    while (b < m) {
        out[n++] = (pp_action){s, true, b++};
        if (f < m && kind != PP_GPIPE) out[n++] = (pp_action){s, false, f++};
    }
    return n;
}

// Interleaved1F1B (PyTorch's ScheduleInterleaved1F1B, its order without the idle slots): v
// stages per rank, micro-batches in rounds of per = m / max(1, m / pp); warm-up forwards
// (v - 1) * per + 2 * (pp - 1 - rank) (at most m * v), then one forward and one backward per op,
// then the backwards left. The op's stage cycles through the rank's stages every `per` ops,
// forwards upwards, backwards downwards.
static int interleaved_actions(int pp, int rank, int v, int m, pp_action *out, ct_error *err) {
    const int rounds = m / pp > 1 ? m / pp : 1, per = m / rounds;
    if (m % rounds != 0)
        return ct_fail(err,
                       "parallelism.pipeline_parallel_microbatch_size: %d micro-batches; "
                       "Interleaved1F1B needs a multiple of its %d rounds",
                       m, rounds);
    int warm = (v - 1) * per + 2 * (pp - 1 - rank);
    if (warm > m * v) warm = m * v;
    const int total = m * v;
    int fmb[PP_MAX_LOCAL] = {0}, bmb[PP_MAX_LOCAL] = {0}, n = 0;
    for (int op = 0; op < total + warm; op++) {
        if (op < total) {
            const int k = (op / per) % v;
            out[n++] = (pp_action){k * pp + rank, false, fmb[k]++};
        }
        if (op >= warm) {
            const int k = v - 1 - ((op - warm) / per) % v;
            out[n++] = (pp_action){k * pp + rank, true, bmb[k]++};
        }
    }
    return n;
}

int pp_schedule_actions(pp_schedule_kind kind, int pp, int rank, int n_stages, int m,
                        pp_action *out, ct_error *err) {
    const int v = n_stages / pp;
    if (kind != PP_INTERLEAVED_1F1B) {
        single_actions(kind, rank, n_stages, m, out);
        return 0;
    }
    if (v > PP_MAX_LOCAL)
        return ct_fail(err, "parallelism.pipeline_parallel_degree = %d: %d stages per rank; at "
                            "most %d",
                       pp, v, PP_MAX_LOCAL);
    return interleaved_actions(pp, rank, v, m, out, err) < 0 ? -1 : 0;
}

int pp_schedule_in_flight(const pp_action *actions, int n) {
    int now = 0, most = 0;
    for (int a = 0; a < n; a++) {
        now += actions[a].backward ? -1 : 1;
        if (now > most) most = now;
    }
    return most;
}
