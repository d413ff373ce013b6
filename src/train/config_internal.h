// Shared between config.c (loading) and config_validate.c (cross-key checks).
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "train/config.h"

#define CONFIG_ORIGIN_MAX (CT_CONFIG_PATH_MAX + 32)
#define CONFIG_MAX_KEYS 96

// Where each key's value came from ("FILE:LINE", "command line --x.y"); "" = the default.
typedef struct config_origins {
    char where[CONFIG_MAX_KEYS][CONFIG_ORIGIN_MAX];
} config_origins;

// Index of "section.key" (full[0..len)) in the key table, or -1.
int config_key_index(const char *full, size_t len);
// Whether a CONFIG_STR value is one of the key's choices; if not, *suggestion points at the
// closest choice inside k->choices (ended by '|' or NUL), or is NULL.
bool config_choice_ok(const config_key *k, const char *s, const char **suggestion);
// "one of \"a\", \"b\"".
void config_choices_text(char *out, size_t cap, const config_key *k);
// config_validate's checks; with origins (may be NULL) the message starts with where the
// offending value was set.
int config_check(const ct_config *c, const config_origins *o, ct_error *err);
