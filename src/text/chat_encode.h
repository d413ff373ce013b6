// A conversation as training data: rendered with the model's chat template, invalid UTF-8
// repaired, encoded, and its assistant tokens marked. The one path from a "messages" line to
// ids and a mask, for the dataset (data/dataset.c) and `ctitan tokenize` alike, so the two give
// the same ids and mask for the same line.
#pragma once
#include <stdint.h>

#include <cjson/cJSON.h>

#include "core/error.h"
#include "core/utf8.h"
#include "text/chat.h"
#include "text/tokenizer.h"

// What chat_encode reuses from one call to the next (one per thread).
typedef struct chat_scratch {
    char *text; // the conversation rendered last, before the UTF-8 repair (malloc'd), and len
    size_t len;
    utf8_scratch fixed; // its repaired copy, when it needed one
} chat_scratch;
void chat_scratch_free(chat_scratch *s);

// Renders messages (and tools, which may be NULL) as apply_chat_template does for training: no
// generation prompt, enable_thinking not passed. Then invalid UTF-8 is repaired (core/utf8.h;
// the replacements are added to *n_replaced), the ids are appended to ids, and, when mask is
// not NULL, *mask (capacity *mask_cap) is grown to ids->cap and the conversation's assistant
// tokens are marked in it, parallel to its ids (text/chat_mask.h). The rendered text stays in
// s->text until the next call. Errors are the template's, the tokenizer's, or out of memory.
int chat_encode(chat_scratch *s, tok_encoder *enc, const tokenizer *tok, const chat_template *t,
                const cJSON *messages, const cJSON *tools, tok_ids *ids, uint8_t **mask,
                size_t *mask_cap, uint64_t *n_replaced, ct_error *err);
