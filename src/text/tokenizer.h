// The Qwen2/Qwen3 tokenizer: byte-level BPE driven by a Hugging Face tokenizer.json, giving the
// ids that HF `tokenizers` gives.
//
// Encoding, in HF's order:
//   1. added tokens (<|im_end|>, <think>, ...) are matched whole in the raw text;
//   2. each stretch between them is NFC-normalised (utf8proc);
//   3. split by the pre-tokenizer regex from the file (PCRE2, UTF + UCP, JIT);
//   4. each piece's bytes are merged by BPE rank (a per-thread cache skips repeated words).
// Anything in a tokenizer.json that this does not implement is a "not supported: X" error at
// load time, never a silent difference.
//
// A tokenizer is read-only once loaded and can be shared by threads; each thread encodes with
// its own tok_encoder (scratch buffers, regex match data, word cache).
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

typedef struct tokenizer tokenizer;
typedef struct tok_encoder tok_encoder;

// A growable id array that tok_encode appends to.
typedef struct tok_ids {
    int32_t *v;
    size_t n, cap;
} tok_ids;

void tok_ids_free(tok_ids *ids);

// Loads DIR/tokenizer.json and, when present, DIR/tokenizer_config.json.
int tok_load(tokenizer **out, const char *dir, ct_error *err);
// The same from memory (config may be NULL); `what` and `config_what` name the two sources in
// errors (config_what NULL: "tokenizer_config.json").
int tok_load_json(tokenizer **out, const char *json, size_t len, const char *config,
                  size_t config_len, const char *what, const char *config_what, ct_error *err);
void tok_free(tokenizer *t);

// One more than the largest id (151669 for Qwen3; the model's embedding may be larger).
int32_t tok_vocab_size(const tokenizer *t);
// The id of a token as tokenizer.json spells it (byte-level form, "Ġthe", or an added token's
// content, "<|im_end|>"), or -1.
int32_t tok_token_id(const tokenizer *t, const char *token);
// The token's string as tokenizer.json spells it, or NULL for an unused id.
const char *tok_token_str(const tokenizer *t, int32_t id);
bool tok_is_special(const tokenizer *t, int32_t id);
// The end-of-document id that pretraining data puts after each document: <|endoftext|> when
// the vocabulary has it, else tokenizer_config.json's eos_token; -1 if neither.
int32_t tok_eos_id(const tokenizer *t);

int tok_encoder_new(tok_encoder **out, const tokenizer *t, ct_error *err);
void tok_encoder_free(tok_encoder *e);
// Appends the ids of text[0..len) to ids. The text must be valid UTF-8: anything else is an
// error naming the byte offset (readers of files repair first, see core/utf8.h).
int tok_encode(tok_encoder *e, tok_ids *ids, const char *text, size_t len, ct_error *err);

// The text of ids, as HF's decode: tokens' bytes joined, then invalid UTF-8 (a multi-byte
// character cut between ids) replaced by U+FFFD. skip_special drops special added tokens.
// An id outside the vocabulary is an error. *out is malloc'd and NUL-terminated.
int tok_decode(const tokenizer *t, char **out, size_t *out_len, const int32_t *ids, size_t n,
               bool skip_special, ct_error *err);

// The bytes of one id as tok_decode joins them (before the UTF-8 repair), a view into the
// tokenizer: nothing is allocated. A special token is empty with skip_special. -1 for an id
// outside the vocabulary. Streaming decoders append these and repair what is complete.
int tok_id_bytes(const tokenizer *t, int32_t id, bool skip_special, const char **bytes, size_t *len,
                 ct_error *err);

// Offsets where text can be cut so that encoding the pieces separately and concatenating the ids
// gives exactly the ids of the whole (for parallel encoding of one long document). Writes up to
// max_cuts increasing offsets in (0, len), about `target` bytes apart, and returns how many.
// Returns 0 when this tokenizer's pre-tokenizer is not one for which cuts are known to be safe.
size_t tok_cut_points(const tokenizer *t, size_t *cuts, size_t max_cuts, const char *text,
                      size_t len, size_t target);
