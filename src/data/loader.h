// The data loader: training samples are non-overlapping windows of seq_len+1 tokens of a
// token_stream, window w = tokens [w*(T+1), (w+1)*(T+1)); input is the first T, target the last
// T (position t predicts token t+1). The tail that does not fill a window is never used.
//
// The loader's whole position is ONE number, the global sample index g: how many samples have
// been consumed so far over all ranks and micro-batches. Sample g is in epoch
// e = g / n_windows and is window perm_e[g % n_windows], where perm_e is the identity without
// shuffle, and with shuffle a Fisher-Yates permutation drawn from the counter-based RNG
// (data/ctr_rng.h) keyed by (seed, e). So any sample can be read in any order, a checkpoint
// stores only g (and the config's seed), resume is exact, and any number of ranks reading
// disjoint sets of g see the same global samples as one process.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "core/error.h"
#include "data/dataset.h"

typedef struct data_loader {
    const int32_t *tokens; // borrowed from the token_stream, which must outlive the loader
    uint64_t n_windows;
    int seq_len; // T
    bool shuffle;
    uint64_t seed;
    uint64_t *perm;      // (n_windows) when shuffle, else NULL; owned
    uint64_t perm_epoch; // the epoch perm holds, UINT64_MAX before the first use
} data_loader;

// n_windows = floor(n_tokens / (seq_len+1)); none is an error naming the dataset, its token
// count and seq_len+1. Allocates the one permutation buffer (with shuffle); nothing later.
int loader_init(data_loader *l, const token_stream *s, int seq_len, bool shuffle, uint64_t seed,
                ct_error *err);
void loader_free(data_loader *l);

// Writes sample g: input (T) and target (T). Builds the permutation of g's epoch when it is not
// the cached one (O(n_windows), once per epoch when samples are read in order). Not
// thread-safe: the cache is shared; use one loader per thread.
void loader_sample(data_loader *l, int32_t *input, int32_t *target, uint64_t g);
// The window that sample g reads (what loader_sample copies), e.g. for tests and logs.
uint64_t loader_window(data_loader *l, uint64_t g);
// The epoch of sample g (0-based); the trainer logs when it changes.
uint64_t loader_epoch(const data_loader *l, uint64_t g);
