// A "swiglu" plugin whose forward dereferences NULL: the parity check must survive it (run it
// in a child) and report the crash instead of dying with it.
#include <ctitan/plugin.h>

static void swiglu_forward(float *out, const float *gate, const float *up, int64_t n) {
    (void)out, (void)gate, (void)up, (void)n;
    // Volatile twice: the compiler can neither prove the pointer NULL nor drop the store.
    volatile float *volatile bad = NULL;
    *bad = 1.0f;
}

// Never reached: the check runs the forward first.
static void swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                            const float *up, int64_t n) {
    (void)dout, (void)gate, (void)up;
    for (int64_t i = 0; i < n; i++) dgate[i] = dup[i] = 0.0f;
}

CTITAN_PLUGIN_EXPORT int ctitan_plugin_init(uint32_t api_version, ctitan_registry *reg) {
    (void)api_version;
    if (ctitan_register_op(reg, "swiglu", (ctitan_fn)swiglu_forward, (ctitan_fn)swiglu_backward, 0))
        return 1;
    return 0;
}
