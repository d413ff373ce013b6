// The architecture of a Qwen3 model, as Hugging Face's config.json describes it.
#pragma once
#include <stdbool.h>

#include "core/error.h"

typedef struct qwen3_config {
    int vocab_size;              // 151936 for released models (not the tokenizer's 151669)
    int hidden_size;             // C
    int intermediate_size;       // F, the SwiGLU width
    int num_hidden_layers;       // L
    int num_attention_heads;     // NH
    int num_key_value_heads;     // NKV; NH % NKV == 0
    int head_dim;                // D; its own field: NH*D is often not C
    int max_position_embeddings; // longest sequence the model was trained for
    float rms_norm_eps;
    double rope_theta;
    bool tie_word_embeddings; // lm_head is embed_tokens; no lm_head.weight on disk
    bool attention_bias;      // q/k/v/o projections carry biases
    char torch_dtype[16];     // "bfloat16", "float32", ... as declared (informational)
} qwen3_config;

// Parses `path` (a config.json). Fields HF defaults (head_dim = C/NH, num_key_value_heads =
// NH, rms_norm_eps = 1e-6, rope_theta = 10000, ...) take HF's defaults; wrong types, bad
// values, non-null rope_scaling and use_sliding_window=true are errors naming file and key.
int qwen3_config_load(qwen3_config *c, const char *path, ct_error *err);
// Writes a config.json that transformers loads as Qwen3ForCausalLM.
int qwen3_config_save(const qwen3_config *c, const char *path, ct_error *err);
// Checks internal consistency (positive sizes, NH % NKV == 0, even head_dim, ...).
// `source` names where the config came from, for the message.
int qwen3_config_validate(const qwen3_config *c, const char *source, ct_error *err);
