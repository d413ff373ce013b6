// Pipeline parallelism's plan (train/pipeline_schedule.c), without processes: the schedule names,
// torchtitan's default split and module_fqns_per_model_part with their errors, each schedule's
// lists checked for completeness (every stage's forward and backward of every micro-batch once,
// on the stage's rank, the forward first), their most micro-batches in flight (the activation
// sets a rank keeps), and replayed as ranks that block on what the actions receive (the previous
// stage's forward, the next stage's backward): no schedule deadlocks. The order against the
// schedules' tables runs under mpirun in tests/pp.sh.
#include "check.h"
#include "train/pipeline_schedule.h"

#define MAXA 4096

static void split(const char *what, int L, int pp, pp_schedule_kind k, int per, const char *fqns,
                  const int *want_lo, const int *want_hi, int want_S) {
    pp_stage st[64];
    int S = 0;
    ct_error err = {0};
    int rc = pp_split(st, 64, &S, L, pp, k, per, 1, 1, fqns, &err);
    CHECK(rc == 0 && S == want_S, "%s: rc %d, %d stages, expected %d: %s", what, rc, S, want_S,
          err.msg);
    for (int s = 0; rc == 0 && s < S && s < want_S; s++)
        CHECK(st[s].lo == want_lo[s] && st[s].hi == want_hi[s] && st[s].embed == (s == 0) &&
                  st[s].head == (s == S - 1),
              "%s: stage %d is layers [%d, %d), expected [%d, %d)", what, s, st[s].lo, st[s].hi,
              want_lo[s], want_hi[s]);
}

static void refused(const char *what, int L, int pp, pp_schedule_kind k, const char *fqns,
                    const char *needle) {
    pp_stage st[64];
    int S = 0;
    ct_error err = {0};
    CHECK(pp_split(st, 64, &S, L, pp, k, 0, 1, 1, fqns, &err) != 0 && strstr(err.msg, needle),
          "%s: %s", what, err.msg);
}

// Every (stage, micro-batch) forward and backward once on the stage's rank, its forward first,
// and the ranks, each blocking on its next action's input, all finish.
static void replay(pp_schedule_kind k, int pp, int S, int m) {
    static pp_action a[16][MAXA];
    int n = 2 * m * S / pp, at[16] = {0};
    static char fdone[64][64], bdone[64][64];
    memset(fdone, 0, sizeof fdone);
    memset(bdone, 0, sizeof bdone);
    for (int r = 0; r < pp; r++) {
        ct_error err = {0};
        CHECK(pp_schedule_actions(k, pp, r, S, m, a[r], &err) == 0, "kind %d pp %d: %s", k, pp,
              err.msg);
        int seen[64][64][2] = {{{0}}};
        for (int i = 0; i < n; i++) {
            const pp_action *x = &a[r][i];
            CHECK(x->stage % pp == r && x->mb >= 0 && x->mb < m, "kind %d pp %d rank %d: stage %d",
                  k, pp, r, x->stage);
            if (x->backward) CHECK(seen[x->stage][x->mb][0], "B before F");
            seen[x->stage][x->mb][x->backward]++;
        }
        // The activation sets the rank keeps: 1F1B min(m, S - rank), GPipe m, Interleaved1F1B
        // between one and all of its forwards.
        const int sets = pp_schedule_in_flight(a[r], n),
                  want = k == PP_GPIPE ? m : k == PP_1F1B ? (S - r < m ? S - r : m) : -1;
        CHECK(want < 0 ? sets >= 1 && sets <= n / 2 : sets == want,
              "kind %d pp %d m %d rank %d: %d micro-batches in flight, expected %d", k, pp, m, r,
              sets, want);
        for (int s = r; s < S; s += pp)
            for (int i = 0; i < m; i++)
                CHECK(seen[s][i][0] == 1 && seen[s][i][1] == 1,
                      "kind %d pp %d m %d: stage %d mb %d ran %d/%d times", k, pp, m, s, i,
                      seen[s][i][0], seen[s][i][1]);
    }
    for (bool moved = true; moved;) {
        moved = false;
        for (int r = 0; r < pp; r++)
            while (at[r] < n) {
                const pp_action *x = &a[r][at[r]];
                const bool ready = x->backward ? x->stage == S - 1 || bdone[x->stage + 1][x->mb]
                                               : x->stage == 0 || fdone[x->stage - 1][x->mb];
                if (!ready) break;
                (x->backward ? bdone : fdone)[x->stage][x->mb] = 1;
                at[r]++;
                moved = true;
            }
    }
    for (int r = 0; r < pp; r++)
        CHECK(at[r] == n, "kind %d pp %d S %d m %d: rank %d stops at action %d of %d (deadlock)",
              k, pp, S, m, r, at[r], n);
}

int main(void) {
    pp_schedule_kind k;
    ct_error err = {0};
    CHECK(pp_schedule_parse("gpipe", &k, &err) == 0 && k == PP_GPIPE, "case-insensitive");
    CHECK(pp_schedule_parse("interleaved1f1b", &k, &err) == 0 && k == PP_INTERLEAVED_1F1B, "il");
    CHECK(pp_schedule_parse("ZBVZeroBubble", &k, &err) != 0 &&
              strstr(err.msg, "not implemented here; expected one of 1F1B, GPipe, Interleaved1F1B"),
          "zbv: %s", err.msg);
    CHECK(pp_schedule_parse("2F2B", &k, &err) != 0 && strstr(err.msg, "expected one of"),
          "unknown: %s", err.msg);

    // torchtitan's split: L + 2 effective layers over S stages, the first `extra` one more; the
    // embedding's and the head's shares taken from the first and last.
    split("2 layers, 2 stages", 2, 2, PP_1F1B, 0, "", (int[]){0, 1}, (int[]){1, 2}, 2);
    split("6 layers, 4 stages", 6, 2, PP_INTERLEAVED_1F1B, 0, "", (int[]){0, 1, 3, 5},
          (int[]){1, 3, 5, 6}, 4);
    split("8 layers, 4 stages", 8, 4, PP_1F1B, 0, "", (int[]){0, 2, 5, 7}, (int[]){2, 5, 7, 8}, 4);
    split("3 layers per stage", 10, 2, PP_INTERLEAVED_1F1B, 3, "", (int[]){0, 2, 5, 8},
          (int[]){2, 5, 8, 10}, 4);
    split("by names", 6, 2, PP_1F1B, 0,
          "tok_embeddings,layers.0,layers.1,layers.2,layers.3;layers.4,layers.5,norm,output",
          (int[]){0, 4}, (int[]){4, 6}, 2);
    refused("too few layers", 2, 2, PP_INTERLEAVED_1F1B, "", "stage 0 of 4 gets no decoder layer");
    refused("more stages than layers", 1, 4, PP_1F1B, "", "4 stages need at least 2 layers");
    refused("names out of order", 2, 2, PP_1F1B, "tok_embeddings,layers.1;layers.0,norm,output",
            "\"layers.1\" in stage 0");
    refused("a layer left out", 3, 2, PP_1F1B, "tok_embeddings,layers.0;layers.2,norm,output",
            "\"layers.2\" in stage 1");
    refused("no head", 2, 2, PP_1F1B, "tok_embeddings,layers.0;layers.1", "no norm, no output");
    refused("stages for the ranks", 2, 2, PP_1F1B, "tok_embeddings,layers.0,layers.1,norm,output",
            "1 stages (module_fqns_per_model_part) for a schedule that places one stage per rank");

    // 1F1B at pp 4, m 8: rank 0 warms up with 4 forwards, rank 3 with 1.
    pp_action a[64];
    CHECK(pp_schedule_actions(PP_1F1B, 4, 0, 4, 8, a, &err) == 0, "1f1b");
    const char *want0 = "F0F1F2F3B0F4B1F5B2F6B3F7B4B5B6B7", *want3 = "F0B0F1B1F2B2F3B3F4B4F5B5F6B6F7B7";
    char got[128] = "";
    for (int i = 0; i < 16; i++)
        snprintf(got + strlen(got), sizeof got - strlen(got), "%c%d", a[i].backward ? 'B' : 'F',
                 a[i].mb);
    CHECK(strcmp(got, want0) == 0, "1F1B rank 0: %s", got);
    CHECK(pp_schedule_actions(PP_1F1B, 4, 3, 4, 8, a, &err) == 0, "1f1b");
    got[0] = 0;
    for (int i = 0; i < 16; i++)
        snprintf(got + strlen(got), sizeof got - strlen(got), "%c%d", a[i].backward ? 'B' : 'F',
                 a[i].mb);
    CHECK(strcmp(got, want3) == 0, "1F1B rank 3: %s", got);
    CHECK(pp_schedule_actions(PP_INTERLEAVED_1F1B, 4, 0, 8, 9, a, &err) != 0 &&
              strstr(err.msg, "9 micro-batches; Interleaved1F1B needs a multiple of its 2 rounds"),
          "9 micro-batches at pp 4: %s", err.msg);

    for (int pp = 2; pp <= 4; pp++)
        for (int m = 1; m <= 12; m++) {
            replay(PP_1F1B, pp, pp, m);
            replay(PP_GPIPE, pp, pp, m);
            const int rounds = m / pp > 1 ? m / pp : 1;
            if (m % rounds == 0) {
                replay(PP_INTERLEAVED_1F1B, pp, 2 * pp, m);
                replay(PP_INTERLEAVED_1F1B, pp, 3 * pp, m);
            }
        }
    return check_summary();
}
