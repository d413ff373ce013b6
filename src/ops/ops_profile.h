// --debug.profile_ops: a table that wraps another and times every call, for a per-op table of
// milliseconds per step and each op's share of the step.
//
// The plugin ABI's kernels take no context argument, so the wrapped table and the timers are
// file-level state: one profiled table per process (the trainer's). Calls come from one thread.
// The kernel state is not among them: it stays the backend's (ct_ops.kernel_state, copied with
// the table; the bf16 entries get the caller's table, which carries it).
#pragma once
#include <stdio.h>

#include "ops/ops.h"

// *out = `inner` with every kernel timed. `inner` must outlive the profiling.
void ops_profile_wrap(ct_ops *out, const ct_ops *inner);
// Forgets the times so far (the trainer drops its first, warm-up step).
void ops_profile_reset(void);
// The table: per op and direction, calls and milliseconds per step and the share of
// `step_seconds` (the mean wall time of a step over `steps` steps), then what the ops do not
// cover (data, communication, host work).
void ops_profile_print(FILE *f, double step_seconds, int steps);
