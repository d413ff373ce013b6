// The architecture of a Qwen3 model, as Hugging Face's config.json describes it.
// qwen3_config.c: validation, the sparse-layer rule and the derived sizes; hf_config.c:
// config.json both ways.
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "core/error.h"

// The most layers config.json's mlp_only_layers may list (the largest Qwen3-MoE has 94 layers).
#define QWEN3_MAX_MLP_ONLY 256
// The most pipeline stages one model (one rank) holds.
#define QWEN3_MAX_PARTS 16
// Qwen3's vocabulary (the embedding's rows; the tokenizer has 151669 ids) and the token ids
// its config.json files name: <|endoftext|> and <|im_end|>.
#define QWEN3_VOCAB_SIZE 151936
#define QWEN3_BOS_TOKEN_ID 151643
#define QWEN3_EOS_TOKEN_ID 151645
// Room for the source config.json, written compactly (a released Qwen3's is about 1 KB).
#define QWEN3_HF_SOURCE_MAX 32768

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

    // Mixture of experts (Qwen3MoeForCausalLM, model_type "qwen3_moe"); num_experts == 0 is a
    // dense Qwen3ForCausalLM and the fields below are unused. See qwen3_layer_is_sparse.
    int num_experts;           // E, routed experts per sparse layer (no shared experts)
    int num_experts_per_tok;   // K, the router's top-k
    int moe_intermediate_size; // each expert's SwiGLU width (dense layers use intermediate_size)
    int decoder_sparse_step;   // layer i is sparse iff (i + 1) % decoder_sparse_step == 0 ...
    int n_mlp_only_layers;     // ... and i is not listed in mlp_only_layers
    int mlp_only_layers[QWEN3_MAX_MLP_ONLY];
    bool norm_topk_prob;         // renormalise the top-k probabilities to sum to 1
    bool output_router_logits;   // HF adds router_aux_loss_coef * aux to the loss
    double router_aux_loss_coef; // the load-balancing loss weight (HF default 0.001)
    // Expert parallelism (not in config.json): this model holds only experts
    // [expert_lo, expert_lo + local_experts) of every sparse layer (0: all num_experts), still
    // named by their global ids. The router stays whole (num_experts outputs).
    int expert_lo, local_experts;
    // Pipeline parallelism (not in config.json): this model is a rank's stages. Its
    // num_hidden_layers local layers are the global model's layers part_lo[0] ..
    // part_lo[0] + part_n[0] - 1, then part_lo[1] .. (one part per stage it holds), still named
    // by their global indices (qwen3_layer_id); n_parts 0: the whole model. no_embed: no
    // embedding (the first layer's input comes from the previous stage); no_head: no final norm
    // and lm_head (the last layer's output goes to the next stage).
    int n_parts;
    int part_lo[QWEN3_MAX_PARTS], part_n[QWEN3_MAX_PARTS];
    bool no_embed, no_head;

    // The config.json this config was read from, as compact JSON text; "" when it was built
    // otherwise (a flavor). qwen3_config_save writes its every field back (bos_token_id,
    // eos_token_id, transformers_version, unknown keys, ...), with the fields above in place of
    // the ones they were read from.
    char hf_source[QWEN3_HF_SOURCE_MAX];
} qwen3_config;

// The sizes the decoder and its kernels are called with, derived from a config and a batch
// of B sequences of T tokens. One definition for the model, its layout and the kernel check.
typedef struct qwen3_dims {
    int B, T, N;       // batch, sequence length, tokens (N = B*T)
    int C, NH, NKV, D; // hidden size, query heads, key/value heads, head_dim
    int F, V, L;       // dense MLP width, vocabulary, layers
    int E, K, Fm;      // experts, experts per token, expert MLP width; 0 when no layer is sparse
} qwen3_dims;

qwen3_dims qwen3_dims_of(const qwen3_config *c, int B, int T);

// HF's rule (i: a local layer, qwen3_layer_id gives its global index): layer i has a sparse MoE block iff i is not in mlp_only_layers, num_experts > 0
// and (i + 1) % decoder_sparse_step == 0. Every other layer has the dense MLP.
bool qwen3_layer_is_sparse(const qwen3_config *c, int layer);
// Local layer l's index in the global model (the same l but in a pipeline stage's model).
int qwen3_layer_id(const qwen3_config *c, int l);
// The experts a sparse layer of this model holds: local_experts, or all of them.
int qwen3_local_experts(const qwen3_config *c);
// How many layers are sparse.
int qwen3_num_sparse_layers(const qwen3_config *c);

// Parses `path` (a config.json). Fields HF defaults (head_dim = C/NH, num_key_value_heads =
// NH, rms_norm_eps = 1e-6, rope_theta = 10000, ...) take HF's defaults; wrong types, bad
// values, non-null rope_scaling and use_sliding_window=true are errors naming file and key.
int qwen3_config_load(qwen3_config *c, const char *path, ct_error *err);
// The same from config.json's text (len bytes); `path` names it in messages.
int qwen3_config_parse(qwen3_config *c, const char *text, size_t len, const char *path,
                       ct_error *err);
// Writes a config.json that transformers loads as Qwen3ForCausalLM (Qwen3MoeForCausalLM when
// num_experts > 0): the fields above, over every other field of hf_source kept as it was.
// torch_dtype is written under the key the source used ("dtype" for transformers 5, else
// "torch_dtype"); rope_theta where the source had it (top level, rope_parameters or both).
// Without a source, the keys transformers writes for Qwen3 take their defaults, and a model
// with Qwen3's vocabulary (151936) gets its token ids: bos_token_id 151643 (<|endoftext|>),
// eos_token_id 151645 (<|im_end|>), as the released Qwen3 config.json files have them; any
// other vocabulary gets none (transformers' default, None): its tokenizer is not known here.
int qwen3_config_save(const qwen3_config *c, const char *path, ct_error *err);
// What qwen3_config_save writes: *out (malloc'd, *out_len bytes); `path` names it in messages.
int qwen3_config_text(char **out, size_t *out_len, const qwen3_config *c, const char *path,
                      ct_error *err);
// Checks internal consistency (positive sizes, NH % NKV == 0, even head_dim, ...).
// `source` names where the config came from, for the message.
int qwen3_config_validate(const qwen3_config *c, const char *source, ct_error *err);
