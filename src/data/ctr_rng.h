// A counter-based random number generator: each draw is a pure function of (seed, stream,
// counter), hashed with SplitMix64's finalizer. There is no state to save or advance, so a
// checkpoint only needs the seed, any draw can be recomputed out of order, and the results are
// the same on every machine and for every thread count.
//
// Not for cryptography. SplitMix64's finalizer passes BigCrush as a generator and is the seeding
// hash of xoshiro; chaining it over the three inputs mixes each into all 64 output bits.
#pragma once
#include <stdint.h>

// SplitMix64's output function of state z (Steele, Lea, Flood 2014).
static inline uint64_t ctr_rng_mix(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// 64 random bits for (seed, stream, counter). Each input passes through a full mix before the
// next is folded in, so (s, a, b) and (s, b, a) or (s+1, a, b) give unrelated outputs.
static inline uint64_t ctr_rng_u64(uint64_t seed, uint64_t stream, uint64_t counter) {
    uint64_t h = ctr_rng_mix(seed);
    h = ctr_rng_mix(h ^ stream);
    return ctr_rng_mix(h ^ counter);
}

// A uniform integer in [0, bound), bound > 0, with no modulo bias: Lemire's multiply-shift
// ("Fast random integer generation in an interval", 2019) with rejection. A rejected draw is
// retried with the next sub-counter, so the result is still a pure function of the inputs.
// Rejection happens with probability below bound / 2^64: never, in practice, for shuffles.
static inline uint64_t ctr_rng_below(uint64_t seed, uint64_t stream, uint64_t counter,
                                     uint64_t bound) {
    uint64_t x = ctr_rng_u64(seed, stream, counter);
    __extension__ unsigned __int128 m = (unsigned __int128)x * bound;
    uint64_t low = (uint64_t)m;
    if (low < bound) {
        uint64_t threshold = (0 - bound) % bound; // 2^64 mod bound
        for (uint64_t retry = 1; low < threshold; retry++) {
            x = ctr_rng_mix(ctr_rng_u64(seed, stream, counter) ^ retry);
            m = (unsigned __int128)x * bound;
            low = (uint64_t)m;
        }
    }
    return (uint64_t)(m >> 64);
}
