#include "text/chat_encode.h"

#include <stdlib.h>

#include "text/chat_mask.h"

void chat_scratch_free(chat_scratch *s) {
    free(s->text);
    utf8_scratch_free(&s->fixed);
    *s = (chat_scratch){0};
}

int chat_encode(chat_scratch *s, tok_encoder *enc, const tokenizer *tok, const chat_template *t,
                const cJSON *messages, const cJSON *tools, tok_ids *ids, uint8_t **mask,
                size_t *mask_cap, uint64_t *n_replaced, ct_error *err) {
    free(s->text);
    s->text = NULL;
    s->len = 0;
    if (chat_render(t, messages, tools, false, -1, &s->text, &s->len, err) != 0) return -1;
    const char *text = s->text;
    size_t len = s->len, first = ids->n;
    if (utf8_repair_text(&s->fixed, &text, &len, n_replaced, NULL) != 0)
        return ct_fail(err, "out of memory repairing UTF-8");
    if (tok_encode(enc, ids, text, len, err) != 0) return -1;
    if (!mask) return 0;
    // As long as ids->cap, not ids->n: callers keep the mask parallel to every id they hold.
    if (*mask_cap < ids->cap) {
        uint8_t *grown = realloc(*mask, ids->cap);
        if (!grown) return ct_fail(err, "out of memory for a conversation's mask");
        *mask = grown;
        *mask_cap = ids->cap;
    }
    if (chat_assistant_mask(tok, ids->v + first, ids->n - first, *mask + first, err) < 0) return -1;
    return 0;
}
