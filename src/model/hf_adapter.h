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
// The load streams: tensor by tensor, a chunk at a time, into wherever the model holds each
// tensor (qwen3_params_write), and each tensor's file pages leave the process once copied.
int hf_load_weights(qwen3_model *m, hf_load_report *r, const st_set *s, const char *source,
                    ct_error *err);
// hf_load_weights for the flat ranges (ascending, disjoint; qwen3_range) of m's layout only:
// out receives their elements, concatenated in range order, each converted from the tensor's
// BF16/F16/F32 values. Only the elements inside the ranges are read (a rank loading its shard
// touches no other part of a tensor). The checks and messages are hf_load_weights' (missing,
// unexpected, shapes, dtypes), over every tensor whatever the ranges, so that every rank agrees.
// m gives only the layout (qwen3_init_layout is enough). A buffer the folder lacks reads as 0.
int hf_load_weights_ranges(const qwen3_model *m, hf_load_report *r, const st_set *s,
                           const char *source, const qwen3_range *ranges, int n_ranges, float *out,
                           ct_error *err);
// Reads DIR/config.json, builds the model (qwen3_init with `ops`) and loads its weights.
int hf_load_folder(qwen3_model *m, hf_load_report *r, const char *dir, const ct_ops *ops,
                   ct_error *err);
// The same for a model that is never trained: qwen3_init_forward_only, no gradients.
int hf_load_folder_forward_only(qwen3_model *m, hf_load_report *r, const char *dir,
                                const ct_ops *ops, ct_error *err);
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
// Reads flat elements [lo, lo + n) of param_mem's layout into dst: where a streamed save finds
// the weights (a checkpoint's files), so that the model need not be in memory.
typedef int (*hf_read_fn)(float *dst, uint64_t lo, uint64_t n, void *ctx, ct_error *err);
// hf_save_folder (buffers: hf_save_folder_with_buffers) with each tensor read through `read`
// a chunk at a time as it is written: the same files, byte for byte, holding one chunk of the
// model in memory. m gives the config and the layout only (qwen3_init_layout is enough).
int hf_save_folder_from(const qwen3_model *m, const char *dir, ct_dtype dtype,
                        uint64_t max_shard_bytes, bool buffers, hf_read_fn read, void *ctx,
                        ct_error *err);
// DIR/config.json alone, as hf_save_folder writes it (torch_dtype from dtype): a checkpoint
// whose weights are in shards of its own still names its model.
int hf_save_config(const qwen3_config *cfg, const char *dir, ct_dtype dtype, ct_error *err);
void hf_report_free(hf_load_report *r);
