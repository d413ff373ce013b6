#include "text/word_cache.h"

#include <stdlib.h>

// 128K slots of 64 bytes (8 MB per thread), emptied at 64K words: a few MB of text has that
// many distinct pre-tokens.
#define WC_SLOTS (1u << 17)

int word_cache_init(word_cache *c, ct_error *err) {
    memset(c, 0, sizeof *c);
    c->slots = calloc(WC_SLOTS, sizeof *c->slots);
    if (!c->slots) return ct_fail(err, "out of memory for the word cache");
    c->mask = WC_SLOTS - 1;
    return 0;
}

void word_cache_free(word_cache *c) {
    free(c->slots);
    memset(c, 0, sizeof *c);
}

void word_cache_put(word_cache *c, const word_key *k, const int32_t *ids, size_t n) {
    if (n == 0 || n > WORD_CACHE_MAX_IDS || k->len == 0) return;
    if (2 * (c->used + 1) > c->mask + 1) {
        memset(c->slots, 0, (c->mask + 1) * sizeof *c->slots);
        c->used = 0;
    }
    size_t i = (k->hash >> 32) & c->mask;
    while (c->slots[i].key_len != 0) i = (i + 1) & c->mask;
    word_cache_slot *s = &c->slots[i];
    s->hash = (uint32_t)k->hash;
    s->key_len = (uint8_t)k->len;
    s->n_ids = (uint8_t)n;
    memcpy(s->ids, ids, n * sizeof *ids);
    memcpy(s->key, k->b, sizeof s->key);
    c->used++;
}
