// Sampling (gen/sample.c) against transformers' logits warpers (tests/ref/gen_ref.py: the
// temperature, top-k and top-p warpers as generate applies them, on fixed logits with ties):
// the same surviving tokens exactly and the renormalised distribution within 1e-6; greedy's
// argmax (first index among ties); seeded draws reproducible, from survivors only, and at the
// distribution's frequencies; the settings' errors.
#include <math.h>
#include <string.h>

#include "check.h"
#include "gen/sample.h"
#include "io/safetensors.h"

static int cmp_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

// (row, temperature, top_k, top_p): gen_ref.py's CASES, in order.
static const struct {
    int row;
    float t;
    int k;
    float p;
} cases[] = {{0, 1.0f, 0, 1.0f},  {0, 0.7f, 50, 1.0f},  {0, 1.3f, 0, 0.9f}, {0, 0.8f, 40, 0.95f},
             {1, 1.0f, 10, 1.0f}, {1, 1.0f, 0, 0.5f},   {1, 0.5f, 3, 0.8f}, {2, 1.0f, 2, 1.0f},
             {2, 1.0f, 0, 0.3f},  {2, 2.0f, 0, 0.999f}, {0, 1.0f, 1, 1.0f}, {0, 1.0f, 0, 0.01f}};

int main(void) {
    char path[4096];
    ct_error err;
    st_file f;
    snprintf(path, sizeof path, "%s/sample.safetensors", check_env("CTITAN_REF_DIR"));
    if (st_open(&f, path, &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    const st_tensor *lt = st_file_find(&f, "logits");
    const int R = (int)lt->shape[0], V = (int)lt->shape[1];
    float *logits = malloc((size_t)R * V * sizeof *logits), *want = malloc(V * sizeof *want);
    st_tensor_to_f32(logits, lt, &err);
    double worst = 0;
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        char name[32];
        snprintf(name, sizeof name, "probs.%zu", c);
        const st_tensor *pt = st_file_find(&f, name);
        CHECK(pt && st_tensor_to_f32(want, pt, &err) == 0, "%s", name);
        gen_sampler s;
        CHECK(gen_sampler_init(&s, V, cases[c].t, cases[c].k, cases[c].p, 1, &err) == 0, "%s",
              err.msg);
        const float *row = logits + (size_t)cases[c].row * V;
        const int kept = gen_sampler_probs(&s, row);
        int want_kept = 0, same_set = 1;
        for (int i = 0; i < V; i++) {
            want_kept += want[i] != 0.0f;
            same_set &= (want[i] != 0.0f) == (s.probs[i] != 0.0f);
        }
        // Top-p cutting through equal scores: torch's sort is not stable, so which of the tied
        // ids HF removes is its sort's internal order (ours: the lower id first). There the same
        // scores must survive, each with HF's probability: compare the sorted distributions.
        const bool tie_cut = !same_set && cases[c].p < 1.0f;
        if (tie_cut) {
            float *mine = malloc(V * sizeof *mine), *hf = malloc(V * sizeof *hf);
            memcpy(mine, s.probs, V * sizeof *mine);
            memcpy(hf, want, V * sizeof *hf);
            qsort(mine, V, sizeof *mine, cmp_float);
            qsort(hf, V, sizeof *hf, cmp_float);
            same_set = check_max_abs(mine, hf, (size_t)V) <= 1e-6;
            memcpy(want, s.probs, V * sizeof *want); // the draws' check below uses ours
            free(mine);
            free(hf);
            printf("case %zu: top-p cuts through tied scores; compared as sorted values\n", c);
        }
        const double e = check_max_abs(s.probs, want, (size_t)V);
        if (e > worst) worst = e;
        CHECK(same_set && kept == want_kept, "case %zu: %d tokens kept, HF keeps %d", c, kept,
              want_kept);
        CHECK(e <= 1e-6, "case %zu: probabilities max abs %.3g", c, e);
        // Draws: from survivors only, reproducible, at the distribution's frequencies.
        enum { DRAWS = 20000 };
        gen_sampler s2;
        gen_sampler_init(&s2, V, cases[c].t, cases[c].k, cases[c].p, 1, &err);
        double *freq = calloc(V, sizeof *freq);
        int same = 1, outside = 0;
        for (int d = 0; d < DRAWS; d++) {
            const int32_t a = gen_sample(&s, row), b = gen_sample(&s2, row);
            same &= a == b;
            outside += want[a] == 0.0f;
            freq[a] += 1.0 / DRAWS;
        }
        double fmax = 0;
        for (int i = 0; i < V; i++) {
            const double d = fabs(freq[i] - want[i]);
            fmax = d > fmax ? d : fmax;
        }
        CHECK(same, "case %zu: the same seed gave other tokens", c);
        CHECK(!outside, "case %zu: %d draws outside the kept tokens", c, outside);
        CHECK(fmax < 0.02, "case %zu: draw frequencies off by %.3g", c, fmax);
        printf("case %2zu (row %d, t %.2f, top_k %2d, top_p %.3f): %4d kept, max abs %.1e, "
               "frequencies within %.1e\n",
               c, cases[c].row, cases[c].t, cases[c].k, cases[c].p, kept, e, fmax);
        free(freq);
        gen_sampler_free(&s);
        gen_sampler_free(&s2);
    }
    // Another seed, other tokens; greedy is the first index among equal maxima.
    gen_sampler a, b, g;
    gen_sampler_init(&a, V, 1.0f, 0, 1.0f, 1, &err);
    gen_sampler_init(&b, V, 1.0f, 0, 1.0f, 2, &err);
    gen_sampler_init(&g, V, 0.0f, 50, 0.5f, 1, &err);
    int differ = 0;
    for (int d = 0; d < 20; d++) differ += gen_sample(&a, logits) != gen_sample(&b, logits);
    CHECK(differ > 10, "seeds 1 and 2 agree on %d of 20 draws", 20 - differ);
    const float *ties = logits + (size_t)1 * V;
    int first = 0;
    for (int i = 1; i < V; i++)
        if (ties[i] > ties[first]) first = i;
    CHECK(gen_sample(&g, ties) == first, "greedy %d, first maximum %d", gen_sample(&g, ties),
          first);
    CHECK(gen_sample(&g, logits + 2 * (size_t)V) == 0, "greedy on the peaked row");
    // A row with no finite score (a broken model's): no token left, and the draw is id 0, as
    // greedy's first maximum, instead of a distribution of NaNs.
    float *none = malloc((size_t)V * sizeof *none);
    for (int i = 0; i < V; i++) none[i] = -INFINITY;
    gen_sampler t;
    gen_sampler_init(&t, V, 0.7f, 20, 0.8f, 1, &err);
    CHECK(gen_sampler_probs(&t, none) == 0 && gen_sample(&t, none) == 0,
          "no finite score: %d tokens left, draw %d", gen_sampler_probs(&t, none),
          gen_sample(&t, none));
    gen_sampler_free(&t);
    free(none);
    // Top-p's sort ties -0 and +0 (`<` does), the lower id first: of eight equal zeros, the
    // cumulative 0.125 .. 0.5 removes ids 0-3, whatever their signs. (A radix key that kept the
    // sign would put the -0s first and remove ids 1, 3, 5, 7.)
    {
        const float zeros[9] = {0.0f, -0.0f, 0.0f, -0.0f, 0.0f, -0.0f, 0.0f, -0.0f, -INFINITY};
        gen_sampler z;
        gen_sampler_init(&z, 9, 1.0f, 0, 0.5f, 1, &err);
        gen_sampler_probs(&z, zeros);
        int removed_low = 1;
        for (int i = 0; i < 8; i++) removed_low &= (z.probs[i] == 0.0f) == (i < 4);
        CHECK(removed_low, "top-p over signed zeros: probs %g %g %g %g %g %g %g %g", z.probs[0],
              z.probs[1], z.probs[2], z.probs[3], z.probs[4], z.probs[5], z.probs[6], z.probs[7]);
        gen_sampler_free(&z);
    }
    gen_sampler_free(&a);
    gen_sampler_free(&b);
    gen_sampler_free(&g);
    // The settings' errors.
    gen_sampler x;
    CHECK(gen_sampler_init(&x, V, -1.0f, 0, 1.0f, 0, &err) != 0 && strstr(err.msg, "--temperature"),
          "%s", err.msg);
    CHECK(gen_sampler_init(&x, V, 1.0f, -2, 1.0f, 0, &err) != 0 && strstr(err.msg, "--top_k"), "%s",
          err.msg);
    CHECK(gen_sampler_init(&x, V, 1.0f, 0, 0.0f, 0, &err) != 0 && strstr(err.msg, "--top_p"), "%s",
          err.msg);
    printf("worst probability max abs against HF's warpers: %.2e (bound 1e-6)\n", worst);
    free(logits);
    free(want);
    st_close(&f);
    return check_summary();
}
