// Windows of a token stream, addressed by the global sample index (see loader.h).
#include "data/loader.h"

#include <stdlib.h>
#include <string.h>

#include "data/ctr_rng.h"

// Keys the shuffle's draws apart from other users of ctr_rng with the same seed (weight init,
// dropout...), so equal seeds do not give correlated streams. ASCII "shuffle".
#define SHUFFLE_DOMAIN 0x73687566666c65ull

int loader_init(data_loader *l, const token_stream *s, int seq_len, bool shuffle, uint64_t seed,
                ct_error *err) {
    memset(l, 0, sizeof *l);
    l->perm_epoch = UINT64_MAX;
    if (seq_len < 1) return ct_fail(err, "seq_len %d: expected at least 1", seq_len);
    uint64_t window = (uint64_t)seq_len + 1;
    if (s->n_tokens < window)
        return ct_fail(err, "dataset %s has %llu tokens, fewer than seq_len+1 = %llu",
                       s->path ? s->path : "(unnamed)", (unsigned long long)s->n_tokens,
                       (unsigned long long)window);
    l->s = s;
    l->n_windows = s->n_tokens / window;
    l->seq_len = seq_len;
    l->shuffle = shuffle;
    l->seed = seed;
    l->ids = malloc(window * sizeof *l->ids);
    l->flags = malloc(window);
    if (!l->ids || !l->flags)
        return ct_fail(err, "out of memory for a window of %llu tokens",
                       (unsigned long long)window);
    if (shuffle) {
        if (l->n_windows > SIZE_MAX / sizeof *l->perm ||
            !(l->perm = malloc((size_t)l->n_windows * sizeof *l->perm)))
            return ct_fail(err, "dataset %s: out of memory for the shuffle of %llu windows",
                           s->path ? s->path : "(unnamed)", (unsigned long long)l->n_windows);
    }
    return 0;
}

void loader_free(data_loader *l) {
    free(l->perm);
    free(l->ids);
    free(l->flags);
    memset(l, 0, sizeof *l);
    l->perm_epoch = UINT64_MAX;
}

// Fisher-Yates from the last position down, each swap partner drawn by its position i, so
// perm_e is a pure function of (seed, e, n_windows).
static void build_perm(data_loader *l, uint64_t epoch) {
    uint64_t n = l->n_windows, key = ctr_rng_u64(l->seed, SHUFFLE_DOMAIN, 0);
    for (uint64_t i = 0; i < n; i++) l->perm[i] = i;
    for (uint64_t i = n - 1; i > 0; i--) {
        uint64_t j = ctr_rng_below(key, epoch, i, i + 1);
        uint64_t t = l->perm[i];
        l->perm[i] = l->perm[j];
        l->perm[j] = t;
    }
    l->perm_epoch = epoch;
}

uint64_t loader_epoch(const data_loader *l, uint64_t g) {
    return g / l->n_windows;
}

uint64_t loader_window(data_loader *l, uint64_t g) {
    uint64_t epoch = g / l->n_windows, i = g % l->n_windows;
    if (!l->shuffle) return i;
    if (epoch != l->perm_epoch) build_perm(l, epoch);
    return l->perm[i];
}

int loader_sample(data_loader *l, int32_t *input, int32_t *target, int32_t *positions, uint64_t g,
                  ct_error *err) {
    size_t T = (size_t)l->seq_len;
    bool flagged = l->s->flags || positions;
    if (stream_read(l->s, loader_window(l, g) * (T + 1), T + 1, l->ids, flagged ? l->flags : NULL,
                    err) != 0)
        return -1;
    memcpy(input, l->ids, T * sizeof *input);
    memcpy(target, l->ids + 1, T * sizeof *target);
    if (!flagged) return 0;
    const uint8_t *f = l->flags;
    for (size_t t = 0; t < T; t++) {
        bool crosses = positions && (f[t + 1] & STREAM_DOC_START);
        if (!(f[t + 1] & STREAM_TRAIN) || crosses) target[t] = -100;
    }
    if (positions) {
        positions[0] = 0;
        for (size_t t = 1; t < T; t++)
            positions[t] = f[t] & STREAM_DOC_START ? 0 : positions[t - 1] + 1;
    }
    return 0;
}
