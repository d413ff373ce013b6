// Vectorisable math for the row-wise CPU kernels (attention_flash.c, cross_entropy.c, swiglu.c,
// fused.c).
#pragma once
#include <stdint.h>
#include <string.h>

// exp(x) written so that `omp simd` loops vectorise it at -O2 (glibc's expf has no vector
// variant without -ffast-math, and the exps are the bulk of the non-GEMM work): x = n ln2 + r,
// |r| <= ln2/2, exp(r) by its Taylor series to r^7 (truncation < 1e-8 relative), times 2^n made
// in the exponent bits. Within 1 ulp of expf for -87 <= x <= 88; 0 below -87 (and for -inf),
// where expf is < 2^-125. The clamp and the zeroing are integer selects: float compares may trap
// (-ftrapping-math) and would keep GCC from if-converting the loop.
static inline float vexp(float x) {
    const uint32_t lim = 0xC2AE0000u; // -87.0f; larger bit patterns are more negative
    uint32_t ux;
    memcpy(&ux, &x, 4);
    const uint32_t keep = -(uint32_t)(ux <= lim);
    ux = ux < lim ? ux : lim;
    float xc;
    memcpy(&xc, &ux, 4);
    const float t = xc * 1.44269504f;
    const float n = (t + 12582912.0f) - 12582912.0f; // round to nearest (1.5 * 2^23 trick)
    const float r = (xc - n * 0.693145752f) - n * 1.42860677e-6f; // ln2 split hi + lo
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const uint32_t two_n = (uint32_t)((int32_t)n + 127) << 23;
    float scale, y;
    memcpy(&scale, &two_n, 4);
    y = p * scale;
    uint32_t uy;
    memcpy(&uy, &y, 4);
    uy &= keep;
    memcpy(&y, &uy, 4);
    return y;
}

// vexp for an argument of either sign: above 89 it is clamped to 89, whose 2^n is 2^128, the bit
// pattern of +inf, so the result is +inf (from 88.38 up, where n rounds to 128) instead of
// garbage from an overflowed exponent (vexp alone holds up to 88). The clamp is a signed-integer
// min: positive floats order like their bits, negative ones read as negative ints.
static inline float vexp_inf(float x) {
    const int32_t hi = 0x42B20000; // 89.0f
    int32_t ix;
    memcpy(&ix, &x, 4);
    ix = ix < hi ? ix : hi;
    memcpy(&x, &ix, 4);
    return vexp(x);
}

// silu(g) = g * sigmoid(g) as torch computes it, g / (1 + exp(-g)); -0 for g below about -88.4
// (exp overflows, as expf's does a little later), g itself above 87 (exp(-g) is flushed to 0).
static inline float silu(float g) {
    return g / (1.0f + vexp_inf(-g));
}

// sigmoid(g) = 1 / (1 + exp(-g)), with silu's exp (for swiglu's backward).
static inline float sigmoid(float g) {
    return 1.0f / (1.0f + vexp_inf(-g));
}

// SwiGLU of one element, out = silu(g) * u, and its gradients (d silu(g)/dg = s (1 + g (1 - s))):
// the one definition the built-in swiglu, the fused rows and the MoE experts all use.
static inline float swiglu_value(float g, float u) {
    return silu(g) * u;
}

static inline void swiglu_grad(float *dg, float *du, float d, float g, float u) {
    const float s = sigmoid(g);
    *dg = d * u * (s * (1.0f + g * (1.0f - s)));
    *du = d * silu(g);
}

// Functions doing row-wise exps are worth wider vectors: on x86-64 GCC also builds AVX2 and
// AVX-512 versions of them and picks one for the CPU at load time (ifunc).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CPU_SIMD_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#include <immintrin.h>
// The sum of an AVX vector's 8 lanes: the halves added (lane i + lane i + 4), then pairs, then
// the two left.
__attribute__((target("avx"), unused)) static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
#else
#define CPU_SIMD_CLONES
#endif
