// AdamW, following torch 1.13's _single_tensor_adamw operation by operation in fp32. The two
// moment updates use fmaf because torch's vectorised CPU kernels for add(alpha=) and addcmul
// fuse the multiply-add (Vectorized fmadd); with them ctitan's step is bit-identical to torch's
// on the same inputs (tests/test_optim.c checks this against tests/ref/train_ref.py's data).
#include "optim/adamw.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int adamw_init(adamw *o, size_t n, ct_error *err) {
    return adamw_init_shard(o, NULL, n, 0, n, err);
}

int adamw_init_shard(adamw *o, ct_backend *be, size_t total, size_t base, size_t n, ct_error *err) {
    memset(o, 0, sizeof *o);
    if (total == 0) return ct_fail(err, "adamw: no parameters to optimize");
    if (base > total || n > total - base)
        return ct_fail(err, "adamw: shard [%zu, %zu) is outside the %zu parameters", base, base + n,
                       total);
    // One element at least, so that an empty shard still has valid (unused) buffers.
    o->be = ct_backend_or_cpu(be);
    if (!(o->m = o->be->alloc(o->be, (n ? n : 1) * sizeof(float), "adamw exp_avg", err)) ||
        !(o->v = o->be->alloc(o->be, (n ? n : 1) * sizeof(float), "adamw exp_avg_sq", err))) {
        adamw_free(o);
        return -1;
    }
    // Read and written whole every step: on huge pages where the backend has them.
    o->be->mark_streamed(o->be, o->m, (n ? n : 1) * sizeof(float));
    o->be->mark_streamed(o->be, o->v, (n ? n : 1) * sizeof(float));
    o->total = total;
    o->base = base;
    o->n = n;
    return 0;
}

void adamw_free(adamw *o) {
    if (o->be) o->be->free(o->be, o->m), o->be->free(o->be, o->v);
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

void adamw_step(adamw *o, float *params, const float *grads, const adamw_hparams *h, double lr) {
    adamw_step_scaled(o, NULL, params, NULL, grads, h, lr, 1.0f);
}

void adamw_step_scaled(adamw *o, const ct_ops *ops, float *params, uint16_t *params_bf16,
                       const float *grads, const adamw_hparams *h, double lr, float grad_scale) {
    o->step++;
    double step = (double)o->step;
    double bc1 = 1.0 - pow(h->beta1, step), bc2 = 1.0 - pow(h->beta2, step);
    ct_adamw_coeffs k = {
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
    const bool decay = h->weight_decay != 0.0;
    (ops ? ops : &ct_ops_cpu)
        ->adamw_update(params + o->base, params_bf16 ? params_bf16 + o->base : NULL,
                       grads + o->base, o->m, o->v, o->n, o->no_decay, o->n_no_decay, decay, &k);
}
