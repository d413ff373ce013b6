#include "data/doc_encoder.h"

#include <stdlib.h>
#include <string.h>

#include "core/grow.h"

void *doc_encoders_new(int n, size_t size, const tokenizer *tok, ct_error *err) {
    size = (size + 63) / 64 * 64;
    char *all = aligned_alloc(64, (size_t)n * size);
    if (!all) {
        ct_fail(err, "out of memory");
        return NULL;
    }
    memset(all, 0, (size_t)n * size);
    for (int i = 0; i < n; i++) {
        if (tok_encoder_new(&((doc_encoder *)(all + (size_t)i * size))->enc, tok, err) != 0) {
            doc_encoders_free(all, n, size);
            return NULL;
        }
    }
    return all;
}

void doc_encoders_free(void *encoders, int n, size_t size) {
    if (!encoders) return;
    size = (size + 63) / 64 * 64;
    for (int i = 0; i < n; i++) {
        doc_encoder *d = (doc_encoder *)((char *)encoders + (size_t)i * size);
        tok_encoder_free(d->enc);
        tok_ids_free(&d->ids);
        free(d->mask);
        jsonl_buf_free(&d->json);
        utf8_scratch_free(&d->fixed);
        chat_scratch_free(&d->chat);
    }
    free(encoders);
}

int doc_encoder_reserve(doc_encoder *d, size_t more) {
    tok_ids *ids = &d->ids;
    if (more > SIZE_MAX / sizeof *ids->v - ids->n) return -1;
    if (grow_to((void **)&ids->v, &ids->cap, ids->n + more, sizeof *ids->v) != 0) return -1;
    if (d->mask_cap < ids->cap) {
        uint8_t *grown = realloc(d->mask, ids->cap);
        if (!grown) return -1;
        d->mask = grown;
        d->mask_cap = ids->cap;
    }
    return 0;
}

int doc_encode_text(doc_encoder *d, const char *text, size_t len, uint64_t *n_replaced,
                    size_t *first_bad, ct_error *err) {
    if (utf8_repair_text(&d->fixed, &text, &len, n_replaced, first_bad) != 0)
        return ct_fail(err, "out of memory repairing invalid UTF-8");
    return tok_encode(d->enc, &d->ids, text, len, err);
}

int doc_encode_chat(doc_encoder *d, const tokenizer *tok, const chat_template *t, const cJSON *root,
                    bool mask, uint64_t *n_replaced, ct_error *err) {
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools");
    if (cJSON_IsNull(tools)) tools = NULL;
    return chat_encode(&d->chat, d->enc, tok, t, cJSON_GetObjectItemCaseSensitive(root, "messages"),
                       tools, &d->ids, mask ? &d->mask : NULL, &d->mask_cap, n_replaced, err);
}
