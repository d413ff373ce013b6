// A per-thread cache of pre-token -> ids. Natural text repeats its words, so most pre-tokens
// skip BPE. Each entry is one 64-byte slot holding the key and ids inline, so a lookup costs one
// cache line. Fixed memory: when half full it is emptied and starts over (no eviction
// bookkeeping; the words that matter come back at once).
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/error.h"

#define WORD_CACHE_MAX_KEY 40 // longer pre-tokens are rare and not cached
#define WORD_CACHE_MAX_IDS 4  // so are pre-tokens of more than 4 tokens

typedef struct word_cache_slot {
    uint32_t hash;   // the low 32 bits of text_hash
    uint8_t key_len; // 0: empty slot (the empty pre-token is never looked up)
    uint8_t n_ids;
    uint16_t unused;
    int32_t ids[WORD_CACHE_MAX_IDS];
    char key[WORD_CACHE_MAX_KEY]; // zero-padded
} word_cache_slot;

typedef struct word_cache {
    word_cache_slot *slots;
    size_t mask, used;
} word_cache;

int word_cache_init(word_cache *c, ct_error *err);
void word_cache_free(word_cache *c);

// A key zero-padded to the slot's size, so comparing it is a few word compares.
typedef struct word_key {
    char b[WORD_CACHE_MAX_KEY];
    size_t len;
    uint64_t hash;
} word_key;

// Fills k from key[0..len) with hash h; false when the key is too long to cache.
static inline bool word_key_make(word_key *k, const char *key, size_t len, uint64_t h) {
    if (len > WORD_CACHE_MAX_KEY) return false;
    memset(k->b, 0, sizeof k->b);
    memcpy(k->b, key, len);
    k->len = len;
    k->hash = h;
    return true;
}

static inline const word_cache_slot *word_cache_get(const word_cache *c, const word_key *k) {
    uint32_t h32 = (uint32_t)k->hash;
    for (size_t i = (k->hash >> 32) & c->mask;; i = (i + 1) & c->mask) {
        const word_cache_slot *s = &c->slots[i];
        if (s->key_len == 0) return NULL;
        if (s->hash == h32 && s->key_len == k->len) {
            uint64_t diff = 0;
            for (int w = 0; w < WORD_CACHE_MAX_KEY / 8; w++) {
                uint64_t a, b;
                memcpy(&a, s->key + 8 * w, 8);
                memcpy(&b, k->b + 8 * w, 8);
                diff |= a ^ b;
            }
            if (diff == 0) return s;
        }
    }
}

// Stores k -> ids[0..n); does nothing when there are too many ids to cache.
void word_cache_put(word_cache *c, const word_key *k, const int32_t *ids, size_t n);

_Static_assert(sizeof(word_cache_slot) == 64, "a word cache slot is one cache line");
