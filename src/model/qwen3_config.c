// What a qwen3_config means beyond its fields, in one place: whether it is consistent
// (qwen3_config_validate), which layers are sparse (HF's decoder_sparse_step / mlp_only_layers
// rule) and the sizes the decoder and its kernels are called with (qwen3_dims_of). The model,
// its layout and the kernel check all read them from here.
#include <limits.h>
#include <math.h>
#include <stdint.h>

#include "model/qwen3_config.h"

qwen3_dims qwen3_dims_of(const qwen3_config *c, int B, int T) {
    const bool moe = qwen3_num_sparse_layers(c) > 0;
    return (qwen3_dims){.B = B,
                        .T = T,
                        .N = B * T,
                        .C = c->hidden_size,
                        .NH = c->num_attention_heads,
                        .NKV = c->num_key_value_heads,
                        .D = c->head_dim,
                        .F = c->intermediate_size,
                        .V = c->vocab_size,
                        .L = c->num_hidden_layers,
                        .E = moe ? c->num_experts : 0,
                        .K = moe ? c->num_experts_per_tok : 0,
                        .Fm = moe ? c->moe_intermediate_size : 0};
}

int qwen3_layer_id(const qwen3_config *c, int l) {
    for (int i = 0; i < c->n_parts; i++) {
        if (l < c->part_n[i]) return c->part_lo[i] + l;
        l -= c->part_n[i];
    }
    return l;
}

bool qwen3_layer_is_sparse(const qwen3_config *c, int layer) {
    layer = qwen3_layer_id(c, layer);
    if (c->num_experts <= 0 || c->decoder_sparse_step <= 0) return false;
    for (int i = 0; i < c->n_mlp_only_layers; i++)
        if (c->mlp_only_layers[i] == layer) return false;
    return (layer + 1) % c->decoder_sparse_step == 0;
}

int qwen3_local_experts(const qwen3_config *c) {
    return c->local_experts ? c->local_experts : c->num_experts;
}

int qwen3_num_sparse_layers(const qwen3_config *c) {
    int n = 0;
    for (int i = 0; i < c->num_hidden_layers; i++) n += qwen3_layer_is_sparse(c, i);
    return n;
}

static int config_validate_moe(const qwen3_config *c, const char *source, ct_error *err) {
    int E = c->num_experts, L = c->num_hidden_layers;
    if (E < 0)
        return ct_fail(err,
                       "%s: key \"num_experts\": expected 0 (dense) or a positive integer, found "
                       "%d",
                       source, E);
    if (E == 0) return 0;
    if (c->num_experts_per_tok < 1 || c->num_experts_per_tok > E)
        return ct_fail(err,
                       "%s: key \"num_experts_per_tok\": expected an integer in [1, num_experts "
                       "= %d], found %d",
                       source, E, c->num_experts_per_tok);
    if (c->moe_intermediate_size <= 0)
        return ct_fail(err,
                       "%s: key \"moe_intermediate_size\": expected a positive integer, found %d",
                       source, c->moe_intermediate_size);
    if (c->decoder_sparse_step < 1)
        return ct_fail(err,
                       "%s: key \"decoder_sparse_step\": expected a positive integer, found %d",
                       source, c->decoder_sparse_step);
    if (c->n_mlp_only_layers < 0 || c->n_mlp_only_layers > QWEN3_MAX_MLP_ONLY)
        return ct_fail(err, "%s: key \"mlp_only_layers\": expected at most %d entries, found %d",
                       source, QWEN3_MAX_MLP_ONLY, c->n_mlp_only_layers);
    for (int i = 0; i < c->n_mlp_only_layers; i++) {
        int l = c->mlp_only_layers[i];
        if (l < 0 || l >= L)
            return ct_fail(err,
                           "%s: key \"mlp_only_layers\": expected layer indices in [0, "
                           "num_hidden_layers = %d), found %d",
                           source, L, l);
        for (int j = 0; j < i; j++)
            if (c->mlp_only_layers[j] == l)
                return ct_fail(err,
                               "%s: key \"mlp_only_layers\": expected distinct layer indices, "
                               "found %d twice",
                               source, l);
    }
    if (!(c->router_aux_loss_coef >= 0) || !isfinite(c->router_aux_loss_coef))
        return ct_fail(err,
                       "%s: key \"router_aux_loss_coef\": expected a finite number >= 0, found %g",
                       source, c->router_aux_loss_coef);
    // The expert kernels index one expert's weights, (3*Fm, C), and the fused gate/up (2*Fm, C)
    // with int. The whole layer's E*3*Fm*C is not required to fit: 235B-A22B's is 2.4e9.
    if ((int64_t)3 * c->moe_intermediate_size * c->hidden_size > INT_MAX)
        return ct_fail(err,
                       "%s: key \"moe_intermediate_size\": 3 x moe_intermediate_size (%d) x "
                       "hidden_size (%d) exceeds %d",
                       source, c->moe_intermediate_size, c->hidden_size, INT_MAX);
    return 0;
}

int qwen3_config_validate(const qwen3_config *c, const char *source, ct_error *err) {
    const struct {
        const char *key;
        int value;
    } sizes[] = {
        {"vocab_size", c->vocab_size},
        {"hidden_size", c->hidden_size},
        {"intermediate_size", c->intermediate_size},
        {"num_hidden_layers", c->num_hidden_layers},
        {"num_attention_heads", c->num_attention_heads},
        {"max_position_embeddings", c->max_position_embeddings},
    };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        if (sizes[i].value <= 0)
            return ct_fail(err, "%s: key \"%s\": expected a positive integer, found %d", source,
                           sizes[i].key, sizes[i].value);
    }
    int nh = c->num_attention_heads, nkv = c->num_key_value_heads;
    if (nkv <= 0 || nh % nkv != 0)
        return ct_fail(err,
                       "%s: key \"num_key_value_heads\": expected a positive integer dividing "
                       "num_attention_heads (%d), found %d",
                       source, nh, nkv);
    if (c->head_dim <= 0 || c->head_dim % 2 != 0)
        return ct_fail(err,
                       "%s: key \"head_dim\": expected a positive even integer (RoPE rotates "
                       "pairs of dimensions), found %d",
                       source, c->head_dim);
    // The kernels index with int: every matrix dimension must fit.
    if ((int64_t)nh * c->head_dim > INT_MAX)
        return ct_fail(err,
                       "%s: key \"head_dim\": num_attention_heads (%d) x head_dim (%d) exceeds "
                       "%d",
                       source, nh, c->head_dim, INT_MAX);
    if (!(c->rms_norm_eps > 0) || !isfinite(c->rms_norm_eps))
        return ct_fail(err, "%s: key \"rms_norm_eps\": expected a positive number, found %g",
                       source, (double)c->rms_norm_eps);
    if (!(c->rope_theta > 0) || !isfinite(c->rope_theta))
        return ct_fail(err, "%s: key \"rope_theta\": expected a positive number, found %g", source,
                       c->rope_theta);
    return config_validate_moe(c, source, err);
}
