// Shared between config.c (loading) and config_validate.c (cross-key checks).
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "io/toml.h"
#include "train/config.h"

#define CONFIG_ORIGIN_MAX (CT_CONFIG_PATH_MAX + 32)
#define CONFIG_MAX_KEYS 128

// Where each key's value came from ("FILE:LINE", "command line --x.y"); "" = the default.
typedef struct config_origins {
    char where[CONFIG_MAX_KEYS][CONFIG_ORIGIN_MAX];
} config_origins;

// The key table (config.c) and its length.
extern const config_key config_table[];
extern const int config_n_keys;
// "section.key" into buf.
void config_full_name(char *buf, size_t cap, const config_key *k);
bool config_section_known(const char *section);
// A parsed value, or command-line text (strings verbatim, the rest parsed as TOML), into its
// field, checking type, range, length and choices; `where` names it in messages.
int config_key_set(ct_config *c, const config_key *k, const toml_value *v, const char *where,
                   ct_error *err);
int config_key_set_text(ct_config *c, const config_key *k, const char *text, const char *where,
                        ct_error *err);
// The table's defaults alone, then the ones that depend on other keys (tokenizer_path).
void config_defaults_raw(ct_config *c);
void config_resolve(ct_config *c);

// Index of "section.key" (full[0..len)) in the key table, or -1.
int config_key_index(const char *full, size_t len);
// Whether a CONFIG_STR value is one of the key's choices; if not, *suggestion points at the
// closest choice inside k->choices (ended by '|' or NUL), or is NULL.
bool config_choice_ok(const config_key *k, const char *s, const char **suggestion);
// "one of \"a\", \"b\"".
void config_choices_text(char *out, size_t cap, const config_key *k);
// config_validate's checks; with origins (may be NULL) the message starts with where the
// offending value was set. needs_data: training.dataset_path must be set.
int config_check(const ct_config *c, const config_origins *o, bool needs_data, ct_error *err);

// The problems of one load, so that a config with several is reported whole: one line each
// (config_errors.c).
#define CONFIG_MAX_ERRORS 32
typedef struct config_errors {
    int n, dropped;
    char msg[CONFIG_MAX_ERRORS][512];
} config_errors;
void config_errors_add(config_errors *e, const ct_error *err);
// 0 when there are none; else -1 with every message, one per line, in err.
int config_errors_report(const config_errors *e, ct_error *err);

// torchtitan compatibility (config_compat.c).
// Sections that hold only torchtitan keys ([profiling], [compile], [quantize.linear.float8],
// [hf_transformers], [training.data]).
bool config_compat_section_known(const char *section);
// The ctitan key a renamed torchtitan key ("training.data.name") stands for, or NULL.
const char *config_compat_renamed(const char *full);
// The key a user typing `full` means when spelling cannot tell ("training.dtype"), or NULL.
const char *config_compat_hint(const char *full);
// The inert torchtitan keys of `section` (NULL: all), for suggestions.
int config_compat_inert_names(const char **names, int cap, const char *section);
// A torchtitan key that has no effect here: 1 when the value is its neutral one (noted), -1
// with an error naming the nearest ctitan equivalent otherwise, 0 when the key is not one.
int config_compat_inert(const char *section, const char *key, const toml_value *v,
                        const char *where, config_notes *notes, ct_error *err);
// model.name, hf_assets_path, training/validation.dataset, last_save_model_only into ctitan's
// own keys; contradictions and hub ids are errors.
void config_compat_resolve(ct_config *c, const config_origins *o, config_errors *errs);

// lora.adapter_path's adapter_config.json into the [lora] keys left at their defaults; a set key
// that disagrees with the file is an error naming both values (config_lora.c).
void config_lora_adapter(ct_config *c, const config_origins *o, config_errors *errs);
