// Random numbers: splitmix64 (Steele, Lea, Flood 2014) and xoshiro256** (Blackman, Vigna), and
// normal values by Box-Muller. Deterministic: the same arguments give the same floats on every
// machine and for every thread count. Not for cryptography.
#pragma once
#include <stddef.h>
#include <stdint.h>

// One step of splitmix64: adds the golden gamma to *state and returns the mix of the result.
uint64_t ct_splitmix64(uint64_t *state);
// Draw k (from 0) of the splitmix64 sequence started at `seed`: what the (k+1)-th call of
// ct_splitmix64 on a state that was `seed` returns. Any draw can be made out of order.
uint64_t ct_splitmix64_at(uint64_t seed, uint64_t k);
// The same draw as a uniform double in [0, 1): its top 53 bits.
double ct_splitmix64_uniform_at(uint64_t seed, uint64_t k);

// Where ct_rng_normal draws from. Both are Box-Muller over 53-bit uniforms (two values per
// pair, the second of the last pair dropped when n is odd) and differ in their generator and
// rounding; each is kept bit for bit, because results and tests depend on it.
typedef enum ct_rng_kind {
    // Stream `stream` of `seed`: a xoshiro256** generator whose state is four splitmix64 draws
    // from seed ^ (stream + 1) * 0xD1B54A32D192ED03, uniforms in (0, 1], each value
    // mean + std * r * cos(theta) in double, rounded once to float (mean 0 adds nothing). The
    // model's random init: one stream per tensor, so tensors fill in parallel and each one
    // depends only on (seed, its index).
    CT_RNG_STREAM,
    // The splitmix64 sequence of `seed` from its draw number `stream` on (a counter, so a
    // sequence can be cut into fills anywhere), uniforms in [0, 1) with 1 - u into the log,
    // each value mean + std * (float)(r * cos(theta)) in float. The kernel check's inputs.
    CT_RNG_COUNTER,
} ct_rng_kind;

// Fills dst[0, n) with N(mean, std) values drawn as `kind` says from (seed, stream). Returns
// the 64-bit draws it used, 2 * ceil(n / 2): where a CT_RNG_COUNTER sequence continues.
uint64_t ct_rng_normal(float *dst, size_t n, float mean, float std, uint64_t seed, uint64_t stream,
                       ct_rng_kind kind);

// N(0, std) cut to [lo, hi] (torch.nn.init.trunc_normal_'s distribution): CT_RNG_STREAM's
// values in order, those outside the bounds dropped. torchtitan's init (model/qwen3_init.c).
void ct_rng_trunc_normal(float *dst, size_t n, float std, double lo, double hi, uint64_t seed,
                         uint64_t stream);
