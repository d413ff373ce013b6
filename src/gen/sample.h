// Sampling the next token from a row of logits, as Hugging Face's generate does: the logits
// processors in its order (the repetition penalty over the ids so far; then, with do_sample,
// temperature, top-k, top-p and min-p), the softmax of what survives, then a seeded draw.
// Temperature 0 is greedy (argmax of the penalised logits, the first index among equal maxima),
// HF's do_sample=False. Host memory only; the scratch is planned for the vocabulary at init, so
// sampling allocates nothing.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

// The settings, with the values that switch each off.
typedef struct gen_settings {
    float temperature; // 0: greedy; else > 0
    int top_k;   // 0: off; else keep the tokens whose score is >= the k-th largest (ties kept)
    float top_p; // 1: off; else in (0, 1): nucleus, at least one token kept
    float min_p; // 0: off; else in (0, 1]: remove the tokens less likely than min_p times the
                 // likeliest (after top-p, as HF's MinPLogitsWarper)
    float repetition_penalty; // 1: off; else > 0: each id seen so far (prompt included) once,
                              // its logit x to x / penalty, or x * penalty where x < 0
    uint64_t seed;            // the draw k uses ct_splitmix64_uniform_at(seed, k)
} gen_settings;

typedef struct gen_sampler {
    int V;
    gen_settings set;
    uint64_t draws;
    float *probs;   // (V) the last distribution drawn from (0 for removed tokens)
    int32_t *order; // (2V) scratch: token ids sorted by score, and the sort's buffer
    uint32_t *keys; // (2V) scratch: the radix sort's keys, and their buffer
    float *sorted;  // (V) scratch: top-p's sorted probabilities
    int32_t *left;  // (V) the ids left after the filters, in id order
    uint8_t *seen;  // (V) scratch: the repetition penalty's ids already penalised
    int n_left;
} gen_sampler;

// Checks the settings (temperature >= 0 and finite, top_k >= 0, top_p in (0, 1], min_p in
// [0, 1], repetition_penalty > 0 and finite) and plans the scratch for V tokens. Errors name the
// setting as its option (--temperature, --top_k, --top_p, --min_p, --repetition_penalty).
int gen_sampler_init(gen_sampler *s, int V, const gen_settings *set, ct_error *err);
void gen_sampler_free(gen_sampler *s);
// The distribution HF samples from for these logits after the ids ids[0, n) (the prompt and the
// tokens so far: the repetition penalty's): s->probs gets softmax(min_p(top_p(top_k(penalty(
// logits) / temperature)))), removed tokens exactly 0. Returns how many tokens survive (0 when
// no score is finite: every probability 0). Needs temperature > 0.
int gen_sampler_probs(gen_sampler *s, const float *logits, const int32_t *ids, size_t n);
// The next token: argmax of the penalised logits under temperature 0, else a draw from
// gen_sampler_probs's distribution with the sampler's next uniform (so a seed gives the same
// tokens again); id 0 when no token survives, as greedy's first maximum of a row of -inf.
int32_t gen_sample(gen_sampler *s, const float *logits, const int32_t *ids, size_t n);
