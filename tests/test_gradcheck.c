// The whole model on tiny configs: the analytic gradient of the mean loss against central
// finite differences of the fp32 forward, for EVERY parameter element of every tensor
// (embedding, norms, q_norm/k_norm, projections, biases, lm_head, tied or not). Also: the
// parameter table, memory plan, errors, determinism, gradient accumulation, and that sequences
// of a batch do not see each other.
//
// Finite-difference step and tolerance. The forward runs in fp32, so the loss (~2.4) carries
// rounding noise of ~3e-7; the step used is the perturbation actually representable in fp32.
// The truncation error of a central difference is h^2/6 * f''', and f''' is large here (tiny
// heads, q/k norms over 4 values, weights of std 0.4): at h = 1e-2 it reaches 4% of the
// gradient, and shrinks 11x at h = 3e-3 (quadratic, so it is truncation and not a bug); at
// h = 1e-3 the fp32 noise (3e-7 / 2e-3 = 1.5e-4) takes over. So h = 3e-3, and an element passes
// when |fd - analytic| <= 2e-4 + 2e-2 * |analytic| (measured worst: 0.3 of that), and each
// tensor as a whole must have rel L2 < 1e-2 (measured worst: 2.4e-3). A wrong gradient term (a
// missed bias, a wrong sign, a missing tied contribution, a transposed weight) is off by O(|g|)
// and fails both.
#include <string.h>

#include "check.h"
#include "model/qwen3.h"

enum { B = 2, T = 5 };

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand(float lo, float hi) {
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return lo +
           (hi - lo) * (float)((double)((rng * 0x2545F4914F6CDD1Dull) >> 11) / 9007199254740992.0);
}

static qwen3_config tiny_config(bool tied, bool bias) {
    qwen3_config c = {0};
    c.vocab_size = 11;
    c.hidden_size = 8;
    c.intermediate_size = 12;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 3;
    c.num_key_value_heads = 1;
    c.head_dim = 4; // NH*D = 12 != C = 8
    c.max_position_embeddings = 16;
    c.rms_norm_eps = 1e-6f;
    c.rope_theta = 10000.0;
    c.tie_word_embeddings = tied;
    c.attention_bias = bias;
    snprintf(c.torch_dtype, sizeof c.torch_dtype, "float32");
    return c;
}

// Weights of std ~0.4 and non-trivial norms and biases, so every gradient is O(0.01..1) and
// every parameter matters.
static void randomize(qwen3_model *m) {
    for (int i = 0; i < m->n_params; i++) {
        const qwen3_param *p = &m->params[i];
        float *x = m->param_mem + p->offset;
        const bool is_bias = strstr(p->name, ".bias") != NULL;
        for (size_t j = 0; j < p->numel; j++) {
            x[j] = p->ndim == 2 ? frand(-0.7f, 0.7f)
                   : is_bias    ? frand(-0.3f, 0.3f)
                                : frand(0.6f, 1.4f);
        }
    }
}

static void make_tokens(int32_t *inputs, int32_t *targets, int V) {
    for (int i = 0; i < B * T; i++) {
        inputs[i] = (int32_t)(frand(0, 1) * V) % V;
        targets[i] = (int32_t)(frand(0, 1) * V) % V;
    }
    targets[3] = QWEN3_IGNORE_INDEX; // ignored targets in both sequences
    targets[T + 4] = QWEN3_IGNORE_INDEX;
}

static double loss_mean(qwen3_model *m, const int32_t *in, const int32_t *tg) {
    int64_t n = 0;
    const double s = qwen3_forward(m, &(qwen3_batch){.inputs = in, .targets = tg}, &n);
    return s / (double)n;
}

static void gradcheck(bool tied, bool bias) {
    qwen3_config cfg = tiny_config(tied, bias);
    qwen3_model m;
    ct_error err = {{0}};
    CHECK(qwen3_init(&m, &cfg, NULL, &err) == 0, "init: %s", err.msg);
    CHECK(qwen3_plan(&m, B, T, &err) == 0, "plan: %s", err.msg);
    randomize(&m);
    int32_t in[B * T], tg[B * T];
    make_tokens(in, tg, cfg.vocab_size);

    qwen3_zero_grad(&m);
    int64_t n_valid = 0;
    const double sum = qwen3_forward(&m, &(qwen3_batch){.inputs = in, .targets = tg}, &n_valid);
    CHECK(n_valid == B * T - 2, "n_valid %lld", (long long)n_valid);
    qwen3_backward(&m, 1.0f / (float)n_valid);
    float *analytic = malloc(m.num_params * sizeof(float));
    memcpy(analytic, m.grad_mem, m.num_params * sizeof(float));
    (void)sum;

    const float h = 3e-3f;
    double worst = 0, worst_rel = 0;
    const char *worst_name = "";
    for (int i = 0; i < m.n_params; i++) {
        const qwen3_param *p = &m.params[i];
        float *fd = malloc(p->numel * sizeof *fd);
        const float *an = analytic + p->offset;
        int bad = 0;
        for (size_t j = 0; j < p->numel; j++) {
            float *x = m.param_mem + p->offset + j;
            const float x0 = *x, xp = x0 + h, xm = x0 - h;
            *x = xp;
            const double lp = loss_mean(&m, in, tg);
            *x = xm;
            const double lm = loss_mean(&m, in, tg);
            *x = x0;
            fd[j] = (float)((lp - lm) / ((double)xp - (double)xm));
            const double diff = fabs((double)fd[j] - an[j]);
            const double tol = 2e-4 + 2e-2 * fabs(an[j]);
            if (diff > tol && bad++ < 3)
                fprintf(stderr, "  %s[%zu]: fd %.6g analytic %.6g\n", p->name, j, fd[j], an[j]);
            if (diff / tol > worst) worst = diff / tol, worst_name = p->name;
        }
        const double rel = check_rel_l2(an, fd, p->numel);
        double norm = 0;
        for (size_t j = 0; j < p->numel; j++) norm += (double)an[j] * an[j];
        worst_rel = rel > worst_rel ? rel : worst_rel;
        CHECK(bad == 0 && rel < 1e-2, "%s%s: %d elements out of tolerance, rel L2 %.3g",
              tied ? "tied " : "", p->name, bad, rel);
        CHECK(norm > 1e-12, "%s: gradient is zero, the check proves nothing", p->name);
        free(fd);
    }
    printf("gradcheck tied=%d bias=%d: %d tensors, %zu values, worst error/tolerance %.3f (%s), "
           "worst tensor rel L2 %.2g\n",
           tied, bias, m.n_params, m.num_params, worst, worst_name, worst_rel);
    free(analytic);
    qwen3_free(&m);
}

// Two identical steps give bit-identical losses and gradients; a second backward without
// zero_grad doubles the gradient (parameter gradients accumulate).
static void test_determinism(bool tied) {
    qwen3_config cfg = tiny_config(tied, true);
    qwen3_model m;
    ct_error err = {{0}};
    CHECK(qwen3_init(&m, &cfg, NULL, &err) == 0 && qwen3_plan(&m, B, T, &err) == 0, "%s", err.msg);
    randomize(&m);
    int32_t in[B * T], tg[B * T];
    make_tokens(in, tg, cfg.vocab_size);
    float *g1 = malloc(m.num_params * sizeof(float));
    int64_t n = 0;
    qwen3_zero_grad(&m);
    const double l1 = qwen3_forward(&m, &(qwen3_batch){.inputs = in, .targets = tg}, &n);
    qwen3_backward(&m, 1.0f / (float)n);
    memcpy(g1, m.grad_mem, m.num_params * sizeof(float));
    qwen3_zero_grad(&m);
    const double l2 = qwen3_forward(&m, &(qwen3_batch){.inputs = in, .targets = tg}, &n);
    qwen3_backward(&m, 1.0f / (float)n);
    CHECK(memcmp(&l1, &l2, sizeof l1) == 0, "losses differ: %.17g %.17g", l1, l2);
    CHECK(memcmp(g1, m.grad_mem, m.num_params * sizeof(float)) == 0,
          "gradients differ between identical runs");
    // Accumulation.
    qwen3_forward(&m, &(qwen3_batch){.inputs = in, .targets = tg}, &n);
    qwen3_backward(&m, 1.0f / (float)n);
    for (size_t i = 0; i < m.num_params; i++) g1[i] *= 2.0f;
    CHECK(check_rel_l2(m.grad_mem, g1, m.num_params) < 1e-6, "second backward does not add");
    // A backward with no forward before it does nothing.
    memcpy(g1, m.grad_mem, m.num_params * sizeof(float));
    qwen3_backward(&m, 1.0f);
    CHECK(memcmp(g1, m.grad_mem, m.num_params * sizeof(float)) == 0,
          "backward without a forward changed the gradients");
    free(g1);
    qwen3_free(&m);
}

// Positions restart in every sequence and attention never crosses sequences: sequence 1 of a
// batch has the logits it has alone. targets NULL gives the same logits.
static void test_batch_independence(void) {
    qwen3_config cfg = tiny_config(false, true);
    qwen3_model m;
    ct_error err = {{0}};
    CHECK(qwen3_init(&m, &cfg, NULL, &err) == 0 && qwen3_plan(&m, B, T, &err) == 0, "%s", err.msg);
    randomize(&m);
    int32_t in[B * T], tg[B * T];
    make_tokens(in, tg, cfg.vocab_size);
    const size_t V = (size_t)cfg.vocab_size;
    float both[B * T * 11];
    qwen3_forward(&m, &(qwen3_batch){.inputs = in, .targets = tg}, NULL);
    memcpy(both, m.logits, sizeof both);
    int64_t n = -1;
    CHECK(qwen3_forward(&m, &(qwen3_batch){.inputs = in}, &n) == 0.0 && n == 0,
          "logits-only forward");
    CHECK(memcmp(both, m.logits, sizeof both) == 0, "logits depend on whether targets are given");
    CHECK(qwen3_plan(&m, 1, T, &err) == 0, "%s", err.msg);
    qwen3_forward(&m, &(qwen3_batch){.inputs = in + T, .targets = tg + T}, NULL);
    const double e = check_rel_l2(m.logits, both + T * V, T * V);
    CHECK(e < 1e-6, "sequence 1 alone vs in a batch: rel L2 %.3g", e);
    qwen3_free(&m);
}

static void test_layout_and_errors(void) {
    qwen3_config cfg = tiny_config(false, true);
    qwen3_model m;
    ct_error err = {{0}};
    CHECK(qwen3_init(&m, &cfg, NULL, &err) == 0, "%s", err.msg);
    // HF's module order, except that q|k|v weights come before their biases (the fused
    // projection); every tensor follows the previous one with no gap.
    const char *layer[] = {
        "input_layernorm.weight",  "self_attn.q_proj.weight", "self_attn.k_proj.weight",
        "self_attn.v_proj.weight", "self_attn.q_proj.bias",   "self_attn.k_proj.bias",
        "self_attn.v_proj.bias",   "self_attn.o_proj.weight", "self_attn.o_proj.bias",
        "self_attn.q_norm.weight", "self_attn.k_norm.weight", "post_attention_layernorm.weight",
        "mlp.gate_proj.weight",    "mlp.up_proj.weight",      "mlp.down_proj.weight"};
    const int per_layer = (int)(sizeof layer / sizeof layer[0]);
    CHECK(m.n_params == 1 + 2 * per_layer + 2, "n_params %d", m.n_params);
    CHECK(strcmp(m.params[0].name, "model.embed_tokens.weight") == 0, "%s", m.params[0].name);
    char name[96];
    for (int l = 0; l < 2; l++)
        for (int i = 0; i < per_layer; i++) {
            snprintf(name, sizeof name, "model.layers.%d.%s", l, layer[i]);
            const qwen3_param *p = &m.params[1 + l * per_layer + i];
            CHECK(strcmp(p->name, name) == 0, "param %d: %s, expected %s", 1 + l * per_layer + i,
                  p->name, name);
        }
    CHECK(strcmp(m.params[m.n_params - 2].name, "model.norm.weight") == 0, "final norm");
    CHECK(strcmp(m.params[m.n_params - 1].name, "lm_head.weight") == 0, "lm_head");
    size_t off = 0;
    for (int i = 0; i < m.n_params; i++) {
        CHECK(m.params[i].offset == off, "%s offset %zu, expected %zu", m.params[i].name,
              m.params[i].offset, off);
        off += m.params[i].numel;
    }
    CHECK(off == m.num_params, "num_params %zu, sum of tensors %zu", m.num_params, off);
    const qwen3_param *wo = qwen3_find_param(&m, "model.layers.1.self_attn.o_proj.weight");
    CHECK(wo && wo->ndim == 2 && wo->shape[0] == 8 && wo->shape[1] == 12 &&
              m.param_mem + wo->offset == m.w.layers[1].wo &&
              m.grad_mem + wo->offset == m.g.layers[1].wo,
          "o_proj entry, shape and named pointers");
    const qwen3_param *qn = qwen3_find_param(&m, "model.layers.0.self_attn.q_norm.weight");
    CHECK(qn && qn->ndim == 1 && qn->shape[0] == 4 &&
              m.w.layers[0].q_norm == m.param_mem + qn->offset,
          "q_norm is (head_dim)");
    CHECK(qwen3_find_param(&m, "model.layers.2.mlp.up_proj.weight") == NULL, "no layer 2");
    // The fused projections: q|k|v (weights, then biases) and gate|up are consecutive blocks,
    // and the layer's fused pointers are their starts.
    static const char *const fused[][3] = {
        {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"},
        {"self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"},
        {"mlp.gate_proj.weight", "mlp.up_proj.weight", NULL},
    };
    for (int f = 0; f < 3; f++) {
        char name[96];
        size_t next = 0;
        for (int k = 0; k < 3 && fused[f][k]; k++) {
            snprintf(name, sizeof name, "model.layers.1.%s", fused[f][k]);
            const qwen3_param *p = qwen3_find_param(&m, name);
            CHECK(p && (k == 0 || p->offset == next), "%s not right after the previous block",
                  name);
            if (!p) break;
            if (k == 0) {
                const float *start = f == 0   ? m.w.layers[1].wqkv
                                     : f == 1 ? m.w.layers[1].bqkv
                                              : m.w.layers[1].w_gate_up;
                CHECK(start == m.param_mem + p->offset, "fused pointer of %s", name);
            }
            next = p->offset + p->numel;
        }
    }

    // Memory plan == what init + plan allocate.
    CHECK(qwen3_plan(&m, 3, 7, &err) == 0, "%s", err.msg);
    const qwen3_memory mem = qwen3_memory_plan(&cfg, 3, 7);
    CHECK(mem.params == m.num_params * 4 && mem.grads == m.num_params * 4, "param bytes");
    CHECK(mem.activations == m.act_floats * 4 + 2 * 3 * 7 * sizeof(int32_t),
          "activation bytes %zu vs %zu", mem.activations, m.act_floats * 4);

    // Random init: deterministic, norms 1, biases 0.
    qwen3_init_random(&m, 42, NULL);
    float *first = malloc(m.num_params * 4);
    memcpy(first, m.param_mem, m.num_params * 4);
    qwen3_init_random(&m, 42, NULL);
    CHECK(memcmp(first, m.param_mem, m.num_params * 4) == 0, "init_random not deterministic");
    qwen3_init_random(&m, 43, NULL);
    CHECK(memcmp(first, m.param_mem, m.num_params * 4) != 0, "seed ignored");
    const qwen3_param *bq = qwen3_find_param(&m, "model.layers.0.self_attn.q_proj.bias");
    const qwen3_param *nw = qwen3_find_param(&m, "model.norm.weight");
    CHECK(m.param_mem[bq->offset] == 0.0f && m.param_mem[nw->offset] == 1.0f &&
              m.w.layers[1].k_norm[3] == 1.0f,
          "bias/norm init");
    // The matrices' distributions, torchtitan's: test_init.c.
    // At init the loss is near log(V): the tied output's logits have unit variance (torchtitan's
    // init), so it sits above it.
    int32_t in[3 * 7], tg[3 * 7];
    for (int i = 0; i < 21; i++) in[i] = i % 11, tg[i] = (i * 3) % 11;
    int64_t n = 0;
    const double loss =
        qwen3_forward(&m, &(qwen3_batch){.inputs = in, .targets = tg}, &n) / (double)n;
    CHECK(loss > log(11.0) && loss < log(11.0) + 1.5, "init loss %.4f vs log(11) %.4f", loss,
          log(11.0));
    free(first);

    // Errors.
    CHECK(qwen3_plan(&m, 1, 17, &err) == -1 &&
              strcmp(err.msg, "seq_len 17 exceeds max_position_embeddings 16") == 0,
          "plan error: %s", err.msg);
    // A failed plan leaves no plan behind: forward refuses.
    CHECK(isnan(qwen3_forward(&m, &(qwen3_batch){.inputs = in, .targets = tg}, NULL)) &&
              m.logits == NULL,
          "no plan: NAN");
    CHECK(qwen3_plan(&m, 1, 3, &err) == 0, "%s", err.msg);
    int32_t bad_in[3] = {1, 11, 2}, ok_tg[3] = {1, -100, 2}, bad_tg[3] = {1, -1, 2};
    CHECK(isnan(qwen3_forward(&m, &(qwen3_batch){.inputs = bad_in, .targets = ok_tg}, NULL)),
          "out-of-range input accepted");
    CHECK(qwen3_check_tokens(&m, bad_in, ok_tg, 3, &err) == -1 && strstr(err.msg, "11") &&
              strstr(err.msg, "position 1"),
          "token error: %s", err.msg);
    CHECK(isnan(qwen3_forward(&m, &(qwen3_batch){.inputs = in, .targets = bad_tg}, NULL)),
          "out-of-range target accepted");
    CHECK(qwen3_check_tokens(&m, in, bad_tg, 3, &err) == -1 && strstr(err.msg, "target -1"),
          "target error: %s", err.msg);
    qwen3_free(&m);

    qwen3_config bad = cfg;
    bad.num_key_value_heads = 2;
    CHECK(qwen3_init(&m, &bad, NULL, &err) == -1 && strstr(err.msg, "num_key_value_heads") &&
              strstr(err.msg, "found 2"),
          "GQA config error: %s", err.msg);
    bad = cfg;
    bad.head_dim = 5;
    CHECK(qwen3_init(&m, &bad, NULL, &err) == -1 && strstr(err.msg, "head_dim"),
          "odd head_dim error: %s", err.msg);
    ct_ops partial = ct_ops_cpu;
    partial.name = "partial";
    partial.rope_backward = NULL;
    CHECK(qwen3_init(&m, &cfg, &partial, &err) == -1 && strstr(err.msg, "rope_backward"),
          "incomplete op table: %s", err.msg);

    // Tied: no lm_head tensor, lm_head is the embedding in both weights and gradients.
    qwen3_config tc = tiny_config(true, false);
    CHECK(qwen3_init(&m, &tc, NULL, &err) == 0, "%s", err.msg);
    CHECK(qwen3_find_param(&m, "lm_head.weight") == NULL && m.w.lm_head == m.w.embed &&
              m.g.lm_head == m.g.embed && m.n_params == 1 + 2 * (per_layer - 4) + 1 &&
              m.w.layers[0].bqkv == NULL && m.w.layers[0].bo == NULL,
          "tied, no bias layout");
    qwen3_free(&m);
}

int main(void) {
    test_layout_and_errors();
    test_determinism(false);
    test_determinism(true);
    test_batch_independence();
    gradcheck(false, true);
    gradcheck(true, false);
    return check_summary();
}
