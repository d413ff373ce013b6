// Byte-pair merging by rank, as Hugging Face's BPE model does it: repeatedly merge the adjacent
// pair with the lowest merge rank, the leftmost first among equal pairs, until no pair of the
// word is in the merge table.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

// (left id, right id) -> (rank, merged id). Read-only once built; shared by threads. One
// 16-byte slot per pair, so a lookup touches one cache line.
typedef struct bpe_slot {
    uint64_t key; // (uint64_t)left << 32 | right; BPE_NO_PAIR when empty
    uint32_t rank;
    int32_t merged;
} bpe_slot;

typedef struct bpe_pairs {
    bpe_slot *slots;
    size_t mask;
} bpe_pairs;

#define BPE_NO_PAIR UINT64_MAX
#define BPE_NO_RANK UINT32_MAX

int bpe_pairs_init(bpe_pairs *m, size_t n_merges, ct_error *err);
void bpe_pairs_free(bpe_pairs *m);
// A pair listed twice keeps its last rank, as HF's table does (a later insert replaces).
void bpe_pairs_put(bpe_pairs *m, int32_t left, int32_t right, uint32_t rank, int32_t merged);

static inline uint32_t bpe_pairs_get(const bpe_pairs *m, int32_t left, int32_t right,
                                     int32_t *merged) {
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    for (size_t i = (h >> 32) & m->mask;; i = (i + 1) & m->mask) {
        const bpe_slot *s = &m->slots[i];
        if (s->key == key) {
            *merged = s->merged;
            return s->rank;
        }
        if (s->key == BPE_NO_PAIR) return BPE_NO_RANK;
    }
}

// Scratch reused across words; zero-initialise, free with bpe_scratch_free.
typedef struct bpe_scratch {
    uint32_t *rank; // short words: rank of the pair (i, i+1)
    int32_t *merged;
    size_t cap;
    int32_t *prev, *next; // long words: a linked list over the symbols
    uint64_t *heap;       // (rank << 32 | position), a min-heap of candidate merges
    size_t long_cap, heap_cap;
} bpe_scratch;

void bpe_scratch_free(bpe_scratch *s);

// ids[0..n) holds the word's initial symbols (one per byte). Merges them in place and sets *out_n
// to the number of ids left. Short words use a scan (fast for the usual 2..20 symbols), long ones
// a heap over a linked list, O(n log n); both give the same result.
int bpe_merge(size_t *out_n, const bpe_pairs *m, int32_t *ids, size_t n, bpe_scratch *s,
              ct_error *err);
// The same, forcing one method (for tests that check the two agree).
int bpe_merge_scan(size_t *out_n, const bpe_pairs *m, int32_t *ids, size_t n, bpe_scratch *s,
                   ct_error *err);
int bpe_merge_heap(size_t *out_n, const bpe_pairs *m, int32_t *ids, size_t n, bpe_scratch *s,
                   ct_error *err);
