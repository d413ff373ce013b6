// FSDP and HSDP as a strategy (parallel/fsdp.h): the units and the whole tensors from the
// model's parallelize plan, the optimizer over the shard, the memory estimate, the weights'
// first values, and the unit hook. A LoRA model's frozen base is sharded here too (fsdp.h's
// frozen mode: no gradients, no optimizer; strategy_lora_fsdp.c trains the adapter).
#include <stdlib.h>
#include <string.h>

#include "model/hf_adapter.h"
#include "model/qwen3_lora.h"
#include "checkpoint/checkpoint.h"
#include "optim/adamw.h"
#include "train/strategy.h"
#include "train/trainer_internal.h"

static fsdp_opts fsdp_options(const trainer *t) {
    const ct_config *c = t->cfg;
    fsdp_opts o = {
        .shard_degree = t->shard_degree,
        .replicate_degree = t->d->size / t->shard_degree,
        .bf16_params = t->setup.mem_opts.bf16,
        .bf16_reduce = strcmp(c->training.mixed_precision_reduce, "bfloat16") == 0,
        .frozen = c->lora.rank > 0, // LoRA's base (strategy_lora_fsdp.c)
    };
    fsdp_reshard_parse(&o.reshard, c->parallelism.fsdp_reshard_after_forward, NULL);
    // torchtitan: "default" is never under pipeline parallelism (the stage's backward of a
    // micro-batch comes after others' forwards).
    if (t->pp > 1 && o.reshard == FSDP_RESHARD_DEFAULT) o.reshard = FSDP_RESHARD_NEVER;
    return o;
}

typedef struct fsdp_bytes {
    double shard_params, shard_grads, shard_bf16, optimizer; // this rank's 1/S
    double gathered; // units' weights and gradients at the worst moment of a step
} fsdp_bytes;

// The model: the run's, or under TP this rank's local one.
static int fsdp_bytes_of(const trainer *t, const qwen3_config *cfg, fsdp_bytes *out,
                         ct_error *err) {
    qwen3_parallel_plan p;
    if (qwen3_parallelize(&p, cfg, NULL, err) != 0) return -1;
    const size_t *lo = p.unit_lo, *hi = p.unit_hi;
    const fsdp_opts o = fsdp_options(t);
    const int n = p.n_units;
    // The largest shard: each unit's piece is at most ceil(len / S).
    double shard = 0;
    for (int u = 0; u < n; u++)
        shard += (double)((hi[u] - lo[u] + o.shard_degree - 1) / o.shard_degree);
    out->shard_params = shard * sizeof(float);
    out->shard_grads = shard * sizeof(float);
    out->shard_bf16 = o.bf16_params ? shard * sizeof(uint16_t) : 0;
    out->optimizer = 2 * shard * sizeof(float);
    out->gathered = fsdp_peak_gathered_bytes(lo, hi, n, &o, p.tied);
    qwen3_parallel_plan_free(&p);
    return 0;
}

// FSDP's parts of the estimate: the shard's 1/S of the weights (and their bf16 copy), gradients
// and moments, plus the units gathered and the gradients not yet reduced at the worst moment.
// Logged on a line of their own; params and grads in `mem` become the shard's plus what is in
// flight.
int strategy_fsdp_estimate_of(const trainer *t, const qwen3_config *cfg, run_memory *mem,
                              ct_error *err) {
    fsdp_bytes b;
    if (fsdp_bytes_of(t, cfg, &b, err) != 0) return -1;
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

// A frozen base (LoRA): its 1/S as held once (bf16 matrices under bf16; the fp32 tensors whole
// when it is held in bf16 only, a small overcount otherwise) and the units gathered at the worst
// moment, beside run_setup_memory_lora's adapter, its gradients and moments.
static int estimate_frozen(const trainer *t, run_memory *mem, ct_error *err) {
    qwen3_parallel_plan p;
    if (qwen3_parallelize(&p, &t->setup.model, NULL, err) != 0) return -1;
    const fsdp_opts o = fsdp_options(t);
    const double gathered = fsdp_peak_gathered_bytes(p.unit_lo, p.unit_hi, p.n_units, &o, p.tied);
    qwen3_parallel_plan_free(&p);
    const double base =
        (double)qwen3_forward_only_weight_bytes(&t->setup.model, &t->setup.mem_opts);
    const double adapter = (double)mem->model.grads, shard = base / t->shard_degree;
    mem->model.params = (size_t)(shard + adapter);
    mem->total =
        shard + 2 * adapter + mem->optimizer + gathered + mem->model.activations + mem->batch;
    mem->node = mem->total * mem->ranks_per_node;
    fprintf(t->log,
            "memory, FSDP: the frozen base's shard (1/%d) %.3f GiB; units gathered at most "
            "%.3f GiB; no gradients for it\n",
            t->shard_degree, shard / GIB, gathered / GIB);
    return 0;
}

static int estimate(const trainer *t, run_memory *mem, ct_error *err) {
    if (t->cfg->lora.rank > 0) return estimate_frozen(t, mem, err);
    return strategy_fsdp_estimate_of(t, &t->setup.model, mem, err);
}

// The plan's whole tensors (the MoE expert bias) are buffers: as FSDP2 does with buffers,
// every rank keeps them whole and in fp32 (strat.whole, back to back in plan order), and a
// unit's go into its gathered weights (which under bf16 gathers hold bf16-rounded values) when
// it runs. Their pieces in the shard follow them, for checkpoints.
typedef enum { WHOLE_PUT, WHOLE_TAKE } whole_dir;

static void move_whole(trainer *t, int unit, whole_dir dir) {
    qwen3_model *m = &t->model;
    const qwen3_parallel_plan *p = &t->strat.plan;
    float *copy = t->strat.whole;
    for (int i = 0; copy && i < p->n_tensors; i++) {
        const qwen3_plan_tensor *x = &p->tensors[i];
        if (x->split != QWEN3_SPLIT_WHOLE) continue;
        const size_t bytes = (x->hi - x->lo) * sizeof(float);
        if (x->unit == unit && dir == WHOLE_PUT)
            m->be->write(m->be, m->param_mem + x->lo, copy, bytes);
        else if (x->unit == unit)
            m->be->read(m->be, copy, m->param_mem + x->lo, bytes);
        copy += x->hi - x->lo;
    }
}

// The model's unit hook, to the four moments of parallel/fsdp.h, for each of the model unit's
// FSDP units: in order in the forward, in reverse in the backward (each prefetches the next one
// it meets).
static void unit_ready(void *ctx, int unit, int event) {
    trainer *t = ctx;
    fsdp *f = &t->strat.fsdp;
    const int a = t->strat.fsdp_first[unit], b = t->strat.fsdp_first[unit + 1];
    switch (event) {
    case QWEN3_UNIT_FORWARD:
        for (int u = a; u < b; u++) fsdp_forward(f, u);
        move_whole(t, unit, WHOLE_PUT);
        break;
    case QWEN3_UNIT_FORWARD_DONE:
        for (int u = a; u < b; u++) fsdp_forward_done(f, u);
        break;
    case QWEN3_UNIT_BACKWARD:
        for (int u = b - 1; u >= a; u--) fsdp_backward(f, u);
        move_whole(t, unit, WHOLE_PUT);
        break;
    case QWEN3_UNIT_BACKWARD_DONE:
        for (int u = b - 1; u >= a; u--) fsdp_backward_done(f, u);
        break;
    }
}

// A model unit whose weights the full buffer holds (after an init or a load) goes to the shard;
// its whole tensors are kept first.
static void take_unit(trainer *t, int unit) {
    move_whole(t, unit, WHOLE_TAKE);
    for (int u = t->strat.fsdp_first[unit]; u < t->strat.fsdp_first[unit + 1]; u++)
        fsdp_take(&t->strat.fsdp, u);
}

// The FSDP units: the plan's, and under EP each sparse layer cut where its experts begin and
// end (the experts are cut over the ranks holding the same ones, the rest over all shard
// ranks). Fills st->fsdp_first and the units' ranges and kinds (n at most 3 per model unit).
static int fsdp_units(trainer *t, size_t *lo, size_t *hi, bool *expert, int *n, ct_error *err) {
    const qwen3_model *m = &t->model;
    const qwen3_parallel_plan *p = &t->strat.plan;
    if (!(t->strat.fsdp_first = malloc(((size_t)p->n_units + 1) * sizeof(int))))
        return ct_fail(err, "out of memory for the FSDP units");
    int k = 0, i = 0;
    for (int u = 0; u < p->n_units; u++) {
        t->strat.fsdp_first[u] = k;
        lo[k] = p->unit_lo[u], expert[k] = false;
        for (; t->ep > 1 && i < m->n_params && m->params[i].offset < p->unit_hi[u]; i++) {
            const qwen3_param *x = &m->params[i];
            const bool e = strategy_ep_is_expert(x->name);
            if (e == expert[k] || x->offset == lo[k]) {
                expert[k] = e;
                continue;
            }
            hi[k] = x->offset, k++;
            lo[k] = x->offset, expert[k] = e;
        }
        hi[k++] = p->unit_hi[u];
    }
    t->strat.fsdp_first[p->n_units] = k;
    *n = k;
    return 0;
}

// AdamW's no-decay tensors, in shard coordinates: each tensor's part inside each piece.
static int exclude_decay(trainer *t, ct_error *err) {
    const qwen3_model *m = &t->model;
    const fsdp *f = &t->strat.fsdp;
    for (int i = 0; i < m->n_params; i++) {
        const qwen3_param *p = &m->params[i];
        if (trainer_param_decays(t, p)) continue;
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

static void add_whole(void *ctx, const float *delta);

static int setup(trainer *t, ct_error *err) {
    qwen3_model *m = &t->model;
    strategy *st = &t->strat;
    if (qwen3_parallelize(&st->plan, &m->cfg, m, err) != 0) return -1;
    const qwen3_parallel_plan *p = &st->plan;
    fsdp_opts o = fsdp_options(t);
    const size_t most = 3 * (size_t)p->n_units;
    size_t *lo = malloc(most * sizeof *lo), *hi = malloc(most * sizeof *hi);
    bool *expert = malloc(most * sizeof *expert);
    int n = 0;
    int rc = lo && hi && expert ? fsdp_units(t, lo, hi, expert, &n, err)
                                : ct_fail(err, "out of memory for the FSDP units");
    // The shard ranks holding the same experts: every ep-th one, or under TP with etp 1 (EP
    // carved out of dp_shard x tp, TP innermost) every (ep / tp)-th one.
    o.expert_degree = t->ep * t->etp / t->tp;
    o.expert_units = expert;
    if (rc == 0)
        rc = fsdp_init(&st->fsdp, t->d, &o, m->be, m->ops, m->param_mem, m->grad_mem,
                       m->param_bf16, m->num_params, lo, hi, n, p->tied, err);
    free(lo), free(hi), free(expert);
    st->fsdp.o.expert_units = NULL;
    if (rc != 0) return -1;
    // The weights the model read so far (none: qwen3_init's zeros) go: only units in use stay.
    fsdp_reshard_all(&st->fsdp);
    if (m->grad_mem) m->be->discard(m->be, m->grad_mem, m->num_params * sizeof(float));
    m->unit_hook = unit_ready;
    m->unit_hook_ctx = t;
    // A base held in bf16 only keeps its fp32 tensors, the expert biases too, whole in param_mem:
    // moe_balance adds to them there.
    if (!m->weights16) {
        if (p->n_whole && !(st->whole = calloc(p->n_whole, sizeof *st->whole)))
            return ct_fail(err, "out of memory for the expert biases");
        t->moe.add_bias = add_whole;
        t->moe.add_bias_ctx = t;
    }
    if (!o.frozen && // a LoRA base's adapter has its optimizer in strategy_lora_fsdp
        (adamw_init_shard(&t->opt, m->be, st->fsdp.n_shard, 0, st->fsdp.n_shard, err) != 0 ||
         exclude_decay(t, err) != 0))
        return -1;
    size_t largest = 0;
    for (int u = 0; u < t->strat.fsdp.n_units; u++) {
        const size_t len = t->strat.fsdp.units[u].hi - t->strat.fsdp.units[u].lo;
        largest = len > largest ? len : largest;
    }
    static const char *reshard[] = {"default", "always", "never"};
    char hsdp[64] = "";
    if (o.replicate_degree > 1)
        snprintf(hsdp, sizeof hsdp, " in each of %d replica groups (HSDP)", o.replicate_degree);
    char grads[96];
    snprintf(grads, sizeof grads,
             o.frozen ? "the frozen base: no gradients" : "gradients reduce-scattered in %s",
             t->cfg->training.mixed_precision_reduce);
    fprintf(t->log,
            "comm: FSDP over %d ranks%s: %d units (embedding, %d layers%s, head), the largest "
            "%.1f MiB of fp32 weights; gathers in %s, %s, reshard_after_forward %s\n",
            o.shard_degree, hsdp, t->strat.fsdp.n_units, m->cfg.num_hidden_layers,
            t->ep > 1 ? ", each sparse layer's experts a unit of their own" : "",
            largest * 4.0 / (1 << 20), o.bf16_params ? "bfloat16" : "float32", grads,
            reshard[o.reshard]);
    return 0;
}

// A frozen base (LoRA's) is filled unit by unit: fill puts [lo, hi) into the model as it holds
// it (buf: room for the largest unit's floats), so its values, bf16-held tensors rounded as one
// process rounds them, are the one-process model's; the unit is hashed (the base's identity,
// qwen3_lora_base_hash, while it is whole), then its piece kept.
typedef int (*frozen_fill)(trainer *t, const void *ctx, size_t lo, size_t hi, float *buf,
                           ct_error *err);

// Random init, unit by unit: each unit is filled whole (the same values as without FSDP), its
// piece kept, the rest handed back, so no rank ever holds more than one unit.
// Under EP each tensor is drawn from its stream in the one-process table (strategy_ep.c).
// The floats in buf, [lo, hi) of the layout, into the model tensor by tensor.
static int write_units(trainer *t, size_t lo, size_t hi, const float *buf, ct_error *err) {
    qwen3_model *m = &t->model;
    for (int i = 0; i < m->n_params; i++) {
        const qwen3_param *p = &m->params[i];
        if (p->offset >= lo && p->offset < hi &&
            qwen3_params_write(m, p->name, 0, p->numel, buf + (p->offset - lo), err) != 0)
            return -1;
    }
    return 0;
}

static int fill_checkpoint(trainer *t, const void *ctx, size_t lo, size_t hi, float *buf,
                           ct_error *err) {
    const ckpt_range r = {lo, hi};
    return ckpt_load_ranges(ctx, &t->model, &r, 1, buf, NULL, NULL, NULL, NULL, err) != 0
               ? -1
               : write_units(t, lo, hi, buf, err);
}

typedef struct hf_source {
    hf_load_report *rep;
    const st_set *set;
    const char *from;
} hf_source;

// The first unit's report is the load's; the checks run over every tensor each time.
static int fill_hf(trainer *t, const void *ctx, size_t lo, size_t hi, float *buf, ct_error *err) {
    const hf_source *s = ctx;
    const ckpt_range r = {lo, hi};
    hf_load_report again = {0}, *rep = lo == 0 ? s->rep : &again;
    int rc = hf_load_weights_ranges(&t->model, rep, s->set, s->from, &r, 1, buf, err);
    hf_report_free(&again);
    return rc != 0 ? -1 : write_units(t, lo, hi, buf, err);
}

static int frozen_units(trainer *t, frozen_fill fill, const void *ctx, ct_error *err) {
    const qwen3_parallel_plan *p = &t->strat.plan;
    size_t most = 1;
    for (int u = 0; u < p->n_units; u++)
        most = p->unit_hi[u] - p->unit_lo[u] > most ? p->unit_hi[u] - p->unit_lo[u] : most;
    float *buf = malloc(most * sizeof *buf);
    if (!buf) return ct_fail(err, "out of memory for one FSDP unit (%zu floats)", most);
    uint64_t h = QWEN3_LORA_HASH0;
    int rc = 0;
    for (int u = 0; u < p->n_units && rc == 0; u++) {
        const size_t lo = p->unit_lo[u], hi = p->unit_hi[u];
        rc = fill(t, ctx, lo, hi, buf, err);
        if (rc == 0) h = qwen3_lora_base_hash_range(&t->model, h, lo, hi);
        take_unit(t, u);
    }
    free(buf);
    t->strat.lora_base_hash = h;
    t->strat.lora_base_hashed = true;
    fsdp_weights_changed(&t->strat.fsdp, false);
    return rc;
}

static int fill_random(trainer *t, const void *ctx, size_t lo, size_t hi, float *buf,
                       ct_error *err) {
    (void)buf;
    return qwen3_init_random_range(&t->model, *(const uint64_t *)ctx, lo, hi, err);
}

static int init_random(trainer *t, uint64_t seed, ct_error *err) {
    if (t->model.lora) return frozen_units(t, fill_random, &seed, err);
    const qwen3_parallel_plan *p = &t->strat.plan;
    for (int u = 0; u < p->n_units; u++) {
        const size_t lo = p->unit_lo[u], hi = p->unit_hi[u];
        if ((t->ep > 1 ? strategy_ep_init_range(t, seed, lo, hi, err)
                       : qwen3_init_random_range(&t->model, seed, lo, hi, err)) != 0)
            return -1;
        take_unit(t, u);
    }
    fsdp_weights_changed(&t->strat.fsdp, false);
    return 0;
}

// MoE, aux-loss-free balancing (moe_balance's add_bias): the same delta on every rank (the
// whole tensors' layout: every sparse layer's expert bias, in layer order), added to the whole
// copy and to this rank's pieces of it.
static void add_whole(void *ctx, const float *delta) {
    trainer *t = ctx;
    const qwen3_parallel_plan *p = &t->strat.plan;
    fsdp *f = &t->strat.fsdp;
    float *copy = t->strat.whole;
    for (int i = 0; i < p->n_tensors; i++) {
        const qwen3_plan_tensor *x = &p->tensors[i];
        if (x->split != QWEN3_SPLIT_WHOLE) continue;
        int k = t->strat.fsdp_first[x->unit];
        while (f->units[k].hi <= x->lo) k++; // the FSDP unit holding it
        const fsdp_unit *u = &f->units[k];
        for (size_t off = x->lo; off < x->hi; off++)
            copy[off - x->lo] += delta[copy - t->strat.whole + (off - x->lo)];
        // The tensor's part inside this rank's piece goes to the shard (backend memory).
        const size_t lo = x->lo > u->piece_lo ? x->lo : u->piece_lo;
        const size_t hi = x->hi < u->piece_hi ? x->hi : u->piece_hi;
        if (lo < hi)
            f->be->write(f->be, f->shard_params + u->at + (lo - u->piece_lo), copy + (lo - x->lo),
                         (hi - lo) * sizeof(float));
        copy += x->hi - x->lo;
    }
}

// The layout checkpoints use: the model's, or under EP the one-process model's (g, made here;
// the experts by id). Returns it; qwen3_free(g) after, when it is g.
static const qwen3_model *ckpt_layout(const trainer *t, qwen3_model *g, ct_error *err) {
    if (t->ep <= 1) return &t->model;
    return qwen3_init_layout(g, &t->setup.model, err) == 0 ? g : NULL;
}
static void ckpt_layout_free(const trainer *t, qwen3_model *g) {
    if (t->ep > 1) qwen3_free(g);
}

// Local offset off, where [off, off + n) lies inside one FSDP unit (contiguous in both
// layouts), at its place in layout.
static size_t at_layout(const trainer *t, const qwen3_model *layout, size_t off) {
    if (layout == &t->model) return off;
    const qwen3_param *p = qwen3_param_at(&t->model, off);
    return qwen3_find_param(layout, p->name)->offset + (off - p->offset);
}

// This rank's pieces, the non-empty ones in order (at most the FSDP units), in layout's
// coordinates: the ranges its checkpoint shard holds, in the shard buffer's order. Returns their
// count.
static int shard_ranges(const trainer *t, const qwen3_model *layout, ckpt_range *out) {
    int n = 0;
    for (int u = 0; u < t->strat.fsdp.n_units; u++) {
        const fsdp_unit *x = &t->strat.fsdp.units[u];
        if (x->piece_lo == x->piece_hi) continue;
        const size_t lo = at_layout(t, layout, x->piece_lo);
        out[n++] = (ckpt_range){lo, lo + (x->piece_hi - x->piece_lo)};
    }
    return n;
}

// The whole tensors as ranges (at most the plan's tensors), in plan order and in layout's
// coordinates: the copy each rank keeps. Returns their count.
static int whole_ranges(const trainer *t, const qwen3_model *layout, ckpt_range *out) {
    const qwen3_parallel_plan *p = &t->strat.plan;
    int n = 0;
    for (int i = 0; i < p->n_tensors; i++)
        if (p->tensors[i].split == QWEN3_SPLIT_WHOLE) {
            const size_t lo = at_layout(t, layout, p->tensors[i].lo);
            out[n++] = (ckpt_range){lo, lo + (p->tensors[i].hi - p->tensors[i].lo)};
        }
    return n;
}

// A host view of n_shard floats of backend memory at dev (the shard's weights, or a moment):
// the loads and saves read and write files through host memory.
static float *shard_view(trainer *t, float *dev, bool fill, ct_error *err) {
    ct_backend *be = t->model.be;
    return be->view(be, dev, t->strat.fsdp.n_shard * sizeof(float), fill, err);
}
static void shard_release(trainer *t, float *host, float *dev, bool write_back) {
    ct_backend *be = t->model.be;
    be->view_release(be, host, dev, t->strat.fsdp.n_shard * sizeof(float), write_back);
}

// This rank's pieces, and every expert bias whole, from a checkpoint of any layout and rank
// count; moments (NULL: not read) get the pieces' AdamW state.
static int load_pieces(trainer *t, const char *dir, float *moments[2], train_state *st,
                       ct_error *err) {
    qwen3_model g;
    const qwen3_model *m = ckpt_layout(t, &g, err);
    if (!m) return -1;
    ckpt_range *r = malloc(((size_t)t->strat.fsdp.n_units + t->strat.plan.n_tensors) * sizeof *r);
    float *dev = t->strat.fsdp.shard_params, *host = r ? shard_view(t, dev, false, err) : NULL;
    int rc = !r      ? ct_fail(err, "out of memory")
             : !host ? -1
                     : ckpt_load_ranges(dir, m, r, shard_ranges(t, m, r), host,
                                        moments ? moments[0] : NULL, moments ? moments[1] : NULL,
                                        st, NULL, err);
    if (host) shard_release(t, host, dev, rc == 0);
    if (rc == 0 && t->strat.whole)
        rc = ckpt_load_ranges(dir, m, r, whole_ranges(t, m, r), t->strat.whole, NULL, NULL, NULL,
                              NULL, err);
    free(r);
    ckpt_layout_free(t, &g);
    if (rc == 0) fsdp_weights_changed(&t->strat.fsdp, false);
    return rc;
}

// The same from a Hugging Face folder (initial_load_path): only this rank's ranges are read.
static int load_hf(trainer *t, hf_load_report *rep, const st_set *set, const char *from,
                   ct_error *err) {
    const hf_source src = {rep, set, from};
    if (t->model.lora) return frozen_units(t, fill_hf, &src, err);
    const qwen3_model *m = &t->model;
    ckpt_range *r = malloc(((size_t)t->strat.fsdp.n_units + t->strat.plan.n_tensors) * sizeof *r);
    if (!r) return ct_fail(err, "out of memory");
    float *dev = t->strat.fsdp.shard_params, *host = shard_view(t, dev, false, err);
    int rc = host ? hf_load_weights_ranges(m, rep, set, from, r, shard_ranges(t, m, r), host, err)
                  : -1;
    if (host) shard_release(t, host, dev, rc == 0);
    if (rc == 0 && t->strat.whole) {
        hf_load_report ignored = {0};
        rc = hf_load_weights_ranges(m, &ignored, set, from, r, whole_ranges(t, m, r),
                                    t->strat.whole, err);
        hf_report_free(&ignored);
    }
    free(r);
    if (rc == 0) fsdp_weights_changed(&t->strat.fsdp, false);
    return rc;
}

static int load_sharded(trainer *t, const char *dir, ct_error *err) {
    if (t->model.lora) return frozen_units(t, fill_checkpoint, dir, err);
    return load_pieces(t, dir, NULL, NULL, err);
}

static int load_checkpoint(trainer *t, const char *dir, float *moments[2], ct_error *err) {
    return load_pieces(t, dir, moments, &t->state, err);
}

// FSDP: the shard ranks of the first replica group each write their pieces of the model and of
// the optimizer state (the other groups hold the same ones); rank 0 then lists them all in
// state.json, gathered from the shard group. No rank holds more than its shard. Under EP the
// pieces are in the one-process layout, the experts by id, so that any layout resumes.
static int save_checkpoint(trainer *t, ct_error *err) {
    const fsdp *f = &t->strat.fsdp;
    const int S = f->o.shard_degree, n_units = f->n_units;
    const int64_t step = t->state.step;
    int rc = is_root(t) ? ckpt_begin(t->ckpt_root, step, t->save_tag, err) : 0;
    if (dist_agree(t->d, rc, "starting the checkpoint", err) != 0) return -1;
    qwen3_model g;
    const qwen3_model *layout = ckpt_layout(t, &g, err);
    char tmp[4200];
    ckpt_shard_info mine[2];
    memset(mine, 0, sizeof mine);
    // Each rank's count, then its ranges (n_units at most).
    const size_t row = (size_t)n_units + 1;
    ckpt_range *own = calloc(row, sizeof *own), *ranges = calloc((size_t)S * row, sizeof *ranges);
    const ckpt_range **of = calloc((size_t)S, sizeof *of);
    int *n_ranges = calloc((size_t)S, sizeof *n_ranges);
    rc = !layout                                      ? -1
         : own && ranges && of && n_ranges ? ckpt_tmp_path(tmp, sizeof tmp, t->ckpt_root,
                                                                    step, t->save_tag, err)
                                                      : ct_fail(err, "out of memory");
    if (rc == 0) own[0].lo = (uint64_t)shard_ranges(t, layout, own + 1);
    rc = dist_agree(t->d, rc, "the checkpoint's ranges", err);
    if (rc == 0)
        rc = dist_allgather(&t->strat.fsdp.shard, own, ranges, (int)(row * sizeof *own),
                            "the shards' ranges", err);
    for (int s = 0; rc == 0 && s < S; s++) {
        of[s] = ranges + (size_t)s * row + 1;
        n_ranges[s] = (int)ranges[(size_t)s * row].lo;
    }
    if (rc == 0 && t->d->rank < S) {
        // The files are written from host views of the shard and its moments.
        float *dev[3] = {f->shard_params, t->opt.m, t->opt.v}, *host[3] = {NULL, NULL, NULL};
        for (int i = 0; rc == 0 && i < 3; i++)
            if (!(host[i] = shard_view(t, dev[i], true, err))) rc = -1;
        if (rc == 0)
            rc = ckpt_write_shard(tmp, layout, f->shard.rank, S, of[f->shard.rank],
                                  n_ranges[f->shard.rank], host[0], host[1], host[2], &mine[0],
                                  &mine[1], err);
        for (int i = 0; i < 3; i++)
            if (host[i]) shard_release(t, host[i], dev[i], false);
    }
    rc = trainer_finish_shards(t, t->d, t->d, rc, mine, S, layout, of, n_ranges,
                               t->ep > 1 ? ", the experts by id" : "", err);
    if (layout) ckpt_layout_free(t, &g);
    free(own), free(ranges), free(of), free(n_ranges);
    return rc;
}

static void describe(const trainer *t, char *buf, size_t size) {
    snprintf(buf, size, "FSDP: parameters, gradients and optimizer state sharded over %d ranks%s",
             t->shard_degree,
             t->d->size / t->shard_degree > 1 ? ", in each of the replica groups (HSDP)" : "");
}

static void free_(trainer *t) {
    fsdp_free(&t->strat.fsdp);
    free(t->strat.fsdp_first);
    t->strat.fsdp_first = NULL;
    free(t->strat.whole);
    qwen3_parallel_plan_free(&t->strat.plan);
}

// The gathers fill the bf16 copy.
static void weights_ready(trainer *t) {
    (void)t;
}

static void begin_step(trainer *t) {
    fsdp_begin_step(&t->strat.fsdp);
}

// FSDP reduces every micro-batch, in the unit hook.
static void begin_micro(trainer *t, bool last) {
    (void)t, (void)last;
}

static int grads_final(trainer *t, ct_error *err) {
    return fsdp_finish(&t->strat.fsdp, err);
}

// Each shard's sum of squares, added in rank order over one shard group (the replicas hold the
// same sums).
static int grad_sq(trainer *t, double *sq, ct_error *err) {
    fsdp *f = &t->strat.fsdp;
    t->model.ops->sum_squares(sq, f->shard_grads, f->n_shard);
    return dist_sum(&f->shard, *sq, sq, "the gradient norm", err);
}

static strategy_shard shard(trainer *t) {
    fsdp *f = &t->strat.fsdp;
    return (strategy_shard){f->shard_params, f->shard_grads, f->shard_bf16};
}

static int after_update(trainer *t, ct_error *err) {
    (void)err;
    fsdp_weights_changed(&t->strat.fsdp, true);
    return 0;
}

// A validation forward leaves the head gathered for a backward.
static void after_eval(trainer *t) {
    fsdp_reshard_all(&t->strat.fsdp);
}

static void take_comm(trainer *t, double *exposed, double *hidden) {
    fsdp_take_comm(&t->strat.fsdp, exposed, hidden);
}

const strategy_vt strategy_fsdp = {.describe = describe,
                                   .memory_note = " (FSDP shard)",
                                   .optimizer_sharded = false, // estimate replaces it
                                   .estimate = estimate,
                                   .setup = setup,
                                   .free = free_,
                                   .init_random = init_random,
                                   .load_sharded = load_sharded,
                                   .load_hf = load_hf,
                                   .weights_ready = weights_ready,
                                   .begin_step = begin_step,
                                   .begin_micro = begin_micro,
                                   .unit_ready = unit_ready,
                                   .grads_final = grads_final,
                                   .grad_sq = grad_sq,
                                   .shard = shard,
                                   .after_update = after_update,
                                   .after_eval = after_eval,
                                   .take_comm = take_comm,
                                   .load_checkpoint = load_checkpoint,
                                   .save_checkpoint = save_checkpoint,
                                   .model_in_shards = true};

// ---------------------------------------------------------------------------------------------
// For a strategy that composes FSDP with another cut (tensor parallelism, strategy_tp.c), whose
// loads write the whole local model into the full buffer first.

void strategy_fsdp_take_all(trainer *t) {
    for (int u = 0; u < t->strat.plan.n_units; u++) take_unit(t, u);
    fsdp_weights_changed(&t->strat.fsdp, false);
}

// Every unit's values of the shard buffer `shard` (backend memory: the fp32 weights or an AdamW
// moment), from the pieces of the unit's group (the shard group, or under EP for the experts the
// shard ranks holding the same ones; padded to the largest piece: the host all-gather takes one
// size), into full (the full buffer's layout, host memory).
int strategy_fsdp_gather(trainer *t, float *shard, float *full, ct_error *err) {
    fsdp *f = &t->strat.fsdp;
    const int S = f->o.shard_degree;
    size_t most = 0;
    for (int u = 0; u < f->n_units; u++)
        for (int s = 0; s < f->units[u].g->size; s++) {
            size_t lo, hi;
            fsdp_piece(f, u, s, &lo, &hi);
            most = hi - lo > most ? hi - lo : most;
        }
    float *mine = malloc((most ? most : 1) * sizeof *mine);
    float *all = malloc((most ? most : 1) * S * sizeof *all);
    float *host = shard_view(t, shard, true, err);
    int rc = mine && all && host ? 0 : ct_fail(err, "gathering the FSDP shards: out of memory");
    for (int u = 0; u < f->n_units && rc == 0; u++) {
        const fsdp_unit *x = &f->units[u];
        memcpy(mine, host + x->at, (x->piece_hi - x->piece_lo) * sizeof *mine);
        rc = dist_allgather(x->g, mine, all, (int)(most * sizeof *mine),
                            "gathering the FSDP shards", err);
        for (int s = 0; s < x->g->size && rc == 0; s++) {
            size_t lo, hi;
            fsdp_piece(f, u, s, &lo, &hi);
            memcpy(full + lo, all + (size_t)s * most, (hi - lo) * sizeof *full);
        }
    }
    if (host) shard_release(t, host, shard, false);
    free(mine);
    free(all);
    return rc;
}

void strategy_fsdp_pieces(const trainer *t, const float *full, float *shard) {
    const fsdp *f = &t->strat.fsdp;
    for (int u = 0; u < f->n_units; u++) {
        const fsdp_unit *x = &f->units[u];
        memcpy(shard + x->at, full + x->piece_lo, (x->piece_hi - x->piece_lo) * sizeof *shard);
    }
}

int strategy_local_state(trainer *t, bool sharded, float *src[3], ct_error *err) {
    qwen3_model *m = &t->model;
    ct_backend *be = t->opt.be;
    const size_t bytes = m->num_params * sizeof(float);
    src[0] = src[1] = src[2] = NULL;
    if (!sharded) {
        if ((src[0] = qwen3_params_view(m, true, err)) &&
            (src[1] = be->view(be, t->opt.m, bytes, true, err)))
            src[2] = be->view(be, t->opt.v, bytes, true, err);
        return src[2] ? 0 : -1;
    }
    src[0] = malloc(3 * bytes + 1);
    int rc = src[0] ? 0 : ct_fail(err, "out of memory for the checkpoint's local model");
    rc = dist_agree(&t->strat.fsdp.shard, rc, "the checkpoint's local model", err);
    if (rc != 0) return -1;
    src[1] = src[0] + m->num_params, src[2] = src[1] + m->num_params;
    float *dev[3] = {t->strat.fsdp.shard_params, t->opt.m, t->opt.v};
    for (int k = 0; k < 3 && rc == 0; k++) rc = strategy_fsdp_gather(t, dev[k], src[k], err);
    return rc;
}

void strategy_local_state_free(trainer *t, bool sharded, float *src[3]) {
    qwen3_model *m = &t->model;
    ct_backend *be = t->opt.be;
    if (sharded) {
        free(src[0]);
        return;
    }
    if (src[2]) be->view_release(be, src[2], t->opt.v, m->num_params * sizeof(float), false);
    if (src[1]) be->view_release(be, src[1], t->opt.m, m->num_params * sizeof(float), false);
    if (src[0]) qwen3_params_view_release(m, src[0], false);
}
