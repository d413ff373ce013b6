// The Split pre-tokenizer of tokenizer.json (behavior "Isolated"): the regex from the file, run
// with PCRE2 in UTF and UCP mode (so \p{L}, \s and (?i) follow Unicode, as Oniguruma does in
// Hugging Face tokenizers) and JIT-compiled. Each match is one piece, and so is each stretch of
// text between matches.
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "core/error.h"

typedef struct pretok pretok;             // compiled pattern; read-only, shared by threads
typedef struct pretok_state pretok_state; // per-thread match data

int pretok_compile(pretok **out, const char *pattern, ct_error *err);
void pretok_free(pretok *p);
const char *pretok_pattern(const pretok *p);

int pretok_state_new(pretok_state **out, const pretok *p, ct_error *err);
void pretok_state_free(pretok_state *s);

// Calls emit(ctx, piece, len) for each piece of valid UTF-8 text[0..n), in order. Stops and
// returns emit's value when it is non-zero; -1 with err on a matcher failure.
typedef int (*pretok_emit)(void *ctx, const char *piece, size_t len);
int pretok_split(pretok_state *s, const char *text, size_t n, pretok_emit emit, void *ctx,
                 ct_error *err);
