// User kernels: loading plugins (include/ctitan/plugin.h) named by --override.imports, keeping
// what each one registered, and building the op table the model runs with.
//
// Life of an override: override_load dlopens each library and calls its ctitan_plugin_init,
// which registers ops through the registry; kernel_check.h then runs every override against
// the built-in kernel; override_apply puts the trusted kernels into a copy of the op table;
// override_report_calls prints the plugin's own call counters at the end.
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "core/error.h"
#include "ctitan/plugin.h"
#include "ops/ops.h"

// The override points, in the order reports list them.
typedef enum override_op {
    OVERRIDE_RMSNORM,
    OVERRIDE_ROPE_HF,
    OVERRIDE_ATTENTION,
    OVERRIDE_SWIGLU,
    OVERRIDE_MOE_EXPERTS,
    OVERRIDE_CROSS_ENTROPY,
    OVERRIDE_MATMUL,
    OVERRIDE_N_OPS
} override_op;

#define OVERRIDE_MAX_LIBS 16
#define OVERRIDE_PATH_MAX 1024

typedef struct override_entry {
    bool set;
    int lib;                  // index into override_set.libs
    ctitan_fn forward;        // the op's forward type (plugin.h), cast
    ctitan_fn backward;       // NULL when forward_only
    bool forward_only;        // the built-in backward runs on the plugin's forward state
    ctitan_fn state_floats;   // attention / moe_experts: the plugin's sizes, or NULL
    ctitan_fn scratch_floats; //   (NULL = the built-in's)
    const uint64_t *forward_calls, *backward_calls; // the plugin's counters, or NULL
} override_entry;

typedef struct override_set {
    int n_libs;
    char libs[OVERRIDE_MAX_LIBS][OVERRIDE_PATH_MAX]; // as given in override.imports
    void *handles[OVERRIDE_MAX_LIBS];
    override_entry ops[OVERRIDE_N_OPS];
} override_set;

// "rmsnorm", "rope_hf", ...; override_op_index returns -1 for an unknown name.
const char *override_op_name(override_op op);
int override_op_index(const char *name);

// Loads the comma-separated libraries of `imports` ("" loads none) into *s (zeroed first).
// Errors name the library: file not found, not a shared library, no ctitan_plugin_init, ABI
// version mismatch, unknown op, an op registered twice (by one plugin or two), a registration
// that breaks a rule of plugin.h, an init that fails, a plugin that registers nothing. On error
// everything loaded so far is closed again.
int override_load(override_set *s, const char *imports, ct_error *err);
void override_close(override_set *s);
bool override_any(const override_set *s);

// *out = *base with every registered kernel in place of the built-in one (a forward-only
// override keeps base's backward; the workspace sizes are the plugin's where it gave them).
void override_apply(ct_ops *out, const ct_ops *base, const override_set *s);

// One line per override: "override: rope_hf forward+backward from ./librope.so".
void override_log(const override_set *s, FILE *log);

// The plugins' call counters: one line per counted override on `log` ("override calls:
// rope_hf forward 40 backward 40 (./librope.so)"), and a JSON object
// {"rope_hf": {"library": ..., "forward_calls": 40, "backward_calls": 40}, ...} written to
// `json` (NULL: not wanted). A counter the plugin did not register is reported as null.
void override_report_calls(const override_set *s, FILE *log);
void override_calls_json(const override_set *s, FILE *json);
