// AdamW, following torch 1.13's _single_tensor_adamw operation by operation in fp32. The two
// moment updates use fmaf because torch's vectorised CPU kernels for add(alpha=) and addcmul
// fuse the multiply-add (Vectorized fmadd); with them ctitan's step is bit-identical to torch's
// on the same inputs (tests/test_optim.c checks this against tests/ref/train_ref.py's data).
#include "optim/adamw.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int adamw_init(adamw *o, size_t n, ct_error *err) {
    return adamw_init_shard(o, n, 0, n, err);
}

int adamw_init_shard(adamw *o, size_t total, size_t base, size_t n, ct_error *err) {
    memset(o, 0, sizeof *o);
    if (total == 0) return ct_fail(err, "adamw: no parameters to optimize");
    if (base > total || n > total - base)
        return ct_fail(err, "adamw: shard [%zu, %zu) is outside the %zu parameters", base, base + n,
                       total);
    // One element at least, so that an empty shard still has valid (unused) buffers.
    o->m = calloc(n ? n : 1, sizeof *o->m);
    o->v = calloc(n ? n : 1, sizeof *o->v);
    if (!o->m || !o->v) {
        adamw_free(o);
        return ct_fail(err, "adamw: out of memory for the moments of %zu parameters (%.2f GiB)", n,
                       2.0 * (double)n * sizeof(float) / (1 << 30));
    }
    o->total = total;
    o->base = base;
    o->n = n;
    return 0;
}

void adamw_free(adamw *o) {
    free(o->m);
    free(o->v);
    free(o->no_decay);
    memset(o, 0, sizeof *o);
}

int adamw_exclude_decay(adamw *o, size_t offset, size_t numel, ct_error *err) {
    if (numel == 0) return 0;
    if (offset > o->total || numel > o->total - offset)
        return ct_fail(err, "adamw: no-decay range [%zu, %zu) is outside the %zu parameters",
                       offset, offset + numel, o->total);
    // The part inside the shard, relative to its start.
    size_t lo = offset > o->base ? offset : o->base;
    size_t hi = offset + numel < o->base + o->n ? offset + numel : o->base + o->n;
    if (lo >= hi) return 0;
    offset = lo - o->base;
    numel = hi - lo;
    int at = 0; // insertion point keeping the ranges sorted by offset
    while (at < o->n_no_decay && o->no_decay[at].offset < offset) at++;
    const adamw_range *prev = at > 0 ? &o->no_decay[at - 1] : NULL;
    const adamw_range *next = at < o->n_no_decay ? &o->no_decay[at] : NULL;
    if ((prev && prev->offset + prev->numel > offset) || (next && offset + numel > next->offset))
        return ct_fail(err, "adamw: no-decay range [%zu, %zu) overlaps one already set", offset,
                       offset + numel);
    adamw_range *grown = realloc(o->no_decay, (o->n_no_decay + 1) * sizeof *grown);
    if (!grown) return ct_fail(err, "adamw: out of memory");
    o->no_decay = grown;
    memmove(grown + at + 1, grown + at, (o->n_no_decay - at) * sizeof *grown);
    grown[at] = (adamw_range){offset, numel};
    o->n_no_decay++;
    return 0;
}

bool adamw_param_decays(const char *name, int ndim) {
    return ndim >= 2 && !strstr(name, "embed_tokens");
}

// The per-step scalars, each a Python float in torch rounded to fp32 where it meets a tensor.
typedef struct adamw_coeffs {
    float decay_mul;     // 1 - lr*wd
    float beta1, one_b1; // beta1, 1 - beta1
    float beta2, one_b2; // beta2, 1 - beta2
    float bc2_sqrt;      // sqrt(1 - beta2^step)
    float eps;
    float neg_step_size; // -lr / (1 - beta1^step)
    float grad_scale;    // the clipping coefficient (1: none; x * 1 is exact)
} adamw_coeffs;

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
                        float *restrict v, size_t lo, size_t hi, bool decay, adamw_coeffs k) {
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

// Elements [lo, hi), shared out in blocks over the threads of the enclosing parallel region.
static void adamw_update(float *p, const float *g, float *m, float *v, size_t lo, size_t hi,
                         bool decay, const adamw_coeffs *k) {
    const size_t n_blocks = hi > lo ? (hi - lo + ADAMW_BLOCK - 1) / ADAMW_BLOCK : 0;
#pragma omp for schedule(static) nowait
    for (size_t b = 0; b < n_blocks; b++) {
        const size_t b0 = lo + b * ADAMW_BLOCK;
        adamw_block(p, g, m, v, b0, b0 + ADAMW_BLOCK < hi ? b0 + ADAMW_BLOCK : hi, decay, *k);
    }
}

void adamw_step(adamw *o, float *params, const float *grads, const adamw_hparams *h, double lr) {
    adamw_step_scaled(o, params, grads, h, lr, 1.0f);
}

void adamw_step_scaled(adamw *o, float *params, const float *grads, const adamw_hparams *h,
                       double lr, float grad_scale) {
    o->step++;
    double step = (double)o->step;
    double bc1 = 1.0 - pow(h->beta1, step), bc2 = 1.0 - pow(h->beta2, step);
    adamw_coeffs k = {
        .decay_mul = (float)(1.0 - lr * h->weight_decay),
        .beta1 = (float)h->beta1,
        .one_b1 = (float)(1.0 - h->beta1),
        .beta2 = (float)h->beta2,
        .one_b2 = (float)(1.0 - h->beta2),
        .bc2_sqrt = (float)sqrt(bc2),
        .eps = (float)h->eps,
        .neg_step_size = (float)-(lr / bc1),
        .grad_scale = grad_scale,
    };
    // Multiplying by 1 - lr*0 is the identity, so decay off equals torch's weight_decay=0 group.
    bool decay = h->weight_decay != 0.0;
    float *m = o->m, *v = o->v;
    params += o->base;
    grads += o->base;
    const adamw_range *nd = o->no_decay;
    int n_nd = o->n_no_decay;
    size_t n = o->n;
#pragma omp parallel
    {
        size_t at = 0;
        for (int r = 0; r <= n_nd; r++) {
            size_t end = r < n_nd ? nd[r].offset : n;
            adamw_update(params, grads, m, v, at, end, decay, &k);
            if (r < n_nd) {
                adamw_update(params, grads, m, v, end, end + nd[r].numel, false, &k);
                at = end + nd[r].numel;
            }
        }
    }
}
