// The registry of built-in Qwen3 shapes ("flavors"), as torchtitan names them: dense
// (debugmodel, 0.6B ... 32B) and mixture-of-experts (debugmodel_moe, 30B-A3B, 235B-A22B).
#pragma once
#include "core/error.h"
#include "model/qwen3_config.h"

// Fills *c with the flavor's architecture. Unknown names are an error suggesting the closest.
// MoE flavors train with HF's load-balancing loss on (output_router_logits = true,
// router_aux_loss_coef = 0.001).
int flavor_lookup(qwen3_config *c, const char *name, ct_error *err);
// The flavor names, for help text; returns the count.
int flavor_names(const char *const **names);
