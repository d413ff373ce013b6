// Random init, torchtitan's (Qwen3 `init_weights`, TOML era): the native flavors start where a
// torchtitan run starts, so the first-step loss is its ln(V) + 1/2 (logits of unit variance).
// Each tensor fills from its own stream (core/rng.h), so its values depend only on (seed, its
// index in the table) and tensors fill in parallel, or one FSDP unit at a time.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "model/qwen3.h"

// torch.nn.init.trunc_normal_'s default cut, in absolute units.
#define TRUNC_DEFAULT 2.0

static bool ends_with(const char *s, const char *suffix) {
    const size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

qwen3_init_rule qwen3_init_rule_of(const qwen3_config *c, const qwen3_param *p) {
    const double out_std = 1.0 / sqrt((double)c->hidden_size);
    const qwen3_init_rule ones = {QWEN3_INIT_CONST, 1, 0}, zeros = {QWEN3_INIT_CONST, 0, 0},
                          output = {QWEN3_INIT_TRUNC, out_std, 3 * out_std};
    if (p->ndim == 1) // biases and buffers (the expert bias) 0, RMSNorm weights 1
        return p->buffer || ends_with(p->name, ".bias") ? zeros : ones;
    if (strcmp(p->name, "lm_head.weight") == 0) return output;
    // A tied embedding is the output layer too; torchtitan inits the output last.
    if (strcmp(p->name, "model.embed_tokens.weight") == 0)
        return c->tie_word_embeddings ? output : (qwen3_init_rule){QWEN3_INIT_NORMAL, 1, 0};
    int layer = 0;
    sscanf(p->name, "model.layers.%d.", &layer);
    // depth_init (torchtitan's default): deeper layers' output projections start smaller.
    const double depth_std = 0.02 / sqrt(2.0 * (layer + 1));
    const qwen3_init_rule in = {QWEN3_INIT_TRUNC, 0.02, TRUNC_DEFAULT},
                          out = {QWEN3_INIT_TRUNC, depth_std, TRUNC_DEFAULT};
    // q, k, v and the gate (w1, dense or expert) read the residual stream: 0.02. o_proj, up
    // (w3), down (w2) and the router use the layer's depth std.
    if (strstr(p->name, ".self_attn.q_proj.") || strstr(p->name, ".self_attn.k_proj.") ||
        strstr(p->name, ".self_attn.v_proj.") || ends_with(p->name, ".gate_proj.weight"))
        return in;
    return out; // o_proj, up_proj, down_proj, mlp.gate (the router)
}

int qwen3_init_random(qwen3_model *m, uint64_t seed, ct_error *err) {
    return qwen3_init_random_range(m, seed, 0, m->num_params, err);
}

// Tensor p's values, into x (p->numel floats).
void qwen3_init_tensor(const qwen3_model *m, const qwen3_param *p, float *x, uint64_t seed) {
    const qwen3_init_rule r = qwen3_init_rule_of(&m->cfg, p);
    if (r.kind == QWEN3_INIT_CONST) {
        for (size_t j = 0; j < p->numel; j++) x[j] = (float)r.value;
    } else {
        const double cut = r.kind == QWEN3_INIT_TRUNC ? r.cut : INFINITY;
        ct_rng_trunc_normal(x, p->numel, (float)r.value, -cut, cut, seed, (uint64_t)(p - m->params));
    }
}

// A model holding its matrices in bf16 only (weights16) has no fp32 buffer to fill in place:
// one tensor at a time through a host buffer of the largest, so the fp32 values never exist
// for the whole model at once.
static int init_by_tensor(qwen3_model *m, uint64_t seed, size_t lo, size_t hi, ct_error *err) {
    size_t most = 0;
    for (int i = 0; i < m->n_params; i++)
        if (m->params[i].numel > most) most = m->params[i].numel;
    float *x = malloc(most * sizeof *x + 1);
    if (!x) return ct_fail(err, "random init: out of memory for a tensor of %zu values", most);
    int rc = 0;
    for (int i = 0; i < m->n_params && rc == 0; i++) {
        const qwen3_param *p = &m->params[i];
        if (p->offset < lo || p->offset >= hi) continue;
        qwen3_init_tensor(m, p, x, seed);
        rc = qwen3_params_write(m, p->name, 0, p->numel, x, err);
    }
    free(x);
    return rc != 0 ? ct_wrap(err, "random init") : 0;
}

int qwen3_init_random_range(qwen3_model *m, uint64_t seed, size_t lo, size_t hi, ct_error *err) {
    if (m->weights16) return init_by_tensor(m, seed, lo, hi, err);
    // Filled on the host (in place on the plain CPU backend), tensors in parallel.
    const size_t bytes = m->num_params * sizeof(float);
    const bool part = lo > 0 || hi < m->num_params; // the rest is kept
    float *base = m->be->view(m->be, m->param_mem, bytes, part, err);
    if (!base) return ct_wrap(err, "random init");
#pragma omp parallel for schedule(dynamic)
    for (int i = 0; i < m->n_params; i++) {
        const qwen3_param *p = &m->params[i];
        if (p->offset >= lo && p->offset < hi) qwen3_init_tensor(m, p, base + p->offset, seed);
    }
    m->be->view_release(m->be, base, m->param_mem, bytes, true);
    return 0;
}
