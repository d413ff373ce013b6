// The NFC normalizer of tokenizer.json, over utf8proc, with a fast path for ASCII.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

// Reused across calls; zero-initialise, free with nfc_scratch_free.
typedef struct nfc_scratch {
    char *out;
    size_t out_cap;
    int32_t *cps;
    size_t cps_cap;
} nfc_scratch;

// NFC of valid UTF-8 text[0..n). *out is either text itself (nothing can change) or s->out.
int nfc_apply(const char **out, size_t *out_len, nfc_scratch *s, const char *text, size_t n,
              ct_error *err);
void nfc_scratch_free(nfc_scratch *s);
