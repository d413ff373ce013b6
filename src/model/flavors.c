#include "model/flavors.h"

#include <string.h>

#include "core/suggest.h"

// The experts of a MoE flavor; {0} (experts == 0) is a dense flavor.
typedef struct flavor_moe {
    int experts, top_k, ffn; // num_experts, num_experts_per_tok, moe_intermediate_size
} flavor_moe;

// Sizes of the released Qwen3 models (their config.json files). debugmodel is ours: the real
// vocabulary (so the real tokenizer works) on a body small enough to train in minutes on two
// cores, with head_dim != hidden/heads as in the real models. debugmodel_moe is the same body
// with every layer sparse: 8 experts, top-2, each as wide as the hidden size. It is untied, as
// every released Qwen3-MoE (and torchtitan's debugmodel_moe) is, so it exercises the separate
// lm_head the real MoE models have.
typedef struct flavor {
    const char *name;
    int hidden, ffn, layers, heads, kv_heads, head_dim;
    bool tied;
    flavor_moe moe;
} flavor;

static const flavor flavors[] = {
    {"debugmodel", 128, 512, 4, 4, 2, 64, true, {0}},
    {"0.6B", 1024, 3072, 28, 16, 8, 128, true, {0}},
    {"1.7B", 2048, 6144, 28, 16, 8, 128, true, {0}},
    {"4B", 2560, 9728, 36, 32, 8, 128, true, {0}},
    {"8B", 4096, 12288, 36, 32, 8, 128, false, {0}},
    {"14B", 5120, 17408, 40, 40, 8, 128, false, {0}},
    {"32B", 5120, 25600, 64, 64, 8, 128, false, {0}},
    {"debugmodel_moe", 128, 512, 4, 4, 2, 64, false, {8, 2, 128}},
    {"30B-A3B", 2048, 6144, 48, 32, 4, 128, false, {128, 8, 768}},
    {"235B-A22B", 4096, 12288, 94, 64, 4, 128, false, {128, 8, 1536}},
};
#define N_FLAVORS ((int)(sizeof flavors / sizeof flavors[0]))

int flavor_names(const char *const **names) {
    static const char *list[N_FLAVORS];
    for (int i = 0; i < N_FLAVORS; i++) list[i] = flavors[i].name;
    *names = list;
    return N_FLAVORS;
}

int flavor_lookup(qwen3_config *c, const char *name, ct_error *err) {
    for (int i = 0; i < N_FLAVORS; i++) {
        const flavor *f = &flavors[i];
        if (strcmp(name, f->name) != 0) continue;
        *c = (qwen3_config){
            .vocab_size = 151936,
            .hidden_size = f->hidden,
            .intermediate_size = f->ffn,
            .num_hidden_layers = f->layers,
            .num_attention_heads = f->heads,
            .num_key_value_heads = f->kv_heads,
            .head_dim = f->head_dim,
            .max_position_embeddings = 40960,
            .rms_norm_eps = 1e-6f,
            .rope_theta = 1000000.0,
            .tie_word_embeddings = f->tied,
            .attention_bias = false,
        };
        strcpy(c->torch_dtype, "bfloat16");
        if (f->moe.experts > 0) {
            // The released MoE models: every layer sparse, top-k renormalised. A flavor is for
            // training, and HF's docs say to turn output_router_logits on to train (the aux
            // loss then joins the loss) with its default coefficient; the released config.json
            // files say false, and an HF folder keeps whatever its file says.
            c->num_experts = f->moe.experts;
            c->num_experts_per_tok = f->moe.top_k;
            c->moe_intermediate_size = f->moe.ffn;
            c->decoder_sparse_step = 1;
            c->norm_topk_prob = true;
            c->output_router_logits = true;
            c->router_aux_loss_coef = 0.001;
        }
        return 0;
    }
    const char *const *names;
    int n = flavor_names(&names);
    const char *close = suggest_closest(name, names, n);
    char list[256] = "";
    for (int i = 0; i < n; i++) {
        strcat(list, i ? ", " : "");
        strcat(list, names[i]);
    }
    if (close)
        return ct_fail(err, "unknown model.flavor \"%s\" (did you mean \"%s\"?)", name, close);
    return ct_fail(err, "unknown model.flavor \"%s\"; known: %s", name, list);
}
