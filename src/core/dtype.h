// Element types as safetensors and numpy name them, and fp32 <-> bf16/f16 conversion.
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef enum ct_dtype {
    CT_F32,
    CT_F16,
    CT_BF16,
    CT_F64,
    CT_I64,
    CT_I32,
    CT_I16,
    CT_I8,
    CT_U64,
    CT_U32,
    CT_U16,
    CT_U8,
    CT_BOOL,
    CT_DTYPE_COUNT
} ct_dtype;

size_t dtype_size(ct_dtype t);
const char *dtype_name(ct_dtype t); // safetensors spelling: "F32", "BF16", ...
// Returns 0 and sets *out if `name` is a safetensors dtype string, else -1.
int dtype_from_name(ct_dtype *out, const char *name);

float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f); // round to nearest even; NaN stays NaN
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f); // round to nearest even; overflow to inf

// Converts n elements of type `t` (F32, BF16, F16 or F64) at src to fp32. Returns -1 for other
// types.
int dtype_to_f32(float *dst, const void *src, ct_dtype t, size_t n);
// Converts n fp32 values to F32, BF16 or F16 at dst. Returns -1 for other types.
int dtype_from_f32(void *dst, const float *src, ct_dtype t, size_t n);
