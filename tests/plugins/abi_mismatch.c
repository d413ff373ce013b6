// A plugin built against a newer header: it passes CTITAN_PLUGIN_API_VERSION + 1 to
// register_op directly (what ctitan_register_op would do with that header), which ctitan
// must refuse. Its kernels must never run.
#include <ctitan/plugin.h>

static void never_called(void) {}

CTITAN_PLUGIN_EXPORT int ctitan_plugin_init(uint32_t api_version, ctitan_registry *reg) {
    (void)api_version;
    return reg->register_op(reg, CTITAN_PLUGIN_API_VERSION + 1, "rope_hf", never_called,
                            never_called, 0);
}
