// The memory options of qwen3_memory_opts, on a model mixing dense and sparse layers with the
// load-balancing loss on.
// - Activation checkpointing: a checkpointed layer keeps only its input and runs its forward
//   again in the backward; under the op policy every layer keeps its GEMM and attention outputs
//   and runs its elementwise ops again. The same ops on the same inputs give the same bits, so
//   the loss, every gradient and the MoE routing statistics must equal the run without
//   checkpointing exactly, for full (every layer), selective (every k-th) and op checkpointing,
//   with both attention kernels and both expert kernels, over two accumulated micro-batches;
//   the activation plan must shrink, and under the op policy by exactly the elementwise
//   outputs of all layers but one set. (Checked once by breaking it: ln2 recomputed from resid
//   instead of resid2, or no op recomputation at all, each failed the 16 op gradient checks.)
// - The chunked loss head: the same loss and gradients (to fp32 rounding: the lm_head gradient
//   is summed chunk by chunk), whether the head's backward runs inside qwen3_forward_train or
//   recomputes the logits in qwen3_backward; the logits buffer shrinks to one chunk.
// - bf16 mixed precision with the experts in bf16: checkpointing as bit-exact as in fp32, and
//   the experts' smaller saved state in the plan.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "model/flavors.h"
#include "model/moe_balance.h"
#include "model/qwen3.h"

enum { B = 2, T = 24 };

static qwen3_config small_moe(void) {
    qwen3_config c;
    ct_error err;
    CHECK(flavor_lookup(&c, "debugmodel_moe", &err) == 0, "flavor: %s", err.msg);
    c.vocab_size = 97;
    c.num_hidden_layers = 5;
    c.num_experts = 4;
    c.num_experts_per_tok = 2;
    c.moe_intermediate_size = 24;
    c.decoder_sparse_step = 2; // layers 1 and 3 sparse, the others dense
    c.output_router_logits = true;
    return c;
}

typedef struct run {
    double loss;
    float *grads;
    double *load;
    size_t act_floats;
} run;

// Two micro-batches accumulated (the second on the tokens shifted by one), as a training step
// with gradient accumulation runs them; ops NULL is the built-in table. The loss is their sum,
// load the last one's routing statistics.
static run train_step(const qwen3_config *cfg, const ct_ops *ops, qwen3_memory_opts opts,
                      bool fused, const int32_t *in, const int32_t *tg) {
    qwen3_model m;
    ct_error err = {{0}};
    run r = {0};
    CHECK(qwen3_init(&m, cfg, ops, &err) == 0, "init: %s", err.msg);
    m.mem_opts = opts;
    CHECK(qwen3_plan(&m, B, T, &err) == 0, "plan: %s", err.msg);
    qwen3_init_random(&m, 7, NULL);
    qwen3_refresh_bf16(&m); // opts.bf16: the weights' bf16 copy
    moe_balance bal;
    CHECK(moe_balance_init(&bal, &m, 1, NULL, NULL, 0.01f, &err) == 0, "balance: %s", err.msg);
    qwen3_zero_grad(&m);
    for (int micro = 0; micro < 2; micro++) {
        int64_t n = B * T - 1; // one ignored target
        const float scale = 1.0f / (float)(2 * n);
        r.loss +=
            fused ? qwen3_forward_train(
                        &m, &(qwen3_batch){.inputs = in + micro, .targets = tg + micro}, scale, &n)
                  : qwen3_forward(&m, &(qwen3_batch){.inputs = in + micro, .targets = tg + micro},
                                  &n);
        CHECK(n == B * T - 1, "valid targets: %lld", (long long)n);
        qwen3_backward(&m, scale);
    }
    const size_t stats = (size_t)m.n_sparse * cfg->num_experts;
    r.grads = malloc(m.num_params * sizeof *r.grads);
    r.load = malloc(stats * sizeof *r.load);
    memcpy(r.grads, m.grad_mem, m.num_params * sizeof *r.grads);
    memcpy(r.load, bal.load, stats * sizeof *r.load); // as the forwards and recomputations left it
    r.act_floats = m.act_floats;
    CHECK(m.act_floats * sizeof(float) + 2 * sizeof(int32_t) * B * T ==
              qwen3_memory_plan_ops(cfg, ops, B, T, &opts).activations,
          "ac_every %d, ac_op %d, loss_chunk %d: the plan equals the allocation", opts.ac_every,
          opts.ac_op, opts.loss_chunk);
    moe_balance_free(&bal);
    qwen3_free(&m);
    return r;
}

static void same_bits(const run *r, const run *base, size_t np, size_t ns, const char *what) {
    CHECK(memcmp(&r->loss, &base->loss, sizeof r->loss) == 0, "%s: loss %.17g vs %.17g", what,
          r->loss, base->loss);
    CHECK(memcmp(r->grads, base->grads, np * sizeof *r->grads) == 0,
          "%s: gradients differ from no checkpointing", what);
    CHECK(memcmp(r->load, base->load, ns * sizeof *r->load) == 0,
          "%s: routing statistics counted again by the recomputation", what);
}

static size_t align16(size_t n) {
    return (n + 15) / 16 * 16;
}

// The op policy, for every attention kernel and expert kernel: bit-identical to no
// checkpointing (alone, with selective checkpointing and with the chunked loss head), and its
// plan smaller than none's by exactly the elementwise outputs (ln1, v, qr, kr, ln2, h and the
// rstds) of every layer but one shared set.
static void check_op_policy(const qwen3_config *cfg, size_t np, size_t ns, const int32_t *in,
                            const int32_t *tg) {
    const char *attn[] = {"sdpa", "flash"}, *impl[] = {"grouped", "loop"};
    for (int i = 0; i < 2; i++) {
        for (int j = 0; j < 2; j++) {
            ct_ops a, ops;
            CHECK(ct_ops_with_attention(&a, &ct_ops_cpu, attn[i]) == 0, "%s", attn[i]);
            CHECK(ct_ops_with_moe_impl(&ops, &a, impl[j]) == 0, "%s", impl[j]);
            char what[96];
            run base = train_step(cfg, &ops, (qwen3_memory_opts){0}, true, in, tg);
            run op = train_step(cfg, &ops, (qwen3_memory_opts){.ac_op = true}, true, in, tg);
            snprintf(what, sizeof what, "op (%s, %s)", attn[i], impl[j]);
            same_bits(&op, &base, np, ns, what);
            const size_t N = B * T, C = cfg->hidden_size, F = cfg->intermediate_size;
            const size_t NH = cfg->num_attention_heads, NKV = cfg->num_key_value_heads;
            const size_t D = cfg->head_dim, L = cfg->num_hidden_layers, dense = 3;
            const size_t attn_cheap = 2 * align16(N * C) + 2 * align16(N) +
                                      2 * align16(N * NKV * D) + align16(N * NH) +
                                      align16(N * NKV) + align16(N * NH * D);
            const size_t saved = (L - 1) * attn_cheap + (dense - 1) * align16(N * F);
            CHECK(op.act_floats + saved == base.act_floats,
                  "%s: %zu floats, none %zu: expected %zu fewer", what, op.act_floats,
                  base.act_floats, saved);
            free(op.grads), free(op.load);
            // Layer 2 (of 1..5, every 3rd) recomputed whole, the others their elementwise ops.
            op = train_step(cfg, &ops, (qwen3_memory_opts){.ac_op = true, .ac_every = 3}, true, in,
                            tg);
            snprintf(what, sizeof what, "op + ac_every 3 (%s, %s)", attn[i], impl[j]);
            same_bits(&op, &base, np, ns, what);
            free(op.grads), free(op.load), free(base.grads), free(base.load);
            // The chunked loss head, fused and recomputed: the same bits as without the op
            // policy at the same chunk.
            for (int fused = 0; fused < 2; fused++) {
                base = train_step(cfg, &ops, (qwen3_memory_opts){.loss_chunk = 13}, fused, in, tg);
                op = train_step(cfg, &ops, (qwen3_memory_opts){.loss_chunk = 13, .ac_op = true},
                                fused, in, tg);
                snprintf(what, sizeof what, "op, loss_chunk 13 %s (%s, %s)",
                         fused ? "fused" : "recomputed", attn[i], impl[j]);
                same_bits(&op, &base, np, ns, what);
                free(op.grads), free(op.load), free(base.grads), free(base.load);
            }
        }
    }
}

// bf16 mixed precision with the experts in bf16 (both kernels): checkpointing, whole layers or
// the op policy, recomputes them bit for bit; the loss stays near the one with fp32 experts; and
// their saved state is smaller than the fp32 kernels' by half the gate/up outputs: with Qwen3's
// vocabulary (the logits then set the shared scratch region) the plan is smaller by exactly
// that, per sparse layer.
static void check_bf16(const qwen3_config *cfg, size_t np, size_t ns, const int32_t *in,
                       const int32_t *tg) {
    const qwen3_memory_opts fp_experts = {.bf16 = true}, bf = {.bf16 = true, .bf16_experts = true};
    const char *impl[] = {"grouped", "loop"};
    for (int j = 0; j < 2; j++) {
        ct_ops ops;
        CHECK(ct_ops_with_moe_impl(&ops, &ct_ops_cpu, impl[j]) == 0, "%s", impl[j]);
        run base = train_step(cfg, &ops, bf, true, in, tg);
        for (int mode = 0; mode < 2; mode++) {
            qwen3_memory_opts o = bf;
            o.ac_every = mode == 0, o.ac_op = mode == 1;
            run r = train_step(cfg, &ops, o, true, in, tg);
            char what[64];
            snprintf(what, sizeof what, "bf16 experts (%s), %s", impl[j],
                     mode ? "ac_op" : "ac_every 1");
            same_bits(&r, &base, np, ns, what);
            free(r.grads), free(r.load);
        }
        run f = train_step(cfg, &ops, fp_experts, true, in, tg);
        CHECK(isfinite(base.loss) && fabs(base.loss - f.loss) < 1e-2 * fabs(f.loss),
              "bf16 experts (%s): loss %.9g, with fp32 experts %.9g", impl[j], base.loss, f.loss);
        free(f.grads), free(f.load), free(base.grads), free(base.load);
    }
    qwen3_config big = *cfg;
    big.vocab_size = 151936;
    const int N = B * T, C = cfg->hidden_size, F = cfg->moe_intermediate_size;
    const int E = cfg->num_experts, K = cfg->num_experts_per_tok;
    const size_t per_layer = ct_ops_cpu.moe_state_floats(N, C, F, E, K) -
                             ct_ops_cpu.moe_bf16_state_floats(N, C, F, E, K);
    const size_t saved = qwen3_memory_plan_ops(&big, NULL, B, T, &fp_experts).activations -
                         qwen3_memory_plan_ops(&big, NULL, B, T, &bf).activations;
    CHECK(per_layer >= align16((size_t)N * K * F) && saved == 2 * per_layer * sizeof(float),
          "bf16 experts: the plan shrank by %zu bytes, expected 2 sparse layers x %zu floats",
          saved, per_layer);
}

int main(void) {
    const qwen3_config cfg = small_moe();
    int32_t in[B * T + 1], tg[B * T + 1]; // the second micro-batch starts one later
    for (int i = 0; i < B * T + 1; i++)
        in[i] = (i * 37 + 11) % cfg.vocab_size, tg[i] = (i * 53) % 97;
    tg[5] = QWEN3_IGNORE_INDEX; // position 5 of the first micro-batch, 4 of the second

    qwen3_model probe;
    ct_error err;
    CHECK(qwen3_init(&probe, &cfg, NULL, &err) == 0, "init: %s", err.msg);
    const size_t np = probe.num_params, ns = (size_t)probe.n_sparse * cfg.num_experts;
    qwen3_free(&probe);
    CHECK(ns == 2 * 4, "two sparse layers of four experts");

    run base = train_step(&cfg, NULL, (qwen3_memory_opts){0}, true, in, tg);
    const int modes[] = {1, 2, 3, 5, 6}; // full, selective every 2nd / 3rd / 5th, and none hit
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        run r = train_step(&cfg, NULL, (qwen3_memory_opts){.ac_every = modes[i]}, true, in, tg);
        char what[32];
        snprintf(what, sizeof what, "ac_every %d", modes[i]);
        same_bits(&r, &base, np, ns, what);
        // Two or more checkpointed layers share one set: less memory. One (every 3rd or 5th of
        // 5 layers) saves nothing, and k > L checkpoints nothing: the same plan.
        if (modes[i] <= 2)
            CHECK(r.act_floats < base.act_floats, "ac_every %d: %zu floats, none: %zu", modes[i],
                  r.act_floats, base.act_floats);
        else
            CHECK(r.act_floats == base.act_floats, "ac_every %d: %zu floats, none: %zu", modes[i],
                  r.act_floats, base.act_floats);
        free(r.grads), free(r.load);
    }
    // The chunked loss head, fused into the forward or recomputed in the backward, alone and
    // with full checkpointing.
    const int chunks[] = {7, 13, 47, 1};
    for (size_t i = 0; i < sizeof chunks / sizeof chunks[0]; i++) {
        for (int fused = 0; fused < 2; fused++) {
            qwen3_memory_opts o = {.loss_chunk = chunks[i], .ac_every = i == 1 ? 1 : 0};
            run r = train_step(&cfg, NULL, o, fused, in, tg);
            double d2 = 0, n2 = 0;
            for (size_t j = 0; j < np; j++) {
                const double dj = (double)r.grads[j] - base.grads[j];
                d2 += dj * dj, n2 += (double)base.grads[j] * base.grads[j];
            }
            CHECK(fabs(r.loss - base.loss) <= 1e-6 * fabs(base.loss),
                  "loss_chunk %d (%s): loss %.17g vs %.17g", chunks[i],
                  fused ? "fused" : "recomputed", r.loss, base.loss);
            CHECK(sqrt(d2 / n2) < 1e-6, "loss_chunk %d (%s): gradients rel L2 %.3g", chunks[i],
                  fused ? "fused" : "recomputed", sqrt(d2 / n2));
            CHECK(memcmp(r.load, base.load, ns * sizeof *r.load) == 0, "routing statistics");
            // Never more; here (97 columns) the layers' scratch, which shares the logits'
            // region, is the larger of the two (the real-vocabulary plan is checked below).
            CHECK(r.act_floats <= base.act_floats, "loss_chunk %d: %zu floats, whole: %zu",
                  chunks[i], r.act_floats, base.act_floats);
            free(r.grads), free(r.load);
        }
    }

    // With Qwen3's vocabulary the logits dominate their shared region: one chunk of 16 rows
    // instead of B*T saves exactly the other rows' logits.
    qwen3_config big = cfg;
    big.vocab_size = 151936;
    const qwen3_memory_opts whole = {0}, chunked = {.loss_chunk = 16};
    const size_t saved = qwen3_memory_plan_ops(&big, NULL, B, T, &whole).activations -
                         qwen3_memory_plan_ops(&big, NULL, B, T, &chunked).activations;
    CHECK(saved == (size_t)(B * T - 16) * big.vocab_size * sizeof(float),
          "a 16-row loss chunk saved %zu bytes of the logits", saved);

    check_op_policy(&cfg, np, ns, in, tg);
    check_bf16(&cfg, np, ns, in, tg);
    const qwen3_memory_opts op3 = {.ac_every = 3, .ac_op = true};
    CHECK(qwen3_layer_recompute(&op3, 2) == QWEN3_AC_LAYER &&
              qwen3_layer_recompute(&op3, 1) == QWEN3_AC_OPS &&
              qwen3_layer_recompute(&(qwen3_memory_opts){.ac_every = 3}, 1) == QWEN3_AC_NONE &&
              qwen3_layer_recompute(NULL, 0) == QWEN3_AC_NONE,
          "a layer checkpointed whole by ac_every recomputes all; the others under ac_op, ops");
    CHECK(qwen3_layer_checkpointed(1, 0) && !qwen3_layer_checkpointed(2, 0) &&
              qwen3_layer_checkpointed(2, 1) && !qwen3_layer_checkpointed(0, 3),
          "layer l is checkpointed when (l + 1) %% k == 0, as torchtitan counts");
    free(base.grads), free(base.load);
    return check_summary();
}
