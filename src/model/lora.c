// LoRA's configuration and the adapter's layout (lora.h).
#include "model/lora.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const module_names[LORA_N_MODULES] = {
    "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
};

const char *lora_module_name(lora_module m) {
    return m >= 0 && m < LORA_N_MODULES ? module_names[m] : "?";
}

int lora_module_of(const char *name) {
    for (int m = 0; m < LORA_N_MODULES; m++)
        if (strcmp(name, module_names[m]) == 0) return m;
    return -1;
}

int lora_parse_targets(const char *const *names, int n, unsigned *targets, const char *source,
                       ct_error *err) {
    unsigned t = 0;
    for (int i = 0; i < n; i++) {
        if (strcmp(names[i], "all-linear") == 0) {
            t |= LORA_ALL_LINEAR;
            continue;
        }
        int m = lora_module_of(names[i]);
        if (m < 0)
            return ct_fail(err,
                           "%s: target_modules: unknown module \"%s\" (expected \"all-linear\" or "
                           "a list of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
                           "down_proj)",
                           source, names[i]);
        t |= 1u << m;
    }
    if (t == 0)
        return ct_fail(err, "%s: target_modules: empty (expected \"all-linear\" or a list of "
                            "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)",
                       source);
    *targets = t;
    return 0;
}

// PEFT's scaling is a Python float (double) that torch rounds to fp32 where it multiplies an
// fp32 or bf16 tensor: computed in double, rounded once.
float lora_scale(const lora_config *lc) {
    const double a = lc->alpha, r = lc->rank;
    return (float)(lc->use_rslora ? a / sqrt(r) : a / r);
}

int lora_config_validate(const lora_config *lc, const char *source, ct_error *err) {
    if (lc->rank <= 0 || lc->rank > 65536)
        return ct_fail(err, "%s: rank: expected an integer in [1, 65536], found %d", source,
                       lc->rank);
    if (!isfinite(lc->alpha))
        return ct_fail(err, "%s: alpha: expected a finite number, found %g", source,
                       (double)lc->alpha);
    if (!(lc->dropout >= 0.0f && lc->dropout < 1.0f))
        return ct_fail(err, "%s: dropout: expected a number in [0, 1), found %g", source,
                       (double)lc->dropout);
    if (lc->targets == 0 || (lc->targets & ~LORA_ALL_LINEAR) != 0)
        return ct_fail(err, "%s: target_modules: expected at least one of q_proj, k_proj, "
                            "v_proj, o_proj, gate_proj, up_proj, down_proj",
                       source);
    return 0;
}

// (out, in) of module m in a layer whose MLP width is f.
static void module_dims(const qwen3_config *c, lora_module m, int64_t f, int64_t *out,
                        int64_t *in) {
    int64_t C = c->hidden_size, q = (int64_t)c->num_attention_heads * c->head_dim,
            kv = (int64_t)c->num_key_value_heads * c->head_dim;
    switch (m) {
    case LORA_Q: *out = q, *in = C; break;
    case LORA_K:
    case LORA_V: *out = kv, *in = C; break;
    case LORA_O: *out = C, *in = q; break;
    case LORA_GATE:
    case LORA_UP: *out = f, *in = C; break;
    default: *out = C, *in = f; break;
    }
}

// Appends module m's A and B (or counts them when L->t is NULL).
static void add_module(lora_layout *L, const qwen3_config *c, int layer, lora_module m,
                       int expert, int64_t f) {
    int64_t out, in;
    module_dims(c, m, f, &out, &in);
    for (int b = 0; b < 2; b++) {
        if (L->t) {
            lora_tensor *x = &L->t[L->n];
            char mod[48];
            if (expert >= 0)
                snprintf(mod, sizeof mod, "mlp.experts.%d.%s", expert, module_names[m]);
            else
                snprintf(mod, sizeof mod, "%s.%s", m <= LORA_O ? "self_attn" : "mlp",
                         module_names[m]);
            snprintf(x->name, sizeof x->name, "base_model.model.model.layers.%d.%s.lora_%c.weight",
                     qwen3_layer_id(c, layer), mod, b ? 'B' : 'A');
            x->layer = layer, x->module = m, x->expert = expert, x->is_b = b;
            x->shape[0] = b ? out : L->lc.rank;
            x->shape[1] = b ? L->lc.rank : in;
            x->offset = L->num;
            x->numel = (size_t)(x->shape[0] * x->shape[1]);
            L->num += x->numel;
        }
        L->n++;
    }
}

static void walk(lora_layout *L, const qwen3_config *c) {
    L->n = 0, L->num = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        if (L->layer_lo) L->layer_lo[l] = L->num, L->layer_first[l] = L->n;
        bool sparse = qwen3_layer_is_sparse(c, l);
        for (int m = 0; m < LORA_N_MODULES; m++) {
            if (!(L->lc.targets & (1u << m))) continue;
            if (m <= LORA_O || !sparse) add_module(L, c, l, m, -1, c->intermediate_size);
        }
        if (sparse)
            for (int e = 0; e < c->num_experts; e++)
                for (int m = LORA_GATE; m <= LORA_DOWN; m++)
                    if (L->lc.targets & (1u << m))
                        add_module(L, c, l, m, e, c->moe_intermediate_size);
        if (L->layer_hi) L->layer_hi[l] = L->num;
    }
    if (L->layer_first) L->layer_first[c->num_hidden_layers] = L->n;
}

int lora_layout_init(lora_layout *L, const qwen3_config *cfg, const lora_config *lc,
                     ct_error *err) {
    memset(L, 0, sizeof *L);
    if (lora_config_validate(lc, "lora", err) != 0) return -1;
    L->lc = *lc;
    L->n_layers = cfg->num_hidden_layers;
    walk(L, cfg); // count
    L->t = calloc((size_t)L->n + 1, sizeof *L->t);
    L->layer_lo = calloc((size_t)L->n_layers + 1, sizeof *L->layer_lo);
    L->layer_hi = calloc((size_t)L->n_layers + 1, sizeof *L->layer_hi);
    L->layer_first = calloc((size_t)L->n_layers + 1, sizeof *L->layer_first);
    if (!L->t || !L->layer_lo || !L->layer_hi || !L->layer_first) {
        lora_layout_free(L);
        return ct_fail(err, "lora: out of memory for the adapter's layout");
    }
    walk(L, cfg); // fill
    return 0;
}

void lora_layout_free(lora_layout *L) {
    free(L->t);
    free(L->layer_lo);
    free(L->layer_hi);
    free(L->layer_first);
    memset(L, 0, sizeof *L);
}

double lora_active_params(const lora_layout *L, const qwen3_config *cfg) {
    double n = 0;
    for (int i = 0; i < L->n; i++)
        n += L->t[i].expert < 0 ? (double)L->t[i].numel
                                : (double)L->t[i].numel * cfg->num_experts_per_tok /
                                      cfg->num_experts;
    return n;
}

const lora_tensor *lora_layout_find(const lora_layout *L, const char *name) {
    for (int i = 0; i < L->n; i++)
        if (strcmp(L->t[i].name, name) == 0) return &L->t[i];
    return NULL;
}

const lora_tensor *lora_layout_tensor(const lora_layout *L, int layer, lora_module m, int expert,
                                      bool is_b) {
    if (layer < 0 || layer >= L->n_layers) return NULL;
    for (int i = L->layer_first[layer]; i < L->layer_first[layer + 1]; i++) {
        const lora_tensor *x = &L->t[i];
        if (x->module == m && x->expert == expert && x->is_b == is_b) return x;
    }
    return NULL;
}
