// The registry of built-in Qwen3 shapes ("flavors"), as torchtitan names them.
#pragma once
#include "core/error.h"
#include "model/qwen3_config.h"

// Fills *c with the flavor's architecture. Unknown names are an error suggesting the closest.
int flavor_lookup(qwen3_config *c, const char *name, ct_error *err);
// The flavor names, for help text; returns the count.
int flavor_names(const char *const **names);
