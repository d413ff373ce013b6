// One document of a .jsonl file: a line holding a JSON object with a string "text" field.
#pragma once
#include <stddef.h>

#include <cjson/cJSON.h>

#include "core/error.h"

// Parses line[0..n) and finds its "text" string. On success *json owns the parsed object and
// *text, *len point into it (cJSON_Delete(*json) when done). The error says what is wrong
// (invalid JSON, no "text" field, "text" not a string, an escaped NUL) without file or line:
// the caller adds them. \u0000 is refused because cJSON's C string would end there and silently
// drop the rest of the document.
int jsonl_text(cJSON **json, const char **text, size_t *len, const char *line, size_t n,
               ct_error *err);
