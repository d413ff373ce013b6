// The tiny model fuzz_peft_config checks adapter tensors against (and make_seeds writes an
// adapter for): two layers, the first sparse (4 experts), the second dense; every projection
// adapted at rank 2.
#pragma once
#include <string.h>

#include "model/lora.h"

static inline void peft_fuzz_geometry(qwen3_config *c, lora_config *lc) {
    memset(c, 0, sizeof *c);
    c->vocab_size = 16, c->hidden_size = 8, c->intermediate_size = 6, c->num_hidden_layers = 2;
    c->num_attention_heads = 2, c->num_key_value_heads = 1, c->head_dim = 4;
    c->max_position_embeddings = 16, c->rms_norm_eps = 1e-6f, c->rope_theta = 10000.0;
    c->num_experts = 4, c->num_experts_per_tok = 2, c->moe_intermediate_size = 2;
    c->decoder_sparse_step = 1, c->n_mlp_only_layers = 1, c->mlp_only_layers[0] = 1;
    *lc = (lora_config){.rank = 2, .alpha = 4, .dropout = 0, .targets = LORA_ALL_LINEAR};
}
