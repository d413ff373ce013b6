// LoRA adapters in Hugging Face PEFT's format (peft_type "LORA"), as the model sees them: which
// projections are adapted, the scale, and the adapter's tensors in one flat fp32 buffer, named
// as PEFT's adapter_model.safetensors names them. y = W x + s * B (A x), A (r, in), B (out, r),
// no bias; s = alpha / r, or alpha / sqrt(r) with rsLoRA.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "model/qwen3_config.h"

// The projections PEFT's target_modules may name, in the order a layer's tensors are laid out.
typedef enum lora_module {
    LORA_Q,
    LORA_K,
    LORA_V,
    LORA_O,
    LORA_GATE,
    LORA_UP,
    LORA_DOWN,
    LORA_N_MODULES
} lora_module;

#define LORA_ALL_LINEAR ((1u << LORA_N_MODULES) - 1u)

typedef struct lora_config {
    int rank;         // PEFT's r (> 0)
    float alpha;      // PEFT's lora_alpha
    float dropout;    // PEFT's lora_dropout, on the LoRA branch's input only; [0, 1)
    unsigned targets; // bit m: module m is adapted (LORA_ALL_LINEAR: "all-linear")
    bool use_rslora;  // s = alpha / sqrt(r) instead of alpha / r
} lora_config;

// "q_proj", ..., "down_proj".
const char *lora_module_name(lora_module m);
// The module named `name` (one of lora_module_name's), or -1.
int lora_module_of(const char *name);
// target_modules: the names (each a module's, or the one word "all-linear") to a bit set; an
// unknown name is an error listing the valid ones; `source` names where the list came from.
int lora_parse_targets(const char *const *names, int n, unsigned *targets, const char *source,
                       ct_error *err);
// The scale s.
float lora_scale(const lora_config *lc);
// Checks rank, alpha, dropout and targets; `source` names where they came from.
int lora_config_validate(const lora_config *lc, const char *source, ct_error *err);

// One adapter tensor: lora_A (rank, in) or lora_B (out, rank) of one module of one layer (and
// one expert of a sparse layer's MLP).
typedef struct lora_tensor {
    char name[160]; // PEFT's key: base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight
    int layer;
    lora_module module;
    int expert; // the expert of a sparse layer's MLP module, else -1
    bool is_b;  // lora_B (else lora_A)
    int64_t shape[2];
    size_t offset, numel; // in floats, into the adapter's buffer
} lora_tensor;

// The adapter's tensors in a fixed order: layer by layer; in a layer, the targeted modules in
// lora_module order (a sparse layer's MLP modules expert by expert: expert 0's gate, up, down,
// then expert 1's, ...), A then B for each. Each layer's tensors are one contiguous range
// [layer_lo[l], layer_hi[l]) of the buffer (empty when nothing in it is adapted).
typedef struct lora_layout {
    lora_config lc;
    lora_tensor *t;
    int n;
    size_t num; // floats in the buffer
    size_t *layer_lo, *layer_hi;
    int *layer_first; // the index in t of layer l's first tensor (n_layers + 1 entries)
    int n_layers;
} lora_layout;

int lora_layout_init(lora_layout *L, const qwen3_config *cfg, const lora_config *lc,
                     ct_error *err);
void lora_layout_free(lora_layout *L);
// The adapter's parameters a token uses: each expert's count K/E of theirs (as metrics count a
// sparse layer's K experts).
double lora_active_params(const lora_layout *L, const qwen3_config *cfg);
// The tensor named `name`, or NULL.
const lora_tensor *lora_layout_find(const lora_layout *L, const char *name);
// The tensor for (layer, module, expert, is_b), or NULL when that module is not adapted.
const lora_tensor *lora_layout_tensor(const lora_layout *L, int layer, lora_module m, int expert,
                                      bool is_b);
