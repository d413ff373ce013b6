#include "model/flavors.h"

#include <string.h>

#include "core/suggest.h"

// Sizes of the released Qwen3 dense models (their config.json files); debugmodel is ours: the
// real vocabulary (so the real tokenizer works) on a body small enough to train in minutes on
// two cores, with head_dim != hidden/heads as in the real models.
typedef struct flavor {
    const char *name;
    int hidden, ffn, layers, heads, kv_heads, head_dim;
    bool tied;
} flavor;

static const flavor flavors[] = {
    {"debugmodel", 128, 512, 4, 4, 2, 64, true}, {"0.6B", 1024, 3072, 28, 16, 8, 128, true},
    {"1.7B", 2048, 6144, 28, 16, 8, 128, true},  {"4B", 2560, 9728, 36, 32, 8, 128, true},
    {"8B", 4096, 12288, 36, 32, 8, 128, false},  {"14B", 5120, 17408, 40, 40, 8, 128, false},
    {"32B", 5120, 25600, 64, 64, 8, 128, false},
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
