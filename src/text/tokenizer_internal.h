// What a loaded tokenizer holds; shared by tokenizer_load.c (building it) and tokenizer.c
// (using it). Not for use outside src/text.
#pragma once
#include "text/added.h"
#include "text/bpe.h"
#include "text/pretokenizer.h"
#include "text/strmap.h"
#include "text/tokenizer.h"

enum { TOK_UNUSED = 0, TOK_MODEL = 1, TOK_ADDED = 2, TOK_SPECIAL = 3 };

struct tokenizer {
    int32_t n_ids;     // largest id + 1
    uint8_t *kind;     // per id: TOK_*
    char *str;         // per id, the token as tokenizer.json spells it, NUL-terminated
    uint32_t *str_off; // n_ids + 1 offsets into str
    char *dec;         // per id, the bytes the ByteLevel decoder gives it
    uint32_t *dec_off; // n_ids + 1 offsets into dec
    strmap by_str;     // token string (model vocab and added tokens) -> id

    int32_t byte_id[256]; // the single-byte token of each byte
    bpe_pairs pairs;
    bool ignore_merges; // a pre-token that is itself in the vocabulary skips BPE

    added_set added; // the added tokens that are matched in text
    bool nfc;
    pretok *split;  // NULL: each stretch between added tokens is one piece
    bool cut_safe;  // tok_cut_points may cut before a letter/digit after '\n'
    int32_t eos_id; // see tok_eos_id
};
