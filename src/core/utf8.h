// UTF-8 primitives shared by every reader and writer of text (tokenizer, TOML, safetensors
// names, checkpoint export). Strict: well-formed means Unicode Table 3-7, so no overlongs, no
// surrogates and nothing above U+10FFFF.
//
// The one rule for invalid input: the tokenizer itself only takes valid UTF-8 (tok_encode
// rejects anything else with the byte offset). Readers of user files (the dataset, ctitan
// tokenize) repair input with utf8_repair, which replaces each maximal ill-formed subsequence
// with U+FFFD. That is what Python's bytes.decode("utf-8", errors="replace") and Rust's
// String::from_utf8_lossy do, so the ids match what Hugging Face sees after Python reads the
// same file with errors="replace".
#pragma once
#include <stddef.h>
#include <stdint.h>

#define UTF8_REPLACEMENT "\xEF\xBF\xBD" // U+FFFD

// Decodes the code point at s[0..n), n > 0. Returns its length (1..4) and sets *cp; for an
// ill-formed start returns minus the length of the maximal ill-formed subsequence (-1..-3),
// the unit that utf8_repair replaces by one U+FFFD. Never returns 0.
int utf8_decode(uint32_t *cp, const unsigned char *s, size_t n);
// Offset of the first ill-formed byte, or n when all of s is valid UTF-8.
size_t utf8_valid_prefix(const char *s, size_t n);
// The length (0..3) of s's last bytes when they begin a character that more bytes could still
// complete: a streaming decoder holds them back; everything before them repairs as it would in
// the whole (utf8_repair's units never reach past a lead byte).
size_t utf8_incomplete_tail(const char *s, size_t n);
// Writes the UTF-8 form of cp (< 0x110000, not a surrogate) to out; returns 1..4.
int utf8_encode(char out[4], uint32_t cp);

// Copies s to out with every maximal ill-formed subsequence replaced by U+FFFD. out must hold
// utf8_repair_bound(n) bytes. Returns the output length; *n_replaced (may be NULL) counts the
// replacements.
size_t utf8_repair(char *out, const char *s, size_t n, size_t *n_replaced);
static inline size_t utf8_repair_bound(size_t n) {
    return 3 * n;
}

// A scratch buffer for utf8_repair_text, reused across calls (one per thread).
typedef struct utf8_scratch {
    char *p;
    size_t cap;
} utf8_scratch;

// *text[0..*len), repaired: when it is valid UTF-8 nothing changes and nothing is copied; else
// *text and *len become the repaired copy in scratch (valid until the next call), *first_bad
// (may be NULL) the offset of the first ill-formed byte in the input, and *n_replaced grows by
// the replacements. -1 only when scratch cannot grow (out of memory).
int utf8_repair_text(utf8_scratch *scratch, const char **text, size_t *len, uint64_t *n_replaced,
                     size_t *first_bad);
void utf8_scratch_free(utf8_scratch *scratch);
