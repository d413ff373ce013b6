// The AdamW update over a parameter shard (optim/adamw.c forms the coefficients and says which
// ranges decay): element-wise, so the result does not depend on the thread count.
#include <math.h>

#include "ops/bf16_round.h"
#include "ops/ops_cpu.h"

// x86-64 with FMA or AVX-512 gets a vectorised copy of the update, picked at load time by CPU
// feature (not "arch=haswell", whose resolver tests the CPU model and picked the scalar default
// on every other CPU): fmaf is one instruction there and rounds exactly as the libm call does,
// and sqrtf is vectorised (the library builds with -fno-math-errno), so the bits are the same
// on every path.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define ADAMW_CLONES __attribute__((target_clones("avx512f", "fma", "default")))
#else
#define ADAMW_CLONES
#endif

ADAMW_CLONES
static void adamw_block(float *restrict p, const float *restrict g, float *restrict m,
                        float *restrict v, size_t lo, size_t hi, bool decay, ct_adamw_coeffs k) {
    const float dm = decay ? k.decay_mul : 1.0f; // decay off: times 1, the identity
#pragma omp simd
    for (size_t i = lo; i < hi; i++) {
        const float pi = p[i] * dm, gi = g[i] * k.grad_scale;
        const float mi = fmaf(gi, k.one_b1, m[i] * k.beta1);
        const float vi = fmaf(k.one_b2 * gi, gi, v[i] * k.beta2);
        const float denom = sqrtf(vi) / k.bc2_sqrt + k.eps;
        m[i] = mi;
        v[i] = vi;
        p[i] = pi + (k.neg_step_size * mi) / denom;
    }
}

#define ADAMW_BLOCK 4096

// Elements [lo, hi), shared out in blocks over the threads of the enclosing parallel region;
// with p16, each block's new weights are also rounded into it while they are in cache.
static void adamw_update(float *p, uint16_t *p16, const float *g, float *m, float *v, size_t lo,
                         size_t hi, bool decay, const ct_adamw_coeffs *k) {
    const size_t n_blocks = hi > lo ? (hi - lo + ADAMW_BLOCK - 1) / ADAMW_BLOCK : 0;
#pragma omp for schedule(static) nowait
    for (size_t b = 0; b < n_blocks; b++) {
        const size_t b0 = lo + b * ADAMW_BLOCK, b1 = b0 + ADAMW_BLOCK < hi ? b0 + ADAMW_BLOCK : hi;
        adamw_block(p, g, m, v, b0, b1, decay, *k);
        if (p16) {
#pragma omp simd
            for (size_t i = b0; i < b1; i++) p16[i] = bf16_round(p[i]);
        }
    }
}

void cpu_adamw_update(float *p, uint16_t *p16, const float *g, float *m, float *v, size_t n,
                      const ct_adamw_range *no_decay, int n_no_decay, bool decay,
                      const ct_adamw_coeffs *k) {
#pragma omp parallel
    {
        size_t at = 0;
        for (int r = 0; r <= n_no_decay; r++) {
            size_t end = r < n_no_decay ? no_decay[r].offset : n;
            adamw_update(p, p16, g, m, v, at, end, decay, k);
            if (r < n_no_decay) {
                adamw_update(p, p16, g, m, v, end, end + no_decay[r].numel, false, k);
                at = end + no_decay[r].numel;
            }
        }
    }
}
