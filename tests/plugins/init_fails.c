// A plugin that refuses to load, with a reason ctitan must print.
#include <ctitan/plugin.h>

CTITAN_PLUGIN_EXPORT int ctitan_plugin_init(uint32_t api_version, ctitan_registry *reg) {
    (void)api_version;
    ctitan_plugin_error(reg, "needs a GPU, none found");
    return 1;
}
