#include "text/chat_mask.h"

#include <stdlib.h>
#include <string.h>

static const char header[] = "assistant\n";

// Whether the tokens after an <|im_start|> at ids[i] begin with "assistant\n"; *first gets the
// token holding the byte after it. Tokens are decoded one at a time (a byte-level token is a
// fixed byte string), so a multi-byte character cut between tokens is not a problem here.
static bool assistant_turn(const tokenizer *t, const int32_t *ids, size_t n, size_t i,
                           size_t *first) {
    size_t have = 0, want = strlen(header);
    for (size_t j = i + 1; j < n && have < want; j++) {
        char *bytes;
        size_t len;
        ct_error err;
        if (tok_decode(t, &bytes, &len, &ids[j], 1, false, &err) != 0) return false;
        size_t cmp = len < want - have ? len : want - have;
        bool same = memcmp(bytes, header + have, cmp) == 0;
        free(bytes);
        if (!same) return false;
        have += cmp;
        // The header ends inside this token (content follows in it) or at its end.
        if (have == want) *first = cmp < len ? j : j + 1;
    }
    return have == want;
}

int64_t chat_assistant_mask(const tokenizer *t, const int32_t *ids, size_t n, uint8_t *mask,
                            ct_error *err) {
    int32_t start = tok_token_id(t, "<|im_start|>"), end = tok_token_id(t, "<|im_end|>");
    if (start < 0 || end < 0)
        return ct_fail(err, "the tokenizer has no <|im_start|> or <|im_end|>: cannot find the "
                            "assistant turns");
    memset(mask, 0, n);
    int64_t trained = 0;
    for (size_t i = 0; i < n; i++) {
        size_t j;
        if (ids[i] != start || !assistant_turn(t, ids, n, i, &j)) continue;
        for (; j < n; j++) {
            mask[j] = 1;
            trained++;
            if (ids[j] == end) break;
        }
        i = j;
    }
    return trained;
}
