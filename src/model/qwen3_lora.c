// LoRA on a frozen Qwen3 model (qwen3_lora.h).
#include "model/qwen3_lora.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "model/peft_adapter.h"
#include "model/qwen3_internal.h"

// The layout's tensors as a model's parameter table (names, shapes, offsets).
static int lora_table(const lora_layout *L, qwen3_param **out, ct_error *err) {
    qwen3_param *table = calloc((size_t)L->n + 1, sizeof *table);
    if (!table) return ct_fail(err, "lora: out of memory for the adapter's table");
    for (int i = 0; i < L->n; i++) {
        const lora_tensor *t = &L->t[i];
        qwen3_param *p = &table[i];
        if (strlen(t->name) >= sizeof p->name) {
            free(table);
            return ct_fail(err, "lora: tensor name %s is longer than %zu characters", t->name,
                           sizeof p->name - 1);
        }
        memcpy(p->name, t->name, strlen(t->name) + 1); // checked to fit above
        p->ndim = 2;
        p->shape[0] = t->shape[0], p->shape[1] = t->shape[1];
        p->offset = t->offset, p->numel = t->numel;
    }
    *out = table;
    return 0;
}

// The adapter as a model-shaped table (qwen3_trained) and its units.
static int lora_view(qwen3_model *m, qwen3_lora *lo, ct_error *err) {
    qwen3_model *v = &lo->view;
    const int L = m->cfg.num_hidden_layers;
    memset(v, 0, sizeof *v);
    v->cfg = m->cfg;
    v->be = m->be;
    v->ops = m->ops;
    v->n_params = lo->L.n;
    v->num_params = lo->L.num;
    v->param_mem = lo->w;
    v->grad_mem = lo->g;
    qwen3_param *table = NULL;
    if (lora_table(&lo->L, &table, err) != 0) return -1;
    if (!(lo->unit_lo = calloc((size_t)L + 3, sizeof *lo->unit_lo))) {
        free(table);
        return ct_fail(err, "lora: out of memory for the adapter's table");
    }
    v->params = table;
    lo->unit_lo[0] = 0; // the embedding: nothing
    for (int l = 0; l < L; l++) lo->unit_lo[1 + l] = lo->L.layer_lo[l];
    lo->unit_lo[L + 1] = lo->unit_lo[L + 2] = lo->L.num; // the head: nothing
    return 0;
}

uint64_t qwen3_lora_base_hash(const qwen3_model *m) {
    return qwen3_lora_base_hash_range(m, QWEN3_LORA_HASH0, 0, m->num_params);
}

uint64_t qwen3_lora_tensor_hash(const qwen3_model *m, const qwen3_param *p) {
    uint64_t t = 0;
    if (qwen3_param_in_bf16(m, p))
        m->ops->hash_xxh64(&t, m->param_bf16 + p->offset, p->numel * sizeof(uint16_t));
    else
        m->ops->hash_xxh64(&t, m->param_mem + p->offset, p->numel * sizeof(float));
    return t;
}

uint64_t qwen3_lora_hash_step(uint64_t h, uint64_t tensor, int i) {
    return ct_splitmix64_at(h ^ tensor, (uint64_t)i);
}

uint64_t qwen3_lora_base_hash_range(const qwen3_model *m, uint64_t h, size_t lo, size_t hi) {
    for (int i = 0; i < m->n_params; i++) {
        const qwen3_param *p = &m->params[i];
        if (p->offset < lo || p->offset >= hi) continue;
        h = qwen3_lora_hash_step(h, qwen3_lora_tensor_hash(m, p), i);
    }
    return h;
}

qwen3_model *qwen3_trained(qwen3_model *m) {
    return m->lora ? &m->lora->view : m;
}

void qwen3_trained_units(const qwen3_model *m, size_t *lo) {
    const int n = qwen3_n_units(&m->cfg);
    if (m->lora) {
        memcpy(lo, m->lora->unit_lo, ((size_t)n + 1) * sizeof *lo);
        return;
    }
    size_t *hi = calloc((size_t)n, sizeof *hi);
    if (!hi) { // a few words; the units then start at 0: every gradient waits for the end
        memset(lo, 0, ((size_t)n + 1) * sizeof *lo);
        return;
    }
    qwen3_units(&m->cfg, lo, hi);
    lo[n] = m->num_params;
    free(hi);
}

// The adapter's buffers and the per-layer table, on a model whose base is built.
static int lora_attach(qwen3_model *m, const lora_config *lc, ct_error *err) {
    const qwen3_config *c = &m->cfg;
    const unsigned mlp = (1u << LORA_GATE) | (1u << LORA_UP) | (1u << LORA_DOWN);
    const bool bf16x = qwen3_bf16_experts(&m->mem_opts);
    if (m->n_sparse > 0 && (lc->targets & mlp) &&
        !(bf16x ? m->ops->moe_bf16_lora_forward && m->ops->moe_bf16_lora_backward
                : m->ops->moe_lora_forward && m->ops->moe_lora_backward))
        return ct_fail(err,
                       "lora: target_modules gate_proj/up_proj/down_proj on a model with "
                       "sparse (MoE) layers: the %sexpert kernel has no LoRA variant "
                       "(model.moe_impl = \"loop\" or a plugin's moe_experts; the default "
                       "\"grouped\" has); or target only q_proj, k_proj, v_proj, o_proj",
                       bf16x ? "bf16 " : "");
    if (!m->ops->lora_forward || !m->ops->lora_backward || !m->ops->lora_dropout)
        return ct_fail(err, "lora: op table '%s' has no lora_forward/lora_backward/lora_dropout",
                       m->ops->name ? m->ops->name : "?");
    qwen3_lora *lo = calloc(1, sizeof *lo);
    if (!lo) return ct_fail(err, "lora: out of memory");
    m->lora = lo;
    if (lora_layout_init(&lo->L, c, lc, err) != 0) return -1;
    lo->scale = lora_scale(lc);
    lo->mod = calloc((size_t)c->num_hidden_layers, sizeof *lo->mod);
    if (!lo->mod) return ct_fail(err, "lora: out of memory");
    const size_t bytes = lo->L.num * sizeof(float);
    if (!(lo->w = m->be->alloc(m->be, bytes, "the LoRA adapter", err)) ||
        !(lo->g = m->be->alloc(m->be, bytes, "the LoRA adapter's gradients", err)))
        return ct_wrap(err, "lora: %zu adapter parameters", lo->L.num);
    lo->experts = calloc((size_t)c->num_hidden_layers, sizeof *lo->experts);
    if (!lo->experts) return ct_fail(err, "lora: out of memory");
    for (int i = 0; i < lo->L.n; i++) {
        const lora_tensor *t = &lo->L.t[i];
        if (t->expert >= 0) { // expert 0's first tensor places the layer's; A and B of each module
            ct_moe_lora *x = &lo->experts[t->layer];
            if (!x->w) {
                x->w = lo->w + t->offset, x->g = lo->g + t->offset;
                x->targets = (lc->targets & mlp) >> LORA_GATE;
                x->r = lc->rank, x->scale = lo->scale;
            }
            if (t->expert == 0) x->stride += t->numel;
            continue;
        }
        qwen3_lora_module *md = &lo->mod[t->layer][t->module];
        if (t->is_b)
            md->b = t;
        else
            md->a = t;
    }
    return lora_view(m, lo, err);
}

void qwen3_lora_free(qwen3_model *m) {
    qwen3_lora *lo = m->lora;
    if (!lo) return;
    for (int j = 1; m->be && j < lo->n_sets; j++) {
        m->be->free(m->be, lo->set_u[j]);
        m->be->free(m->be, lo->set_eu[j]);
    }
    free(lo->set_u);
    free(lo->set_eu);
    free(lo->set_token0);
    free(lo->set_training);
    if (m->be) {
        m->be->free(m->be, lo->w);
        m->be->free(m->be, lo->g);
        m->be->free(m->be, lo->act);
        m->be->free(m->be, lo->experts_act);
    }
    free(lo->mod);
    free(lo->experts);
    free((qwen3_param *)lo->view.params);
    free(lo->unit_lo);
    lora_layout_free(&lo->L);
    free(lo);
    m->lora = NULL;
}

// Tensor t of m's adapter in W, the whole model's layout: its global layer's (NULL: not there).
static const lora_tensor *whole_tensor(const qwen3_model *m, const lora_layout *W,
                                       const lora_tensor *t) {
    return lora_layout_tensor(W, qwen3_layer_id(&m->cfg, t->layer), t->module, t->expert, t->is_b);
}

// The whole model's adapter layout into G (NULL: the model's own is whole), as *W.
static int whole_layout(const qwen3_model *m, const qwen3_config *whole, lora_layout *G,
                        const lora_layout **W, ct_error *err) {
    *W = &m->lora->L;
    if (!whole) return 0;
    if (lora_layout_init(G, whole, &m->lora->L.lc, err) != 0) return -1;
    *W = G;
    for (int i = 0; i < m->lora->L.n; i++)
        if (!whole_tensor(m, G, &m->lora->L.t[i])) {
            lora_layout_free(G);
            return ct_fail(err, "lora: %s is not in the whole model's adapter",
                           m->lora->L.t[i].name);
        }
    return 0;
}

int qwen3_lora_init_random(qwen3_model *m, uint64_t seed, const qwen3_config *whole,
                           ct_error *err) {
    qwen3_lora *lo = m->lora;
    lora_layout G;
    const lora_layout *W;
    if (whole_layout(m, whole, &G, &W, err) != 0) return -1;
    float *host = calloc(lo->L.num ? lo->L.num : 1, sizeof *host);
    if (!host) {
        if (whole) lora_layout_free(&G);
        return ct_fail(err, "lora: out of memory for the adapter's %zu floats", lo->L.num);
    }
    const uint64_t base = ct_splitmix64_at(seed ^ 0x4c6f5241ull /* "LoRA" */, 0);
    for (int i = 0; i < lo->L.n; i++) {
        const lora_tensor *t = &lo->L.t[i];
        if (t->is_b) continue; // zero
        // kaiming_uniform_(a = sqrt(5)): gain sqrt(2 / (1 + 5)), bound gain * sqrt(3 / fan_in)
        // = 1 / sqrt(fan_in).
        const double bound = 1.0 / sqrt((double)t->shape[1]);
        const uint64_t stream = ct_splitmix64_at(base, (uint64_t)(whole_tensor(m, W, t) - W->t));
        for (size_t k = 0; k < t->numel; k++)
            host[t->offset + k] = (float)(-bound + 2.0 * bound * ct_splitmix64_uniform_at(stream, k));
    }
    m->be->write(m->be, lo->w, host, lo->L.num * sizeof *host);
    free(host);
    lo->seed = ct_splitmix64_at(base, (uint64_t)W->n);
    lo->forwards = 0;
    if (whole) lora_layout_free(&G);
    return 0;
}

int qwen3_lora_to_whole(const qwen3_model *m, const lora_layout *W, float *local, float *whole,
                        bool back, ct_error *err) {
    const lora_layout *L = &m->lora->L;
    for (int i = 0; i < L->n; i++) {
        const lora_tensor *t = &L->t[i], *w = whole_tensor(m, W, t);
        if (!w) return ct_fail(err, "lora: %s is not in the whole model's adapter", t->name);
        if (back)
            memcpy(local + t->offset, whole + w->offset, t->numel * sizeof *local);
        else
            memcpy(whole + w->offset, local + t->offset, t->numel * sizeof *whole);
    }
    return 0;
}

int qwen3_lora_read_whole(const qwen3_model *m, const lora_layout *W, float *dst, ct_error *err) {
    const lora_layout *L = &m->lora->L;
    float *host = malloc(L->num * sizeof *host + 1);
    if (!host) return ct_fail(err, "lora: out of memory for the adapter's %zu floats", L->num);
    qwen3_lora_read(m, host, 0, L->num, false);
    const int rc = qwen3_lora_to_whole(m, W, host, dst, false, err);
    free(host);
    return rc;
}

int qwen3_lora_table(qwen3_model *g, const lora_layout *W, const qwen3_config *whole,
                     const qwen3_model *m, ct_error *err) {
    ct_backend *be = m->be;
    memset(g, 0, sizeof *g);
    g->cfg = *whole;
    g->be = be;
    g->ops = m->ops;
    g->n_params = W->n;
    g->num_params = W->num;
    qwen3_param *table = NULL;
    if (lora_table(W, &table, err) != 0) return -1;
    g->params = table;
    if (!(g->param_mem = be->alloc(be, (W->num + 1) * sizeof(float), "the whole adapter", err)))
        return ct_wrap(err, "lora: the whole model's adapter (%zu floats)", W->num);
    be->zero(be, g->param_mem, W->num * sizeof(float));
    return 0;
}

void qwen3_lora_table_free(qwen3_model *g) {
    g->ops = NULL; // m's
    qwen3_free(g);
}

void qwen3_lora_write(qwen3_model *m, size_t offset, size_t n, const float *src) {
    m->be->write(m->be, m->lora->w + offset, src, n * sizeof *src);
}

void qwen3_lora_read(const qwen3_model *m, float *dst, size_t offset, size_t n, bool grads) {
    const qwen3_lora *lo = m->lora;
    m->be->read(m->be, dst, (grads ? lo->g : lo->w) + offset, n * sizeof *dst);
}

void qwen3_lora_zero_grad(qwen3_model *m) {
    if (m->lora) m->be->zero(m->be, m->lora->g, m->lora->L.num * sizeof(float));
}

// The adapted sparse layers' u (each module's A x of each routed row) and the expert kernels'
// scratch, for N tokens.
static int plan_experts(qwen3_model *m, int N, ct_error *err) {
    qwen3_lora *lo = m->lora;
    const qwen3_config *c = &m->cfg;
    m->be->free(m->be, lo->experts_act);
    lo->experts_act = lo->eu0 = NULL;
    lo->eu_floats = 0;
    const size_t S = (size_t)N * c->num_experts_per_tok, r = (size_t)lo->L.lc.rank;
    size_t n = 0;
    for (int l = 0; l < c->num_hidden_layers; l++)
        if (lo->experts[l].w) n += 3 * S * r;
    if (n == 0) return 0;
    const size_t scratch = ct_moe_lora_scratch_floats(N, c->hidden_size, c->moe_intermediate_size,
                                                      c->num_experts, c->num_experts_per_tok,
                                                      lo->L.lc.rank);
    // fp32 experts sum their branch's products in double (ct_moe_lora.acc), each expert its own
    // region: the larger of gate/up's and down's.
    const int C = c->hidden_size, F = c->moe_intermediate_size, R = lo->L.lc.rank;
    const size_t ga = ct_lora_acc_doubles(C, R, F), da = ct_lora_acc_doubles(F, R, C);
    const size_t stride = qwen3_bf16_experts(&m->mem_opts) ? 0 : ga > da ? ga : da;
    const size_t acc = 2 * stride * c->num_experts; // in floats
    if (!(lo->experts_act = m->be->alloc(m->be, (acc + n + scratch) * sizeof(float),
                                         "the LoRA experts' activations", err)))
        return ct_wrap(err, "qwen3_plan: LoRA on the experts");
    float *at = lo->experts_act + acc; // the doubles first, at the allocation's alignment
    for (int l = 0; l < c->num_hidden_layers; l++) {
        lo->experts[l].acc = stride ? (double *)lo->experts_act : NULL;
        lo->experts[l].acc_stride = stride;
    }
    lo->eu0 = at, lo->eu_floats = n;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        if (!lo->experts[l].w) continue;
        lo->experts[l].u = at;
        at += 3 * S * r;
    }
    for (int l = 0; l < c->num_hidden_layers; l++) lo->experts[l].scratch = at;
    return 0;
}

int qwen3_lora_plan(qwen3_model *m, int B, int T, ct_error *err) {
    qwen3_lora *lo = m->lora;
    if (!lo) return 0;
    m->be->free(m->be, lo->act);
    lo->act = NULL;
    const size_t N = (size_t)B * T;
    const int r = lo->L.lc.rank;
    int max_in = 1, max_out = 1, n_mod = 0;
    for (int i = 0; i < lo->L.n; i++) {
        const lora_tensor *t = &lo->L.t[i];
        if (t->is_b) {
            if (t->shape[0] > max_out) max_out = (int)t->shape[0];
        } else {
            if (t->shape[1] > max_in) max_in = (int)t->shape[1];
            n_mod++;
        }
    }
    carve cv = {0};
    for (int pass = 0; pass < 2; pass++) {
        if (pass) {
            if (!(lo->act = m->be->alloc(m->be, cv.off * sizeof(float), "the LoRA activations", err)))
                return ct_wrap(err, "qwen3_plan: LoRA");
            cv = (carve){.base = lo->act};
        }
        for (int l = 0; l < m->cfg.num_hidden_layers; l++)
            for (int md = 0; md < LORA_N_MODULES; md++)
                if (lo->mod[l][md].a) lo->mod[l][md].u = carve_take(&cv, N * r);
        lo->xd = carve_take(&cv, N * max_in);
        lo->dx = carve_take(&cv, N * max_in);
        lo->scratch = carve_take(&cv, ct_lora_scratch_floats((int)N, max_in, r, max_out));
    }
    (void)n_mod;
    lo->u_floats = (size_t)(lo->xd - lo->act); // the modules' u, carved first
    return plan_experts(m, (int)N, err);
}

int qwen3_lora_plan_sets(qwen3_model *m, int n, ct_error *err) {
    qwen3_lora *lo = m->lora;
    if (!lo || n <= 1) return 0;
    lo->set_u = calloc((size_t)n, sizeof *lo->set_u);
    lo->set_eu = calloc((size_t)n, sizeof *lo->set_eu);
    lo->set_token0 = calloc((size_t)n, sizeof *lo->set_token0);
    lo->set_training = calloc((size_t)n, sizeof *lo->set_training);
    if (!lo->set_u || !lo->set_eu || !lo->set_token0 || !lo->set_training)
        return ct_fail(err, "lora: out of memory for %d activation sets", n);
    lo->n_sets = n; // from here qwen3_lora_free frees the sets made
    lo->set_u[0] = lo->act, lo->set_eu[0] = lo->eu0;
    for (int j = 1; j < n; j++) {
        if (lo->u_floats && !(lo->set_u[j] = m->be->alloc(m->be, lo->u_floats * sizeof(float),
                                                          "the LoRA activations of a set", err)))
            return ct_wrap(err, "lora: activation set %d of %d", j + 1, n);
        if (lo->eu_floats &&
            !(lo->set_eu[j] = m->be->alloc(m->be, lo->eu_floats * sizeof(float),
                                           "the LoRA experts' activations of a set", err)))
            return ct_wrap(err, "lora: activation set %d of %d", j + 1, n);
    }
    return 0;
}

// Each u moves from the set in use to set j, at the same place in it; the forward's dropout key
// and mode go with their set.
void qwen3_lora_use_set(qwen3_model *m, int j) {
    qwen3_lora *lo = m->lora;
    if (!lo || j < 0 || j >= lo->n_sets || j == lo->set) return;
    const int k = lo->set;
    for (int l = 0; l < m->cfg.num_hidden_layers; l++) {
        for (int md = 0; md < LORA_N_MODULES; md++)
            if (lo->mod[l][md].a)
                lo->mod[l][md].u = lo->set_u[j] + (lo->mod[l][md].u - lo->set_u[k]);
        if (lo->experts[l].w && lo->experts[l].u)
            lo->experts[l].u = lo->set_eu[j] + (lo->experts[l].u - lo->set_eu[k]);
    }
    lo->set_token0[k] = lo->token0, lo->set_training[k] = lo->training;
    lo->token0 = lo->set_token0[j], lo->training = lo->set_training[j];
    lo->set = j;
}

// The dropout masks of (layer, module): one sequence, element j of the forward's token n drawing
// number (token0 + n) * in + j of it, so a mask depends on the token's place in the run only (a
// recomputation and the backward draw the same one; so do the ranks of a step, or a resume).
// A pipeline stage's layer l draws the mask of its global index.
static uint64_t mask_seed(const qwen3_lora *lo, int l, lora_module md) {
    const uint64_t g = (uint64_t)qwen3_layer_id(&lo->view.cfg, l);
    return ct_splitmix64_at(lo->seed, g * LORA_N_MODULES + (uint64_t)md);
}

// The branch's input: x, or (bf16) x16 widened, then through dropout, staged in lo->xd.
static const float *branch_input(const qwen3_model *m, int l, lora_module md, const float *x,
                                 const uint16_t *x16, size_t n) {
    const qwen3_lora *lo = m->lora;
    if (m->mem_opts.bf16 && x16) {
        m->ops->bf16_to_f32(lo->xd, x16, n);
        x = lo->xd;
    }
    if (lo->training && lo->L.lc.dropout > 0.0f) {
        const uint64_t in = n / (uint64_t)m->B / (uint64_t)m->T;
        m->ops->lora_dropout(lo->xd, x, (int64_t)n, lo->L.lc.dropout, mask_seed(lo, l, md),
                             lo->token0 * in);
        x = lo->xd;
    }
    return x;
}

const ct_moe_lora *qwen3_lora_experts(const qwen3_model *m, int l) {
    qwen3_lora *lo = m->lora;
    if (!lo || !lo->experts[l].w) return NULL;
    ct_moe_lora *x = &lo->experts[l];
    x->dropout = lo->training ? lo->L.lc.dropout : 0.0f;
    for (int k = 0; k < 3; k++) x->seed[k] = mask_seed(lo, l, (lora_module)(LORA_GATE + k));
    x->token0 = lo->token0;
    return x;
}

void qwen3_lora_forward(const qwen3_model *m, int l, lora_module md, float *y, uint16_t *y16,
                        int ldy, const float *x, const uint16_t *x16, int N) {
    if (!qwen3_lora_has(m, l, md)) return;
    const qwen3_lora *lo = m->lora;
    const qwen3_lora_module *mm = &lo->mod[l][md];
    const int r = (int)mm->a->shape[0], in = (int)mm->a->shape[1], out = (int)mm->b->shape[0];
    const float *xin = branch_input(m, l, md, x, x16, (size_t)N * in);
    m->ops->lora_forward(y, y16, ldy, mm->u, lo->scratch, xin, lo->w + mm->a->offset,
                         lo->w + mm->b->offset, lo->scale, m->mem_opts.bf16, N, in, r, out);
}

void qwen3_lora_backward(const qwen3_model *m, int l, lora_module md, float *dx, const float *dy,
                         const uint16_t *dy16, int ldy, const float *x, const uint16_t *x16,
                         int N) {
    if (!qwen3_lora_has(m, l, md)) return;
    const qwen3_lora *lo = m->lora;
    const qwen3_lora_module *mm = &lo->mod[l][md];
    const int r = (int)mm->a->shape[0], in = (int)mm->a->shape[1], out = (int)mm->b->shape[0];
    const size_t n = (size_t)N * in;
    const float *xin = branch_input(m, l, md, x, x16, n);
    m->ops->lora_backward(lo->dx, lo->g + mm->a->offset, lo->g + mm->b->offset, lo->scratch, dy,
                          dy16, ldy, mm->u, xin, lo->w + mm->a->offset, lo->w + mm->b->offset,
                          lo->scale, m->mem_opts.bf16, N, in, r, out);
    if (lo->training && lo->L.lc.dropout > 0.0f) // dropout's backward: the same mask and scale
        m->ops->lora_dropout(lo->dx, lo->dx, (int64_t)n, lo->L.lc.dropout, mask_seed(lo, l, md),
                             lo->token0 * (uint64_t)in);
    m->ops->add(dx, dx, lo->dx, (int64_t)n);
}

int qwen3_init_lora(qwen3_model *m, const qwen3_config *cfg, ct_backend *be, const ct_ops *ops,
                    const qwen3_memory_opts *opts, const lora_config *lc, ct_error *err) {
    if (qwen3_init_frozen(m, cfg, be, ops, opts, err) != 0) return -1;
    if (lora_attach(m, lc, err) != 0) {
        qwen3_free(m);
        return -1;
    }
    return 0;
}

int peft_adapter_apply(qwen3_model *m, const char *dir, const qwen3_config *whole, ct_error *err) {
    if (!m->lora) return ct_fail(err, "%s: the model has no LoRA adapter to read it into", dir);
    const lora_config *mc = &m->lora->L.lc;
    peft_adapter a;
    if (peft_adapter_load(&a, dir, whole ? whole : &m->cfg, err) != 0) return -1;
    const lora_config *f = &a.pc.lc;
    int rc = 0;
    if (f->rank != mc->rank || f->alpha != mc->alpha || f->targets != mc->targets ||
        f->use_rslora != mc->use_rslora)
        rc = ct_fail(err,
                     "%s/%s: r %d, lora_alpha %g, targets 0x%x, use_rslora %d; the model's "
                     "adapter has rank %d, alpha %g, targets 0x%x, use_rslora %d",
                     dir, PEFT_CONFIG_NAME, f->rank, (double)f->alpha, f->targets,
                     (int)f->use_rslora, mc->rank, (double)mc->alpha, mc->targets,
                     (int)mc->use_rslora);
    else if (!whole && a.L.num != m->lora->L.num)
        rc = ct_fail(err, "%s: %zu adapter floats, the model's adapter has %zu", dir, a.L.num,
                     m->lora->L.num);
    const lora_layout *L = &m->lora->L;
    float *mine = rc == 0 && whole ? malloc(L->num * sizeof *mine + 1) : NULL;
    if (rc == 0 && whole && !mine) rc = ct_fail(err, "%s: out of memory", dir);
    for (int i = 0; rc == 0 && whole && i < L->n; i++) { // this stage's tensors, by global layer
        const lora_tensor *t = &L->t[i], *w = whole_tensor(m, &a.L, t);
        if (!w)
            rc = ct_fail(err, "%s: no %s", dir, t->name);
        else
            memcpy(mine + t->offset, a.buf + w->offset, t->numel * sizeof *mine);
    }
    if (rc == 0) qwen3_lora_write(m, 0, L->num, whole ? mine : a.buf);
    free(mine);
    peft_adapter_free(&a);
    return rc;
}
