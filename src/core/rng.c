// Random numbers (rng.h). The two Box-Muller loops are written as each caller wrote them before
// they shared this file, so that every value keeps its bits.
#include "core/rng.h"

#include <math.h>

#define SPLITMIX64_GAMMA 0x9E3779B97F4A7C15ull

uint64_t ct_splitmix64(uint64_t *state) {
    uint64_t z = (*state += SPLITMIX64_GAMMA);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint64_t ct_splitmix64_at(uint64_t seed, uint64_t k) {
    uint64_t s = seed + k * SPLITMIX64_GAMMA;
    return ct_splitmix64(&s);
}

static uint64_t rotl64(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}

static uint64_t xoshiro_next(uint64_t st[4]) {
    const uint64_t result = rotl64(st[1] * 5, 7) * 9, t = st[1] << 17;
    st[2] ^= st[0];
    st[3] ^= st[1];
    st[1] ^= st[2];
    st[0] ^= st[3];
    st[2] ^= t;
    st[3] = rotl64(st[3], 45);
    return result;
}

// Uniform in (0, 1]: 53 random bits, never 0 so log() is finite.
static double xoshiro_uniform(uint64_t st[4]) {
    return ((double)(xoshiro_next(st) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
}

// Values outside [lo, hi] are dropped and the stream goes on (torch's trunc_normal_ gives the
// same distribution by inverting the CDF). With infinite bounds nothing is dropped, so the plain
// fill keeps its bits.
static void normal_stream(float *x, size_t n, float mean, float stddev, double lo, double hi,
                          uint64_t seed, uint64_t stream) {
    uint64_t sm = seed ^ (0xD1B54A32D192ED03ull * (stream + 1)), st[4];
    for (int i = 0; i < 4; i++) st[i] = ct_splitmix64(&sm);
    const double two_pi = 6.283185307179586476925;
    for (size_t k = 0; k < n;) { // two normals per pair of uniforms
        const double r = sqrt(-2.0 * log(xoshiro_uniform(st)));
        const double th = two_pi * xoshiro_uniform(st);
        const double pair[2] = {stddev * r * cos(th), stddev * r * sin(th)};
        for (int j = 0; j < 2 && k < n; j++) {
            if (!(pair[j] >= lo && pair[j] <= hi)) continue;
            // mean + a would turn a -0.0 into +0.0 when mean is 0.
            x[k++] = (float)(mean == 0.0f ? pair[j] : mean + pair[j]);
        }
    }
}

double ct_splitmix64_uniform_at(uint64_t seed, uint64_t k) {
    return (double)(ct_splitmix64_at(seed, k) >> 11) * 0x1.0p-53;
}

static void normal_counter(float *p, size_t n, float mean, float std, uint64_t seed,
                           uint64_t next) {
    for (size_t i = 0; i < n; i += 2) {
        const double r = sqrt(-2.0 * log(1.0 - ct_splitmix64_uniform_at(seed, next++)));
        const double a = 6.283185307179586 * ct_splitmix64_uniform_at(seed, next++);
        p[i] = mean + std * (float)(r * cos(a));
        if (i + 1 < n) p[i + 1] = mean + std * (float)(r * sin(a));
    }
}

uint64_t ct_rng_normal(float *dst, size_t n, float mean, float std, uint64_t seed, uint64_t stream,
                       ct_rng_kind kind) {
    if (kind == CT_RNG_STREAM)
        normal_stream(dst, n, mean, std, -INFINITY, INFINITY, seed, stream);
    else
        normal_counter(dst, n, mean, std, seed, stream);
    return (uint64_t)(n / 2 + n % 2) * 2;
}

void ct_rng_trunc_normal(float *dst, size_t n, float std, double lo, double hi, uint64_t seed,
                         uint64_t stream) {
    normal_stream(dst, n, 0.0f, std, lo, hi, seed, stream);
}
