#include "core/dtype.h"

#include <string.h>

static const struct {
    const char *name;
    size_t size;
} dtype_table[CT_DTYPE_COUNT] = {
    [CT_F32] = {"F32", 4},   [CT_F16] = {"F16", 2}, [CT_BF16] = {"BF16", 2}, [CT_F64] = {"F64", 8},
    [CT_I64] = {"I64", 8},   [CT_I32] = {"I32", 4}, [CT_I16] = {"I16", 2},   [CT_I8] = {"I8", 1},
    [CT_U64] = {"U64", 8},   [CT_U32] = {"U32", 4}, [CT_U16] = {"U16", 2},   [CT_U8] = {"U8", 1},
    [CT_BOOL] = {"BOOL", 1},
};

size_t dtype_size(ct_dtype t) {
    return t < CT_DTYPE_COUNT ? dtype_table[t].size : 0;
}
const char *dtype_name(ct_dtype t) {
    return t < CT_DTYPE_COUNT ? dtype_table[t].name : "?";
}

int dtype_from_name(ct_dtype *out, const char *name) {
    for (int t = 0; t < CT_DTYPE_COUNT; t++) {
        if (strcmp(name, dtype_table[t].name) == 0) {
            *out = (ct_dtype)t;
            return 0;
        }
    }
    return -1;
}

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float bf16_to_f32(uint16_t h) {
    return bits_f32((uint32_t)h << 16);
}

uint16_t f32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (mant << 13)); // inf/NaN
    if (exp == 0) {
        // zero or subnormal: mant * 2^-24
        float v = (float)mant * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

uint16_t f32_to_f16(float f) {
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00u;  // NaN
    if (a >= 0x477ff000u) return sign | 0x7c00u; // rounds to >= 65520: inf
    if (a < 0x38800000u) {
        // result is subnormal (or zero) in f16: round a * 2^24 to an integer, ties to even
        float v = bits_f32(a) * 16777216.0f; // exact scaling (power of two)
        uint32_t i = (uint32_t)v;
        float rem = v - (float)i;
        if (rem > 0.5f || (rem == 0.5f && (i & 1u))) i++;
        return sign | (uint16_t)i; // i == 0x400 carries into the smallest normal, which is right
    }
    // normal: rebias exponent, round mantissa 23 -> 10 bits, ties to even
    uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
    return sign | (uint16_t)((r - 0x38000000u) >> 13);
}

int dtype_to_f32(float *dst, const void *src, ct_dtype t, size_t n) {
    const unsigned char *p = src;
    switch (t) {
    case CT_F32:
        memcpy(dst, src, n * 4);
        return 0;
    case CT_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            dst[i] = bf16_to_f32(h);
        }
        return 0;
    case CT_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            dst[i] = f16_to_f32(h);
        }
        return 0;
    case CT_F64:
        for (size_t i = 0; i < n; i++) {
            double d;
            memcpy(&d, p + 8 * i, 8);
            dst[i] = (float)d;
        }
        return 0;
    default:
        return -1;
    }
}

int dtype_from_f32(void *dst, const float *src, ct_dtype t, size_t n) {
    unsigned char *p = dst;
    switch (t) {
    case CT_F32:
        memcpy(dst, src, n * 4);
        return 0;
    case CT_BF16:
    case CT_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h = t == CT_BF16 ? f32_to_bf16(src[i]) : f32_to_f16(src[i]);
            memcpy(p + 2 * i, &h, 2);
        }
        return 0;
    default:
        return -1;
    }
}
