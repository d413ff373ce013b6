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

size_t ct_lora_acc_doubles(int in, int r, int out) {
    return 2 * (size_t)out * r + (size_t)r * in + (size_t)LORA_ACC_ROWS * (in + out + 2 * r);
}

// dst (m, k) += a^T b, a (N, m) and b (N, k): under bf16 the product rounded to bf16 (tmp) before
// it is added, as the gradient of autocast's cast of an fp32 weight.
static void add_product(float *dst, float *tmp, const float *a, int m, const float *b, int k,
                        int N, bool bf16) {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, m, k, N, 1.0f, a, m, b, k,
                bf16 ? 0.0f : 1.0f, bf16 ? tmp : dst, k);
    if (bf16)
        for (size_t i = 0; i < (size_t)m * k; i++) dst[i] += bf16_value(bf16_round(tmp[i]));
}

// fp32's three rank-r products, dB += dz^T u, du = dz B and dA += du^T x, summed in double:
// row blocks of dz, x and u widened into acc (ct_lora_acc_doubles), then dgemm.
static void products_f64(const float *dz, const float *u, const float *x, const float *B,
                         float *dA, float *dB, float *du, int N, int in, int r, int out,
                         double *acc) {
    double *dBd = acc, *dAd = dBd + (size_t)out * r, *Bd = dAd + (size_t)r * in;
    double *zd = Bd + (size_t)out * r, *xd = zd + (size_t)LORA_ACC_ROWS * out;
    double *ud = xd + (size_t)LORA_ACC_ROWS * in, *dud = ud + (size_t)LORA_ACC_ROWS * r;
    for (size_t i = 0; i < (size_t)out * r; i++) Bd[i] = B[i], dBd[i] = 0;
    for (size_t i = 0; i < (size_t)r * in; i++) dAd[i] = 0;
    for (int n0 = 0; n0 < N; n0 += LORA_ACC_ROWS) {
        const int n = N - n0 < LORA_ACC_ROWS ? N - n0 : LORA_ACC_ROWS;
        for (size_t i = 0; i < (size_t)n * out; i++) zd[i] = dz[(size_t)n0 * out + i];
        for (size_t i = 0; i < (size_t)n * in; i++) xd[i] = x[(size_t)n0 * in + i];
        for (size_t i = 0; i < (size_t)n * r; i++) ud[i] = u[(size_t)n0 * r + i];
        cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, r, n, 1.0, zd, out, ud, r, 1.0,
                    dBd, r);
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, r, out, 1.0, zd, out, Bd, r, 0.0,
                    dud, r);
        cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r, in, n, 1.0, dud, r, xd, in, 1.0,
                    dAd, in);
        for (size_t i = 0; i < (size_t)n * r; i++) du[(size_t)n0 * r + i] = (float)dud[i];
    }
    for (size_t i = 0; i < (size_t)out * r; i++) dB[i] += (float)dBd[i];
    for (size_t i = 0; i < (size_t)r * in; i++) dA[i] += (float)dAd[i];
}

void cpu_lora_backward(float *dx, float *dA, float *dB, float *scratch, const float *dy,
                       const uint16_t *dy16, int ldy, const float *u, const float *x,
                       const float *A, const float *B, float scale, bool bf16, int N, int in,
                       int r, int out) {
    cpu_lora_backward_acc(dx, dA, dB, scratch, dy, dy16, ldy, u, x, A, B, scale, bf16, N, in, r,
                          out, NULL);
}

void cpu_lora_backward_acc(float *dx, float *dA, float *dB, float *scratch, const float *dy,
                           const uint16_t *dy16, int ldy, const float *u, const float *x,
                           const float *A, const float *B, float scale, bool bf16, int N, int in,
                           int r, int out, double *acc) {
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
    if (acc && !bf16) {
        products_f64(dz, u, x, B, dA, dB, du, N, in, r, out, acc);
    } else {
        if (bf16) {
            round_copy(xb, x, (size_t)N * in);
            round_copy(Ab, A, (size_t)r * in);
            round_copy(Bb, B, (size_t)out * r);
            x = xb, A = Ab, B = Bb;
        }
        add_product(dB, tmp, dz, out, u, r, N, bf16); // dB += dz^T @ u
        // du(N,r) = dz @ B
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, r, out, 1.0f, dz, out, B, r,
                    0.0f, du, r);
        if (bf16) round_inplace(du, (size_t)N * r);
        add_product(dA, tmp, du, r, x, in, N, bf16); // dA += du^T @ x
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
