// Merging a LoRA adapter into its base weights, as PEFT's merge_and_unload does for plain LoRA
// (fan_in_fan_out false): W + (B @ A) * scaling, in fp32. Per HF tensor (q_proj, ..., an
// expert's up_proj), so that a merged export streams tensor by tensor.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "core/error.h"
#include "io/safetensors.h"
#include "model/lora.h"
#include "model/peft_adapter.h"
#include "model/qwen3.h"

// A (rank, in) and B (out, rank) of the HF parameter `name`
// (model.layers.3.self_attn.q_proj.weight, model.layers.1.mlp.experts.5.up_proj.weight); false when
// the adapter leaves it alone.
bool lora_pair_of(const lora_layout *L, const char *name, const lora_tensor **A,
                  const lora_tensor **B);
// w holds elements [first, first + count) (row-major) of the (out, in) weight that A and B adapt;
// each gets s * (B @ A)[o][i] added, the product summed over the rank in fp32, then scaled, then
// added (PEFT's order). buf is the adapter's buffer (lora.h).
void lora_merge_range(float *w, uint64_t first, uint64_t count, const lora_tensor *A,
                      const lora_tensor *B, const float *buf, float s);
// The whole (out, in) tensor w of HF parameter `name`, with s = lora_scale(&L->lc); nothing
// happens when it is not adapted; a shape other than the adapter's is an error.
int lora_merge_tensor(float *w, const char *name, int64_t out, int64_t in, const lora_layout *L,
                      const float *buf, ct_error *err);

// The source of a merged export: a base HF folder (mapped) and an adapter folder, read through
// lora_merge_read a chunk at a time (hf_save_folder_from, ckpt_export_hf_from), so that neither
// the base nor the merged model is ever whole in memory; only the adapter is.
typedef struct lora_merge_src {
    qwen3_model m; // the base's geometry and layout only (qwen3_init_layout)
    st_set base;
    peft_adapter ad;
    float scale;
    int n_merged; // base tensors the adapter changes
    char base_dir[4096];
} lora_merge_src;

// Reads base_dir/config.json, checks every base tensor (names, shapes, dtypes, as
// hf_load_weights), and loads the adapter for that geometry.
int lora_merge_open(lora_merge_src *s, const char *base_dir, const char *adapter_dir,
                    ct_error *err);
// An hf_read_fn over s: flat elements [lo, lo + n) of s->m's layout, merged.
int lora_merge_read(float *dst, uint64_t lo, uint64_t n, void *ctx, ct_error *err);
void lora_merge_close(lora_merge_src *s);
