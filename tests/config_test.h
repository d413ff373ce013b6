// Helpers of the config tests (test_train_config.c, test_config_compat.c).
#pragma once
#include <stdarg.h>
#include <stdio.h>

#include "train/config.h"

static const char *tmp_dir; // CTITAN_TMP, set by main

// Writes `text` to tmp_dir/name; the path stays valid for the next 7 calls.
static const char *write_file(const char *name, const char *text) {
    static char path[8][1024];
    static int next;
    char *p = path[next++ % 8];
    snprintf(p, 1024, "%s/%s", tmp_dir, name);
    FILE *f = fopen(p, "wb");
    fputs(text, f);
    fclose(f);
    return p;
}

// config_load_noted with the arguments of a va_list, ended by NULL.
static int load_va(ct_config *c, config_notes *notes, const char *toml, ct_error *err, va_list ap) {
    char *argv[32];
    int argc = 0;
    for (char *a; (a = va_arg(ap, char *)) && argc < 32;) argv[argc++] = a;
    return config_load_noted(c, notes, toml, argc, argv, err);
}
