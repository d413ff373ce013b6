// The memory options of qwen3_memory_opts, on a model mixing dense and sparse layers with the
// load-balancing loss on.
// - Activation checkpointing: a checkpointed layer keeps only its input and runs its forward
//   again in the backward. The same ops on the same inputs give the same bits, so the loss,
//   every gradient and the MoE routing statistics must equal the run without checkpointing
//   exactly, for full (every layer) and selective (every k-th) checkpointing; the activation
//   plan must shrink.
// - The chunked loss head: the same loss and gradients (to fp32 rounding: the lm_head gradient
//   is summed chunk by chunk), whether the head's backward runs inside qwen3_forward_train or
//   recomputes the logits in qwen3_backward; the logits buffer shrinks to one chunk.
#include <math.h>
#include <string.h>

#include "check.h"
#include "model/flavors.h"
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

static run train_step(const qwen3_config *cfg, qwen3_memory_opts opts, bool fused,
                      const int32_t *in, const int32_t *tg) {
    qwen3_model m;
    ct_error err = {{0}};
    run r = {0};
    CHECK(qwen3_init(&m, cfg, NULL, &err) == 0, "init: %s", err.msg);
    m.mem_opts = opts;
    CHECK(qwen3_plan(&m, B, T, &err) == 0, "plan: %s", err.msg);
    qwen3_init_random(&m, 7);
    qwen3_zero_grad(&m);
    int64_t n = B * T - 1; // one ignored target
    r.loss = fused ? qwen3_forward_train(&m, in, tg, 1.0f / (float)n, &n)
                   : qwen3_forward(&m, in, tg, &n);
    CHECK(n == B * T - 1, "valid targets: %lld", (long long)n);
    const size_t stats = (size_t)m.n_sparse * cfg->num_experts;
    qwen3_moe_aux_grad(&m, m.moe_load, (double)B * T, 0.01f);
    qwen3_backward(&m, 1.0f / (float)n);
    r.grads = malloc(m.num_params * sizeof *r.grads);
    r.load = malloc(stats * sizeof *r.load);
    memcpy(r.grads, m.grad_mem, m.num_params * sizeof *r.grads);
    memcpy(r.load, m.moe_load, stats * sizeof *r.load);
    r.act_floats = m.act_floats;
    CHECK(m.act_floats * sizeof(float) + 2 * sizeof(int32_t) * B * T ==
              qwen3_memory_plan_ops(cfg, NULL, B, T, &opts).activations,
          "ac_every %d, loss_chunk %d: the plan equals the allocation", opts.ac_every,
          opts.loss_chunk);
    qwen3_free(&m);
    return r;
}

int main(void) {
    const qwen3_config cfg = small_moe();
    int32_t in[B * T], tg[B * T];
    for (int i = 0; i < B * T; i++) in[i] = (i * 37 + 11) % cfg.vocab_size, tg[i] = (i * 53) % 97;
    tg[5] = QWEN3_IGNORE_INDEX;

    qwen3_model probe;
    ct_error err;
    CHECK(qwen3_init(&probe, &cfg, NULL, &err) == 0, "init: %s", err.msg);
    const size_t np = probe.num_params, ns = (size_t)probe.n_sparse * cfg.num_experts;
    qwen3_free(&probe);
    CHECK(ns == 2 * 4, "two sparse layers of four experts");

    run base = train_step(&cfg, (qwen3_memory_opts){0}, true, in, tg);
    const int modes[] = {1, 2, 3, 5, 6}; // full, selective every 2nd / 3rd / 5th, and none hit
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        run r = train_step(&cfg, (qwen3_memory_opts){.ac_every = modes[i]}, true, in, tg);
        CHECK(memcmp(&r.loss, &base.loss, sizeof r.loss) == 0, "ac_every %d: loss %.17g vs %.17g",
              modes[i], r.loss, base.loss);
        CHECK(memcmp(r.grads, base.grads, np * sizeof *r.grads) == 0,
              "ac_every %d: gradients differ from no checkpointing", modes[i]);
        CHECK(memcmp(r.load, base.load, ns * sizeof *r.load) == 0,
              "ac_every %d: routing statistics counted again by the recomputation", modes[i]);
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
            run r = train_step(&cfg, o, fused, in, tg);
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

    CHECK(qwen3_layer_checkpointed(1, 0) && !qwen3_layer_checkpointed(2, 0) &&
              qwen3_layer_checkpointed(2, 1) && !qwen3_layer_checkpointed(0, 3),
          "layer l is checkpointed when (l + 1) %% k == 0, as torchtitan counts");
    free(base.grads), free(base.load);
    return check_summary();
}
