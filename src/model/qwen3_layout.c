// Where everything lives: the parameter table (HF names, one contiguous buffer, llm.c style),
// the activation plan and allocation (the random init: qwen3_init.c; the arithmetic: qwen3.c).
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "model/qwen3.h"
#include "model/qwen3_internal.h"
#include "model/qwen3_lora.h"
#include "ops/moe_router.h"

// ---------------------------------------------------------------------------------------------
// An op table must provide every op the model calls (plugins fill their own tables); the
// expert kernel only for a MoE model. The op list says which: the ALL entries are checked
// first, in its order, then the MOE ones.

static int model_check_ops(const ct_ops *o, bool moe, ct_error *err) {
    enum { ALL, MOE, OPT };
    const struct {
        int need;
        bool present;
    } fns[CT_OP_COUNT] = {
#define OP_PRESENT(kind, field, type, cpu, need, ...) [CT_OP_##field] = {need, o->field != NULL},
        CT_OPS_LIST(OP_PRESENT)
#undef OP_PRESENT
    };
    for (int pass = ALL; pass <= (moe ? MOE : ALL); pass++)
        for (int i = 0; i < CT_OP_COUNT; i++)
            if (fns[i].need == pass && !fns[i].present)
                return ct_fail(err, "op table '%s' has no %s", o->name ? o->name : "?",
                               ct_op_field_names[i]);
    return 0;
}

// ---------------------------------------------------------------------------------------------
// Parameters. One walk in HF order serves three purposes: counting (table and base NULL),
// filling the table and the named pointers into param_mem, and the same pointers into grad_mem.

typedef struct param_walk {
    qwen3_param *table; // NULL: do not record names
    float *base;        // NULL: do not make pointers
    int n;              // tensors so far
    size_t off;         // floats so far
    size_t *unit_lo;    // NULL, or where each FSDP unit starts (qwen3_units)
} param_walk;

// cols == 0 for a 1-D tensor of `rows` values.
static float *param_add_kind(param_walk *pw, const char *name, int64_t rows, int64_t cols,
                             bool buffer) {
    const size_t numel = (size_t)rows * (size_t)(cols ? cols : 1);
    if (pw->table) {
        qwen3_param *p = &pw->table[pw->n];
        snprintf(p->name, sizeof p->name, "%s", name);
        p->ndim = cols ? 2 : 1;
        p->shape[0] = rows;
        p->shape[1] = cols;
        p->offset = pw->off;
        p->numel = numel;
        p->buffer = buffer;
    }
    float *ptr = pw->base ? pw->base + pw->off : NULL;
    pw->n++;
    pw->off += numel;
    return ptr;
}

static float *param_add(param_walk *pw, const char *name, int64_t rows, int64_t cols) {
    return param_add_kind(pw, name, rows, cols, false);
}

// A sparse layer's MoE block, in HF's module order: the router, then each expert's gate, up
// and down projections back to back (so expert e's gate|up is one (2Fm, C) matrix and its
// block starts at experts + e*3*Fm*C), then the aux-loss-free bias (ours, a buffer).
static void param_walk_moe(param_walk *pw, qwen3_layer_weights *lw, const qwen3_config *c,
                           int layer) {
    const int C = c->hidden_size, Fm = c->moe_intermediate_size, E = c->num_experts;
    const int lo = c->local_experts ? c->expert_lo : 0, hi = lo + qwen3_local_experts(c);
    static const char *const proj[3] = {"gate_proj", "up_proj", "down_proj"};
    char name[96];
    snprintf(name, sizeof name, "model.layers.%d.mlp.gate.weight", layer);
    lw->router = param_add(pw, name, E, C);
    for (int e = lo; e < hi; e++)
        for (int k = 0; k < 3; k++) {
            snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.%s.weight", layer, e,
                     proj[k]);
            float *p = param_add(pw, name, k < 2 ? Fm : C, k < 2 ? C : Fm);
            if (e == lo && k == 0) lw->experts = p;
        }
    snprintf(name, sizeof name, "model.layers.%d.mlp.expert_bias", layer);
    lw->expert_bias = param_add_kind(pw, name, E, 0, true);
    lw->w_gate_up = lw->w_down = NULL;
}

// w (may be NULL) receives the named pointers; w->layers must hold L entries.
static void param_walk_model(param_walk *pw, qwen3_weights *w, const qwen3_config *c) {
    const int C = c->hidden_size, F = c->intermediate_size, D = c->head_dim;
    const int QD = c->num_attention_heads * D, KVD = c->num_key_value_heads * D;
    const bool bias = c->attention_bias;
    qwen3_weights dummy;
    qwen3_layer_weights dl;
    if (!w) w = &dummy;
    char name[96];

    const int L = c->num_hidden_layers;
    if (pw->unit_lo) pw->unit_lo[0] = pw->off;
    w->embed = c->no_embed ? NULL : param_add(pw, "model.embed_tokens.weight", c->vocab_size, C);
    for (int i = 0; i < L; i++) {
        const int id = qwen3_layer_id(c, i); // the global index, in the names
        qwen3_layer_weights *lw = w == &dummy ? &dl : &w->layers[i];
        if (pw->unit_lo) pw->unit_lo[1 + i] = pw->off;
#define P(suffix, rows, cols)                                                                      \
    (snprintf(name, sizeof name, "model.layers.%d.%s", id, suffix), param_add(pw, name, rows, cols))
        lw->input_norm = P("input_layernorm.weight", C, 0);
        // Back to back, with nothing between: the fused (QD + 2*KVD, C) matrix and its bias.
        lw->wqkv = P("self_attn.q_proj.weight", QD, C);
        P("self_attn.k_proj.weight", KVD, C);
        P("self_attn.v_proj.weight", KVD, C);
        lw->bqkv = bias ? P("self_attn.q_proj.bias", QD, 0) : NULL;
        if (bias) P("self_attn.k_proj.bias", KVD, 0), P("self_attn.v_proj.bias", KVD, 0);
        lw->wo = P("self_attn.o_proj.weight", C, QD);
        lw->bo = bias ? P("self_attn.o_proj.bias", C, 0) : NULL;
        lw->q_norm = P("self_attn.q_norm.weight", D, 0);
        lw->k_norm = P("self_attn.k_norm.weight", D, 0);
        lw->post_norm = P("post_attention_layernorm.weight", C, 0);
        if (qwen3_layer_is_sparse(c, i)) {
            param_walk_moe(pw, lw, c, id);
            continue;
        }
        lw->router = lw->experts = lw->expert_bias = NULL;
        lw->w_gate_up = P("mlp.gate_proj.weight", F, C); // then up_proj: one (2F, C) matrix
        P("mlp.up_proj.weight", F, C);
        lw->w_down = P("mlp.down_proj.weight", C, F);
#undef P
    }
    if (pw->unit_lo) pw->unit_lo[L + 1] = pw->off;
    if (c->no_head) {
        w->final_norm = w->lm_head = NULL;
        return;
    }
    w->final_norm = param_add(pw, "model.norm.weight", C, 0);
    w->lm_head =
        c->tie_word_embeddings ? w->embed : param_add(pw, "lm_head.weight", c->vocab_size, C);
}

// ---------------------------------------------------------------------------------------------
// Activations: carved from one buffer (qwen3_internal.h's carve).

bool qwen3_layer_checkpointed(int ac_every, int l) {
    return ac_every > 0 && (l + 1) % ac_every == 0;
}

qwen3_layer_ac qwen3_layer_recompute(const qwen3_memory_opts *opts, int l) {
    if (!opts) return QWEN3_AC_NONE;
    if (qwen3_layer_checkpointed(opts->ac_every, l)) return QWEN3_AC_LAYER;
    return opts->ac_op ? QWEN3_AC_OPS : QWEN3_AC_NONE;
}

// The two classes of a layer's saved activations under the op policy: outputs of GEMMs and
// attention (kept) and outputs of elementwise ops (recomputed from the kept ones).
enum { ACT_KEPT = 1, ACT_CHEAP = 2, ACT_ALL = ACT_KEPT | ACT_CHEAP };

// Carves n floats for *p when its class is among `own`; else *p keeps the pointer it had (the
// recompute set's buffer, or NULL).
static void take(float **p, carve *cv, unsigned own, unsigned cls, size_t n) {
    if (own & cls) *p = carve_take(cv, n);
}

// A saved activation that torch's autocast keeps in bf16: under bf16 its bf16 copy *p16 (*p is
// pointed at the fp32 staging later, by stage_layers), else *p in fp32.
static void take_act(float **p, uint16_t **p16, bool bf16, carve *cv, unsigned own, unsigned cls,
                     size_t n) {
    if (!(own & cls)) return;
    if (bf16)
        *p16 = (uint16_t *)carve_take(cv, (n + 1) / 2);
    else
        *p = carve_take(cv, n);
}

// Sequence parallelism's degree: the rows of a sequence shard are N / it.
static size_t sp_degree(const qwen3_memory_opts *opts) {
    return opts && opts->sp > 1 ? (size_t)opts->sp : 1;
}

// One layer's saved activations, except resid: the buffers of the classes in `dense` that a
// dense layer has, and of those in `sparse` that a sparse one has (the recompute set may need
// both kinds). Buffers of other classes and kinds are left as they are.
static void layer_layout(qwen3_layer_acts *la, carve *cv, const qwen3_config *cfg,
                         const ct_ops *ops, int B, int T, const qwen3_memory_opts *opts, bool bf16,
                         bool bf16_experts, unsigned dense, unsigned sparse) {
    const qwen3_dims d = qwen3_dims_of(cfg, B, T);
    const size_t N = (size_t)B * T, C = d.C, F = d.F, NH = d.NH, NKV = d.NKV, D = d.D;
    const size_t E = d.E, K = d.K, Ns = N / sp_degree(opts);
    const unsigned any = dense | sparse;
    take_act(&la->ln1, &la->ln1_16, bf16, cv, any, ACT_CHEAP, N * C);
    take(&la->ln1_rstd, cv, any, ACT_CHEAP, Ns);
    take_act(&la->qkv, &la->qkv16, bf16, cv, any, ACT_KEPT, N * (NH + 2 * NKV) * D);
    take_act(&la->v, &la->v16, bf16, cv, any, ACT_CHEAP, N * NKV * D);
    take(&la->q_rstd, cv, any, ACT_CHEAP, N * NH);
    take(&la->k_rstd, cv, any, ACT_CHEAP, N * NKV);
    take_act(&la->qr, &la->qr16, bf16, cv, any, ACT_CHEAP, N * NH * D);
    take_act(&la->kr, &la->kr16, bf16, cv, any, ACT_CHEAP, N * NKV * D);
    take(&la->att, cv, any, ACT_KEPT,
         opts && opts->cp > 1 ? N * NH // the ring's lse
                              : ops->attention_state_floats(B, T, (int)NH, (int)NKV, (int)D));
    take_act(&la->atty, &la->atty16, bf16, cv, any, ACT_KEPT, N * NH * D);
    // o_proj's output is kept as the residual stream it is added into: the same bytes, and no
    // add to redo. down_proj's (and the experts') is the next layer's resid.
    take(&la->resid2, cv, any, ACT_KEPT, Ns * C);
    take_act(&la->ln2, &la->ln2_16, bf16, cv, any, ACT_CHEAP, N * C);
    take(&la->ln2_rstd, cv, any, ACT_CHEAP, Ns);
    take_act(&la->gate_up, &la->gate_up16, bf16, cv, dense, ACT_KEPT, N * 2 * F);
    take_act(&la->h, &la->h16, bf16, cv, dense, ACT_CHEAP, N * F);
    // The router logits (softmaxed in place), the routing and the expert kernel's state (its
    // GEMM outputs) are all kept: recomputing them would mean the expert GEMMs again.
    take(&la->probs, cv, sparse, ACT_KEPT, N * E);
    // Expert ids share the float buffer: int32_t and float have the same size.
    float *expert = (float *)la->expert;
    take(&expert, cv, sparse, ACT_KEPT, N * K);
    la->expert = (int32_t *)expert;
    take(&la->route_w, cv, sparse, ACT_KEPT, N * K);
    const ctitan_moe_experts_floats_fn moe_state =
        bf16_experts ? ops->moe_bf16_state_floats : ops->moe_state_floats;
    take(&la->moe_state, cv, sparse, ACT_KEPT,
         moe_state(B * T, (int)C, cfg->moe_intermediate_size, (int)E, (int)K));
}

// The buffers a layer recomputed this way takes from the recompute set (and so does not own).
static unsigned recomputed_classes(qwen3_layer_ac ac) {
    return ac == QWEN3_AC_LAYER ? ACT_ALL : ac == QWEN3_AC_OPS ? ACT_CHEAP : 0;
}

// Under bf16 mixed precision: the scratch of the largest of the model's linear layers (every
// shape's oneDNN primitives are created here, once), or SIZE_MAX when one cannot be made. Under
// sequence parallelism over sp ranks the router may run on a shard too (EP with TP).
static size_t bf16_scratch_floats(const qwen3_config *cfg, const ct_ops *ops, int B, int T,
                                  int chunk, bool head_bf16, int sp) {
    const qwen3_dims d = qwen3_dims_of(cfg, B, T);
    const int QD = d.NH * d.D, QKV = (d.NH + 2 * d.NKV) * d.D;
    bool dense = false;
    for (int l = 0; l < d.L; l++) dense |= !qwen3_layer_is_sparse(cfg, l);
    // {N, C, OC, staged}: the bf16 head passes its bf16 logits' gradient (the layers round theirs).
    const int shapes[][4] = {{d.N, d.C, QKV, 0},
                             {d.N, QD, d.C, 0},
                             {dense ? d.N : 0, d.C, 2 * d.F, 0},
                             {dense ? d.N : 0, d.F, d.C, 0},
                             {d.E ? d.N : 0, d.C, d.E, 0},
                             {d.E && sp > 1 ? d.N / sp : 0, d.C, d.E, 0},
                             {chunk, d.C, d.V, head_bf16},
                             {d.N % chunk, d.C, d.V, head_bf16}};
    size_t most = 0;
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        if (shapes[i][0] == 0) continue;
        const size_t n = ops->matmul_bf16_scratch_floats(ops, shapes[i][0], shapes[i][1],
                                                         shapes[i][2], shapes[i][3]);
        if (n == SIZE_MAX) return SIZE_MAX;
        if (n > most) most = n;
    }
    return most;
}

// Under bf16, points the layers' fp32 names of their bf16 activations, and lnf, at the staging.
static void stage_layers(qwen3_acts *a, int L) {
    a->lnf = a->stage_ln;
    for (int l = 0; a->layers && l < L; l++) {
        qwen3_layer_acts *la = &a->layers[l];
        la->ln1 = a->stage_ln;
        la->qkv = a->stage_qkv;
        la->atty = a->stage_atty;
        la->qr = a->stage_qr;
        la->kr = a->stage_kr;
        la->v = a->stage_v;
        la->ln2 = a->stage_ln;
        la->gate_up = la->gate_up16 ? a->stage_gate_up : NULL; // NULL with the bf16 SwiGLU
        la->h = la->h16 ? a->dh : NULL;
    }
}

size_t qwen3_acts_layout(qwen3_acts *a, float *base, const qwen3_config *cfg, const ct_ops *ops,
                         int B, int T, const qwen3_memory_opts *opts) {
    const int chunk =
        opts && opts->loss_chunk > 0 && opts->loss_chunk < B * T ? opts->loss_chunk : B * T;
    const qwen3_dims d = qwen3_dims_of(cfg, B, T);
    const size_t N = (size_t)B * T, C = d.C, F = d.F, NH = d.NH, NKV = d.NKV, D = d.D, V = d.V;
    const size_t E = d.E, K = d.K, Ns = N / sp_degree(opts);
    const int nh = d.NH, nkv = d.NKV, n = d.N, c = d.C, fm = d.Fm, e = d.E, k = d.K, L = d.L;
    const bool moe = d.E > 0, bf16 = opts && opts->bf16;
    carve cv = {base, 0};
    // The recompute set: one layer's worth of the buffers that some layer recomputes, of each
    // kind (dense, sparse) that such a layer has.
    qwen3_layer_acts shared = {0};
    unsigned dense_rc = 0, sparse_rc = 0;
    for (int l = 0; l < L; l++) {
        const unsigned cls = recomputed_classes(qwen3_layer_recompute(opts, l));
        if (qwen3_layer_is_sparse(cfg, l))
            sparse_rc |= cls;
        else
            dense_rc |= cls;
    }
    if (dense_rc | sparse_rc)
        layer_layout(&shared, &cv, cfg, ops, B, T, opts, bf16, qwen3_bf16_experts(opts), dense_rc,
                     sparse_rc);
    int n_sparse = 0;
    for (int l = 0; l < L; l++) {
        qwen3_layer_acts dummy, *la = a->layers ? &a->layers[l] : &dummy;
        const bool sparse = qwen3_layer_is_sparse(cfg, l);
        const qwen3_layer_ac ac = qwen3_layer_recompute(opts, l);
        const unsigned own = ACT_ALL & ~recomputed_classes(ac);
        *la = ac == QWEN3_AC_NONE ? (qwen3_layer_acts){0} : shared;
        layer_layout(la, &cv, cfg, ops, B, T, opts, bf16, qwen3_bf16_experts(opts),
                     sparse ? 0 : own, sparse ? own : 0);
        la->resid = carve_take(&cv, Ns * C); // sequence parallel: this rank's rows

        la->recompute = ac;
        la->sparse_index = sparse ? n_sparse++ : -1;
    }
    const size_t cp = opts && opts->cp > 1 ? (size_t)opts->cp : 1;
    a->rope_cos = carve_take(&cv, cp * T * D / 2); // context parallel: the whole sequence's
    a->rope_sin = carve_take(&cv, cp * T * D / 2);
    if (cp > 1) {
        // The ring's buffers, its rotate method's: all-gather, every rank's K|V, then its share
        // of every rank's dK|dV and the shares it receives (3 cp blocks of 2 KV); ring, two
        // slots of dK|dV|K|V and this rank's share (10 KV).
        const size_t KV = N * NKV * D;
        a->cp_kv_floats = (opts->cp_ring ? 10 : 6 * cp) * KV;
        a->cp_kv = carve_take(&cv, a->cp_kv_floats);
        a->cp_out = carve_take(&cv, N * NH * D);
        a->cp_lse = carve_take(&cv, N * NH);
        a->cp_di = carve_take(&cv, N * NH);
        if (opts->block_causal) a->cp_doc = (int32_t *)carve_take(&cv, N); // N int32
    }
    if ((opts && opts->block_causal) || cp > 1) { // each token's RoPE rows, at its position
        a->pos_cos = carve_take(&cv, N * D / 2);
        a->pos_sin = carve_take(&cv, N * D / 2);
    }
    a->resid_out = carve_take(&cv, Ns * C);
    if (bf16)
        a->lnf16 = (uint16_t *)carve_take(&cv, N * C / 2 + 1);
    else
        a->lnf = carve_take(&cv, N * C);
    a->lnf_rstd = carve_take(&cv, Ns);
    a->losses = carve_take(&cv, N);
    a->dresid = carve_take(&cv, Ns * C);
    a->dln = carve_take(&cv, N * C);
    a->dtmp = carve_take(&cv, N * C);
    a->aux_dprob = moe ? carve_take(&cv, E) : NULL;
    // The loss head's logits and the layers' scratch are never live at once: a layer's forward
    // is done before the head starts and its backward starts after the head is done (and the
    // logits are not read after the backward). So they share one region, the larger of the two.
    // A pipeline stage without the head (no_head) has no logits.
    const size_t shared_from = cv.off, logit_rows = cfg->no_head ? 0 : (size_t)chunk;
    a->logits = carve_take(&cv, qwen3_head_bf16(ops, opts) ? (logit_rows * V + 1) / 2
                                                           : logit_rows * V);
    a->logits16 = qwen3_head_bf16(ops, opts) ? (uint16_t *)a->logits : NULL;
    const size_t logits_end = cv.off;
    cv.off = shared_from;
    a->dq = carve_take(&cv, N * NH * D);
    a->datty = carve_take(&cv, N * NH * D);
    a->dk = carve_take(&cv, N * NKV * D);
    a->dv = carve_take(&cv, N * NKV * D);
    a->dqkv = carve_take(&cv, N * (NH + 2 * NKV) * D);
    a->dh = carve_take(&cv, N * F);
    a->swiglu_scratch = carve_take(
        &cv, ops->swiglu_rows_scratch_floats ? ops->swiglu_rows_scratch_floats(n, (int)F) : 0);
    // Under CP the ring's pair kernels replace the attention op and need none of its scratch.
    a->att_scratch = carve_take(
        &cv, opts && opts->cp > 1 ? 0 : ops->attention_scratch_floats(B, T, nh, nkv, (int)D));
    size_t moe_floats = 0;
    if (moe && qwen3_bf16_experts(opts))
        moe_floats = ops->moe_bf16_scratch_floats(ops, n, c, fm, e, k);
    else if (moe)
        moe_floats = ops->moe_scratch_floats(n, c, fm, e, k);
    a->moe_scratch = moe ? carve_take(&cv, moe_floats == SIZE_MAX ? 0 : moe_floats) : NULL;
    // A router with more experts than fit on a thread's stack sorts its top-k in here (live
    // only during moe_route_forward, like the other layer scratch above).
    a->route_threads = omp_get_max_threads();
    a->route_scratch = moe ? carve_take(&cv, moe_route_scratch_floats(e, a->route_threads)) : NULL;
    a->dweight = moe ? carve_take(&cv, N * K) : NULL;
    a->dlogits = moe ? carve_take(&cv, N * E) : NULL;
    if (bf16) {
        a->stage_ln = carve_take(&cv, N * C);
        a->stage_qkv = carve_take(&cv, N * (NH + 2 * NKV) * D);
        a->stage_atty = carve_take(&cv, N * NH * D);
        a->stage_qr = carve_take(&cv, N * NH * D);
        a->stage_kr = carve_take(&cv, N * NKV * D);
        a->stage_v = carve_take(&cv, N * NKV * D);
        a->stage_gate_up = qwen3_mlp_bf16(ops, opts) ? NULL : carve_take(&cv, N * 2 * F);
        stage_layers(a, L);
    }
    if (cv.off < logits_end) cv.off = logits_end;
    // Live with the logits, so past them: where the bf16 loss keeps a row's exps, per thread.
    a->ce_scratch = qwen3_head_bf16(ops, opts) && !cfg->no_head
                        ? carve_take(&cv, (size_t)omp_get_max_threads() * V)
                        : NULL;
    // Live during every linear layer, the loss head's among them: not in the region above.
    const size_t mm = opts && opts->bf16 ? bf16_scratch_floats(cfg, ops, B, T, chunk,
                                                               qwen3_head_bf16(ops, opts), opts->sp)
                                         : 0;
    a->mm_scratch = mm ? carve_take(&cv, mm == SIZE_MAX ? 0 : mm) : NULL;
    return cv.off;
}

// ---------------------------------------------------------------------------------------------

static size_t model_count_params(const qwen3_config *cfg, int *n_tensors) {
    param_walk pw = {0};
    param_walk_model(&pw, NULL, cfg);
    if (n_tensors) *n_tensors = pw.n;
    return pw.off;
}

int qwen3_n_units(const qwen3_config *cfg) {
    return cfg->num_hidden_layers + 2;
}

void qwen3_units(const qwen3_config *cfg, size_t *lo, size_t *hi) {
    param_walk pw = {.unit_lo = lo};
    param_walk_model(&pw, NULL, cfg);
    const int n = qwen3_n_units(cfg);
    for (int u = 0; u < n; u++) hi[u] = u + 1 < n ? lo[u + 1] : pw.off;
}

// The saved token ids (inputs and targets) and, block-causal, the two host lists of documents.
static size_t model_token_bytes(int B, int T, const qwen3_memory_opts *opts) {
    const size_t N = (size_t)B * T;
    const bool docs = opts && opts->block_causal, cp = opts && opts->cp > 1;
    return 2 * N * sizeof(int32_t) + (docs ? 2 * N * sizeof(qwen3_doc) : 0) +
           (docs && cp ? N * sizeof(int32_t) : 0);
}

qwen3_memory qwen3_memory_plan_ops(const qwen3_config *cfg, const ct_ops *ops, int B, int T,
                                   const qwen3_memory_opts *opts) {
    qwen3_memory mem = {0};
    const size_t np = model_count_params(cfg, NULL);
    mem.params = np * sizeof(float);
    mem.grads = np * sizeof(float);
    mem.weights_bf16 = opts && opts->bf16 ? np * sizeof(uint16_t) : 0;
    qwen3_acts a = {0};
    mem.activations =
        qwen3_acts_layout(&a, NULL, cfg, ops ? ops : &ct_ops_cpu, B, T, opts) * sizeof(float) +
        model_token_bytes(B, T, opts);
    return mem;
}

qwen3_memory qwen3_memory_plan(const qwen3_config *cfg, int B, int T) {
    return qwen3_memory_plan_ops(cfg, &ct_ops_cpu, B, T, NULL);
}

int qwen3_init_layout(qwen3_model *m, const qwen3_config *cfg, ct_error *err) {
    memset(m, 0, sizeof *m);
    if (qwen3_config_validate(cfg, "qwen3_init_layout: config", err)) return -1;
    m->cfg = *cfg;
    m->num_params = model_count_params(cfg, &m->n_params);
    m->params = calloc((size_t)m->n_params, sizeof *m->params);
    if (!m->params) return ct_fail(err, "qwen3_init_layout: out of memory for the parameter table");
    param_walk pw = {.table = m->params};
    param_walk_model(&pw, NULL, cfg);
    return 0;
}

const qwen3_param *qwen3_param_at(const qwen3_model *m, size_t i) {
    int lo = 0, hi = m->n_params - 1; // the last tensor starting at or before i
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (m->params[mid].offset <= i)
            lo = mid;
        else
            hi = mid - 1;
    }
    return &m->params[lo];
}

int qwen3_init(qwen3_model *m, const qwen3_config *cfg, const ct_ops *ops, ct_error *err) {
    return qwen3_init_on(m, cfg, NULL, ops, err);
}

// The model, with gradients (training), without (forward only), or frozen: held as forward
// only, planned with the options as given and allowed a backward that computes input gradients
// only (LoRA's base, qwen3_init_frozen).
typedef enum { MODEL_TRAIN, MODEL_FORWARD_ONLY, MODEL_FROZEN } model_kind;

static int model_init(qwen3_model *m, const qwen3_config *cfg, ct_backend *be, const ct_ops *ops,
                      model_kind kind, const qwen3_memory_opts *opts, ct_error *err) {
    const bool grads = kind == MODEL_TRAIN;
    memset(m, 0, sizeof *m);
    if (!ops) ops = &ct_ops_cpu;
    be = ct_backend_or_cpu(be);
    const int n_sparse = qwen3_num_sparse_layers(cfg);
    if (qwen3_config_validate(cfg, "qwen3_init: config", err) ||
        model_check_ops(ops, n_sparse > 0, err))
        return -1;
    m->cfg = *cfg;
    m->be = be;
    const int L = cfg->num_hidden_layers;
    m->num_params = model_count_params(cfg, &m->n_params);
    const size_t bytes = m->num_params * sizeof(float);
    ct_ops *bound = calloc(1, sizeof *bound);
    m->ops = bound;
    m->params = calloc((size_t)m->n_params, sizeof *m->params);
    m->w.layers = calloc((size_t)L, sizeof *m->w.layers);
    m->g.layers = calloc((size_t)L, sizeof *m->g.layers);
    m->n_sparse = n_sparse;
    if (!bound || !m->params || !m->w.layers || !m->g.layers) {
        qwen3_free(m);
        return ct_fail(err, "qwen3_init: out of memory for the parameter table");
    }
    if (kind == MODEL_FORWARD_ONLY) m->mem_opts = qwen3_forward_only_opts(opts);
    if (kind == MODEL_FROZEN && opts) m->mem_opts = *opts;
    // Forward only under bf16: the matrices live in param_bf16 alone (qwen3_init_forward_only).
    m->weights16 = !grads && m->mem_opts.bf16;
    if (m->weights16 && !ops->embedding_bf16_forward) {
        qwen3_free(m);
        return ct_fail(err, "op table '%s' has no embedding_bf16_forward (bf16 inference)",
                       ops->name ? ops->name : "?");
    }
    if (be->bind_ops(be, bound, ops, err) ||
        !(m->param_mem = be->alloc(be, bytes, "the weights", err)) ||
        (m->weights16 && !(m->param_bf16 = be->alloc(be, bytes / 2, "the bf16 weights", err))) ||
        (grads && !(m->grad_mem = be->alloc(be, bytes, "the gradients", err)))) {
        qwen3_free(m);
        return ct_wrap(err,
                       "qwen3_init: %zu parameters (%zu bytes for weights + %zu bytes for "
                       "gradients)",
                       bytes / sizeof(float), bytes, grads ? bytes : 0);
    }
    // A forward-only model's weights are read whole by every forward (each decoded token):
    // where they live, they are written whole at the load. A trained model's weights and
    // gradients are read and written whole every step (FSDP's, unit by unit). A frozen bf16
    // base's param_mem holds only its vectors: left on 4 KiB pages.
    if (m->weights16)
        be->mark_streamed(be, m->param_bf16, bytes / 2);
    else if (kind != MODEL_FROZEN)
        be->mark_streamed(be, m->param_mem, bytes);
    if (grads) be->mark_streamed(be, m->grad_mem, bytes);
    param_walk pw = {.table = m->params, .base = m->param_mem};
    param_walk_model(&pw, &m->w, cfg);
    if (grads) { // else m->g stays all NULL
        param_walk gw = {.base = m->grad_mem};
        param_walk_model(&gw, &m->g, cfg);
    }
    if (kind == MODEL_FROZEN) {
        // The RMSNorm kernels' backward always accumulates a weight gradient: a frozen model
        // points those at one small sink, never read (C for the layer and final norms, D each
        // for q_norm and k_norm). Every other m->g stays NULL: no dW, no bias or embedding
        // gradient.
        const size_t C = (size_t)cfg->hidden_size, D = (size_t)cfg->head_dim;
        if (!(m->grad_sink = be->alloc(be, (C + 2 * D) * sizeof(float), "the norm-gradient sink",
                                       err))) {
            qwen3_free(m);
            return ct_wrap(err, "qwen3_init");
        }
        for (int l = 0; l < L; l++) {
            qwen3_layer_weights *g = &m->g.layers[l];
            g->input_norm = g->post_norm = m->grad_sink;
            g->q_norm = m->grad_sink + C;
            g->k_norm = m->grad_sink + C + D;
        }
        m->g.final_norm = m->grad_sink;
    }
    return 0;
}

int qwen3_init_frozen(qwen3_model *m, const qwen3_config *cfg, ct_backend *be, const ct_ops *ops,
                      const qwen3_memory_opts *opts, ct_error *err) {
    return model_init(m, cfg, be, ops, MODEL_FROZEN, opts, err);
}

int qwen3_init_on(qwen3_model *m, const qwen3_config *cfg, ct_backend *be, const ct_ops *ops,
                  ct_error *err) {
    return model_init(m, cfg, be, ops, MODEL_TRAIN, NULL, err);
}

int qwen3_init_forward_only(qwen3_model *m, const qwen3_config *cfg, ct_backend *be,
                            const ct_ops *ops, const qwen3_memory_opts *opts, ct_error *err) {
    return model_init(m, cfg, be, ops, MODEL_FORWARD_ONLY, opts, err);
}

qwen3_memory_opts qwen3_forward_only_opts(const qwen3_memory_opts *opts) {
    qwen3_memory_opts o = opts ? *opts : (qwen3_memory_opts){0};
    o.ac_every = 1;
    o.ac_op = false;
    return o;
}

// The bf16 kernels read every matrix (the linear layers, the embedding, the router) but a MoE
// model's experts when a plugin's fp32 expert kernel runs them.
static bool read_in_bf16(const qwen3_param *p, const qwen3_memory_opts *o) {
    return o->bf16 && p->ndim == 2 && (!strstr(p->name, ".mlp.experts.") || qwen3_bf16_experts(o));
}

bool qwen3_param_in_bf16(const qwen3_model *m, const qwen3_param *p) {
    return m->weights16 && read_in_bf16(p, &m->mem_opts);
}

size_t qwen3_forward_only_weight_bytes(const qwen3_config *cfg, const qwen3_memory_opts *opts) {
    qwen3_model layout;
    const qwen3_memory_opts none = {0};
    ct_error err;
    if (qwen3_init_layout(&layout, cfg, &err) != 0) return SIZE_MAX;
    size_t bytes = 0;
    for (int i = 0; i < layout.n_params; i++)
        bytes += layout.params[i].numel *
                 (read_in_bf16(&layout.params[i], opts ? opts : &none) ? 2 : 4);
    qwen3_free(&layout);
    return bytes;
}

// RoPE tables exactly as HF builds them in fp32: inv_freq = 1 / theta^(2i/D) (float pow),
// angle = float(pos) * inv_freq rounded to fp32, cos/sin of that fp32 angle.
void qwen3_rope_tables(float *cos_t, float *sin_t, int T, int D, double theta) {
    const int half = D / 2;
    for (int i = 0; i < half; i++) {
        const float inv_freq = 1.0f / powf((float)theta, (float)(2 * i) / (float)D);
        for (int t = 0; t < T; t++) {
            const float angle = (float)t * inv_freq;
            cos_t[(size_t)t * half + i] = (float)cos((double)angle);
            sin_t[(size_t)t * half + i] = (float)sin((double)angle);
        }
    }
}

int qwen3_rope_write(ct_backend *be, float *cos_t, float *sin_t, int T, const qwen3_config *c,
                     ct_error *err) {
    // Built on the host, as HF builds them, then copied in.
    const size_t half = (size_t)T * (c->head_dim / 2);
    float *rope = malloc(2 * half * sizeof *rope);
    if (!rope) return ct_fail(err, "out of memory for the RoPE tables");
    qwen3_rope_tables(rope, rope + half, T, c->head_dim, c->rope_theta);
    be->write(be, cos_t, rope, half * sizeof *rope);
    be->write(be, sin_t, rope + half, half * sizeof *rope);
    free(rope);
    return 0;
}

// One activation set: its struct, token copies and document lists, and its block.
static void acts_free(ct_backend *be, qwen3_acts *a, float *mem) {
    if (a) {
        free(a->layers);
        be->free(be, a->inputs);
        be->free(be, a->targets);
        free(a->docs);
        free(a->docs_next);
        free(a->cp_doc_host);
        free(a);
    }
    if (be) be->free(be, mem);
}

static void model_free_acts(qwen3_model *m) {
    if (m->n_sets > 0) { // set 0 is among them, wherever acts points
        for (int j = 0; j < m->n_sets; j++) acts_free(m->be, m->set_acts[j], m->set_mem[j]);
    } else {
        acts_free(m->be, m->acts, m->act_mem);
    }
    free(m->set_acts);
    free(m->set_mem);
    m->set_acts = NULL;
    m->set_mem = NULL;
    m->n_sets = 0;
    m->acts = NULL;
    m->act_mem = NULL;
    m->act_floats = 0;
    m->logits = NULL;
    m->B = m->T = 0;
}

// One activation set for (B, T) on m's backend: the layout over a new block (*mem), the token
// copies, the document lists and the RoPE tables. NULL (err set) when out of memory.
static qwen3_acts *acts_new(qwen3_model *m, int B, int T, float **mem, ct_error *err) {
    const qwen3_config *c = &m->cfg;
    ct_backend *be = m->be;
    *mem = NULL;
    qwen3_acts *a = calloc(1, sizeof *a);
    if (!a) {
        ct_fail(err, "qwen3_plan: out of memory");
        return NULL;
    }
    const size_t floats = qwen3_acts_layout(a, NULL, c, m->ops, B, T, &m->mem_opts);
    const size_t tokens = (size_t)B * T * sizeof(int32_t);
    a->layers = calloc((size_t)c->num_hidden_layers, sizeof *a->layers);
    if (!a->layers || !(a->inputs = be->alloc(be, tokens, "the input tokens", err)) ||
        !(a->targets = be->alloc(be, tokens, "the target tokens", err)) ||
        (m->mem_opts.block_causal &&
         (!(a->docs = calloc((size_t)B * T, sizeof *a->docs)) ||
          !(a->docs_next = calloc((size_t)B * T, sizeof *a->docs_next)) ||
          (m->mem_opts.cp > 1 && !(a->cp_doc_host = calloc((size_t)B * T, sizeof(int32_t)))))) ||
        !(*mem = be->alloc(be, floats * sizeof(float), "the activations", err))) {
        acts_free(be, a, *mem);
        *mem = NULL;
        ct_fail(err,
                "qwen3_plan: out of memory allocating %zu bytes of activations for batch %d x "
                "seq_len %d",
                floats * sizeof(float) + model_token_bytes(B, T, &m->mem_opts), B, T);
        return NULL;
    }
    m->act_floats = qwen3_acts_layout(a, *mem, c, m->ops, B, T, &m->mem_opts);
    const int cp = m->mem_opts.cp > 1 ? m->mem_opts.cp : 1;
    a->cp_rows = -1;
    if (qwen3_rope_write(be, a->rope_cos, a->rope_sin, cp * T, c, err) != 0) {
        acts_free(be, a, *mem);
        *mem = NULL;
        ct_wrap(err, "qwen3_plan");
        return NULL;
    }
    return a;
}

int qwen3_plan(qwen3_model *m, int B, int T, ct_error *err) {
    const qwen3_config *c = &m->cfg;
    model_free_acts(m);
    if (B < 1 || T < 1)
        return ct_fail(err, "qwen3_plan: batch %d x seq_len %d must both be positive", B, T);
    if (T > c->max_position_embeddings)
        return ct_fail(err, "seq_len %d exceeds max_position_embeddings %d", T,
                       c->max_position_embeddings);
    // The ops index rows with int: the most rows any op sees is B*T*NH (q_norm).
    if ((int64_t)B * T * c->num_attention_heads > INT_MAX)
        return ct_fail(err, "qwen3_plan: batch %d x seq_len %d x %d heads exceeds %d rows", B, T,
                       c->num_attention_heads, INT_MAX);
    // ... and the expert kernel sees B*T*K token slots, each (2*Fm) wide.
    if ((int64_t)B * T * c->num_experts_per_tok * 2 * c->moe_intermediate_size > INT_MAX)
        return ct_fail(err,
                       "qwen3_plan: batch %d x seq_len %d x %d experts per token x 2 x "
                       "moe_intermediate_size %d exceeds %d",
                       B, T, c->num_experts_per_tok, c->moe_intermediate_size, INT_MAX);
    if (m->mem_opts.cp > 1 && T % 2 != 0)
        return ct_fail(err,
                       "qwen3_plan: context parallelism needs an even number of rows per rank "
                       "(two chunks), found %d",
                       T);
    ct_backend *be = m->be;
    if (m->mem_opts.bf16) {
        const int chunk = m->mem_opts.loss_chunk > 0 && m->mem_opts.loss_chunk < B * T
                              ? m->mem_opts.loss_chunk
                              : B * T;
        if (!m->ops->matmul_bf16_forward || !m->ops->matmul_bf16_scratch_floats ||
            bf16_scratch_floats(c, m->ops, B, T, chunk, qwen3_head_bf16(m->ops, &m->mem_opts),
                                m->mem_opts.sp) == SIZE_MAX)
            return ct_fail(err,
                           "qwen3_plan: oneDNN could not create the bf16 matmuls for batch %d "
                           "x seq_len %d (training.mixed_precision_param = \"bfloat16\")",
                           B, T);
        if (m->n_sparse && qwen3_bf16_experts(&m->mem_opts) &&
            (!m->ops->moe_bf16_forward || !m->ops->moe_bf16_backward ||
             !m->ops->moe_bf16_state_floats || !m->ops->moe_bf16_scratch_floats ||
             m->ops->moe_bf16_scratch_floats(m->ops, B * T, c->hidden_size,
                                             c->moe_intermediate_size, c->num_experts,
                                             c->num_experts_per_tok) == SIZE_MAX))
            return ct_fail(err,
                           "qwen3_plan: oneDNN could not create the bf16 expert GEMMs for hidden "
                           "size %d, moe_intermediate_size %d (training.mixed_precision_param = "
                           "\"bfloat16\")",
                           c->hidden_size, c->moe_intermediate_size);
        if (!m->param_bf16 && !(m->param_bf16 = be->alloc(be, m->num_params * sizeof(uint16_t),
                                                          "the bf16 copy of the weights", err)))
            return ct_wrap(err, "qwen3_plan");
    }
    qwen3_acts *a = acts_new(m, B, T, &m->act_mem, err);
    if (!a) return -1;
    m->acts = a;
    if (qwen3_lora_plan(m, B, T, err) != 0) {
        model_free_acts(m);
        return -1;
    }
    m->B = B;
    m->T = T;
    m->logits = a->logits;
    m->logits_bf16 = a->logits16 != NULL;
    return 0;
}

int qwen3_plan_sets(qwen3_model *m, int n, ct_error *err) {
    if (n <= 1) return 0;
    if (!m->acts || m->n_sets)
        return ct_fail(err, "qwen3_plan_sets: the model is not planned once (qwen3_plan)");
    m->set_acts = calloc((size_t)n, sizeof *m->set_acts);
    m->set_mem = calloc((size_t)n, sizeof *m->set_mem);
    if (!m->set_acts || !m->set_mem) {
        free(m->set_acts);
        free(m->set_mem);
        m->set_acts = NULL, m->set_mem = NULL;
        return ct_fail(err, "qwen3_plan_sets: out of memory");
    }
    m->set_acts[0] = m->acts;
    m->set_mem[0] = m->act_mem;
    m->n_sets = n; // from here model_free_acts frees the sets made
    for (int j = 1; j < n; j++)
        if (!(m->set_acts[j] = acts_new(m, m->B, m->T, &m->set_mem[j], err)))
            return ct_wrap(err, "activation set %d of %d", j + 1, n);
    return qwen3_lora_plan_sets(m, n, err);
}

void qwen3_use_set(qwen3_model *m, int j) {
    if (j < 0 || j >= m->n_sets) return; // one set: always it
    m->acts = m->set_acts[j];
    m->act_mem = m->set_mem[j];
    m->logits = ((qwen3_acts *)m->acts)->logits;
    qwen3_lora_use_set(m, j);
}

void qwen3_free(qwen3_model *m) {
    model_free_acts(m);
    qwen3_lora_free(m);
    free(m->params);
    free(m->w.layers);
    free(m->g.layers);
    free((ct_ops *)m->ops);
    if (m->be) {
        m->be->free(m->be, m->param_mem);
        m->be->free(m->be, m->grad_mem);
        m->be->free(m->be, m->param_bf16);
        m->be->free(m->be, m->grad_sink);
    }
    memset(m, 0, sizeof *m);
}

const qwen3_param *qwen3_find_param(const qwen3_model *m, const char *name) {
    for (int i = 0; i < m->n_params; i++) {
        if (strcmp(m->params[i].name, name) == 0) return &m->params[i];
    }
    return NULL;
}

size_t qwen3_num_hf_parameters(const qwen3_model *m) {
    size_t n = 0;
    for (int i = 0; i < m->n_params; i++)
        if (!m->params[i].buffer) n += m->params[i].numel;
    return n;
}
