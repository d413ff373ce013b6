// The problems of one config load, collected so that a config with several is reported whole.
// Its own file because loading, torchtitan's keys (config_compat.c) and the cross-key checks
// (config_validate.c) all report through it: kept in config_load.c it tied the three into a
// circle of files calling each other.
#include <stdio.h>
#include <string.h>

#include "train/config_internal.h"

void config_errors_add(config_errors *e, const ct_error *err) {
    if (e->n < CONFIG_MAX_ERRORS)
        snprintf(e->msg[e->n++], sizeof e->msg[0], "%.*s", (int)sizeof e->msg[0] - 1, err->msg);
    else
        e->dropped++;
}

int config_errors_report(const config_errors *e, ct_error *err) {
    if (e->n == 0) return 0;
    size_t len = 0, cap = sizeof err->msg;
    err->msg[0] = '\0';
    int shown = 0;
    for (int i = 0; i < e->n; i++) {
        size_t n = strlen(e->msg[i]);
        if (len + n + 64 > cap) break; // keep room for the "more" line
        len += (size_t)snprintf(err->msg + len, cap - len, "%s%s", i ? "\n" : "", e->msg[i]);
        shown++;
    }
    int more = e->n - shown + e->dropped;
    if (more > 0) snprintf(err->msg + len, cap - len, "\n(and %d more problems)", more);
    return -1;
}
