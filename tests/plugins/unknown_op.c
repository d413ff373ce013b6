// Registers an op ctitan does not have ("rope_neox"), which it must refuse.
#include <ctitan/plugin.h>

static void never_called(void) {}

CTITAN_PLUGIN_EXPORT int ctitan_plugin_init(uint32_t api_version, ctitan_registry *reg) {
    (void)api_version;
    return ctitan_register_op(reg, "rope_neox", never_called, never_called, 0) ? 1 : 0;
}
