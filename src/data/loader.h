// The data loader: training samples are non-overlapping windows of seq_len+1 tokens of a
// token_stream, window w = tokens [w*(T+1), (w+1)*(T+1)); input is the first T, target the last
// T (position t predicts token t+1). The tail that does not fill a window is never used.
// A target the stream does not train (a conversation's non-assistant tokens, data/dataset.h)
// is -100 (ignored).
//
// Block-causal packing (loader_sample with positions): each token's RoPE position is its offset
// in its document, which restarts at 0 where a document starts (and at the window's first
// token, whose document may have begun in the window before), as HF's position_ids for
// padding-free packing; and the target that would be predicted across a document boundary (the
// next document's first token) is -100, as HF's DataCollatorWithFlattening does, so a packed
// window trains exactly what its documents would alone.
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
    const token_stream *s; // borrowed: it must outlive the loader
    uint64_t n_windows;
    int seq_len; // T
    bool shuffle;
    uint64_t seed;
    uint64_t *perm;      // (n_windows) when shuffle, else NULL; owned
    uint64_t perm_epoch; // the epoch perm holds, UINT64_MAX before the first use
    int32_t *ids;        // (T+1) the window being read; owned
    uint8_t *flags;      // (T+1) its flags; owned
} data_loader;

// n_windows = floor(n_tokens / (seq_len+1)); none is an error naming the dataset, its token
// count and seq_len+1. Allocates the permutation (with shuffle: 8 bytes a window, the only
// memory that grows with the corpus) and one window's buffers; nothing later.
int loader_init(data_loader *l, const token_stream *s, int seq_len, bool shuffle, uint64_t seed,
                ct_error *err);
void loader_free(data_loader *l);

// Writes sample g: input (T), target (T) and, when positions is non-NULL, the block-causal
// positions (T) and targets (above). Builds the permutation of g's epoch when it is not the
// cached one (O(n_windows), once per epoch when samples are read in order). Not thread-safe:
// the cache is shared; use one loader per thread. Fails only when a .npy's pages cannot be
// mapped (the error names the file).
int loader_sample(data_loader *l, int32_t *input, int32_t *target, int32_t *positions, uint64_t g,
                  ct_error *err);
// The window that sample g reads (what loader_sample copies), e.g. for tests and logs.
uint64_t loader_window(data_loader *l, uint64_t g);
// The epoch of sample g (0-based); the trainer logs when it changes.
uint64_t loader_epoch(const data_loader *l, uint64_t g);
