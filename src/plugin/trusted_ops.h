// Plugin trust: load the plugins, check them against the built-in ops, refuse or use what passes.
// The run setup (src/train/run_setup.c) is its one caller, for train, verify and check-kernels.
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

// Loads the plugins of `imports` into *s, logs what they override, and runs the parity check
// of their kernels against `builtin` in a child process, logging its table (log NULL: nothing
// is printed). Fills *r (kernel_check_free) and decides nothing. On error *s is closed. Call it
// before the process's first OpenMP parallel region (see kernel_check_isolated).
int trusted_ops_check(kernel_check_report *r, override_set *s, const char *imports,
                      const ct_ops *builtin, const kernel_check_shape *shape, FILE *log,
                      ct_error *err);

// With `imports` empty: nothing (*ops keeps the built-in table). Otherwise trusted_ops_check
// against *ops (the built-in table on entry), then the verdict: refuses with a one-line error,
// naming the op, tensor and difference, when the check fails, unless allow_mismatch: then it
// warns on `log` and on `warn` (NULL: only the log) and goes on. A plugin that crashes or hangs
// in the check is always refused. What passes goes into *ops. On error *s is closed.
int trusted_ops_setup(ct_ops *ops, override_set *s, const char *imports, bool allow_mismatch,
                      const kernel_check_shape *shape, FILE *log, FILE *warn, ct_error *err);
