// Hugging Face folder <-> model: config.json plus safetensors weights found by name.
// Today native names are HF names; this is where a layout change (fused QKV, fused gate/up)
// splits and joins tensors at load and save.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "model/qwen3.h"

typedef struct hf_load_report {
    int n_loaded;
    char **missing; // expected by the model, absent on disk
    int n_missing;
    char **unexpected; // on disk, unknown to the model
    int n_unexpected;
    ct_dtype source_dtype; // dtype of the loaded tensors (the first one, if mixed)
    bool mixed_dtypes;
    int n_files; // safetensors files read
} hf_load_report;

// Copies every model parameter from `s` (converting to fp32), checking shapes. A shape mismatch
// is an error naming the tensor, expected vs found. Missing tensors are an error listing them;
// unexpected ones are only reported. A tied lm_head is absent by design and not missing.
// Buffers (qwen3_param.buffer: the MoE "model.layers.{i}.mlp.expert_bias") are not HF's: absent,
// they are not missing and keep their values (zero after qwen3_init); present (a ctitan
// checkpoint's model.safetensors has them), they are loaded like any parameter.
// `source` names the folder or file, for messages.
int hf_load_weights(qwen3_model *m, hf_load_report *r, const st_set *s, const char *source,
                    ct_error *err);
// Reads DIR/config.json, builds the model (qwen3_init with `ops`) and loads its weights.
int hf_load_folder(qwen3_model *m, hf_load_report *r, const char *dir, const ct_ops *ops,
                   ct_error *err);
// Writes DIR/config.json and the weights (no lm_head.weight when tied, no buffers) as `dtype`
// (F32, BF16, F16), sharded by max_shard_bytes (0 = one file), in save_pretrained's order (a
// sparse layer's router, then its experts by index, between attention and the norms). Creates
// DIR if needed.
int hf_save_folder(const qwen3_model *m, const char *dir, ct_dtype dtype, uint64_t max_shard_bytes,
                   ct_error *err);
// hf_save_folder plus the buffers, after each layer's experts: a ctitan checkpoint's model,
// which hf_load_weights reads back whole (transformers would list the buffers as unexpected).
int hf_save_folder_with_buffers(const qwen3_model *m, const char *dir, ct_dtype dtype,
                                uint64_t max_shard_bytes, ct_error *err);
void hf_report_free(hf_load_report *r);
