// One document of a .jsonl file: a line holding a JSON object with a string "text" field, a
// conversation ("messages"), or pre-tokenized ids ("ids", and "mask" for a conversation).
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "core/error.h"

// A buffer for texts with escapes, reused across lines (zero it first, jsonl_buf_free at the end).
typedef struct jsonl_buf {
    char *p;
    size_t cap;
} jsonl_buf;

void jsonl_buf_free(jsonl_buf *buf);

typedef enum { JSONL_TEXT, JSONL_CHAT, JSONL_IDS } jsonl_kind;
extern const char *const jsonl_kind_names[]; // "text", "messages", "ids"

// What a line holds: "messages" (a conversation; with "text" too it is an error), else "ids"
// (any "text" beside them is their rendering, not read), else "text". For JSONL_TEXT the text is
// the "text" string's exact bytes (NUL included; a pointer into the line when it has no
// escapes, else into buf; not checked for UTF-8); for the others *root is the parsed line
// (cJSON_Delete it). The error, without file or line, names what is wrong.
typedef struct jsonl_doc {
    jsonl_kind kind;
    const char *text; // JSONL_TEXT
    size_t len;
    cJSON *root; // JSONL_CHAT, JSONL_IDS
} jsonl_doc;
int jsonl_doc_parse(jsonl_doc *d, jsonl_buf *buf, const char *line, size_t n, ct_error *err);

// A pre-tokenized line (JSONL_IDS): checks "ids" (integers in [0, vocab_size); vocab_size <= 0:
// no upper bound) and, if present, "mask" (0 or 1 each, as many), and gives their count.
int jsonl_ids_check(const cJSON *root, int32_t vocab_size, size_t *n, bool *has_mask,
                    ct_error *err);
// Copies a checked line's ids and (when it has one and mask is non-NULL) its mask.
void jsonl_ids_copy(const cJSON *root, int32_t *ids, uint8_t *mask);
