// Parity before trust: every overridden op runs against the built-in kernel on random inputs,
// forward and backward, and is trusted only within the op's tolerance.
//
// Each op runs on two cases: "model", shaped like the model being trained (its hidden size,
// heads, head_dim, FFN and vocabulary, one sequence of min(seq_len, 256) tokens, at most 16
// experts), and "awkward", small odd sizes that catch tail loops and wrong strides. The model
// case calls in place where the ABI allows aliasing and the model does it (rope_hf, the rmsnorm
// backward, cross_entropy's backward); the awkward case calls out of place.
//
// For each output and gradient tensor the check reports max abs difference and max relative
// difference, the latter normwise: max|plugin - builtin| / max|builtin|, so values near zero
// do not blow it up. A non-finite value where the built-in has a finite one fails. Outputs
// that are overwritten start as NaN (so an element the plugin forgets fails), and so do the
// attention and MoE state and scratch; accumulated gradients start from the same random values
// on both sides (so `=` instead of `+=` fails). Each side's backward runs on that side's own
// forward state. A forward-only override runs with the built-in backward: its backward rows
// are reported for the ops whose backward reads saved state (rmsnorm, attention), and left
// out for the stateless ones, where they would compare the built-in with itself.
#pragma once
#include <stdbool.h>
#include <stdio.h>

#include "core/error.h"
#include "ops/ops.h"
#include "plugin/override.h"

// The model geometry the "model" case mirrors.
typedef struct kernel_check_shape {
    int T;             // sequence length (the check uses min(T, 256))
    int C;             // hidden size
    int NH, NKV, D;    // query heads, kv heads, head_dim
    int F;             // dense FFN size
    int V;             // vocabulary
    int E, K, FM;      // experts, experts per token, expert FFN size (E = 0: dense model)
    float eps;         // rms_norm_eps
    double rope_theta; // for realistic cos/sin tables
} kernel_check_shape;

// One compared tensor.
typedef struct kernel_check_row {
    char op[24];        // "rope_hf"
    char direction[12]; // "forward" | "backward"
    char tensor[12];    // "out", "rstd", "dinp", "dweight", ...
    char case_name[12]; // "model" | "awkward"
    double max_abs;     // max |plugin - builtin| (inf if non-finite)
    double max_rel;     // max_abs / max |builtin|
    double tolerance;   // the op's limit on max_rel
    bool pass;
    // built-in time / plugin time for this op and direction on the model case (the same on
    // each of its rows; best of 3 after a warm-up); 0 when not measured: awkward rows, and the
    // backward of a forward-only override (the built-in's own).
    double speedup;
} kernel_check_row;

typedef struct kernel_check_report {
    kernel_check_row *rows; // malloc'd
    int n_rows;
    bool passed;     // every row passed
    bool crashed;    // the child died (kernel_check_isolated only)
    char crash[256]; // "rope_hf forward (model case): killed by SIGSEGV"
} kernel_check_report;

// The relative tolerance of an op (rope_hf and swiglu 1e-6, rmsnorm, cross_entropy and matmul
// 1e-5, attention and moe_experts 1e-4).
double kernel_check_tolerance(override_op op);

// Runs every override of `s` in this process against `builtin` (the table the model would use
// without plugins). `progress`, if not NULL, gets a line "checking OP DIRECTION (CASE)" before
// each run, flushed, so that a crash can be placed. Returns 0 (the report says whether it
// passed) or -1 with *err set (a bad shape, a set entry without its kernels, out of memory).
int kernel_check_run(kernel_check_report *r, const override_set *s, const ct_ops *builtin,
                     const kernel_check_shape *shape, FILE *progress, ct_error *err);

// How long the child may stay silent (train, verify, check-kernels): generous for the
// check's few hundred tokens; a kernel that needs longer is broken.
#define KERNEL_CHECK_TIMEOUT_S 600.0

// The same in a forked child, so a plugin that crashes or hangs cannot take the caller down:
// the rows come back over a pipe; a child killed by a signal, exiting early (as under ASan,
// which catches a SIGSEGV and exits 1) or silent for `timeout_s` seconds (no new progress line;
// then killed; <= 0: no limit) gives r->crashed, r->crash naming the step it was at:
// "swiglu forward (model case): killed by SIGSEGV", "...: exited with code 1 without
// finishing", "...: no answer after 600 s". Returns -1 only for the check's own errors (fork,
// pipe, out of memory, a bad shape; in this process or in the child). Must be called before
// this process runs its first OpenMP parallel region (libgomp's thread pool does not survive
// fork); trainer and verify call it first thing.
int kernel_check_isolated(kernel_check_report *r, const override_set *s, const ct_ops *builtin,
                          const kernel_check_shape *shape, double timeout_s, ct_error *err);

void kernel_check_free(kernel_check_report *r);

// The table for people: op, direction, tensor, case, max abs, max rel, tolerance, pass/FAIL,
// speed vs built-in.
void kernel_check_print(const kernel_check_report *r, const override_set *s, FILE *f);
// {"passed": bool, "crashed": null | "...", "rows": [{"op", "direction", "tensor", "case",
// "max_abs", "max_rel", "tolerance", "pass", "speedup"}, ...]} on one line, no newline after it
// (so that it can be embedded); non-finite numbers and a speedup not measured are null.
void kernel_check_json(const kernel_check_report *r, FILE *f);

// The first failing row as one line, for refusals: "rope_hf forward out (model case): max abs
// 1.2e+00, max rel 3.4e-01 > tolerance 1e-06"; the crash text when the child crashed. Empty
// when everything passed.
void kernel_check_first_failure(const kernel_check_report *r, char *buf, size_t cap);
