#include "text/added.h"

#include <stdlib.h>
#include <string.h>

static int added_cmp(const void *x, const void *y) {
    const added_token *a = x, *b = y;
    unsigned char fa = (unsigned char)a->content[0], fb = (unsigned char)b->content[0];
    if (fa != fb) return fa < fb ? -1 : 1;
    if (a->len != b->len) return a->len > b->len ? -1 : 1;
    return memcmp(a->content, b->content, a->len);
}

int added_set_init(added_set *a, added_token *tok, int n, ct_error *err) {
    memset(a, 0, sizeof *a);
    a->tok = tok;
    a->n = n;
    for (int i = 0; i < n; i++)
        if (tok[i].len == 0) {
            int id = tok[i].id;
            added_set_free(a);
            return ct_fail(err, "added token with id %d has empty content", id);
        }
    if (n > 0) qsort(tok, (size_t)n, sizeof *tok, added_cmp);
    int k = 0;
    for (int b = 0; b <= 256; b++) {
        a->first[b] = k;
        int start = k;
        while (b < 256 && k < n && (unsigned char)tok[k].content[0] == b) k++;
        if (k > start) {
            a->n_first++;
            a->only_first = (unsigned char)b;
        }
    }
    return 0;
}

void added_set_free(added_set *a) {
    for (int i = 0; i < a->n; i++) free(a->tok[i].content);
    free(a->tok);
    memset(a, 0, sizeof *a);
}

bool added_find(const added_set *a, const char *text, size_t n, size_t *at, size_t *len,
                int32_t *id) {
    if (a->n == 0) return false;
    const unsigned char *t = (const unsigned char *)text;
    for (size_t i = 0; i < n;) {
        if (a->n_first == 1) {
            // Qwen's added tokens all start with '<': memchr skips the text in between.
            const unsigned char *p = memchr(t + i, a->only_first, n - i);
            if (!p) return false;
            i = (size_t)(p - t);
        }
        unsigned char b = t[i];
        for (int k = a->first[b]; k < a->first[b + 1]; k++) {
            const added_token *tk = &a->tok[k];
            if (tk->len <= n - i && memcmp(t + i, tk->content, tk->len) == 0) {
                *at = i;
                *len = tk->len;
                *id = tk->id;
                return true;
            }
        }
        i++;
    }
    return false;
}
