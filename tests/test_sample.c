// Sampling (gen/sample.c) against transformers' logits processors (tests/ref/gen_ref.py: the
// repetition penalty, temperature, top-k, top-p and min-p as generate applies them, on fixed
// logits with ties and a fixed history of ids): the same surviving tokens exactly and the
// renormalised distribution within 1e-6; greedy's argmax (first index among ties), of the
// penalised logits where a penalty is set; seeded draws reproducible, from survivors only, and
// at the distribution's frequencies; the settings' errors; generation_config.json's settings
// (gen/gen_config.c) and its refusals.
#include <math.h>
#include <string.h>

#include "check.h"
#include "gen/gen_config.h"
#include "gen/sample.h"
#include "io/safetensors.h"

static int cmp_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

// (row, temperature, top_k, top_p, min_p, repetition penalty): gen_ref.py's CASES, in order.
static const struct {
    int row;
    float t;
    int k;
    float p, min_p, rp;
} cases[] = {
    {0, 1.0f, 0, 1.0f, 0, 1},         {0, 0.7f, 50, 1.0f, 0, 1},     {0, 1.3f, 0, 0.9f, 0, 1},
    {0, 0.8f, 40, 0.95f, 0, 1},       {1, 1.0f, 10, 1.0f, 0, 1},     {1, 1.0f, 0, 0.5f, 0, 1},
    {1, 0.5f, 3, 0.8f, 0, 1},         {2, 1.0f, 2, 1.0f, 0, 1},      {2, 1.0f, 0, 0.3f, 0, 1},
    {2, 2.0f, 0, 0.999f, 0, 1},       {0, 1.0f, 1, 1.0f, 0, 1},      {0, 1.0f, 0, 0.01f, 0, 1},
    {0, 1.0f, 0, 1.0f, 0.05f, 1},     {0, 0.7f, 20, 0.9f, 0.1f, 1},  {1, 1.0f, 0, 1.0f, 0.3f, 1},
    {2, 1.0f, 0, 1.0f, 1.0f, 1},      {0, 1.0f, 0, 1.0f, 0, 1.3f},   {0, 1.0f, 0, 1.0f, 0, 0.7f},
    {2, 0.8f, 0, 0.95f, 0.05f, 1.5f}, {1, 1.0f, 0, 0.5f, 0.2f, 1.2f}};

// Settings with only temperature, top_k and top_p (the rest off).
static gen_settings tkp(float t, int k, float p, uint64_t seed) {
    return (gen_settings){
        .temperature = t, .top_k = k, .top_p = p, .repetition_penalty = 1, .seed = seed};
}

// generation_config.json: Qwen3's as published, unsupported settings, nulls, and refusals that
// name the file and the key in one line.
static void test_gen_config(void) {
    gen_file_config g;
    ct_error err;
    const char *qwen3 = "{\"bos_token_id\": 151643, \"do_sample\": true, \"eos_token_id\": "
                        "[151645, 151643], \"pad_token_id\": 151643, \"temperature\": 0.6, "
                        "\"top_k\": 20, \"top_p\": 0.95, \"transformers_version\": \"4.51.0\"}";
    CHECK(gen_config_parse(&g, qwen3, strlen(qwen3), "g.json", &err) == 0 && g.n_eos == 2 &&
              g.eos[0] == 151645 && g.eos[1] == 151643 && g.do_sample && g.temperature == 0.6 &&
              g.top_k == 20 && g.top_p == 0.95 && isnan(g.min_p) && isnan(g.repetition_penalty) &&
              g.n_unsupported == 0,
          "Qwen3's generation_config.json");
    const char *off = "{\"eos_token_id\": -1, \"num_beams\": 1, \"typical_p\": 1.0, "
                      "\"bad_words_ids\": [], \"suppress_tokens\": null, \"temperature\": null}";
    CHECK(gen_config_parse(&g, off, strlen(off), "g.json", &err) == 0 && g.n_eos == 1 &&
              g.eos[0] == -1 && !g.do_sample && isnan(g.temperature) && g.n_unsupported == 0,
          "settings at their off values");
    const char *on = "{\"num_beams\": 4, \"suppress_tokens\": [1], \"no_repeat_ngram_size\": 3, "
                     "\"forced_bos_token_id\": 0, \"repetition_penalty\": 1.05}";
    CHECK(gen_config_parse(&g, on, strlen(on), "g.json", &err) == 0 && g.n_unsupported == 4 &&
              strcmp(g.unsupported[0], "num_beams") == 0 && g.unsupported_value[0] == 4 &&
              strcmp(g.unsupported[1], "no_repeat_ngram_size") == 0 &&
              strcmp(g.unsupported[2], "suppress_tokens") == 0 && isnan(g.unsupported_value[2]) &&
              strcmp(g.unsupported[3], "forced_bos_token_id") == 0 &&
              g.repetition_penalty == 1.05 && g.n_eos == 0,
          "unsupported settings named: %d", g.n_unsupported);
    const struct {
        const char *text, *names;
    } bad[] = {{"[1, 2]", "expected a JSON object, found an array"},
               {"{\"temperature\": \"0.7\"}", "\"temperature\": expected a number, found a string"},
               {"{\"top_k\": [50]}", "\"top_k\": expected a number"},
               {"{\"do_sample\": 1}", "\"do_sample\": expected true or false"},
               {"{\"eos_token_id\": 1.5}", "eos_token_id: expected 32-bit integers"},
               {"{\"eos_token_id\": 2147483648}", "eos_token_id: expected 32-bit integers"},
               {"{\"eos_token_id\": [1, \"2\"]}", "eos_token_id: expected 32-bit integers"},
               {"{\"eos_token_id\": [0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]}", "at most 16"},
               {"{\"eos_token_id\": {}}", "eos_token_id: expected an integer or a list"},
               {"{\"temperature\": 0.6,", "invalid JSON"}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK(gen_config_parse(&g, bad[i].text, strlen(bad[i].text), "g.json", &err) != 0 &&
                  strncmp(err.msg, "g.json: ", 8) == 0 && strstr(err.msg, bad[i].names) &&
                  !strchr(err.msg, '\n'),
              "bad generation_config %zu: %s", i, err.msg);
    bool found = true;
    CHECK(gen_config_read(&g, &found, "/nonexistent/generation_config.json", &err) == 0 && !found &&
              g.n_eos == 0 && isnan(g.temperature),
          "an absent file is no settings");
}

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
    const st_tensor *ht = st_file_find(&f, "history");
    CHECK(ht != NULL, "history");
    const size_t H = ht ? (size_t)ht->shape[0] : 0;
    float *hf_ids = malloc((H + 1) * sizeof *hf_ids);
    int32_t *hist = malloc((H + 1) * sizeof *hist);
    if (ht) st_tensor_to_f32(hf_ids, ht, &err);
    for (size_t i = 0; i < H; i++) hist[i] = (int32_t)hf_ids[i];
    double worst = 0;
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        char name[32];
        snprintf(name, sizeof name, "probs.%zu", c);
        const st_tensor *pt = st_file_find(&f, name);
        CHECK(pt && st_tensor_to_f32(want, pt, &err) == 0, "%s", name);
        gen_sampler s;
        const gen_settings set = {.temperature = cases[c].t,
                                  .top_k = cases[c].k,
                                  .top_p = cases[c].p,
                                  .min_p = cases[c].min_p,
                                  .repetition_penalty = cases[c].rp,
                                  .seed = 1};
        CHECK(gen_sampler_init(&s, V, &set, &err) == 0, "%s", err.msg);
        const float *row = logits + (size_t)cases[c].row * V;
        const int kept = gen_sampler_probs(&s, row, hist, H);
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
        gen_sampler_init(&s2, V, &set, &err);
        double *freq = calloc(V, sizeof *freq);
        int same = 1, outside = 0;
        for (int d = 0; d < DRAWS; d++) {
            const int32_t a = gen_sample(&s, row, hist, H), b = gen_sample(&s2, row, hist, H);
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
        // Greedy with the penalty: the argmax of HF's penalised scores (the first among ties).
        if (cases[c].rp != 1.0f) {
            snprintf(name, sizeof name, "penalized.%zu", c);
            const st_tensor *rt = st_file_find(&f, name);
            CHECK(rt && st_tensor_to_f32(want, rt, &err) == 0, "%s", name);
            int first = 0, plain = 0;
            for (int i = 1; i < V; i++) {
                if (want[i] > want[first]) first = i;
                if (row[i] > row[plain]) plain = i;
            }
            gen_settings gs = set;
            gs.temperature = 0;
            gen_sampler g;
            gen_sampler_init(&g, V, &gs, &err);
            const int32_t got = gen_sample(&g, row, hist, H);
            CHECK(got == first, "case %zu: greedy with the penalty %d, HF's %d (without: %d)", c,
                  got, first, plain);
            printf("case %zu: greedy with penalty %.2f takes %d (without it %d)\n", c,
                   (double)cases[c].rp, got, plain);
            gen_sampler_free(&g);
        }
        printf("case %2zu (row %d, t %.2f, top_k %2d, top_p %.3f, min_p %.2f, penalty %.2f): %4d "
               "kept, max abs %.1e, frequencies within %.1e\n",
               c, cases[c].row, cases[c].t, cases[c].k, cases[c].p, (double)cases[c].min_p,
               (double)cases[c].rp, kept, e, fmax);
        free(freq);
        gen_sampler_free(&s);
        gen_sampler_free(&s2);
    }
    // Another seed, other tokens; greedy is the first index among equal maxima.
    gen_sampler a, b, g;
    gen_settings sa = tkp(1.0f, 0, 1.0f, 1), sb = tkp(1.0f, 0, 1.0f, 2), sg = tkp(0, 50, 0.5f, 1);
    gen_sampler_init(&a, V, &sa, &err);
    gen_sampler_init(&b, V, &sb, &err);
    gen_sampler_init(&g, V, &sg, &err);
    int differ = 0;
    for (int d = 0; d < 20; d++)
        differ += gen_sample(&a, logits, NULL, 0) != gen_sample(&b, logits, NULL, 0);
    CHECK(differ > 10, "seeds 1 and 2 agree on %d of 20 draws", 20 - differ);
    const float *ties = logits + (size_t)1 * V;
    int first = 0;
    for (int i = 1; i < V; i++)
        if (ties[i] > ties[first]) first = i;
    CHECK(gen_sample(&g, ties, NULL, 0) == first, "greedy %d, first maximum %d",
          gen_sample(&g, ties, NULL, 0), first);
    CHECK(gen_sample(&g, logits + 2 * (size_t)V, NULL, 0) == 0, "greedy on the peaked row");
    // A row with no finite score (a broken model's): no token left, and the draw is id 0, as
    // greedy's first maximum, instead of a distribution of NaNs.
    float *none = malloc((size_t)V * sizeof *none);
    for (int i = 0; i < V; i++) none[i] = -INFINITY;
    gen_sampler t;
    gen_settings st = tkp(0.7f, 20, 0.8f, 1);
    st.min_p = 0.1f;
    gen_sampler_init(&t, V, &st, &err);
    CHECK(gen_sampler_probs(&t, none, NULL, 0) == 0 && gen_sample(&t, none, NULL, 0) == 0,
          "no finite score: %d tokens left, draw %d", gen_sampler_probs(&t, none, NULL, 0),
          gen_sample(&t, none, NULL, 0));
    gen_sampler_free(&t);
    free(none);
    // Top-p's sort ties -0 and +0 (`<` does), the lower id first: of eight equal zeros, the
    // cumulative 0.125 .. 0.5 removes ids 0-3, whatever their signs. (A radix key that kept the
    // sign would put the -0s first and remove ids 1, 3, 5, 7.)
    {
        const float zeros[9] = {0.0f, -0.0f, 0.0f, -0.0f, 0.0f, -0.0f, 0.0f, -0.0f, -INFINITY};
        gen_sampler z;
        const gen_settings sz = tkp(1.0f, 0, 0.5f, 1);
        gen_sampler_init(&z, 9, &sz, &err);
        gen_sampler_probs(&z, zeros, NULL, 0);
        int removed_low = 1;
        for (int i = 0; i < 8; i++) removed_low &= (z.probs[i] == 0.0f) == (i < 4);
        CHECK(removed_low, "top-p over signed zeros: probs %g %g %g %g %g %g %g %g", z.probs[0],
              z.probs[1], z.probs[2], z.probs[3], z.probs[4], z.probs[5], z.probs[6], z.probs[7]);
        gen_sampler_free(&z);
    }
    gen_sampler_free(&a);
    gen_sampler_free(&b);
    gen_sampler_free(&g);
    // The settings' errors, each naming its option.
    const struct {
        gen_settings set;
        const char *names;
    } bad[] = {{tkp(-1.0f, 0, 1.0f, 0), "--temperature"},
               {tkp(INFINITY, 0, 1.0f, 0), "--temperature"},
               {tkp(1.0f, -2, 1.0f, 0), "--top_k"},
               {tkp(1.0f, 0, 0.0f, 0), "--top_p"},
               {tkp(1.0f, 0, 1.5f, 0), "--top_p"},
               {{1, 0, 1, -0.1f, 1, 0}, "--min_p"},
               {{1, 0, 1, 1.5f, 1, 0}, "--min_p"},
               {{1, 0, 1, NAN, 1, 0}, "--min_p"},
               {{1, 0, 1, 0, 0, 0}, "--repetition_penalty"},
               {{1, 0, 1, 0, -1, 0}, "--repetition_penalty"},
               {{1, 0, 1, 0, INFINITY, 0}, "--repetition_penalty"}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        gen_sampler x;
        CHECK(gen_sampler_init(&x, V, &bad[i].set, &err) != 0 && strstr(err.msg, bad[i].names),
              "bad setting %zu: %s", i, err.msg);
    }
    test_gen_config();
    printf("worst probability max abs against HF's warpers: %.2e (bound 1e-6)\n", worst);
    free(logits);
    free(want);
    free(hf_ids);
    free(hist);
    st_close(&f);
    return check_summary();
}
