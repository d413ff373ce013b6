// Added tokens (<|im_end|>, <think>, ...) are found whole in the raw text before anything else
// runs, the leftmost match first and the longest at that position, as HF's AddedVocabulary does
// with its LeftmostLongest automaton.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

typedef struct added_token {
    char *content;
    size_t len;
    int32_t id;
    bool special;
} added_token;

typedef struct added_set {
    added_token *tok; // sorted by first byte, then longest first
    int n;
    int first[257]; // tokens starting with byte b are tok[first[b] .. first[b+1])
    int n_first;    // how many distinct first bytes (1 lets the scan use memchr)
    unsigned char only_first;
} added_set;

// Takes ownership of tok[0..n) (each content malloc'd); empty contents are an error.
int added_set_init(added_set *a, added_token *tok, int n, ct_error *err);
void added_set_free(added_set *a);
// Finds the leftmost-longest added token in text[0..n): true with its offset, length and id.
bool added_find(const added_set *a, const char *text, size_t n, size_t *at, size_t *len,
                int32_t *id);
