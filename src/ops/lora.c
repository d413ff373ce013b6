// PEFT's LoRA branch on a frozen linear layer (model/qwen3_lora.c), as Hugging Face PEFT's
// lora.Linear.forward computes it: result = base_layer(x); result = result + lora_B(lora_A(
// dropout(x))) * scaling. Under bf16 the branch follows torch.autocast: x, A and B are cast to
// bf16, each GEMM sums in fp32 and rounds its output to bf16, the scaling multiplies a bf16
// tensor (rounded) and the sum with the base output (bf16) rounds again. The backward's weight
// gradients are the bf16 GEMMs' outputs (rounded to bf16) added to the fp32 gradients, as the
// gradient of autocast's cast of an fp32 weight.
//
// The bf16 products are exact in fp32 (8-bit mantissas), so a GEMM of bf16 values in fp32 BLAS
// gives fp32 sums of the same products (in BLAS's order); its output rounded to bf16 is what a
// bf16 GEMM with fp32 accumulation returns, up to the order of the sums.
#include <cblas.h>

#include "ops/bf16_round.h"
#include "ops/ops_cpu.h"
#include "core/rng.h"

size_t ct_lora_scratch_floats(int N, int in, int r, int out) {
    return (size_t)N * in + (size_t)N * out + (size_t)N * r + 2 * ((size_t)r * in + (size_t)out * r);
}

// dst(n) = src rounded to bf16's values (fp32 holders).
static void round_copy(float *dst, const float *src, size_t n) {
#pragma omp parallel for simd schedule(static) if (n >= CPU_PAR_MIN)
    for (size_t i = 0; i < n; i++) dst[i] = bf16_value(bf16_round(src[i]));
}

static void round_inplace(float *x, size_t n) {
    round_copy(x, x, n);
}

void cpu_lora_term(float *t, float *Bb, const float *u, const float *B, float scale, bool bf16,
                   int N, int r, int out) {
    if (bf16) {
        round_copy(Bb, B, (size_t)out * r);
        B = Bb;
    }
    // t(N,out) = u @ B^T, then scaled: bf16 rounds the product and the scaled term (two
    // roundings, as autocast's bf16 GEMM output times a Python float).
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, out, r, 1.0f, u, r, B, r, 0.0f, t, out);
#pragma omp parallel for simd schedule(static) if ((int64_t)N * out >= CPU_PAR_MIN)
    for (size_t i = 0; i < (size_t)N * out; i++)
        t[i] = bf16 ? bf16_value(bf16_round(bf16_value(bf16_round(t[i])) * scale)) : t[i] * scale;
}

void cpu_lora_forward(float *y, uint16_t *y16, int ldy, float *u, float *scratch, const float *x,
                      const float *A, const float *B, float scale, bool bf16, int N, int in, int r,
                      int out) {
    float *z = scratch, *xb = z + (size_t)N * out, *Ab = xb + (size_t)N * in,
          *Bb = Ab + (size_t)r * in;
    if (bf16) {
        round_copy(xb, x, (size_t)N * in);
        round_copy(Ab, A, (size_t)r * in);
        x = xb, A = Ab;
    }
    // u(N,r) = x @ A^T; z(N,out) = the branch's term
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, r, in, 1.0f, x, in, A, in, 0.0f, u, r);
    if (bf16) round_inplace(u, (size_t)N * r);
    cpu_lora_term(z, Bb, u, B, scale, bf16, N, r, out);
#pragma omp parallel for schedule(static) if ((int64_t)N * out >= CPU_PAR_MIN)
    for (int n = 0; n < N; n++) {
        const float *t = z + (size_t)n * out;
        for (int o = 0; o < out; o++) {
            // result + term (bf16: the sum rounded)
            const size_t at = (size_t)n * ldy + o;
            if (y16)
                y16[at] = bf16_round(bf16_value(y16[at]) + t[o]);
            else
                y[at] = bf16 ? bf16_value(bf16_round(y[at] + t[o])) : y[at] + t[o];
        }
    }
}

void cpu_lora_backward(float *dx, float *dA, float *dB, float *scratch, const float *dy,
                       const uint16_t *dy16, int ldy, const float *u, const float *x,
                       const float *A, const float *B, float scale, bool bf16, int N, int in,
                       int r, int out) {
    float *dz = scratch, *xb = dz + (size_t)N * out, *du = xb + (size_t)N * in,
          *Ab = du + (size_t)N * r, *Bb = Ab + (size_t)r * in, *tmp = Bb + (size_t)out * r;
    // dz = dy * scaling (bf16: the output gradient is bf16, the product rounded)
#pragma omp parallel for schedule(static) if ((int64_t)N * out >= CPU_PAR_MIN)
    for (int n = 0; n < N; n++) {
        for (int o = 0; o < out; o++) {
            const size_t at = (size_t)n * ldy + o;
            const float g = dy16 ? bf16_value(dy16[at]) : bf16 ? bf16_value(bf16_round(dy[at])) : dy[at];
            const float v = g * scale;
            dz[(size_t)n * out + o] = bf16 ? bf16_value(bf16_round(v)) : v;
        }
    }
    if (bf16) {
        round_copy(xb, x, (size_t)N * in);
        round_copy(Ab, A, (size_t)r * in);
        round_copy(Bb, B, (size_t)out * r);
        x = xb, A = Ab, B = Bb;
        // dB += bf16(dz^T @ u)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, r, N, 1.0f, dz, out, u, r, 0.0f,
                    tmp, r);
        for (size_t i = 0; i < (size_t)out * r; i++) dB[i] += bf16_value(bf16_round(tmp[i]));
    } else {
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, r, N, 1.0f, dz, out, u, r, 1.0f,
                    dB, r);
    }
    // du(N,r) = dz @ B
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, r, out, 1.0f, dz, out, B, r, 0.0f, du,
                r);
    if (bf16) {
        round_inplace(du, (size_t)N * r);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r, in, N, 1.0f, du, r, x, in, 0.0f,
                    tmp, in);
        for (size_t i = 0; i < (size_t)r * in; i++) dA[i] += bf16_value(bf16_round(tmp[i]));
    } else {
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r, in, N, 1.0f, du, r, x, in, 1.0f, dA,
                    in);
    }
    // dx(N,in) = du @ A
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, in, r, 1.0f, du, r, A, in, 0.0f, dx,
                in);
    if (bf16) round_inplace(dx, (size_t)N * in);
}

void cpu_lora_dropout(float *out, const float *x, int64_t n, float p, uint64_t seed,
                      uint64_t first) {
    const float keep_scale = 1.0f / (1.0f - p);
#pragma omp parallel for schedule(static) if (n >= CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++)
        out[i] = ct_splitmix64_uniform_at(seed, first + (uint64_t)i) < (double)p ? 0.0f
                                                                                 : x[i] * keep_scale;
}
