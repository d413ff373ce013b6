// A byte-string -> int32 hash map (open addressing), built once and then read-only, and the
// hash function that the tokenizer's other tables share.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/error.h"

// 64-bit hash of a byte string: 8 bytes per multiply, then a final avalanche (murmur fmix64).
static inline uint64_t text_hash(const void *p, size_t n) {
    const unsigned char *s = (const unsigned char *)p;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ ((uint64_t)n * 0xC2B2AE3D27D4EB4Full);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xFF51AFD7ED558CCDull;
        h ^= h >> 32;
        s += 8;
        n -= 8;
    }
    if (n) {
        uint64_t w = 0;
        memcpy(&w, s, n);
        h = (h ^ w) * 0xFF51AFD7ED558CCDull;
    }
    h ^= h >> 33;
    h *= 0xC4CEB9FE1A85EC53ull;
    h ^= h >> 33;
    return h;
}

typedef struct strmap {
    struct strmap_slot {
        uint64_t hash;
        uint32_t off, len; // key bytes in `keys`
        int32_t value;     // -1: empty slot
    } * slots;
    size_t mask;
    char *keys;
    size_t keys_len, keys_cap;
    size_t count;
} strmap;

// `expected` sizes the table (it keeps the load at or below 1/2).
int strmap_init(strmap *m, size_t expected, ct_error *err);
void strmap_free(strmap *m);
// Inserts or replaces (the last value for a key wins, as in a JSON object read in order).
int strmap_put(strmap *m, const char *key, size_t len, int32_t value, ct_error *err);
// The value for key, or -1.
int32_t strmap_get(const strmap *m, const char *key, size_t len);
