#include "text/strmap.h"

#include <stdlib.h>

#include "core/grow.h"

int strmap_init(strmap *m, size_t expected, ct_error *err) {
    memset(m, 0, sizeof *m);
    size_t cap = 16;
    while (cap < 2 * expected) cap *= 2;
    m->slots = malloc(cap * sizeof *m->slots);
    if (!m->slots) return ct_fail(err, "out of memory for a table of %zu strings", expected);
    for (size_t i = 0; i < cap; i++) m->slots[i].value = -1;
    m->mask = cap - 1;
    return 0;
}

void strmap_free(strmap *m) {
    free(m->slots);
    free(m->keys);
    memset(m, 0, sizeof *m);
}

static struct strmap_slot *strmap_find(const strmap *m, const char *key, size_t len, uint64_t h) {
    for (size_t i = h & m->mask;; i = (i + 1) & m->mask) {
        struct strmap_slot *s = &m->slots[i];
        if (s->value < 0) return s;
        if (s->hash == h && s->len == len && memcmp(m->keys + s->off, key, len) == 0) return s;
    }
}

int strmap_put(strmap *m, const char *key, size_t len, int32_t value, ct_error *err) {
    if (value < 0) return ct_fail(err, "strmap: negative value %d", (int)value);
    if (2 * (m->count + 1) > m->mask + 1) {
        // Grow by rehashing into a table twice the size.
        strmap bigger = *m;
        size_t cap = 2 * (m->mask + 1);
        bigger.slots = malloc(cap * sizeof *bigger.slots);
        if (!bigger.slots) return ct_fail(err, "out of memory growing a string table");
        for (size_t i = 0; i < cap; i++) bigger.slots[i].value = -1;
        bigger.mask = cap - 1;
        for (size_t i = 0; i <= m->mask; i++)
            if (m->slots[i].value >= 0)
                *strmap_find(&bigger, m->keys + m->slots[i].off, m->slots[i].len,
                             m->slots[i].hash) = m->slots[i];
        free(m->slots);
        *m = bigger;
    }
    uint64_t h = text_hash(key, len);
    struct strmap_slot *s = strmap_find(m, key, len, h);
    if (s->value >= 0) {
        s->value = value;
        return 0;
    }
    if (len > UINT32_MAX || m->keys_len + len > UINT32_MAX)
        return ct_fail(err, "string table: keys exceed 4 GiB");
    if (grow_to((void **)&m->keys, &m->keys_cap, m->keys_len + len + 1, 1) != 0)
        return ct_fail(err, "out of memory for string table keys");
    memcpy(m->keys + m->keys_len, key, len);
    *s = (struct strmap_slot){h, (uint32_t)m->keys_len, (uint32_t)len, value};
    m->keys_len += len;
    m->count++;
    return 0;
}

int32_t strmap_get(const strmap *m, const char *key, size_t len) {
    if (!m->slots) return -1;
    return strmap_find(m, key, len, text_hash(key, len))->value;
}
