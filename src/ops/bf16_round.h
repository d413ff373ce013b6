// fp32 -> bf16 as torch's .to(torch.bfloat16) rounds: to nearest even; a NaN stays a (quiet)
// NaN. Inline and branch-free, so that loops over it vectorise (matmul_bf16.c, adamw_update.c).
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "ops/vec_math.h"

static inline uint16_t bf16_round(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    const uint32_t nan = (u & 0x7fffffffu) > 0x7f800000u;
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (uint16_t)(nan ? (u >> 16) | 0x40u : rounded);
}

// bf16 -> fp32, exact.
static inline float bf16_value(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

// x rounded to bf16, as an fp32 value (torch's x.to(bfloat16) read back as float).
static inline float bf16_rounded(float x) {
    return bf16_value(bf16_round(x));
}

// bf16 attention (the flash tiles, decode's chunks): n values rounded to bf16 as torch's autocast
// rounds them, and when scale != 1 times scale and rounded again (the scores).
CPU_SIMD_CLONES __attribute__((unused)) static void bf16_round_scaled(float *x, size_t n,
                                                                      float scale) {
    if (scale == 1.0f) {
#pragma omp simd
        for (size_t i = 0; i < n; i++) x[i] = bf16_rounded(x[i]);
    } else {
#pragma omp simd
        for (size_t i = 0; i < n; i++) x[i] = bf16_rounded(bf16_rounded(x[i]) * scale);
    }
}
