// fp32 -> bf16 as torch's .to(torch.bfloat16) rounds: to nearest even; a NaN stays a (quiet)
// NaN. Inline and branch-free, so that loops over it vectorise (matmul_bf16.c, adamw_update.c).
#pragma once
#include <stdint.h>
#include <string.h>

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
