// One thread's encoder of documents: the state and the steps that the dataset's workers
// (data/dataset.c) and `ctitan tokenize`'s share, so a .txt piece, a .jsonl text and a
// conversation become the same ids (and mask) on both paths. The callers keep their own
// scheduling: the dataset encodes whole batches then appends them in order, tokenize writes
// each unit in order as soon as it is encoded.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "core/error.h"
#include "core/utf8.h"
#include "data/jsonl.h"
#include "text/chat_encode.h"
#include "text/tokenizer.h"

typedef struct doc_encoder {
    tok_encoder *enc;
    tok_ids ids;   // the documents encoded since the caller last set ids.n = 0, back to back
    uint8_t *mask; // parallel to ids where a conversation was encoded (as long as ids.cap)
    size_t mask_cap;
    jsonl_buf json;     // a .jsonl text with escapes, decoded
    utf8_scratch fixed; // a text with invalid UTF-8, repaired
    chat_scratch chat;  // the conversation rendered last (chat.text, chat.len)
} doc_encoder;

// Threads' encoders side by side, each on its own cache lines: every thread updates its ids.n
// for every word, and two sharing a line would make the threads take turns. `size` is the
// caller's struct, which starts with a doc_encoder; the array is zeroed.
void *doc_encoders_new(int n, size_t size, const tokenizer *tok, ct_error *err);
void doc_encoders_free(void *encoders, int n, size_t size);

// Room for `more` ids after ids.n, and a mask as long as the ids' capacity.
int doc_encoder_reserve(doc_encoder *d, size_t more);
// Appends text's ids, invalid UTF-8 repaired first (core/utf8.h): *n_replaced grows by the
// replacements, *first_bad (may be NULL) is set to the offset of the first ill-formed byte
// when there is one.
int doc_encode_text(doc_encoder *d, const char *text, size_t len, uint64_t *n_replaced,
                    size_t *first_bad, ct_error *err);
// Appends the ids of a conversation line (root: its "messages" and "tools"; a null "tools" is
// none), with its assistant mask in d->mask when `mask` (text/chat_encode.h).
int doc_encode_chat(doc_encoder *d, const tokenizer *tok, const chat_template *t, const cJSON *root,
                    bool mask, uint64_t *n_replaced, ct_error *err);
