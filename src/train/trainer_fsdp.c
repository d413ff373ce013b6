// The trainer's side of FSDP (dist/fsdp.h): the units from the model's layout, the optimizer
// over the shard, the memory estimate, the weights' first values, and the model's unit hook.
#include <stdlib.h>
#include <string.h>

#include "model/hf_adapter.h"
#include "checkpoint/checkpoint.h"
#include "optim/adamw.h"
#include "train/trainer_internal.h"

// The model's units, malloc'd: lo and hi arrays of qwen3_n_units each (one allocation, lo first).
static size_t *units_of(const qwen3_config *cfg, size_t **hi, ct_error *err) {
    const int n = qwen3_n_units(cfg);
    size_t *lo = malloc(2 * (size_t)n * sizeof *lo);
    if (!lo) return ct_fail(err, "out of memory for the FSDP units"), NULL;
    *hi = lo + n;
    qwen3_units(cfg, lo, *hi);
    return lo;
}

static fsdp_opts fsdp_options(const trainer *t) {
    const ct_config *c = t->cfg;
    fsdp_opts o = {
        .shard_degree = t->shard_degree,
        .replicate_degree = t->d->size / t->shard_degree,
        .bf16_params = t->setup.mem_opts.bf16,
        .bf16_reduce = strcmp(c->training.mixed_precision_reduce, "bfloat16") == 0,
    };
    fsdp_reshard_parse(&o.reshard, c->parallelism.fsdp_reshard_after_forward, NULL);
    return o;
}

typedef struct fsdp_bytes {
    double shard_params, shard_grads, shard_bf16, optimizer; // this rank's 1/S
    double gathered; // units' weights and gradients at the worst moment of a step
} fsdp_bytes;

static int fsdp_bytes_of(const trainer *t, fsdp_bytes *out, ct_error *err) {
    const qwen3_config *cfg = &t->setup.model;
    size_t *hi, *lo = units_of(cfg, &hi, err);
    if (!lo) return -1;
    const fsdp_opts o = fsdp_options(t);
    const int n = qwen3_n_units(cfg);
    // The largest shard: each unit's piece is at most ceil(len / S).
    double shard = 0;
    for (int u = 0; u < n; u++)
        shard += (double)((hi[u] - lo[u] + o.shard_degree - 1) / o.shard_degree);
    out->shard_params = shard * sizeof(float);
    out->shard_grads = shard * sizeof(float);
    out->shard_bf16 = o.bf16_params ? shard * sizeof(uint16_t) : 0;
    out->optimizer = 2 * shard * sizeof(float);
    out->gathered = fsdp_peak_gathered_bytes(lo, hi, n, &o, cfg->tie_word_embeddings);
    free(lo);
    return 0;
}

// FSDP's parts of the estimate: the shard's 1/S of the weights (and their bf16 copy), gradients
// and moments, plus the units gathered and the gradients not yet reduced at the worst moment.
// Logged on a line of their own; params and grads in `mem` become the shard's plus what is in
// flight.
int trainer_fsdp_estimate(const trainer *t, run_memory *mem, ct_error *err) {
    fsdp_bytes b;
    if (fsdp_bytes_of(t, &b, err) != 0) return -1;
    mem->model.params = (size_t)b.shard_params;
    mem->model.weights_bf16 = (size_t)b.shard_bf16;
    mem->model.grads = (size_t)b.shard_grads;
    mem->optimizer = b.optimizer;
    mem->total = b.shard_params + b.shard_bf16 + b.shard_grads + b.optimizer + b.gathered +
                 mem->model.activations + mem->batch;
    mem->node = mem->total * mem->ranks_per_node;
    fprintf(t->log,
            "memory, FSDP: shard (1/%d) weights %.3f GiB%s, gradients %.3f GiB, optimizer "
            "%.3f GiB; units gathered and gradients not yet reduced, at most %.3f GiB\n",
            t->shard_degree, b.shard_params / GIB, b.shard_bf16 ? " (+ their bf16 copy)" : "",
            b.shard_grads / GIB, b.optimizer / GIB, b.gathered / GIB);
    return 0;
}

// The MoE expert bias is a buffer: as FSDP2 does with buffers, every rank keeps it whole and in
// fp32 (t->expert_bias, sparse layer s at s*E), and it goes into a layer's gathered weights
// (which under bf16 gathers hold bf16-rounded values) when the layer runs. Its pieces in the
// shard follow it, for checkpoints.
static float *bias_copy(trainer *t, int l) {
    const qwen3_model *m = &t->model;
    int s = 0;
    for (int i = 0; i < l; i++) s += m->w.layers[i].expert_bias != NULL;
    return m->w.layers[l].expert_bias ? t->expert_bias + (size_t)s * m->cfg.num_experts : NULL;
}

static void put_expert_bias(trainer *t, int unit) {
    qwen3_model *m = &t->model;
    const int l = unit - 1;
    if (!t->expert_bias || l < 0 || l >= m->cfg.num_hidden_layers || !m->w.layers[l].expert_bias)
        return;
    m->be->write(m->be, m->w.layers[l].expert_bias, bias_copy(t, l),
                 (size_t)m->cfg.num_experts * sizeof(float));
}

// The model's unit hook, to the four moments of dist/fsdp.h.
static void on_unit(void *ctx, int unit, int event) {
    trainer *t = ctx;
    fsdp *f = &t->fsdp;
    switch (event) {
    case QWEN3_UNIT_FORWARD:
        fsdp_forward(f, unit);
        put_expert_bias(t, unit);
        break;
    case QWEN3_UNIT_FORWARD_DONE:
        fsdp_forward_done(f, unit);
        break;
    case QWEN3_UNIT_BACKWARD:
        fsdp_backward(f, unit);
        put_expert_bias(t, unit);
        break;
    case QWEN3_UNIT_BACKWARD_DONE:
        fsdp_backward_done(f, unit);
        break;
    }
}

// A unit whose weights the full buffer holds (after an init or a load) goes to the shard; a
// layer's expert bias is kept whole first.
static void take_unit(trainer *t, int u) {
    qwen3_model *m = &t->model;
    const int l = u - 1;
    if (t->expert_bias && l >= 0 && l < m->cfg.num_hidden_layers && m->w.layers[l].expert_bias)
        m->be->read(m->be, bias_copy(t, l), m->w.layers[l].expert_bias,
                    (size_t)m->cfg.num_experts * sizeof(float));
    fsdp_take(&t->fsdp, u);
}

// AdamW's no-decay tensors, in shard coordinates: each tensor's part inside each piece.
static int exclude_decay(trainer *t, ct_error *err) {
    const qwen3_model *m = &t->model;
    const fsdp *f = &t->fsdp;
    for (int i = 0; i < m->n_params; i++) {
        const qwen3_param *p = &m->params[i];
        if (!p->buffer &&
            (t->cfg->optimizer.decay_norms_and_embeddings || adamw_param_decays(p->name, p->ndim)))
            continue;
        for (int u = 0; u < f->n_units; u++) {
            const fsdp_unit *x = &f->units[u];
            size_t lo = p->offset > x->piece_lo ? p->offset : x->piece_lo;
            size_t hi = p->offset + p->numel < x->piece_hi ? p->offset + p->numel : x->piece_hi;
            if (lo < hi && adamw_exclude_decay(&t->opt, x->at + (lo - x->piece_lo), hi - lo, err))
                return -1;
        }
    }
    return 0;
}

static void add_expert_bias(void *ctx, const float *delta);

int trainer_fsdp_setup(trainer *t, ct_error *err) {
    qwen3_model *m = &t->model;
    size_t *hi, *lo = units_of(&m->cfg, &hi, err);
    if (!lo) return -1;
    const fsdp_opts o = fsdp_options(t);
    int rc =
        fsdp_init(&t->fsdp, t->d, &o, m->be, m->ops, m->param_mem, m->grad_mem, m->param_bf16,
                  m->num_params, lo, hi, qwen3_n_units(&m->cfg), m->cfg.tie_word_embeddings, err);
    free(lo);
    if (rc != 0) return -1;
    // The weights the model read so far (none: qwen3_init's zeros) go: only units in use stay.
    fsdp_reshard_all(&t->fsdp);
    m->be->discard(m->be, m->grad_mem, m->num_params * sizeof(float));
    m->unit_hook = on_unit;
    m->unit_hook_ctx = t;
    if (m->n_sparse && !(t->expert_bias = calloc((size_t)m->n_sparse * m->cfg.num_experts,
                                                 sizeof *t->expert_bias)))
        return ct_fail(err, "out of memory for the expert biases");
    t->moe.add_bias = add_expert_bias;
    t->moe.add_bias_ctx = t;
    if (adamw_init_shard(&t->opt, m->be, t->fsdp.n_shard, 0, t->fsdp.n_shard, err) != 0 ||
        exclude_decay(t, err) != 0)
        return -1;
    size_t largest = 0;
    for (int u = 0; u < t->fsdp.n_units; u++) {
        const size_t len = t->fsdp.units[u].hi - t->fsdp.units[u].lo;
        largest = len > largest ? len : largest;
    }
    static const char *reshard[] = {"default", "always", "never"};
    char hsdp[64] = "";
    if (o.replicate_degree > 1)
        snprintf(hsdp, sizeof hsdp, " in each of %d replica groups (HSDP)", o.replicate_degree);
    fprintf(t->log,
            "comm: FSDP over %d ranks%s: %d units (embedding, %d layers, head), the largest "
            "%.1f MiB of fp32 weights; gathers in %s, gradients reduce-scattered in %s, "
            "reshard_after_forward %s\n",
            o.shard_degree, hsdp, t->fsdp.n_units, m->cfg.num_hidden_layers,
            largest * 4.0 / (1 << 20), o.bf16_params ? "bfloat16" : "float32",
            t->cfg->training.mixed_precision_reduce, reshard[o.reshard]);
    return 0;
}

// Random init, unit by unit: each unit is filled whole (the same values as without FSDP), its
// piece kept, the rest handed back, so no rank ever holds more than one unit.
int trainer_fsdp_init_random(trainer *t, uint64_t seed, ct_error *err) {
    for (int u = 0; u < t->fsdp.n_units; u++) {
        const fsdp_unit *x = &t->fsdp.units[u];
        if (qwen3_init_random_range(&t->model, seed, x->lo, x->hi, err) != 0) return -1;
        take_unit(t, u);
    }
    fsdp_weights_changed(&t->fsdp, false);
    return 0;
}

// MoE, aux-loss-free balancing (moe_balance's add_bias): the same delta on every rank, added to
// the whole copy and to this rank's pieces of the biases.
static void add_expert_bias(void *ctx, const float *delta) {
    trainer *t = ctx;
    const qwen3_model *m = &t->model;
    const int E = m->cfg.num_experts;
    for (int l = 0; l < m->cfg.num_hidden_layers; l++) {
        float *copy = bias_copy(t, l);
        if (!copy) continue;
        const float *d = delta + (copy - t->expert_bias);
        const size_t off = (size_t)(m->w.layers[l].expert_bias - m->param_mem);
        const fsdp_unit *x = &t->fsdp.units[1 + l];
        for (int e = 0; e < E; e++) {
            copy[e] += d[e];
            if (off + e >= x->piece_lo && off + e < x->piece_hi)
                t->fsdp.shard_params[x->at + (off + e - x->piece_lo)] = copy[e];
        }
    }
}

int trainer_fsdp_ranges(const trainer *t, int s, ckpt_range *out) {
    int n = 0;
    for (int u = 0; u < t->fsdp.n_units; u++) {
        size_t lo, hi;
        fsdp_piece(&t->fsdp, u, s, &lo, &hi);
        if (lo < hi) out[n++] = (ckpt_range){lo, hi};
    }
    return n;
}

int trainer_fsdp_bias_ranges(const trainer *t, ckpt_range *out) {
    const qwen3_model *m = &t->model;
    int n = 0;
    for (int l = 0; l < m->cfg.num_hidden_layers; l++) {
        const float *bias = m->w.layers[l].expert_bias;
        if (!bias) continue;
        const size_t lo = (size_t)(bias - m->param_mem);
        out[n++] = (ckpt_range){lo, lo + (size_t)m->cfg.num_experts};
    }
    return n;
}

// This rank's pieces, and every expert bias whole, from a checkpoint of any layout and rank
// count; moments (NULL: not read) get the pieces' AdamW state.
int trainer_fsdp_load(trainer *t, const char *dir, float *moments[2], train_state *st,
                      ct_error *err) {
    const qwen3_model *m = &t->model;
    ckpt_range *r = malloc(((size_t)t->fsdp.n_units + m->cfg.num_hidden_layers) * sizeof *r);
    if (!r) return ct_fail(err, "out of memory");
    int n = trainer_fsdp_ranges(t, t->fsdp.shard.rank, r);
    int rc = ckpt_load_ranges(dir, m, r, n, t->fsdp.shard_params, moments ? moments[0] : NULL,
                              moments ? moments[1] : NULL, st, NULL, err);
    if (rc == 0 && t->expert_bias)
        rc = ckpt_load_ranges(dir, m, r, trainer_fsdp_bias_ranges(t, r), t->expert_bias, NULL, NULL,
                              NULL, NULL, err);
    free(r);
    if (rc == 0) fsdp_weights_changed(&t->fsdp, false);
    return rc;
}

// The same from a Hugging Face folder (initial_load_path): only this rank's ranges are read.
int trainer_fsdp_load_hf(trainer *t, hf_load_report *rep, const st_set *set, const char *from,
                         ct_error *err) {
    const qwen3_model *m = &t->model;
    ckpt_range *r = malloc(((size_t)t->fsdp.n_units + m->cfg.num_hidden_layers) * sizeof *r);
    if (!r) return ct_fail(err, "out of memory");
    int rc =
        hf_load_weights_ranges(m, rep, set, from, r, trainer_fsdp_ranges(t, t->fsdp.shard.rank, r),
                               t->fsdp.shard_params, err);
    if (rc == 0 && t->expert_bias) {
        hf_load_report ignored = {0};
        rc = hf_load_weights_ranges(m, &ignored, set, from, r, trainer_fsdp_bias_ranges(t, r),
                                    t->expert_bias, err);
        hf_report_free(&ignored);
    }
    free(r);
    if (rc == 0) fsdp_weights_changed(&t->fsdp, false);
    return rc;
}
