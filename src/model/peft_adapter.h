// Hugging Face PEFT's LoRA adapter folder, both ways: adapter_config.json (peft_type "LORA") and
// adapter_model.safetensors, whose tensors land in (and come from) lora.h's flat fp32 buffer.
// Reading is strict: every PEFT option that would change what the adapter computes (DoRA,
// per-module ranks, biases, extra trained modules, ...) is refused with one line naming it, as is
// every tensor that is missing, unexpected or of the wrong shape.
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "core/error.h"
#include "io/safetensors.h"
#include "model/lora.h"

#define PEFT_CONFIG_NAME "adapter_config.json"
#define PEFT_WEIGHTS_NAME "adapter_model.safetensors"
#define PEFT_PICKLE_NAME "adapter_model.bin"

typedef struct peft_config {
    lora_config lc;        // r, lora_alpha, lora_dropout, target_modules, use_rslora
    char base_model[1024]; // base_model_name_or_path ("" when absent or null)
} peft_config;

// Parses adapter_config.json's text; `file` names it in messages. PEFT's defaults fill what is
// absent (r 8, lora_alpha 8, lora_dropout 0, bias "none"), except target_modules, which must be
// given. task_type must be "CAUSAL_LM" (or absent/null): other tasks wrap the model differently.
int peft_config_parse(peft_config *pc, const char *text, size_t len, const char *file,
                      ct_error *err);
// DIR/adapter_config.json.
int peft_config_load(peft_config *pc, const char *dir, ct_error *err);
// The JSON PEFT's save_pretrained writes (keys sorted, indent 2), with target_modules an explicit
// sorted list of names (never "all-linear", so that PEFT adapts exactly what was trained). *out
// is malloc'd and NUL-terminated.
int peft_config_text(char **out, size_t *len, const peft_config *pc, ct_error *err);

// Checks the adapter tensors of `f` against the layout: every tensor of L present once, nothing
// else (a tensor of a module target_modules leaves out is named as such), each 2-D with L's shape
// (a rank other than L's r is reported as r disagreeing with the config), each F32, BF16 or F16.
// Keys are PEFT's on-disk keys (base_model.model.model.layers...), or the same without the
// "base_model.model." prefix (what transformers' own adapter integration saves and loads).
// `source` names the file in messages.
int peft_tensors_check(const lora_layout *L, const st_file *f, const char *source, ct_error *err);
// peft_tensors_check, then each tensor converted to fp32 at its offset in buf (L->num floats).
// buf is untouched when a check fails.
int peft_tensors_read(float *buf, const lora_layout *L, const st_file *f, const char *source,
                      ct_error *err);
// The layout's tensor that an adapter key names (either spelling above), or NULL. *untargeted
// (may be NULL) is set to the module a LoRA key of this model's form adapts when target_modules
// leaves that module out, else -1.
const lora_tensor *peft_key_tensor(const lora_layout *L, const char *key, int *untargeted);
// Writes buf's tensors under PEFT's keys as F32 with metadata {"format": "pt"}, atomically.
int peft_tensors_write(const char *path, const lora_layout *L, const float *buf, ct_error *err);

// An adapter folder, loaded for a model of geometry cfg.
typedef struct peft_adapter {
    peft_config pc;
    lora_layout L; // from cfg and pc.lc
    float *buf;    // L.num floats
} peft_adapter;

// Reads DIR/adapter_config.json and DIR/adapter_model.safetensors (mapped, converted straight into
// buf). A folder with only adapter_model.bin (a pickle) is refused: convert it to safetensors.
int peft_adapter_load(peft_adapter *a, const char *dir, const qwen3_config *cfg, ct_error *err);
void peft_adapter_free(peft_adapter *a);
// Writes DIR/adapter_model.safetensors and DIR/adapter_config.json (creating DIR): a folder
// PeftModel.from_pretrained loads. pc->lc must be L->lc (checked).
int peft_adapter_save(const char *dir, const peft_config *pc, const lora_layout *L,
                      const float *buf, ct_error *err);

