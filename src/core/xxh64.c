#include "core/xxh64.h"

#include <stdbool.h>
#include <string.h>

#include "core/fs.h"

// XXH64, from the xxHash specification (doc/xxhash_spec.md): four 64-bit lanes over 32-byte
// stripes, then the tail, then an avalanche. Chosen over FNV-1a because it runs at memory speed,
// so verifying a multi-GB checkpoint costs about as much as reading it.

#define P1 0x9E3779B185EBCA87ull
#define P2 0xC2B2AE3D27D4EB4Full
#define P3 0x165667B19E3779F9ull
#define P4 0x85EBCA77C2B2AE63ull
#define P5 0x27D4EB2F165667C5ull

static inline uint64_t rotl64(uint64_t x, int r) {
    return (x << r) | (x >> (64 - r));
}

// Little-endian loads through memcpy: any alignment, no aliasing issues.
static inline uint64_t read64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}
static inline uint32_t read32(const unsigned char *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline uint64_t xxh_round(uint64_t acc, uint64_t input) {
    acc += input * P2;
    return rotl64(acc, 31) * P1;
}

static inline uint64_t xxh_merge(uint64_t acc, uint64_t v) {
    acc ^= xxh_round(0, v);
    return acc * P1 + P4;
}

// release: every 16 MiB read of a file mapping leave the process (fs_release_read).
static uint64_t xxh64(const void *data, size_t len, uint64_t seed, bool release) {
    const unsigned char *p = data, *end = p + len, *kept = p;
    uint64_t h;
    if (len >= 32) {
        uint64_t v1 = seed + P1 + P2, v2 = seed + P2, v3 = seed, v4 = seed - P1;
        for (const unsigned char *limit = end - 32; p <= limit; p += 32) {
            if (release && p - kept >= (16 << 20)) {
                fs_release_read(kept, (size_t)(p - kept));
                kept = p;
            }
            v1 = xxh_round(v1, read64(p));
            v2 = xxh_round(v2, read64(p + 8));
            v3 = xxh_round(v3, read64(p + 16));
            v4 = xxh_round(v4, read64(p + 24));
        }
        h = rotl64(v1, 1) + rotl64(v2, 7) + rotl64(v3, 12) + rotl64(v4, 18);
        h = xxh_merge(h, v1);
        h = xxh_merge(h, v2);
        h = xxh_merge(h, v3);
        h = xxh_merge(h, v4);
    } else {
        h = seed + P5;
    }
    h += (uint64_t)len;
    for (; end - p >= 8; p += 8) h = rotl64(h ^ xxh_round(0, read64(p)), 27) * P1 + P4;
    if (end - p >= 4) {
        h = rotl64(h ^ (uint64_t)read32(p) * P1, 23) * P2 + P3;
        p += 4;
    }
    for (; p < end; p++) h = rotl64(h ^ (uint64_t)*p * P5, 11) * P1;
    h ^= h >> 33;
    h *= P2;
    h ^= h >> 29;
    h *= P3;
    h ^= h >> 32;
    if (release) fs_release_read(kept, (size_t)(end - kept));
    return h;
}

uint64_t ct_xxh64(const void *data, size_t len, uint64_t seed) {
    return xxh64(data, len, seed, false);
}

uint64_t ct_xxh64_file_map(const void *map, size_t len, uint64_t seed) {
    return xxh64(map, len, seed, true);
}
