// Generation: the Qwen3 forward over a KV cache, through the model's op table (qwen3.h).
//
// The layers are the training forward's own (qwen3_layer_forward in qwen3.c), run with a pass
// (qwen3_pass) that sends k and v to the cache and keeps nothing: one layer's activations,
// reused by every layer, and no routing statistics. Prefill runs the prompt's n tokens as one
// batch (B = 1, T = n), as the training forward runs a window: q/k norm + RoPE at positions
// [0, n) writing k and v straight into the layer's cache rows, the table's causal attention over
// the block; then the head on the last row only. Decode runs one token at position p the same way
// with T = 1, its RoPE row p, and the table's attention_decode over the cache rows [0, p]. A
// prefill that keeps the cache's first `keep` positions (a chat's earlier turns) runs its n rows
// at positions [keep, keep + n), each row's attention as decode's over the rows before it. Under
// bf16 every step rounds where the training forward rounds (it is the same code), and a prompt
// runs padded to a planned row count (the bf16 GEMMs are prepared per shape): padded rows come
// after the prompt, so causal attention keeps them out of its rows, and their cache rows are
// overwritten by decode or the next prefill before any query reads them.
#include <limits.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "model/qwen3.h"
#include "model/qwen3_internal.h"
#include "model/qwen3_lora.h"
#include "ops/moe_router.h"

// The bf16 GEMM shapes of a forward over n rows; {0,...} entries are skipped.
static size_t gen_mm_scratch(const qwen3_config *cfg, const ct_ops *ops, int n) {
    const qwen3_dims d = qwen3_dims_of(cfg, 1, n);
    const int QD = d.NH * d.D, QKV = (d.NH + 2 * d.NKV) * d.D;
    bool dense = false;
    for (int l = 0; l < d.L; l++) dense |= !qwen3_layer_is_sparse(cfg, l);
    const int shapes[][3] = {{n, d.C, QKV},
                             {n, QD, d.C},
                             {dense ? n : 0, d.C, 2 * d.F},
                             {dense ? n : 0, d.F, d.C},
                             {d.E ? n : 0, d.C, d.E},
                             {1, d.C, d.V}};
    size_t most = 0;
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        if (!shapes[i][0]) continue;
        const size_t s =
            ops->matmul_bf16_scratch_floats(ops, shapes[i][0], shapes[i][1], shapes[i][2], true);
        if (s == SIZE_MAX) return SIZE_MAX;
        if (s > most) most = s;
    }
    return most;
}

// bf16: the prefill row counts (powers of two from 16, then max_len), and 1 for decode.
static int gen_buckets(int *out, int max_len) {
    int n = 0;
    out[n++] = 1;
    for (int b = 16; b < max_len; b *= 2) out[n++] = b;
    if (max_len > 1) out[n++] = max_len;
    return n;
}

static size_t half_floats(size_t n16) { // floats holding n16 bf16 values
    return (n16 + 1) / 2;
}

// Scratch sizes from queries that may prepare kernels (the bf16 GEMMs): asked once.
typedef struct gen_sizes {
    size_t mm, moe_scratch;
} gen_sizes;

// The walk that sizes (base NULL) and carves the buffer; returns its floats.
static size_t gen_layout(qwen3_gen *g, float *base, const qwen3_config *cfg, const ct_ops *op,
                         const qwen3_memory_opts *o, int max_len, gen_sizes sz) {
    const qwen3_dims d = qwen3_dims_of(cfg, 1, max_len);
    const size_t n = (size_t)max_len, C = d.C, QD = (size_t)d.NH * d.D, KV = (size_t)d.NKV * d.D,
                 QKV = QD + 2 * KV, F = d.F;
    bool dense = false;
    for (int l = 0; l < d.L; l++) dense |= !qwen3_layer_is_sparse(cfg, l);
    const bool moe = d.E > 0, bf16 = o->bf16, bf16_mlp = qwen3_mlp_bf16(op, o);
    carve cv = {base, 0};
    if (bf16) { // the bf16 cache first, as the fp32 one: plan prefaults [mem, rope_cos)
        g->kcache16 = (uint16_t *)carve_take(&cv, half_floats((size_t)d.L * n * KV));
        g->vcache16 = (uint16_t *)carve_take(&cv, half_floats((size_t)d.L * n * KV));
    } else {
        g->kcache = carve_take(&cv, (size_t)d.L * n * KV);
        g->vcache = carve_take(&cv, (size_t)d.L * n * KV);
    }
    g->rope_cos = carve_take(&cv, n * d.D / 2);
    g->rope_sin = carve_take(&cv, n * d.D / 2);
    g->resid[0] = carve_take(&cv, n * C);
    g->resid[1] = carve_take(&cv, n * C);
    g->resid2 = carve_take(&cv, n * C);
    g->ln = carve_take(&cv, n * C);
    g->rstd = carve_take(&cv, n);
    g->qkv = carve_take(&cv, n * QKV);
    g->qr = carve_take(&cv, n * QD);
    g->q_rstd = carve_take(&cv, n * d.NH);
    g->k_rstd = carve_take(&cv, n * d.NKV);
    g->rope_scratch = carve_take(&cv, n * QD);
    g->kr = bf16 ? carve_take(&cv, n * KV) : NULL;
    g->v = bf16 ? carve_take(&cv, n * KV) : NULL;
    g->atty = carve_take(&cv, n * QD);
    g->att_state = carve_take(&cv, op->attention_state_floats(1, max_len, d.NH, d.NKV, d.D));
    g->dec_scratch = carve_take(&cv, op->attention_decode_scratch_floats(max_len, d.NH, d.D));
    g->gate_up = dense && !bf16_mlp ? carve_take(&cv, n * 2 * F) : NULL;
    g->h = dense && !bf16_mlp ? carve_take(&cv, n * F) : NULL;
    g->swiglu_scratch = dense && op->swiglu_rows_scratch_floats
                            ? carve_take(&cv, op->swiglu_rows_scratch_floats(max_len, d.F))
                            : NULL;
    g->gate_up16 = dense && bf16_mlp ? (uint16_t *)carve_take(&cv, n * F) : NULL;
    if (moe) {
        const ctitan_moe_experts_floats_fn st =
            qwen3_bf16_experts(o) ? op->moe_bf16_state_floats : op->moe_state_floats;
        g->probs = carve_take(&cv, n * d.E);
        g->expert = (int32_t *)carve_take(&cv, n * d.K);
        g->route_w = carve_take(&cv, n * d.K);
        g->moe_state = carve_take(&cv, st(max_len, d.C, d.Fm, d.E, d.K));
        g->moe_scratch = carve_take(&cv, sz.moe_scratch);
        g->route_threads = omp_get_max_threads();
        g->route_scratch = carve_take(&cv, moe_route_scratch_floats(d.E, g->route_threads));
    }
    size_t widest = C > QD ? C : QD; // in16 holds the input of each linear layer in turn
    if (dense && F > widest) widest = F;
    g->in16 = bf16 ? (uint16_t *)carve_take(&cv, half_floats(n * widest)) : NULL;
    g->lnf = carve_take(&cv, C);
    g->lnf_rstd = carve_take(&cv, 1);
    g->lnf16 = bf16 ? (uint16_t *)carve_take(&cv, half_floats(C)) : NULL;
    g->dev_logits = carve_take(&cv, d.V);
    g->ids = (int32_t *)carve_take(&cv, n);
    g->mm_scratch = bf16 ? carve_take(&cv, sz.mm) : NULL;
    return cv.off;
}

// The scratch sizes (preparing the bf16 GEMMs of every planned shape), then the layout's floats;
// SIZE_MAX when a bf16 kernel cannot be made.
static size_t gen_count(qwen3_gen *g, const qwen3_config *cfg, const ct_ops *op,
                        const qwen3_memory_opts *o, int max_len, gen_sizes *sz) {
    *sz = (gen_sizes){0, 0};
    if (o->bf16) {
        g->n_buckets = gen_buckets(g->buckets, max_len);
        for (int i = 0; i < g->n_buckets; i++) {
            const size_t s = gen_mm_scratch(cfg, op, g->buckets[i]);
            if (s == SIZE_MAX) return SIZE_MAX;
            if (s > sz->mm) sz->mm = s;
        }
    }
    if (qwen3_dims_of(cfg, 1, 1).E) {
        const bool b = qwen3_bf16_experts(o);
        const int C = cfg->hidden_size, F = cfg->moe_intermediate_size, E = cfg->num_experts,
                  K = cfg->num_experts_per_tok;
        sz->moe_scratch = b ? op->moe_bf16_scratch_floats(op, max_len, C, F, E, K)
                            : op->moe_scratch_floats(max_len, C, F, E, K);
        if (sz->moe_scratch == SIZE_MAX) return SIZE_MAX;
    }
    return gen_layout(g, NULL, cfg, op, o, max_len, *sz);
}

size_t qwen3_gen_memory(const qwen3_config *cfg, const ct_ops *ops, const qwen3_memory_opts *opts,
                        int max_len) {
    qwen3_gen g = {0};
    gen_sizes sz;
    const qwen3_memory_opts none = {0};
    const size_t floats =
        gen_count(&g, cfg, ops ? ops : &ct_ops_cpu, opts ? opts : &none, max_len, &sz);
    if (floats == SIZE_MAX) return SIZE_MAX;
    return floats * sizeof(float) + (size_t)cfg->vocab_size * sizeof(float);
}

void qwen3_gen_free(qwen3_gen *g) {
    if (g->m && g->mem) g->m->be->free(g->m->be, g->mem);
    free(g->logits);
    memset(g, 0, sizeof *g);
}

int qwen3_gen_plan(qwen3_gen *g, qwen3_model *m, int max_len, ct_error *err) {
    memset(g, 0, sizeof *g);
    const qwen3_config *c = &m->cfg;
    const ct_ops *op = m->ops;
    const qwen3_memory_opts *o = &m->mem_opts;
    if (max_len < 1 || max_len > c->max_position_embeddings)
        return ct_fail(err,
                       "generation: %d positions (prompt + new tokens) is outside [1, %d] "
                       "(max_position_embeddings)",
                       max_len, c->max_position_embeddings);
    if ((int64_t)max_len * c->num_attention_heads * 2 * (c->moe_intermediate_size + 1) > INT_MAX)
        return ct_fail(err, "generation: %d positions is too many for this model's rows", max_len);
    if (!op->attention_decode)
        return ct_fail(err, "generation: the op table has no attention_decode kernel");
    // A LoRA model (qwen3_init_lora): each adapted projection adds its branch in prefill and
    // decode alike (qwen3_layer_forward's), over buffers for the most rows a forward runs, in
    // PEFT's eval mode (no dropout); W + s * B @ A is never formed.
    if (m->lora) {
        if (qwen3_lora_plan(m, 1, max_len, err) != 0) return ct_wrap(err, "generation");
        m->lora->training = false;
    }
    if (o->bf16 && (!op->matmul_bf16_forward || !op->matmul_bf16_scratch_floats))
        return ct_fail(err, "generation: bf16 needs the table's bf16 matmul");
    gen_sizes sz;
    const size_t floats = gen_count(g, c, op, o, max_len, &sz);
    if (floats == SIZE_MAX)
        return ct_fail(err,
                       "generation: oneDNN could not create the bf16 matmuls for %d "
                       "positions",
                       max_len);
    ct_backend *be = m->be;
    if (o->bf16 && !m->param_bf16 &&
        !(m->param_bf16 =
              be->alloc(be, m->num_params * sizeof(uint16_t), "the bf16 copy of the weights", err)))
        return ct_wrap(err, "generation");
    g->m = m;
    g->max_len = max_len;
    g->logits = malloc((size_t)c->vocab_size * sizeof *g->logits);
    if (!g->logits || !(g->mem = be->alloc(be, floats * sizeof(float),
                                           "the KV cache and generation buffers", err))) {
        qwen3_gen_free(g);
        return ct_fail(err, "generation: out of memory for %zu bytes (KV cache of %d positions)",
                       floats * sizeof(float), max_len);
    }
    g->floats = gen_layout(g, g->mem, c, op, o, max_len, sz);
    // The KV cache is mapped in whole now, on 2 MiB pages where the kernel allows: decode writes a
    // new row of every layer's keys and values each token, and one page fault a row cost more
    // than the layer's q/k norm and RoPE (docs/performance.md); the reads then miss the TLB less.
    const size_t kv_bytes = (size_t)((char *)g->rope_cos - (char *)g->mem);
    be->mark_streamed(be, g->mem, kv_bytes);
    be->populate(be, g->mem, kv_bytes);
    if (qwen3_rope_write(be, g->rope_cos, g->rope_sin, max_len, c, err) != 0) {
        qwen3_gen_free(g);
        return ct_wrap(err, "generation");
    }
    qwen3_refresh_bf16(m);
    return 0;
}

// One layer's activations over the generation buffers, shared by the layers (nothing is kept
// for a backward): the residual stream ping-pongs between resid[0] and resid[1]; k and v go to
// the fp32 cache (kr and v unused), or under bf16 are computed in kr and v and their bf16 values
// cached; under bf16 the inputs of the linear layers are rounded into in16 in turn, and q, k, v
// are rounded in place (no saved copies).
static qwen3_layer_acts gen_acts(const qwen3_gen *g) {
    return (qwen3_layer_acts){.ln1 = g->ln,
                              .ln1_rstd = g->rstd,
                              .qkv = g->qkv,
                              .q_rstd = g->q_rstd,
                              .k_rstd = g->k_rstd,
                              .qr = g->qr,
                              .kr = g->kr,
                              .v = g->v,
                              .att = g->att_state,
                              .atty = g->atty,
                              .resid2 = g->resid2,
                              .ln2 = g->ln,
                              .ln2_rstd = g->rstd,
                              .gate_up = g->gate_up,
                              .h = g->h,
                              .probs = g->probs,
                              .expert = g->expert,
                              .route_w = g->route_w,
                              .moe_state = g->moe_state,
                              .ln1_16 = g->in16,
                              .atty16 = g->in16,
                              .ln2_16 = g->in16,
                              .gate_up16 = g->gate_up16,
                              .h16 = g->in16};
}

// The forward of ids[0, n) at positions [pos, pos + n), run over `rows` >= n rows (bf16's
// padding: ids past n are 0): the training forward's layers (qwen3_layer_forward) over the
// cache, then the head on row n - 1 into g->logits.
static void gen_forward(qwen3_gen *g, const int32_t *ids, int n, int rows, int pos) {
    qwen3_model *m = g->m;
    const ct_ops *op = m->ops;
    ct_backend *be = m->be;
    const int C = m->cfg.hidden_size, V = m->cfg.vocab_size, L = m->cfg.num_hidden_layers;
    const size_t half = (size_t)m->cfg.head_dim / 2;
    be->write(be, g->ids, ids, (size_t)n * sizeof *ids);
    if (rows > n) be->zero(be, g->ids + n, (size_t)(rows - n) * sizeof *ids);
    qwen3_embed(m, g->resid[0], g->ids, rows);
    const qwen3_pass p = {.d = qwen3_dims_of(&m->cfg, 1, rows),
                          .rope_cos = g->rope_cos + (size_t)pos * half,
                          .rope_sin = g->rope_sin + (size_t)pos * half,
                          .rope_B = 1,
                          .rope_T = rows,
                          .kcache = g->kcache,
                          .vcache = g->vcache,
                          .kcache16 = g->kcache16,
                          .vcache16 = g->vcache16,
                          .cache_len = g->max_len,
                          .pos = pos,
                          .dec_scratch = g->dec_scratch,
                          .rope_scratch = g->rope_scratch,
                          .swiglu_scratch = g->swiglu_scratch,
                          .moe_scratch = g->moe_scratch,
                          .route_scratch = g->route_scratch,
                          .route_threads = g->route_threads,
                          .mm_scratch = g->mm_scratch,
                          .count = false,
                          .lora = m->lora != NULL};
    qwen3_layer_acts a = gen_acts(g);
    for (int l = 0, sparse = 0; l < L; l++) {
        a.resid = g->resid[l & 1];
        a.sparse_index = qwen3_layer_is_sparse(&m->cfg, l) ? sparse++ : -1;
        qwen3_layer_forward(m, l, &a, &p, g->resid[!(l & 1)], true);
    }
    const float *last = g->resid[L & 1] + (size_t)(n - 1) * C;
    op->rmsnorm_forward(g->lnf, g->lnf_rstd, last, m->w.final_norm, 1, C, m->cfg.rms_norm_eps);
    if (m->mem_opts.bf16) op->round_to_bf16(g->lnf16, g->lnf, (size_t)C);
    qwen3_linear(m, g->mm_scratch, g->dev_logits, NULL, g->lnf, g->lnf16, m->w.lm_head, NULL, 1, C,
                 V);
    if (m->mem_opts.bf16) op->round_to_bf16(NULL, g->dev_logits, (size_t)V);
    be->read(be, g->logits, g->dev_logits, (size_t)V * sizeof *g->logits);
}

int qwen3_gen_prefill(qwen3_gen *g, int keep, const int32_t *ids, int n, ct_error *err) {
    if (n < 1) return ct_fail(err, "generation: an empty prompt");
    if (keep < 0 || keep > g->len)
        return ct_fail(err, "generation: cannot keep %d positions of a cache holding %d", keep,
                       g->len);
    if (n > g->max_len - keep)
        return ct_fail(err,
                       "generation: a prompt of %d tokens after %d kept does not fit the cache of "
                       "%d positions",
                       n, keep, g->max_len);
    if (qwen3_check_tokens(g->m, ids, NULL, n, err) != 0) return ct_wrap(err, "generation");
    // fp32: one forward of the n rows. bf16: the smallest planned row count holding the rest
    // whose rows still fit the cache past pos (padding rows write cache rows too), else the
    // largest that fits, unpadded, and the next piece after it (bucket 1 always fits).
    for (int pos = keep, done = 0; done < n;) {
        const int rest = n - done;
        int take = rest, rows = rest;
        for (int i = 0; g->m->mem_opts.bf16 && i < g->n_buckets; i++) {
            const int b = g->buckets[i];
            if (b > g->max_len - pos) break; // its padding rows would run past the cache
            take = b < rest ? b : rest;
            rows = b;
            if (b >= rest) break;
        }
        gen_forward(g, ids + done, take, rows, pos);
        pos += take;
        done += take;
    }
    g->len = keep + n;
    return 0;
}

int qwen3_gen_decode(qwen3_gen *g, int32_t id, ct_error *err) {
    if (g->len < 1) return ct_fail(err, "generation: decode before a prefill");
    if (g->len >= g->max_len)
        return ct_fail(err, "generation: the cache of %d positions is full", g->max_len);
    if (qwen3_check_tokens(g->m, &id, NULL, 1, err) != 0) return ct_wrap(err, "generation");
    gen_forward(g, &id, 1, 1, g->len);
    g->len++;
    return 0;
}
