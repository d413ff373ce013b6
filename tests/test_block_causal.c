// Block-causal attention over packed documents (mem_opts.block_causal, qwen3_batch.positions).
// One packed window (B = 2 rows of T = 72 tokens; row 0 holds documents of 13, 1, 45 and 13
// tokens, row 1 one document of 72, longer than flash's 64-key tile) must give the loss sum,
// the valid-target count and every parameter gradient of the documents run alone (each as its
// own sequence, B = 1, T = its length, without block_causal) and summed: the token-weighted
// combination, since both backwards get the same loss scale 1 / (all valid targets).
//
// Gradients are compared per tensor, normwise: max |g - g_ref| / max |g_ref| over the tensor
// (a tensor whose reference is all zeros must come back all zeros); the loss as a relative
// difference. Cases: dense (GQA 2, head_dim 16 != hidden / heads 12, attention biases) and MoE
// (GQA 3, head_dim 10 != 8, dense and sparse layers, no aux loss, zero expert bias: routing is
// per token) x both attention kernels (flash, sdpa) x fp32 and bf16 mixed precision x no
// activation checkpointing, full (ac_every 1) and op-level (ac_op); and, in fp32, the q/k
// norm + RoPE composite that runs when a plugin replaces rope_hf (the fused kernel otherwise).
// Measured on this machine (1, 2 and 3 OpenMP threads; bf16 also through the sgemm emulation):
// fp32 loss within 3.7e-9, gradients 6.6e-7, layer 0's q and k after RoPE (below) 1.4e-7;
// bf16 loss bitwise, gradients 4.9e-7 (the weight gradients summed over tokens in another
// grouping). Bounds: fp32 1e-5 (the brief's), bf16 5e-6 (10x).
// RoPE is relative: inside a document the scores do not change when every position moves by
// the same offset, so a missing restart shows in the loss and gradients only through rounding
// (bf16's; nothing at fp32's bounds). So layer 0's q and k after RoPE are compared directly.
// Checked once by breaking it: attention over each whole row again (the previous document
// seen) failed every case (gradients 1.2-1.4 off); RoPE positions that do not restart (each
// token's position in its row) failed the 8 q/k checks (1.6 off) and every bf16 case
// (gradients 8e-3 - 1.4e-2 off).
//
// Also: the positions' errors; NULL positions, no call and rows that are each one document
// all give the plain causal model's bits; each forward takes its own positions (a step with
// other positions before it gives the same bits); the memory plan equals the allocation; an
// attention kernel whose state grows with the number of calls is refused by qwen3_batch_check.
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "model/flavors.h"
#include "model/qwen3.h"
#include "model/qwen3_internal.h"
#include "ops/ops_cpu.h"

#define FP32_BOUND 1e-5
#define BF16_BOUND 5e-6

enum { B = 2, T = 72, N = B * T, MAX_DOCS = 8 };

// The window's documents, flat token ranges.
static const int doc_start[] = {0, 13, 14, 59, 72};
static const int doc_len[] = {13, 1, 45, 13, 72};
enum { N_DOCS = 5 };

static qwen3_config dense_config(void) {
    qwen3_config c;
    ct_error err;
    CHECK(flavor_lookup(&c, "debugmodel", &err) == 0, "flavor: %s", err.msg);
    c.vocab_size = 97;
    c.hidden_size = 48;
    c.intermediate_size = 64;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 16;
    c.attention_bias = true;
    c.tie_word_embeddings = false;
    return c;
}

// The dense body with layer 1 of 3 sparse: GQA 3, head_dim 10 (hidden / heads is 8).
static qwen3_config moe_config(void) {
    qwen3_config c = dense_config();
    c.intermediate_size = 40;
    c.num_hidden_layers = 3;
    c.num_attention_heads = 6;
    c.head_dim = 10;
    c.attention_bias = false;
    c.num_experts = 4;
    c.num_experts_per_tok = 2;
    c.moe_intermediate_size = 24;
    c.decoder_sparse_step = 2; // layer 1 sparse, 0 and 2 dense
    c.norm_topk_prob = true;
    c.output_router_logits = false; // no aux loss: the routing alone, per token
    return c;
}

typedef struct result {
    double loss;
    int64_t n_valid;
    float *grads;
    float *qk; // layer 0's q then k after q/k norm and RoPE, (N, NH*D) and (N, NKV*D)
} result;

// Layer 0's q and k after RoPE (what RoPE wrote; see above) are saved by the forward when
// nothing recomputes them: fp32, no checkpointing.
static bool qk_saved(qwen3_memory_opts opts) {
    return !opts.bf16 && !opts.ac_every && !opts.ac_op;
}

// Copies layer 0's q and k of tokens [0, n) into qk at token `at` of the window.
static void qk_copy(float *qk, const qwen3_model *m, int at, int n) {
    const qwen3_layer_acts *a = &((const qwen3_acts *)m->acts)->layers[0];
    const size_t QD = (size_t)m->cfg.num_attention_heads * m->cfg.head_dim;
    const size_t KD = (size_t)m->cfg.num_key_value_heads * m->cfg.head_dim;
    memcpy(qk + at * QD, a->qr, n * QD * sizeof *qk);
    memcpy(qk + N * QD + at * KD, a->kr, n * KD * sizeof *qk);
}

static size_t qk_floats(const qwen3_config *cfg) {
    return (size_t)N * (cfg->num_attention_heads + cfg->num_key_value_heads) * cfg->head_dim;
}

static void tokens(int32_t *in, int32_t *tg, int V) {
    uint32_t x = 12345;
    for (int i = 0; i < N; i++) {
        x = x * 1664525u + 1013904223u;
        in[i] = (int32_t)((x >> 8) % (uint32_t)V);
        x = x * 1664525u + 1013904223u;
        tg[i] = (int32_t)((x >> 8) % (uint32_t)V);
    }
    // A packer's ignored targets: the last token of documents 0 and 2, and two inside.
    tg[12] = tg[58] = tg[30] = tg[100] = QWEN3_IGNORE_INDEX;
}

static void positions(int32_t *pos) {
    for (int i = 0; i < N_DOCS; i++)
        for (int t = 0; t < doc_len[i]; t++) pos[doc_start[i] + t] = t;
}

static int model_open(qwen3_model *m, const qwen3_config *cfg, const ct_ops *ops,
                      qwen3_memory_opts opts, int b, int t) {
    ct_error err = {{0}};
    if (qwen3_init(m, cfg, ops, &err) != 0) {
        CHECK(false, "init: %s", err.msg);
        return -1;
    }
    m->mem_opts = opts;
    if (qwen3_plan(m, b, t, &err) != 0) {
        CHECK(false, "plan: %s", err.msg);
        qwen3_free(m);
        return -1;
    }
    qwen3_init_random(m, 11, NULL);
    qwen3_refresh_bf16(m);
    qwen3_zero_grad(m);
    return 0;
}

static result grads_of(const qwen3_model *m, double loss, int64_t n) {
    result r = {loss, n, malloc(m->num_params * sizeof(float)), NULL};
    memcpy(r.grads, m->grad_mem, m->num_params * sizeof(float));
    return r;
}

// The packed window under block_causal with positions pos (NULL: one document per row), one
// training step. before: a step with these other positions first, its gradients then cleared.
static result packed_run(const qwen3_config *cfg, const ct_ops *ops, qwen3_memory_opts opts,
                         const int32_t *in, const int32_t *tg, const int32_t *pos,
                         const int32_t *before, float scale) {
    qwen3_model m;
    opts.block_causal = true;
    if (model_open(&m, cfg, ops, opts, B, T)) return (result){NAN, 0, NULL, NULL};
    CHECK(m.act_floats * sizeof(float) + 2 * N * sizeof(int32_t) + 2 * N * sizeof(qwen3_doc) ==
              qwen3_memory_plan_ops(cfg, ops, B, T, &opts).activations,
          "block_causal: the plan equals the allocation");
    if (before) {
        qwen3_forward_train(&m, &(qwen3_batch){.inputs = in, .targets = tg, .positions = before},
                            scale, NULL);
        qwen3_backward(&m, scale);
        qwen3_zero_grad(&m);
    }
    int64_t n = 0;
    const double loss = qwen3_forward_train(
        &m, &(qwen3_batch){.inputs = in, .targets = tg, .positions = pos}, scale, &n);
    float *qk = qk_saved(opts) ? malloc(qk_floats(cfg) * sizeof *qk) : NULL;
    if (qk) qk_copy(qk, &m, 0, N);
    qwen3_backward(&m, scale);
    result r = grads_of(&m, loss, n);
    r.qk = qk;
    qwen3_free(&m);
    return r;
}

// The plain causal model (no block_causal) over the whole window.
static result plain_run(const qwen3_config *cfg, const ct_ops *ops, qwen3_memory_opts opts,
                        const int32_t *in, const int32_t *tg, float scale) {
    qwen3_model m;
    if (model_open(&m, cfg, ops, opts, B, T)) return (result){NAN, 0, NULL, NULL};
    int64_t n = 0;
    const double loss =
        qwen3_forward_train(&m, &(qwen3_batch){.inputs = in, .targets = tg}, scale, &n);
    qwen3_backward(&m, scale);
    result r = grads_of(&m, loss, n);
    qwen3_free(&m);
    return r;
}

// Each document alone (B = 1, T = its length, the same weights), the gradients accumulated.
static result docs_run(const qwen3_config *cfg, const ct_ops *ops, qwen3_memory_opts opts,
                       const int32_t *in, const int32_t *tg, float scale) {
    qwen3_model m;
    if (model_open(&m, cfg, ops, opts, 1, doc_len[0])) return (result){NAN, 0, NULL, NULL};
    double loss = 0;
    int64_t total = 0;
    float *qk = qk_saved(opts) ? malloc(qk_floats(cfg) * sizeof *qk) : NULL;
    for (int i = 0; i < N_DOCS; i++) {
        ct_error err = {{0}};
        CHECK(qwen3_plan(&m, 1, doc_len[i], &err) == 0, "plan: %s", err.msg);
        int64_t n = 0;
        loss += qwen3_forward_train(
            &m, &(qwen3_batch){.inputs = in + doc_start[i], .targets = tg + doc_start[i]}, scale,
            &n);
        if (qk) qk_copy(qk, &m, doc_start[i], doc_len[i]);
        qwen3_backward(&m, scale);
        total += n;
    }
    result r = grads_of(&m, loss, total);
    r.qk = qk;
    qwen3_free(&m);
    return r;
}

// The worst per-tensor normwise gradient error of r against ref, and its tensor.
static double grad_error(const qwen3_model *layout, const result *r, const result *ref,
                         const char **worst) {
    double most = 0;
    *worst = "";
    for (int p = 0; p < layout->n_params; p++) {
        const qwen3_param *t = &layout->params[p];
        double dmax = 0, gmax = 0;
        for (size_t j = t->offset; j < t->offset + t->numel; j++) {
            dmax = fmax(dmax, fabs((double)r->grads[j] - ref->grads[j]));
            gmax = fmax(gmax, fabs((double)ref->grads[j]));
        }
        const double e = gmax > 0 ? dmax / gmax : dmax > 0 ? INFINITY : 0;
        if (e > most) most = e, *worst = t->name;
    }
    return most;
}

static void result_free(result *r) {
    free(r->grads);
    free(r->qk);
}

static bool same_bits(const result *a, const result *b, size_t np) {
    return memcmp(&a->loss, &b->loss, sizeof a->loss) == 0 && a->n_valid == b->n_valid &&
           memcmp(a->grads, b->grads, np * sizeof *a->grads) == 0;
}

static void rope_fwd_wrapped(float *out, const float *inp, const float *cos, const float *sin,
                             int b, int t, int H, int D) {
    cpu_rope_forward(out, inp, cos, sin, b, t, H, D);
}

static void rope_bwd_wrapped(float *dinp, const float *dout, const float *cos, const float *sin,
                             int b, int t, int H, int D) {
    cpu_rope_backward(dinp, dout, cos, sin, b, t, H, D);
}

static double worst_fp32, worst_bf16;

static void check_case(const char *what, const qwen3_config *cfg, const ct_ops *ops,
                       qwen3_memory_opts opts, const int32_t *in, const int32_t *tg,
                       const int32_t *pos, const qwen3_model *layout) {
    int64_t n_valid = 0;
    for (int i = 0; i < N; i++) n_valid += tg[i] != QWEN3_IGNORE_INDEX;
    const float scale = 1.0f / (float)n_valid;
    result packed = packed_run(cfg, ops, opts, in, tg, pos, NULL, scale);
    result ref = docs_run(cfg, ops, opts, in, tg, scale);
    if (!packed.grads || !ref.grads) {
        result_free(&packed), result_free(&ref);
        return;
    }
    const char *tensor;
    const double ge = grad_error(layout, &packed, &ref, &tensor);
    const double le = fabs(packed.loss - ref.loss) / fabs(ref.loss);
    const double bound = opts.bf16 ? BF16_BOUND : FP32_BOUND;
    printf("%-44s loss %.9g rel %.2g, n_valid %lld, gradients %.2g (%s)\n", what, packed.loss, le,
           (long long)packed.n_valid, ge, tensor);
    double *worst = opts.bf16 ? &worst_bf16 : &worst_fp32;
    *worst = fmax(*worst, fmax(ge, le));
    CHECK(isfinite(packed.loss) && le <= bound, "%s: loss %.17g, documents alone %.17g", what,
          packed.loss, ref.loss);
    CHECK(packed.n_valid == ref.n_valid && packed.n_valid == n_valid, "%s: n_valid %lld vs %lld",
          what, (long long)packed.n_valid, (long long)ref.n_valid);
    CHECK(ge <= bound, "%s: gradients %.3g (%s) > %g", what, ge, tensor, bound);
    if (packed.qk && ref.qk) {
        double dmax = 0, gmax = 0;
        for (size_t j = 0; j < qk_floats(cfg); j++) {
            dmax = fmax(dmax, fabs((double)packed.qk[j] - ref.qk[j]));
            gmax = fmax(gmax, fabs((double)ref.qk[j]));
        }
        printf("%-44s layer 0 q, k after RoPE %.2g\n", "", dmax / gmax);
        worst_fp32 = fmax(worst_fp32, dmax / gmax);
        CHECK(dmax <= FP32_BOUND * gmax, "%s: layer 0's q and k after RoPE %.3g from alone", what,
              dmax / gmax);
    }
    result_free(&packed), result_free(&ref);
}

// What is not the documents' equivalence: errors, the plain cases, each forward its own
// positions, the attention state check.
static void check_api(const qwen3_config *cfg, const int32_t *in, const int32_t *tg,
                      const int32_t *pos, size_t np) {
    ct_error err = {{0}};
    qwen3_model m;
    CHECK(qwen3_init(&m, cfg, NULL, &err) == 0, "init: %s", err.msg);
    CHECK(qwen3_batch_check(&m, &(qwen3_batch){.inputs = in, .targets = tg, .positions = pos}, B,
                            &err) != 0 &&
              strstr(err.msg, "not planned"),
          "before plan: %s", err.msg);
    CHECK(qwen3_plan(&m, B, T, &err) == 0, "plan: %s", err.msg);
    CHECK(qwen3_batch_check(&m, &(qwen3_batch){.inputs = in, .targets = tg, .positions = pos}, B,
                            &err) != 0 &&
              strstr(err.msg, "block_causal"),
          "without block_causal: %s", err.msg);
    m.mem_opts.block_causal = true;
    CHECK(qwen3_plan(&m, B, T, &err) == 0, "plan: %s", err.msg);
    int32_t bad[N];
    memcpy(bad, pos, sizeof bad);
    bad[T] = 3; // row 1 starts at 3
    CHECK(qwen3_batch_check(&m, &(qwen3_batch){.inputs = in, .targets = tg, .positions = bad}, B,
                            &err) != 0 &&
              strstr(err.msg, "positions[1, 0] is 3") && strstr(err.msg, "expected 0"),
          "a row not starting at 0: %s", err.msg);
    memcpy(bad, pos, sizeof bad);
    bad[20] = 9; // document 2 (from 14): position 6 expected
    CHECK(qwen3_batch_check(&m, &(qwen3_batch){.inputs = in, .targets = tg, .positions = bad}, B,
                            &err) != 0 &&
              strstr(err.msg, "positions[0, 20] is 9") && strstr(err.msg, "expected 6"),
          "a gap: %s", err.msg);
    bad[20] = -1;
    CHECK(qwen3_batch_check(&m, &(qwen3_batch){.inputs = in, .targets = tg, .positions = bad}, B,
                            &err) != 0 &&
              strstr(err.msg, "positions[0, 20] is -1"),
          "negative: %s", err.msg);
    CHECK(qwen3_batch_check(&m, &(qwen3_batch){.inputs = in, .targets = tg, .positions = pos}, B,
                            &err) == 0,
          "valid: %s", err.msg);
    CHECK(qwen3_batch_check(&m, &(qwen3_batch){.inputs = in, .targets = tg}, B, &err) == 0,
          "NULL: %s", err.msg);
    qwen3_free(&m);

    // The plain causal model's bits: no positions given, NULL, and one document per row.
    int64_t n_valid = 0;
    for (int i = 0; i < N; i++) n_valid += tg[i] != QWEN3_IGNORE_INDEX;
    const float scale = 1.0f / (float)n_valid;
    int32_t rows[N];
    for (int i = 0; i < N; i++) rows[i] = i % T;
    ct_ops flash;
    CHECK(ct_ops_with_attention(&flash, &ct_ops_cpu, "flash") == 0, "flash");
    const qwen3_memory_opts none = {0};
    result plain = plain_run(cfg, &flash, none, in, tg, scale);
    result r = packed_run(cfg, &flash, none, in, tg, NULL, NULL, scale);
    CHECK(same_bits(&r, &plain, np), "block_causal, no positions: not the plain model's bits");
    result_free(&r);
    r = packed_run(cfg, &flash, none, in, tg, rows, NULL, scale);
    CHECK(same_bits(&r, &plain, np), "block_causal, one document per row: not the plain bits");
    result_free(&r);
    // Each forward takes its own positions, whatever the step before it had.
    result docs = packed_run(cfg, &flash, none, in, tg, pos, NULL, scale);
    r = packed_run(cfg, &flash, none, in, tg, pos, rows, scale);
    CHECK(same_bits(&r, &docs, np), "a step with other positions before it changed the step");
    result_free(&r);
    r = packed_run(cfg, &flash, none, in, tg, rows, pos, scale);
    CHECK(same_bits(&r, &plain, np), "a step with documents before it changed the plain step");
    result_free(&r), result_free(&docs), result_free(&plain);
}

// A kernel whose state has a fixed part per call: documents need more than it asked for at
// (B, T), which qwen3_batch_check refuses.
static size_t state_per_call(int b, int t, int NH, int NKV, int D) {
    (void)NKV, (void)D;
    return (size_t)b * NH * ((size_t)t * t + 1000);
}

static void check_state_refused(const qwen3_config *cfg, const int32_t *in, const int32_t *tg,
                                const int32_t *pos) {
    ct_ops ops = ct_ops_cpu;
    ops.attention_state_floats = state_per_call;
    qwen3_model m;
    ct_error err = {{0}};
    CHECK(qwen3_init(&m, cfg, &ops, &err) == 0, "init: %s", err.msg);
    m.mem_opts.block_causal = true;
    CHECK(qwen3_plan(&m, B, T, &err) == 0, "plan: %s", err.msg);
    CHECK(qwen3_batch_check(&m, &(qwen3_batch){.inputs = in, .targets = tg, .positions = pos}, B,
                            &err) != 0 &&
              strstr(err.msg, "floats of state"),
          "a state growing per call: %s", err.msg);
    int32_t rows[N];
    for (int i = 0; i < N; i++) rows[i] = i % T;
    CHECK(qwen3_batch_check(&m, &(qwen3_batch){.inputs = in, .targets = tg, .positions = rows}, B,
                            &err) == 0,
          "one document per row: %s", err.msg);
    qwen3_free(&m);
}

int main(void) {
    const qwen3_config cfgs[2] = {dense_config(), moe_config()};
    const char *names[2] = {"dense", "moe"};
    int32_t pos[N];
    positions(pos);
    for (int c = 0; c < 2; c++) {
        const qwen3_config *cfg = &cfgs[c];
        int32_t in[N], tg[N];
        tokens(in, tg, cfg->vocab_size);
        qwen3_model layout;
        ct_error err = {{0}};
        CHECK(qwen3_init_layout(&layout, cfg, &err) == 0, "layout: %s", err.msg);
        const size_t np = layout.num_params;
        check_api(cfg, in, tg, pos, np);
        const char *attn[2] = {"flash", "sdpa"};
        for (int a = 0; a < 2; a++) {
            ct_ops ops;
            CHECK(ct_ops_with_attention(&ops, &ct_ops_cpu, attn[a]) == 0, "%s", attn[a]);
            for (int bf = 0; bf < 2; bf++) {
                for (int ac = 0; ac < 3; ac++) {
                    const qwen3_memory_opts opts = {
                        .bf16 = bf, .bf16_experts = bf, .ac_every = ac == 1, .ac_op = ac == 2};
                    char what[96];
                    snprintf(what, sizeof what, "%s %s %s%s", names[c], attn[a],
                             bf ? "bf16" : "fp32",
                             ac == 1   ? " ac_every 1"
                             : ac == 2 ? " ac_op"
                                       : "");
                    check_case(what, cfg, &ops, opts, in, tg, pos, &layout);
                }
            }
            // q/k norm + RoPE as the composite over the table's rope (a plugin's rope_hf).
            ops.rope_forward = rope_fwd_wrapped;
            ops.rope_backward = rope_bwd_wrapped;
            ct_ops_fit_fusions(&ops);
            CHECK(ops.qk_norm_rope_forward != cpu_qk_norm_rope_forward, "the composite runs");
            char what[96];
            snprintf(what, sizeof what, "%s %s fp32 composite rope", names[c], attn[a]);
            check_case(what, cfg, &ops, (qwen3_memory_opts){0}, in, tg, pos, &layout);
        }
        qwen3_free(&layout);
    }
    int32_t in[N], tg[N];
    tokens(in, tg, cfgs[0].vocab_size);
    check_state_refused(&cfgs[0], in, tg, pos);
    printf("worst: fp32 %.3g (bound %g), bf16 %.3g (bound %g)\n", worst_fp32, FP32_BOUND,
           worst_bf16, BF16_BOUND);
    return check_summary();
}
