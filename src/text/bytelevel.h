// GPT-2's byte-level alphabet (bytes_to_unicode): each byte is shown as one printable character
// (space -> U+0120 'Ġ', newline -> U+010A 'Ċ'), so that a BPE vocabulary of "characters" covers
// all byte strings. tokenizer.json stores vocab and merges in this form.
#pragma once
#include <stddef.h>
#include <stdint.h>

// The code point that shows byte b.
uint32_t bytelevel_char(unsigned char b);
// The byte that code point cp shows, or -1 when cp is not in the alphabet.
int bytelevel_byte(uint32_t cp);
// Writes the byte-level form of bytes[0..n) to out (at most 2n bytes); returns its length.
size_t bytelevel_encode(char *out, const char *bytes, size_t n);
// The ByteLevel decoder's rule for one token string (valid UTF-8): when every character is in
// the alphabet, the bytes they show; otherwise (an added token such as "<think>" can contain
// anything) the token's own UTF-8. Writes at most n bytes to out; returns the length.
size_t bytelevel_decode(char *out, const char *tok, size_t n);
