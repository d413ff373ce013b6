// A model folder's generation_config.json (HF's GenerationConfig as saved; also config.json,
// whose eos_token_id is HF's fallback): the settings ctitan's generate takes from it, and those
// HF's generate would apply that ctitan does not do, for the CLI to name.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "core/error.h"

enum { GEN_MAX_EOS = 16, GEN_MAX_UNSUPPORTED = 20 };

typedef struct gen_file_config {
    int32_t eos[GEN_MAX_EOS]; // eos_token_id: an integer or a list of them (a negative id
    int n_eos;                // matches no token); 0 when absent or null
    bool do_sample;           // false when absent or null
    // NAN when absent or null
    double temperature, top_k, top_p, min_p, repetition_penalty;
    // Settings set to something other than their off value: each key (static strings), with its
    // number, or NAN for a list or object where only null (or an empty list) is off.
    const char *unsupported[GEN_MAX_UNSUPPORTED];
    double unsupported_value[GEN_MAX_UNSUPPORTED];
    int n_unsupported;
} gen_file_config;

// Parses len bytes of text as the file `path` names. An error (one line naming path and the key):
// text that is not a JSON object, an eos_token_id that is not 32-bit integers (at most 16), a
// setting above that is not a number (do_sample: a boolean) or null.
int gen_config_parse(gen_file_config *out, const char *text, size_t len, const char *path,
                     ct_error *err);
// The file at path; *found is false (and the result 0, *out empty) when it is not there.
int gen_config_read(gen_file_config *out, bool *found, const char *path, ct_error *err);
// eos_token_id of a parsed JSON object (the same rules; config.json's, HF's fallback): *n ids,
// 0 when absent or null.
int gen_eos_read(int32_t eos[GEN_MAX_EOS], int *n, const cJSON *root, const char *path,
                 ct_error *err);
