// Shared by the two ways matmul_bf16.c runs a bf16 linear layer: oneDNN's primitives, or the
// emulation on OpenBLAS sgemm (matmul_bf16_emulated.c). The contracts are ops.h's matmul_bf16_*.
#pragma once
#include <stddef.h>
#include <stdint.h>

size_t mm_emulated_scratch_floats(int N, int C, int OC);
void mm_emulated_forward(float *out, uint16_t *out16, float *scratch, const float *inp,
                         const uint16_t *inp16, const uint16_t *weight, int N, int C, int OC);
void mm_emulated_backward(float *dinp, float *dweight, float *scratch, const float *dout,
                          const uint16_t *dout16, const float *inp, const uint16_t *inp16,
                          const uint16_t *weight, int N, int C, int OC);
