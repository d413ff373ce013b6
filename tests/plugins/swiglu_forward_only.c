// A correct forward-only "swiglu": the same float operations as the built-in (bit-identical),
// registered with CTITAN_OP_FORWARD_ONLY so the built-in backward runs. Only a forward counter.
#include <ctitan/plugin.h>

// The built-in's silu (its vectorisable exp), so that the bits are the built-in's.
#include "../../src/ops/vec_math.h"

static uint64_t forward_calls;

static void swiglu_forward(float *out, const float *gate, const float *up, int64_t n) {
    forward_calls++;
    for (int64_t i = 0; i < n; i++) out[i] = silu(gate[i]) * up[i];
}

CTITAN_PLUGIN_EXPORT int ctitan_plugin_init(uint32_t api_version, ctitan_registry *reg) {
    (void)api_version;
    if (ctitan_register_op(reg, "swiglu", (ctitan_fn)swiglu_forward, NULL, CTITAN_OP_FORWARD_ONLY))
        return 1;
    return ctitan_register_counters(reg, "swiglu", &forward_calls, NULL) ? 1 : 0;
}
