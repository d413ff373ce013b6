// The one call that train and verify make: load the plugins, check them, use what passes.
#pragma once
#include <stdbool.h>
#include <stdio.h>

#include "core/error.h"
#include "model/qwen3_config.h"
#include "ops/ops.h"
#include "plugin/kernel_check.h"
#include "plugin/override.h"

// The geometry of the model the check's "model" case mirrors.
kernel_check_shape kernel_check_shape_of(const qwen3_config *c, int seq_len);

// With `imports` empty: nothing (*ops keeps the built-in table). Otherwise loads the plugins
// into *s, logs what they override, runs the parity check in a child process and logs its
// table, then puts the overrides into *ops (the built-in table on entry, the check's
// reference). Refuses with a one-line error, naming the op, tensor and difference, when the
// check fails, unless allow_mismatch: then it warns on `log` and on `warn` (NULL: only the log)
// and goes on. A plugin
// that crashes or hangs in the check is always refused. Call it before the process's first
// OpenMP parallel region (see kernel_check_isolated).
int trusted_ops_setup(ct_ops *ops, override_set *s, const char *imports, bool allow_mismatch,
                      const kernel_check_shape *shape, FILE *log, FILE *warn, ct_error *err);
