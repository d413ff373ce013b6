// Sampling the next token from a row of logits, as Hugging Face's generate does with
// do_sample: the logits processors in its order (temperature, then top-k, then top-p), the
// softmax of what survives, then a seeded draw. Temperature 0 is greedy (argmax, the first index
// among equal maxima), HF's do_sample=False. Host memory only; the scratch is planned for the
// vocabulary at init, so sampling allocates nothing.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "core/error.h"

typedef struct gen_sampler {
    int V;
    float temperature; // 0: greedy; else > 0
    int top_k;   // 0: off; else keep the tokens whose score is >= the k-th largest (ties kept)
    float top_p; // 1: off; else in (0, 1): nucleus, at least one token kept
    uint64_t seed, draws; // the draw k uses ct_splitmix64_uniform_at(seed, k)
    float *probs;         // (V) the last distribution drawn from (0 for removed tokens)
    int32_t *order;       // (2V) scratch: token ids sorted by score, and the sort's buffer
    uint32_t *keys;       // (2V) scratch: the radix sort's keys, and their buffer
    float *sorted;        // (V) scratch: top-p's sorted probabilities
    int32_t *left;        // (V) the ids left after top-k and top-p, in id order
    int n_left;
} gen_sampler;

// Checks the settings (temperature >= 0 and finite, top_k >= 0, top_p in (0, 1]) and plans the
// scratch for V tokens. Errors name the setting as --temperature, --top_k, --top_p.
int gen_sampler_init(gen_sampler *s, int V, float temperature, int top_k, float top_p,
                     uint64_t seed, ct_error *err);
void gen_sampler_free(gen_sampler *s);
// The distribution HF samples from for these logits: s->probs gets softmax(top_p(top_k(logits /
// temperature))), removed tokens exactly 0. Returns how many tokens survive (0 when no score is
// finite: every probability 0). Needs temperature > 0.
int gen_sampler_probs(gen_sampler *s, const float *logits);
// The next token: argmax under temperature 0, else a draw from gen_sampler_probs's distribution
// with the sampler's next uniform (so a seed gives the same tokens again); id 0 when no token
// survives, as greedy's first maximum of a row of -inf.
int32_t gen_sample(gen_sampler *s, const float *logits);
