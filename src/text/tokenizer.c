// Encoding and decoding with a loaded tokenizer (loading is in tokenizer_load.c).
#include <stdlib.h>
#include <string.h>

#include "text/bytelevel.h"
#include "core/grow.h"
#include "text/normalize.h"
#include "text/tokenizer_internal.h"
#include "core/utf8.h"
#include "text/word_cache.h"

struct tok_encoder {
    const tokenizer *t;
    pretok_state *ps;
    nfc_scratch nfc;
    word_cache cache;
    bpe_scratch bpe;
    int32_t *sym; // a word's symbols while BPE merges them
    size_t sym_cap;
    char *bl; // a word in byte-level form (ignore_merges looks it up)
    size_t bl_cap;
    tok_ids *out; // the call in progress
    ct_error *err;
};

void tok_ids_free(tok_ids *ids) {
    free(ids->v);
    memset(ids, 0, sizeof *ids);
}

int32_t tok_vocab_size(const tokenizer *t) {
    return t->n_ids;
}

int32_t tok_token_id(const tokenizer *t, const char *token) {
    return strmap_get(&t->by_str, token, strlen(token));
}

const char *tok_token_str(const tokenizer *t, int32_t id) {
    if (id < 0 || id >= t->n_ids || t->kind[id] == TOK_UNUSED) return NULL;
    return t->str + t->str_off[id];
}

bool tok_is_special(const tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_ids && t->kind[id] == TOK_SPECIAL;
}

int32_t tok_eos_id(const tokenizer *t) {
    return t->eos_id;
}

int tok_encoder_new(tok_encoder **out, const tokenizer *t, ct_error *err) {
    *out = NULL;
    tok_encoder *e = calloc(1, sizeof *e);
    if (!e) return ct_fail(err, "out of memory for a tokenizer encoder");
    e->t = t;
    if (word_cache_init(&e->cache, err) != 0 ||
        (t->split && pretok_state_new(&e->ps, t->split, err) != 0)) {
        tok_encoder_free(e);
        return -1;
    }
    *out = e;
    return 0;
}

void tok_encoder_free(tok_encoder *e) {
    if (!e) return;
    pretok_state_free(e->ps);
    nfc_scratch_free(&e->nfc);
    word_cache_free(&e->cache);
    bpe_scratch_free(&e->bpe);
    free(e->sym);
    free(e->bl);
    free(e);
}

static int push_ids(tok_encoder *e, const int32_t *ids, size_t n) {
    tok_ids *o = e->out;
    if (n == 0) return 0;
    if (grow_to((void **)&o->v, &o->cap, o->n + n, sizeof *o->v) != 0)
        return ct_fail(e->err, "out of memory for %zu token ids", o->n + n);
    memcpy(o->v + o->n, ids, n * sizeof *ids);
    o->n += n;
    return 0;
}

// One pre-token: the cache, else BPE over its bytes.
static int encode_piece(void *ctx, const char *p, size_t n) {
    tok_encoder *e = ctx;
    const tokenizer *t = e->t;
    if (n == 1) return push_ids(e, &t->byte_id[(unsigned char)p[0]], 1);
    word_key key;
    bool cacheable = n <= WORD_CACHE_MAX_KEY && word_key_make(&key, p, n, text_hash(p, n));
    const word_cache_slot *hit = cacheable ? word_cache_get(&e->cache, &key) : NULL;
    if (hit) return push_ids(e, hit->ids, hit->n_ids);
    size_t k;
    if (t->ignore_merges) {
        if (grow_to((void **)&e->bl, &e->bl_cap, 2 * n, 1) != 0)
            return ct_fail(e->err, "out of memory for a word of %zu bytes", n);
        int32_t id = strmap_get(&t->by_str, e->bl, bytelevel_encode(e->bl, p, n));
        if (id >= 0 && t->kind[id] == TOK_MODEL) {
            if (cacheable) word_cache_put(&e->cache, &key, &id, 1);
            return push_ids(e, &id, 1);
        }
    }
    if (grow_to((void **)&e->sym, &e->sym_cap, n, sizeof *e->sym) != 0)
        return ct_fail(e->err, "out of memory for a word of %zu bytes", n);
    for (size_t i = 0; i < n; i++) e->sym[i] = t->byte_id[(unsigned char)p[i]];
    if (bpe_merge(&k, &t->pairs, e->sym, n, &e->bpe, e->err) != 0) return -1;
    if (cacheable) word_cache_put(&e->cache, &key, e->sym, k);
    return push_ids(e, e->sym, k);
}

// A stretch of text between added tokens: normalise, split, BPE each piece.
static int encode_plain(tok_encoder *e, const char *text, size_t n) {
    if (n == 0) return 0;
    const tokenizer *t = e->t;
    if (t->nfc && nfc_apply(&text, &n, &e->nfc, text, n, e->err) != 0) return -1;
    if (!t->split) return encode_piece(e, text, n);
    return pretok_split(e->ps, text, n, encode_piece, e, e->err);
}

int tok_encode(tok_encoder *e, tok_ids *ids, const char *text, size_t len, ct_error *err) {
    size_t bad = utf8_valid_prefix(text, len);
    if (bad < len)
        return ct_fail(err, "invalid UTF-8 at byte offset %zu (byte 0x%02X)", bad,
                       (unsigned char)text[bad]);
    e->out = ids;
    e->err = err;
    const tokenizer *t = e->t;
    size_t pos = 0, at, mlen;
    int32_t id;
    while (pos < len && added_find(&t->added, text + pos, len - pos, &at, &mlen, &id)) {
        if (encode_plain(e, text + pos, at) != 0 || push_ids(e, &id, 1) != 0) return -1;
        pos += at + mlen;
    }
    return encode_plain(e, text + pos, len - pos);
}

int tok_id_bytes(const tokenizer *t, int32_t id, bool skip_special, const char **bytes, size_t *len,
                 ct_error *err) {
    if (id < 0 || id >= t->n_ids || t->kind[id] == TOK_UNUSED)
        return ct_fail(err, "decode: id %d is not in the vocabulary (size %d)", (int)id,
                       (int)t->n_ids);
    const bool skip = skip_special && t->kind[id] == TOK_SPECIAL;
    *bytes = t->dec + t->dec_off[id];
    *len = skip ? 0 : t->dec_off[id + 1] - t->dec_off[id];
    return 0;
}

int tok_decode(const tokenizer *t, char **out, size_t *out_len, const int32_t *ids, size_t n,
               bool skip_special, ct_error *err) {
    *out = NULL;
    *out_len = 0;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->n_ids || t->kind[id] == TOK_UNUSED)
            return ct_fail(err, "decode: id %d at index %zu is not in the vocabulary (size %d)",
                           (int)id, i, (int)t->n_ids);
        total += t->dec_off[id + 1] - t->dec_off[id];
    }
    char *raw = malloc(total + 1);
    if (!raw) return ct_fail(err, "decode: out of memory for %zu bytes", total);
    size_t len = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (skip_special && t->kind[id] == TOK_SPECIAL) continue;
        size_t k = t->dec_off[id + 1] - t->dec_off[id];
        memcpy(raw + len, t->dec + t->dec_off[id], k);
        len += k;
    }
    raw[len] = 0;
    // Ids may cut a multi-byte character (a lone id of an emoji, say): HF's lossy conversion.
    if (utf8_valid_prefix(raw, len) < len) {
        char *fixed = malloc(utf8_repair_bound(len) + 1);
        if (!fixed) {
            free(raw);
            return ct_fail(err, "decode: out of memory for %zu bytes", utf8_repair_bound(len));
        }
        len = utf8_repair(fixed, raw, len, NULL);
        free(raw);
        raw = fixed;
    }
    raw[len] = 0;
    *out = raw;
    *out_len = len;
    return 0;
}

static bool ascii_alnum(unsigned char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

// Why a cut at "\n|X" (X an ASCII letter or digit) is safe for the Qwen2 pattern:
//  - no match contains both the '\n' and X: the letter alternative's optional prefix excludes
//    \r\n, " ?[^\s\p{L}\p{N}]+[\r\n]*" ends at the newlines, and the \s alternatives stop at X;
//  - no alternative's outcome for a match left of the cut depends on X: "\s*[\r\n]+" comes before
//    the lookahead "\s+(?!\S)" and takes every whitespace run that ends in '\n' whole;
//  - X is ASCII, so NFC never composes across the cut, and no added token contains '\n' (checked
//    at load), so none spans it.
size_t tok_cut_points(const tokenizer *t, size_t *cuts, size_t max_cuts, const char *text,
                      size_t len, size_t target) {
    if (!t->cut_safe || target == 0) return 0;
    size_t k = 0, from = target;
    while (k < max_cuts && from < len) {
        const char *nl = memchr(text + from - 1, '\n', len - from + 1);
        if (!nl) break;
        size_t cut = (size_t)(nl - text) + 1;
        if (cut < len && ascii_alnum((unsigned char)text[cut])) {
            cuts[k++] = cut;
            from = cut + target;
        } else {
            from = cut + 1;
        }
    }
    return k;
}
