// UTF-8 primitives shared by every reader and writer of text (tokenizer, TOML, safetensors
// names, checkpoint export). Strict: well-formed means Unicode Table 3-7, so no overlongs, no
// surrogates and nothing above U+10FFFF. The repair rule for invalid input lives in text/utf8.h.
#pragma once
#include <stddef.h>
#include <stdint.h>

// Decodes the code point at s[0..n), n > 0. Returns its length (1..4) and sets *cp; for an
// ill-formed start returns minus the length of the maximal ill-formed subsequence (-1..-3),
// the unit that utf8_repair replaces by one U+FFFD. Never returns 0.
int utf8_decode(uint32_t *cp, const unsigned char *s, size_t n);
// Offset of the first ill-formed byte, or n when all of s is valid UTF-8.
size_t utf8_valid_prefix(const char *s, size_t n);
// Writes the UTF-8 form of cp (< 0x110000, not a surrogate) to out; returns 1..4.
int utf8_encode(char out[4], uint32_t cp);
