// The optimizer pieces on their own: AdamW against torch.optim.AdamW's own results (bit for bit
// where this torch fuses its multiply-adds) and against the formula in double; weight-decay
// exclusion; the LR schedule against torchtitan's formula run through torch's LambdaLR and
// against values worked out by hand; clipping as clip_grad_norm_.
#include <omp.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "check.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "optim/lr_schedule.h"

// Deterministic values in [-1, 1).
static float frand(uint64_t *s) {
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((double)(*s >> 40) / (double)(1ULL << 23) - 1.0);
}

static int count_bit_diffs(const float *a, const float *b, size_t n) {
    int d = 0;
    for (size_t i = 0; i < n; i++) d += memcmp(&a[i], &b[i], sizeof(float)) != 0;
    return d;
}

// Largest |a-b| / max(|b|, floor) over the elements.
static double max_rel(const float *a, const float *b, size_t n, double floor) {
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]) / fmax(fabs((double)b[i]), floor);
        if (!(d <= worst)) worst = isnan(d) ? INFINITY : d;
    }
    return worst;
}

static int load_f32(float *dst, size_t n, const st_file *f, const char *name) {
    const st_tensor *t = st_file_find(f, name);
    ct_error err;
    if (!t || t->numel != n || st_tensor_to_f32(dst, t, &err) != 0) {
        CHECK(0, "reference tensor %s missing or of the wrong size", name);
        return -1;
    }
    return 0;
}

// torch's own AdamW steps (tests/ref/train_ref.py write_adamw) replayed one by one: each step
// starts from torch's previous state, so a difference is this step's and does not compound.
static void test_adamw_vs_torch(const char *ref) {
    char path[4096];
    ct_error err;
    cJSON *meta = NULL;
    st_file f = {0};
    snprintf(path, sizeof path, "%s/train/adamw.json", ref);
    int rc = json_parse_file(&meta, path, &err);
    CHECK(rc == 0, "%s", err.msg);
    snprintf(path, sizeof path, "%s/train/adamw.safetensors", ref);
    if (rc == 0) rc = st_open(&f, path, &err);
    CHECK(rc == 0, "%s", err.msg);
    if (rc != 0) {
        cJSON_Delete(meta);
        return;
    }
    int64_t n64 = 0;
    bool fused = false;
    json_get_int(&n64, meta, "n", true, 1, 1 << 20, path, &err);
    json_get_bool(&fused, meta, "fused", true, path, &err);
    size_t n = (size_t)n64;
    float *p = malloc(n * sizeof *p), *g = malloc(n * sizeof *g), *want = malloc(n * sizeof *want);
    const cJSON *runs = cJSON_GetObjectItemCaseSensitive(meta, "runs"), *run;
    int r = 0, steps_checked = 0;
    cJSON_ArrayForEach(run, runs) {
        adamw_hparams h = {0};
        json_get_double(&h.beta1, run, "beta1", true, path, &err);
        json_get_double(&h.beta2, run, "beta2", true, path, &err);
        json_get_double(&h.eps, run, "eps", true, path, &err);
        json_get_double(&h.weight_decay, run, "weight_decay", true, path, &err);
        adamw o;
        CHECK(adamw_init(&o, n, &err) == 0, "%s", err.msg);
        load_f32(p, n, &f, "p0");
        const cJSON *lr;
        int k = 0;
        cJSON_ArrayForEach(lr, cJSON_GetObjectItemCaseSensitive(run, "lrs")) {
            char name[64];
            if (k > 0) { // continue from torch's state after step k-1
                snprintf(name, sizeof name, "p.%d.%d", r, k - 1);
                load_f32(p, n, &f, name);
                snprintf(name, sizeof name, "m.%d.%d", r, k - 1);
                load_f32(o.m, n, &f, name);
                snprintf(name, sizeof name, "v.%d.%d", r, k - 1);
                load_f32(o.v, n, &f, name);
            }
            snprintf(name, sizeof name, "g.%d.%d", r, k);
            load_f32(g, n, &f, name);
            adamw_step(&o, p, g, &h, lr->valuedouble);
            CHECK(o.step == k + 1, "step count %lld after %d steps", (long long)o.step, k + 1);
            const char *what[3] = {"p", "m", "v"};
            const float *got[3] = {p, o.m, o.v};
            for (int w = 0; w < 3; w++) {
                snprintf(name, sizeof name, "%s.%d.%d", what[w], r, k);
                if (load_f32(want, n, &f, name) != 0) continue;
                int diffs = count_bit_diffs(got[w], want, n);
                double rel = max_rel(got[w], want, n, 1e-30);
                // Without fused kernels torch rounds the moment updates twice: a few ulps.
                if (fused)
                    CHECK(diffs == 0,
                          "AdamW run %d step %d: %s differs from torch in %d of %zu "
                          "elements (max rel %.2e)",
                          r, k, what[w], diffs, n, rel);
                else
                    CHECK(rel < 1e-6, "AdamW run %d step %d: %s max rel %.2e", r, k, what[w], rel);
            }
            steps_checked++;
            k++;
        }
        adamw_free(&o);
        r++;
    }
    CHECK(r == 2 && steps_checked == 7, "replayed %d runs, %d steps", r, steps_checked);
    printf("adamw vs torch: %d steps over %d runs, %s\n", steps_checked, r,
           fused ? "bit-identical required (torch fuses)" : "within 1e-6 (torch does not fuse)");
    free(p), free(g), free(want);
    st_close(&f);
    cJSON_Delete(meta);
}

// Many steps of the formula in double, from the same start, on gradients of mixed scales.
static void test_adamw_vs_double(void) {
    enum { N = 4099, STEPS = 20 };
    adamw_hparams h = {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    static float p[N], g[N];
    static double pd[N], md[N], vd[N];
    uint64_t s = 7;
    for (int i = 0; i < N; i++) pd[i] = p[i] = frand(&s);
    adamw o;
    ct_error err;
    CHECK(adamw_init(&o, N, &err) == 0, "%s", err.msg);
    double worst_p = 0, worst_m = 0, worst_v = 0;
    for (int t = 1; t <= STEPS; t++) {
        double lr = 1e-3 * (1.0 + 0.1 * t);
        for (int i = 0; i < N; i++) g[i] = frand(&s) * (i % 3 == 0 ? 1e-4f : 1.0f);
        adamw_step(&o, p, g, &h, lr);
        double bc1 = 1 - pow(h.beta1, t), bc2 = 1 - pow(h.beta2, t);
        for (int i = 0; i < N; i++) {
            pd[i] *= 1 - lr * h.weight_decay;
            md[i] = h.beta1 * md[i] + (1 - h.beta1) * g[i];
            vd[i] = h.beta2 * vd[i] + (1 - h.beta2) * (double)g[i] * g[i];
            pd[i] -= lr / bc1 * md[i] / (sqrt(vd[i]) / sqrt(bc2) + h.eps);
            worst_p = fmax(worst_p, fabs(p[i] - pd[i]));
            // m can cancel to near 0: measure it against the scale of its gradients.
            double gscale = i % 3 == 0 ? 1e-4 : 1.0;
            worst_m = fmax(worst_m, fabs(o.m[i] - md[i]) / gscale);
            worst_v = fmax(worst_v, fabs(o.v[i] - vd[i]) / fmax(vd[i], 1e-24));
        }
    }
    // fp32 rounding over 20 steps of ~1e-3 updates on values of size 1: a few 1e-7 absolute.
    CHECK(worst_p < 1e-6, "AdamW vs double: params max abs %.2e", worst_p);
    CHECK(worst_m < 1e-5 && worst_v < 1e-5, "AdamW vs double: m %.2e of |g|, v rel %.2e", worst_m,
          worst_v);
    printf("adamw vs double (%d steps): params %.1e abs, m %.1e (of |g|), v %.1e rel\n", STEPS,
           worst_p, worst_m, worst_v);
    adamw_free(&o);
}

// Excluded ranges take the weight_decay=0 update, the rest the decayed one, exactly; and the
// result does not depend on the thread count.
static void test_adamw_no_decay(void) {
    enum { N = 1000 };
    static float p0[N], g[N], pa[N], pb[N], pc[N];
    uint64_t s = 11;
    for (int i = 0; i < N; i++) p0[i] = frand(&s), g[i] = frand(&s);
    adamw_hparams h = {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.5};
    adamw_hparams h0 = h;
    h0.weight_decay = 0;
    adamw a, b, c;
    ct_error err;
    CHECK(adamw_init(&a, N, &err) == 0 && adamw_init(&b, N, &err) == 0 &&
              adamw_init(&c, N, &err) == 0,
          "%s", err.msg);
    // Given out of order; [0,10) at the start, [990,1000) at the end, one in the middle.
    CHECK(adamw_exclude_decay(&a, 500, 37, &err) == 0, "%s", err.msg);
    CHECK(adamw_exclude_decay(&a, 990, 10, &err) == 0, "%s", err.msg);
    CHECK(adamw_exclude_decay(&a, 0, 10, &err) == 0, "%s", err.msg);
    CHECK(adamw_exclude_decay(&a, 600, 0, &err) == 0, "empty range: %s", err.msg);
    CHECK(a.n_no_decay == 3 && a.no_decay[0].offset == 0 && a.no_decay[1].offset == 500 &&
              a.no_decay[2].offset == 990,
          "ranges kept sorted");
    CHECK(adamw_exclude_decay(&a, 530, 20, &err) != 0 && strstr(err.msg, "overlaps"),
          "overlap refused: %s", err.msg);
    CHECK(adamw_exclude_decay(&a, 5, 10, &err) != 0 && strstr(err.msg, "overlaps"),
          "overlap refused: %s", err.msg);
    CHECK(adamw_exclude_decay(&a, 995, 10, &err) != 0 && strstr(err.msg, "outside"),
          "out of bounds refused: %s", err.msg);
    CHECK(adamw_exclude_decay(&a, SIZE_MAX, 2, &err) != 0, "offset overflow refused");
    memcpy(pa, p0, sizeof p0), memcpy(pb, p0, sizeof p0), memcpy(pc, p0, sizeof p0);
    for (int t = 0; t < 3; t++) {
        omp_set_num_threads(t == 1 ? 1 : 3);
        adamw_step(&a, pa, g, &h, 1e-2);
        adamw_step(&b, pb, g, &h, 1e-2);
        adamw_step(&c, pc, g, &h0, 1e-2);
    }
    omp_set_num_threads(2);
    int bad = 0;
    for (int i = 0; i < N; i++) {
        bool off = i < 10 || (i >= 500 && i < 537) || i >= 990;
        const float *want = off ? pc : pb;
        bad += memcmp(&pa[i], &want[i], sizeof(float)) != 0;
    }
    CHECK(bad == 0, "%d elements took the wrong decay", bad);
    CHECK(memcmp(pb, pc, sizeof pb) != 0, "weight decay changes the result");
    CHECK(memcmp(a.m, b.m, sizeof(float) * N) == 0 && memcmp(a.v, b.v, sizeof(float) * N) == 0,
          "moments do not depend on decay");
    adamw_free(&a), adamw_free(&b), adamw_free(&c);

    CHECK(adamw_init(&a, 0, &err) != 0, "zero parameters refused");
    CHECK(!adamw_param_decays("model.norm.weight", 1), "norm");
    CHECK(!adamw_param_decays("model.layers.0.self_attn.q_norm.weight", 1), "q_norm");
    CHECK(!adamw_param_decays("model.layers.3.self_attn.q_proj.bias", 1), "bias");
    CHECK(!adamw_param_decays("model.embed_tokens.weight", 2), "embedding");
    CHECK(adamw_param_decays("model.layers.0.mlp.down_proj.weight", 2), "matrix");
    CHECK(adamw_param_decays("lm_head.weight", 2), "untied lm_head decays");
}

// ZeRO-1: AdamW over shards of the buffer, each with its own moments, gives exactly the full
// optimizer's result, with no-decay ranges that straddle shard boundaries.
static void test_adamw_shards(void) {
    enum { N = 1001 };
    static float p0[N], g[N], full[N], sharded[N];
    uint64_t s = 5;
    for (int i = 0; i < N; i++) p0[i] = frand(&s), g[i] = frand(&s);
    adamw_hparams h = {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.3};
    const size_t nd[][2] = {{0, 10}, {320, 50}, {660, 20}, {990, 11}}; // crosses 333 and 667
    ct_error err;
    adamw whole;
    CHECK(adamw_init(&whole, N, &err) == 0, "%s", err.msg);
    for (int r = 0; r < 4; r++) adamw_exclude_decay(&whole, nd[r][0], nd[r][1], &err);
    memcpy(full, p0, sizeof p0), memcpy(sharded, p0, sizeof p0);
    const size_t cut[] = {0, 333, 667, 667, N}; // shard 2 is empty
    adamw part[4];
    for (int k = 0; k < 4; k++) {
        CHECK(adamw_init_shard(&part[k], NULL, N, cut[k], cut[k + 1] - cut[k], &err) == 0, "%s",
              err.msg);
        for (int r = 0; r < 4; r++)
            CHECK(adamw_exclude_decay(&part[k], nd[r][0], nd[r][1], &err) == 0, "%s", err.msg);
    }
    CHECK(part[1].n_no_decay == 2 && part[1].no_decay[0].offset == 0 &&
              part[1].no_decay[0].numel == 37 && part[1].no_decay[1].offset == 327 &&
              part[1].no_decay[1].numel == 7,
          "shard 1 keeps [333, 370) and [660, 667) as [0, 37) and [327, 334)");
    for (int t = 0; t < 3; t++) {
        adamw_step(&whole, full, g, &h, 1e-2);
        for (int k = 0; k < 4; k++) adamw_step(&part[k], sharded, g, &h, 1e-2);
    }
    CHECK(count_bit_diffs(full, sharded, N) == 0, "sharded AdamW differs from the whole");
    int bad = 0;
    for (int k = 0; k < 4; k++) {
        size_t n = cut[k + 1] - cut[k];
        bad += count_bit_diffs(part[k].m, whole.m + cut[k], n) +
               count_bit_diffs(part[k].v, whole.v + cut[k], n);
        CHECK(part[k].step == 3, "every shard counts the steps");
        adamw_free(&part[k]);
    }
    CHECK(bad == 0, "%d moment elements differ", bad);
    CHECK(adamw_init_shard(&part[0], NULL, N, 1000, 2, &err) != 0 && strstr(err.msg, "outside"),
          "shard past the end refused: %s", err.msg);
    adamw_free(&whole);
}

// LambdaLR's learning rates over every step of each setting in schedules.json: the same double
// expressions, the same libm, so equality is exact.
static void test_schedule_vs_torch(const char *ref) {
    char path[4096];
    ct_error err;
    cJSON *root = NULL;
    snprintf(path, sizeof path, "%s/train/schedules.json", ref);
    int rc = json_parse_file(&root, path, &err);
    CHECK(rc == 0, "%s", err.msg);
    if (rc != 0) return;
    const cJSON *it;
    int n_sched = 0, n_values = 0;
    cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(root, "schedules")) {
        lr_schedule_cfg c = {0};
        int64_t steps = 0;
        char type[16];
        json_get_double(&c.lr, it, "lr", true, path, &err);
        json_get_int(&steps, it, "steps", true, 1, 1 << 20, path, &err);
        json_get_int(&c.warmup_steps, it, "warmup_steps", true, 0, 1 << 20, path, &err);
        const cJSON *ratio = cJSON_GetObjectItemCaseSensitive(it, "decay_ratio");
        CHECK(cJSON_IsNumber(ratio) || cJSON_IsNull(ratio), "%s: decay_ratio", path);
        c.decay_ratio = cJSON_IsNumber(ratio) ? ratio->valuedouble : NAN; // null: unset
        json_get_double(&c.min_lr_factor, it, "min_lr_factor", true, path, &err);
        json_get_string(type, sizeof type, it, "decay_type", true, path, &err);
        CHECK(lr_decay_parse(&c.decay_type, type, &err) == 0, "%s", err.msg);
        const cJSON *v;
        int64_t s = 0;
        cJSON_ArrayForEach(v, cJSON_GetObjectItemCaseSensitive(it, "lrs")) {
            double got = lr_at(&c, s, steps);
            CHECK(got == v->valuedouble,
                  "schedule steps=%lld warmup=%lld decay_ratio=%g %s min=%g: step %lld lr %.17g, "
                  "torch %.17g",
                  (long long)steps, (long long)c.warmup_steps, c.decay_ratio, type, c.min_lr_factor,
                  (long long)s, got, v->valuedouble);
            s++, n_values++;
        }
        CHECK(s == steps + 1, "schedule lists %lld values for %lld steps", (long long)s,
              (long long)steps);
        n_sched++;
    }
    CHECK(n_sched >= 10, "only %d schedules", n_sched);
    printf("lr schedule vs LambdaLR: %d values over %d settings, all equal\n", n_values, n_sched);
    cJSON_Delete(root);
}

// Values that follow from the definition alone.
static void test_schedule_by_hand(void) {
    lr_schedule_cfg c = {.lr = 2.0, .warmup_steps = 0, .decay_ratio = 0};
    for (int s = 0; s < 50; s++) CHECK(lr_at(&c, s, 50) == 2.0, "constant at step %d", s);
    c.warmup_steps = 4; // warmup then constant: 1/4, 2/4, 3/4, 1, 1, ...
    CHECK(lr_factor(&c, 0, 10) == 0.25 && lr_factor(&c, 2, 10) == 0.75 &&
              lr_factor(&c, 3, 10) == 1.0 && lr_factor(&c, 9, 10) == 1.0,
          "warmup (step+1)/warmup_steps");
    // 100 steps, warmup 10, decay_ratio 0.2 -> 20 decay steps; stable = 100 + 1 - 10 - 20 = 71,
    // so the decay starts at step 81: progress (step + 1 - 81) / 20.
    c = (lr_schedule_cfg){.lr = 1,
                          .warmup_steps = 10,
                          .decay_ratio = 0.2,
                          .decay_type = LR_DECAY_LINEAR,
                          .min_lr_factor = 0.1};
    CHECK(lr_factor(&c, 9, 100) == 1.0 && lr_factor(&c, 80, 100) == 1.0, "stable phase");
    CHECK(fabs(lr_factor(&c, 81, 100) - (0.1 + 0.9 * (1 - 1 / 20.0))) < 1e-15, "first decay");
    CHECK(fabs(lr_factor(&c, 99, 100) - (0.1 + 0.9 * (1 - 19 / 20.0))) < 1e-15, "last step");
    CHECK(fabs(lr_factor(&c, 100, 100) - 0.1) < 1e-15, "the floor at the virtual last step");
    CHECK(lr_factor(&c, 1000, 100) == lr_factor(&c, 100, 100), "past the end: clamped");
    c.decay_type = LR_DECAY_SQRT;
    CHECK(fabs(lr_factor(&c, 85, 100) - (0.1 + 0.9 * (1 - sqrt(5 / 20.0)))) < 1e-15, "sqrt");
    c.decay_type = LR_DECAY_COSINE;
    CHECK(fabs(lr_factor(&c, 90, 100) - (0.1 + 0.9 * 0.5 * (1 + cos(M_PI * 0.5)))) < 1e-15,
          "cosine halfway");
    double prev = 2;
    for (int s = 0; s <= 100; s++) { // warmup rises, decay falls, never below the floor
        double f = lr_factor(&c, s, 100);
        CHECK(f > 0 && f <= 1 && f >= 0.1 - 1e-15, "factor %g at step %d", f, s);
        if (s >= 10) CHECK(f <= prev, "not increasing after warmup at step %d", s);
        prev = f;
    }
    // Clamps: warmup longer than the run, decay longer than what warmup leaves.
    c = (lr_schedule_cfg){.lr = 1, .warmup_steps = 30, .decay_ratio = 0.5};
    CHECK(lr_factor(&c, 9, 10) == 1.0 && lr_factor(&c, 0, 10) == 0.1, "warmup clamped to steps");
    c.warmup_steps = 8; // decay round(5) clamped to 10 - 8 = 2; stable 1; decay from step 9
    CHECK(lr_factor(&c, 8, 10) == 1.0 && lr_factor(&c, 9, 10) == 0.5, "decay clamped");
    c = (lr_schedule_cfg){.lr = 1, .decay_ratio = 0.5}; // round(2.5) = 2 (half to even)
    CHECK(lr_factor(&c, 3, 5) == 1.0 && lr_factor(&c, 4, 5) == 0.5, "round half to even");

    // torchtitan's phases in the cases issue 16 names. decay_ratio unset: decay over all steps
    // after the warmup; 10 steps, warmup 3 -> decay 7, stable 1 (the virtual step), so step 3
    // is 1 and step 4 has progress 1/7.
    c = (lr_schedule_cfg){.lr = 1, .warmup_steps = 3, .decay_ratio = NAN};
    lr_phases ph = lr_phases_of(&c, 10);
    CHECK(ph.warmup == 3 && ph.stable == 1 && ph.decay == 7 && !ph.warmup_clamped &&
              !ph.decay_clamped,
          "unset decay_ratio: %lld %lld %lld", (long long)ph.warmup, (long long)ph.stable,
          (long long)ph.decay);
    CHECK(lr_factor(&c, 2, 10) == 1.0 && lr_factor(&c, 3, 10) == 1.0 &&
              lr_factor(&c, 4, 10) == 1 - 1 / 7.0 && lr_factor(&c, 9, 10) == 1 - 6 / 7.0,
          "unset decay_ratio decays after the warmup");
    c.warmup_steps = 0; // warmup_steps = 0: the first step already decays after one stable step
    ph = lr_phases_of(&c, 10);
    CHECK(ph.warmup == 0 && ph.stable == 1 && ph.decay == 10, "warmup 0, unset ratio");
    CHECK(lr_factor(&c, 0, 10) == 1.0 && lr_factor(&c, 1, 10) == 1 - 1 / 10.0, "warmup 0");
    c.warmup_steps = 200; // warmup longer than the run: clamped, nothing left to decay
    ph = lr_phases_of(&c, 10);
    CHECK(ph.warmup == 10 && ph.decay == 0 && ph.stable == 1 && ph.warmup_clamped &&
              !ph.decay_clamped,
          "warmup clamped");
    CHECK(lr_factor(&c, 0, 10) == 0.1 && lr_factor(&c, 9, 10) == 1.0, "clamped warmup factors");
    c = (lr_schedule_cfg){.lr = 1, .warmup_steps = 6, .decay_ratio = 0.6}; // 6 + 6 > 10
    ph = lr_phases_of(&c, 10);
    CHECK(ph.warmup == 6 && ph.decay == 4 && ph.stable == 1 && ph.decay_clamped &&
              !ph.warmup_clamped,
          "decay clamped to what the warmup leaves");

    lr_decay_type t;
    ct_error err;
    CHECK(lr_decay_parse(&t, "cosine", &err) == 0 && t == LR_DECAY_COSINE, "parse cosine");
    CHECK(lr_decay_parse(&t, "sqrt", &err) == 0 && t == LR_DECAY_SQRT, "parse sqrt");
    CHECK(lr_decay_parse(&t, "linear", &err) == 0 && t == LR_DECAY_LINEAR, "parse linear");
    CHECK(lr_decay_parse(&t, "Cosine", &err) != 0 && strstr(err.msg, "decay_type") &&
              strstr(err.msg, "\"Cosine\""),
          "bad name: %s", err.msg);
    CHECK(strcmp(lr_decay_name(LR_DECAY_SQRT), "sqrt") == 0, "name");
}

static void test_clip(void) {
    enum { N = 3 * (1 << 16) * 5 + 123 }; // several chunks and a ragged end
    float *g = malloc(N * sizeof *g), *g2 = malloc(N * sizeof *g2);
    uint64_t s = 3;
    double exact = 0;
    for (int i = 0; i < N; i++) {
        g[i] = frand(&s) * (i % 7 == 0 ? 100.0f : 0.01f);
        exact += (double)g[i] * g[i];
    }
    omp_set_num_threads(1);
    double ss1 = clip_sum_squares(&ct_ops_cpu, g, N);
    omp_set_num_threads(3);
    double ss3 = clip_sum_squares(&ct_ops_cpu, g, N);
    omp_set_num_threads(2);
    CHECK(ss1 == ss3, "sum of squares depends on the thread count: %.17g vs %.17g", ss1, ss3);
    CHECK(fabs(ss1 - exact) <= 1e-12 * exact, "sum of squares %.17g vs %.17g", ss1, exact);

    double norm = sqrt(exact);
    // Below the limit, or clipping off: untouched, and the norm is still returned.
    memcpy(g2, g, N * sizeof *g);
    CHECK(clip_grad_norm(&ct_ops_cpu, g2, N, norm * 2) == sqrt(ss1), "norm returned");
    CHECK(memcmp(g, g2, N * sizeof *g) == 0, "no clipping below max_norm");
    CHECK(clip_grad_norm(&ct_ops_cpu, g2, N, 0) == sqrt(ss1) && memcmp(g, g2, N * sizeof *g) == 0,
          "max_norm 0 is off");
    // Above: g *= max_norm / (norm + 1e-6), formed in fp32 as torch does.
    double max_norm = norm / 4;
    float coef = (1.0f / ((float)norm + 1e-6f)) * (float)max_norm;
    CHECK(clip_coefficient(norm, max_norm) == coef, "coefficient %.9g vs %.9g",
          clip_coefficient(norm, max_norm), coef);
    CHECK(clip_grad_norm(&ct_ops_cpu, g2, N, max_norm) == sqrt(ss1), "pre-clip norm returned");
    int bad = 0;
    for (int i = 0; i < N; i++) bad += g2[i] != g[i] * coef;
    CHECK(bad == 0, "%d elements not scaled by the coefficient", bad);
    double after = sqrt(clip_sum_squares(&ct_ops_cpu, g2, N));
    CHECK(fabs(after - max_norm) < 1e-5 * max_norm, "norm after clipping %.9g, max %.9g", after,
          max_norm);
    CHECK(clip_coefficient(1.0, 1.0) < 1.0f, "norm == max_norm: the 1e-6 makes it clip a hair");
    // Non-finite norms leave the gradients alone; the trainer skips the step.
    CHECK(clip_coefficient(NAN, 1.0) == 1.0f && clip_coefficient(INFINITY, 1.0) == 1.0f,
          "non-finite norm: coefficient 1");
    memcpy(g2, g, N * sizeof *g);
    g2[17] = NAN;
    CHECK(isnan(clip_grad_norm(&ct_ops_cpu, g2, N, 1.0)), "NaN gradient gives a NaN norm");
    CHECK(memcmp(g2, g, 17 * sizeof *g) == 0, "gradients untouched when the norm is NaN");
    g2[17] = INFINITY;
    CHECK(isinf(clip_grad_norm(&ct_ops_cpu, g2, N, 1.0)),
          "infinite gradient gives an infinite norm");
    float big[2] = {3e38f, 3e38f}; // squares overflow fp32 but not the double accumulator
    CHECK(isfinite(clip_grad_norm(&ct_ops_cpu, big, 2, 0)),
          "large finite gradients have a finite norm");
    CHECK(clip_sum_squares(&ct_ops_cpu, g, 0) == 0, "empty");
    free(g), free(g2);
}

// adamw_step_scaled (the trainer's clipping folded into the update) gives the bits of
// clip_scale followed by adamw_step, over several steps, and leaves the gradients untouched.
static void test_adamw_scaled(void) {
    enum { N = 5003 };
    static float g[N], gs[N], pa[N], pb[N];
    for (int i = 0; i < N; i++) {
        g[i] = (float)sin(0.37 * i) * (i % 7 ? 1e-3f : 3.0f);
        pa[i] = pb[i] = (float)cos(0.11 * i);
    }
    adamw a, b;
    ct_error err;
    const adamw_hparams h = {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    CHECK(adamw_init(&a, N, &err) == 0 && adamw_init(&b, N, &err) == 0, "%s", err.msg);
    const float coefs[] = {0.3173f, 1.0f, 0.0421f};
    for (int t = 0; t < 3; t++) {
        memcpy(gs, g, sizeof g);
        clip_scale(gs, N, coefs[t]);
        adamw_step(&a, pa, gs, &h, 1e-2);
        adamw_step_scaled(&b, NULL, pb, NULL, g, &h, 1e-2, coefs[t]);
    }
    CHECK(memcmp(pa, pb, sizeof pa) == 0 && memcmp(a.m, b.m, sizeof(float) * N) == 0 &&
              memcmp(a.v, b.v, sizeof(float) * N) == 0,
          "adamw_step_scaled differs from clip_scale + adamw_step");
    adamw_free(&a), adamw_free(&b);
}

int main(void) {
    const char *ref = check_env("CTITAN_REF_DIR");
    test_adamw_scaled();
    test_adamw_vs_torch(ref);
    test_adamw_vs_double();
    test_adamw_no_decay();
    test_adamw_shards();
    test_schedule_vs_torch(ref);
    test_schedule_by_hand();
    test_clip();
    return check_summary();
}
