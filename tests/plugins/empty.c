// A plugin that loads fine and overrides nothing.
#include <ctitan/plugin.h>

CTITAN_PLUGIN_EXPORT int ctitan_plugin_init(uint32_t api_version, ctitan_registry *reg) {
    (void)api_version, (void)reg;
    return 0;
}
