// UTF-8: the one rule for invalid input (the primitives are in core/utf8.h).
//
// The rule: the tokenizer itself only takes valid UTF-8 (tok_encode rejects anything else with
// the byte offset). Readers of user files (ctitan tokenize) repair input with utf8_repair, which
// replaces each maximal ill-formed subsequence with U+FFFD. That is what Python's
// bytes.decode("utf-8", errors="replace") and Rust's String::from_utf8_lossy do, so the ids
// match what Hugging Face sees after Python reads the same file with errors="replace".
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/utf8.h" // utf8_decode, utf8_valid_prefix, utf8_encode

#define UTF8_REPLACEMENT "\xEF\xBF\xBD" // U+FFFD

// Copies s to out with every maximal ill-formed subsequence replaced by U+FFFD. out must hold
// utf8_repair_bound(n) bytes. Returns the output length; *n_replaced counts the replacements.
size_t utf8_repair(char *out, const char *s, size_t n, size_t *n_replaced);
static inline size_t utf8_repair_bound(size_t n) {
    return 3 * n;
}
