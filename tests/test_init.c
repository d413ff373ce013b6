// The native flavors' random init against torchtitan's formulas (Qwen3 init_weights, TOML era;
// ../shared/design.md): each tensor's rule by name, then each tensor's values: constants exact,
// the sample std of every random tensor against the (truncated) normal's std, nothing past a
// cut, depth scaling across layers, and the tied embedding holding the output layer's init.
#include <math.h>
#include <string.h>

#include "check.h"
#include "model/flavors.h"
#include "model/qwen3.h"

// The std of N(0, s) cut to [-c, c]: s * sqrt(1 - 2 k phi(k) / (2 Phi(k) - 1)), k = c / s.
static double trunc_std(double s, double c) {
    const double k = c / s, phi = exp(-k * k / 2) / sqrt(2 * M_PI), mass = erf(k / sqrt(2));
    return s * sqrt(1 - 2 * k * phi / mass);
}

static void expect_rule(const qwen3_model *m, const char *name, qwen3_init_kind kind, double value,
                        double cut) {
    const qwen3_param *p = qwen3_find_param(m, name);
    CHECK(p != NULL, "%s is not in the table", name);
    if (!p) return;
    const qwen3_init_rule r = qwen3_init_rule_of(&m->cfg, p);
    CHECK(r.kind == kind && fabs(r.value - value) < 1e-12 * value + 1e-15 &&
              fabs(r.cut - cut) < 1e-12,
          "%s: rule (%d, %g, cut %g), want (%d, %g, cut %g)", name, r.kind, r.value, r.cut, kind,
          value, cut);
}

// Every tensor's values against its rule.
static void check_values(const qwen3_model *m, const float *w) {
    for (int i = 0; i < m->n_params; i++) {
        const qwen3_param *p = &m->params[i];
        const qwen3_init_rule r = qwen3_init_rule_of(&m->cfg, p);
        const float *x = w + p->offset;
        if (r.kind == QWEN3_INIT_CONST) {
            size_t off = 0;
            for (size_t j = 0; j < p->numel; j++) off += x[j] != (float)r.value;
            CHECK(off == 0, "%s: %zu values differ from %g", p->name, off, r.value);
            continue;
        }
        double ss = 0, mean = 0, most = 0;
        for (size_t j = 0; j < p->numel; j++) {
            ss += (double)x[j] * x[j];
            mean += x[j];
            most = fmax(most, fabs(x[j]));
        }
        const double n = (double)p->numel, sd = sqrt(ss / n);
        const double want = r.kind == QWEN3_INIT_TRUNC ? trunc_std(r.value, r.cut) : r.value;
        // The sample std's relative error is about 1/sqrt(2n) (a normal's); 5 of those.
        CHECK(fabs(sd / want - 1) < 5 / sqrt(2 * n), "%s: std %.6g, want %.6g (n %zu)", p->name, sd,
              want, p->numel);
        CHECK(fabs(mean / n) < 5 * want / sqrt(n), "%s: mean %.3g", p->name, mean / n);
        if (r.kind == QWEN3_INIT_TRUNC)
            CHECK(most <= r.cut, "%s: |x| reaches %.6g past the cut %.6g", p->name, most, r.cut);
        // A cut at 3 std binds: the extreme values reach near it (a plain normal would pass it).
        if (r.kind == QWEN3_INIT_TRUNC && r.cut < 4 * r.value && n > 1e5)
            CHECK(most > 0.99 * r.cut, "%s: max |x| %.6g, expected near the cut %.6g", p->name,
                  most, r.cut);
    }
}

static void test_flavor(const char *flavor) {
    qwen3_config cfg;
    ct_error err = {0};
    CHECK(flavor_lookup(&cfg, flavor, &err) == 0, "%s: %s", flavor, err.msg);
    qwen3_model m;
    if (qwen3_init(&m, &cfg, NULL, &err) != 0) {
        CHECK(0, "%s: %s", flavor, err.msg);
        return;
    }
    const double out = 1 / sqrt((double)cfg.hidden_size);
    const bool tied = cfg.tie_word_embeddings;
    // The rules by name.
    if (tied)
        expect_rule(&m, "model.embed_tokens.weight", QWEN3_INIT_TRUNC, out, 3 * out);
    else {
        expect_rule(&m, "model.embed_tokens.weight", QWEN3_INIT_NORMAL, 1, 0);
        expect_rule(&m, "lm_head.weight", QWEN3_INIT_TRUNC, out, 3 * out);
    }
    expect_rule(&m, "model.norm.weight", QWEN3_INIT_CONST, 1, 0);
    for (int l = 0; l < cfg.num_hidden_layers; l++) {
        const double depth = 0.02 / sqrt(2.0 * (l + 1));
        char name[128];
#define RULE(suffix, kind, value, cut)                                                             \
    (snprintf(name, sizeof name, "model.layers.%d.%s", l, suffix),                                 \
     expect_rule(&m, name, kind, value, cut))
        RULE("input_layernorm.weight", QWEN3_INIT_CONST, 1, 0);
        RULE("post_attention_layernorm.weight", QWEN3_INIT_CONST, 1, 0);
        RULE("self_attn.q_norm.weight", QWEN3_INIT_CONST, 1, 0);
        RULE("self_attn.k_norm.weight", QWEN3_INIT_CONST, 1, 0);
        RULE("self_attn.q_proj.weight", QWEN3_INIT_TRUNC, 0.02, 2);
        RULE("self_attn.k_proj.weight", QWEN3_INIT_TRUNC, 0.02, 2);
        RULE("self_attn.v_proj.weight", QWEN3_INIT_TRUNC, 0.02, 2);
        RULE("self_attn.o_proj.weight", QWEN3_INIT_TRUNC, depth, 2);
        if (qwen3_layer_is_sparse(&cfg, l)) {
            RULE("mlp.gate.weight", QWEN3_INIT_TRUNC, depth, 2);
            RULE("mlp.expert_bias", QWEN3_INIT_CONST, 0, 0);
            for (int e = 0; e < cfg.num_experts; e++) {
                char ex[64];
                snprintf(ex, sizeof ex, "mlp.experts.%d.gate_proj.weight", e);
                RULE(ex, QWEN3_INIT_TRUNC, 0.02, 2);
                snprintf(ex, sizeof ex, "mlp.experts.%d.up_proj.weight", e);
                RULE(ex, QWEN3_INIT_TRUNC, depth, 2);
                snprintf(ex, sizeof ex, "mlp.experts.%d.down_proj.weight", e);
                RULE(ex, QWEN3_INIT_TRUNC, depth, 2);
            }
        } else {
            RULE("mlp.gate_proj.weight", QWEN3_INIT_TRUNC, 0.02, 2);
            RULE("mlp.up_proj.weight", QWEN3_INIT_TRUNC, depth, 2);
            RULE("mlp.down_proj.weight", QWEN3_INIT_TRUNC, depth, 2);
        }
#undef RULE
    }
    // The values, and determinism: the same seed gives the same bits, one unit at a time too.
    CHECK(qwen3_init_random(&m, 1234, &err) == 0, "%s", err.msg);
    float *w = qwen3_params_view(&m, true, &err);
    CHECK(w != NULL, "%s", err.msg);
    if (!w) goto done;
    check_values(&m, w);
    float *first = malloc(m.num_params * sizeof *first);
    memcpy(first, w, m.num_params * sizeof *first);
    qwen3_params_view_release(&m, w, false);
    size_t lo[64], hi[64];
    const int units = qwen3_n_units(&cfg);
    qwen3_units(&cfg, lo, hi);
    CHECK(qwen3_init_random(&m, 99, &err) == 0, "%s", err.msg);
    for (int u = 0; u < units; u++)
        CHECK(qwen3_init_random_range(&m, 1234, lo[u], hi[u], &err) == 0, "%s", err.msg);
    w = qwen3_params_view(&m, true, &err);
    CHECK(w && memcmp(first, w, m.num_params * sizeof *first) == 0,
          "%s: unit by unit differs from whole", flavor);
    if (w) qwen3_params_view_release(&m, w, false);
    free(first);
done:
    qwen3_free(&m);
}

int main(void) {
    test_flavor("debugmodel");     // tied: the embedding holds the output init
    test_flavor("debugmodel_moe"); // untied, every layer sparse: experts and router
    return check_summary();
}
