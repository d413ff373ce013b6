// A Jinja2 subset for Hugging Face chat templates, rendering as transformers'
// apply_chat_template does: Jinja2 with trim_blocks and lstrip_blocks, the loopcontrols
// extension, the globals raise_exception and strftime_now, and tojson as
// json.dumps(x, ensure_ascii=False, indent=indent) (", " and ": " separators, keys in insertion
// order). Values print as Python's str() does: 1, 1.0, 0.1, True, None, ['a', 1].
// What it covers is listed in docs/architecture.md ("Chat templates"); anything else is an error
// naming the construct and its position ("chat_template:3:14: unsupported filter 'wordwrap'"),
// at parse time where it can be seen there. The reference in the tests is @huggingface/jinja.
#pragma once
#include <stddef.h>

#include <cjson/cJSON.h>

#include "core/error.h"

typedef struct jinja_template jinja_template;

// Parses src[0..len). name prefixes error messages: "name:LINE:COL: ..." (1-based; COL counts
// bytes).
int jinja_parse(jinja_template **out, const char *src, size_t len, const char *name, ct_error *err);
void jinja_free(jinja_template *t);
// Renders with vars (a cJSON object, or NULL: the template's globals) into a malloc'd,
// NUL-terminated *out. JSON numbers that are whole become Python ints, the others floats.
// Runtime errors (an undefined method called, raise_exception(...), a type error, a limit below
// passed) name the position.
int jinja_render(const jinja_template *t, const cJSON *vars, char **out, size_t *out_len,
                 ct_error *err);

// Limits against runaway templates; 0 keeps a limit as it is. Defaults: 64 MiB of output,
// 256 MiB of values made while rendering, 10 million loop iterations and macro calls together,
// and 200 nested macro calls.
typedef struct jinja_limits {
    size_t max_output, max_memory, max_steps, max_depth;
} jinja_limits;
void jinja_set_limits(jinja_template *t, const jinja_limits *limits);
