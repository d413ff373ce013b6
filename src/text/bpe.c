#include "text/bpe.h"

#include <stdlib.h>
#include <string.h>

#include "core/grow.h"

// Words up to this many symbols use the O(n^2) scan; its inner loop is a few compares, which
// beats a heap for the short words that make up nearly all text.
#define BPE_SCAN_MAX 64

int bpe_pairs_init(bpe_pairs *m, size_t n_merges, ct_error *err) {
    memset(m, 0, sizeof *m);
    size_t cap = 1024;
    while (cap < 2 * n_merges) cap *= 2; // load <= 1/2 keeps probes short
    m->slots = malloc(cap * sizeof *m->slots);
    if (!m->slots) return ct_fail(err, "out of memory for %zu merges", n_merges);
    for (size_t i = 0; i < cap; i++) m->slots[i].key = BPE_NO_PAIR;
    m->mask = cap - 1;
    return 0;
}

void bpe_pairs_free(bpe_pairs *m) {
    free(m->slots);
    memset(m, 0, sizeof *m);
}

void bpe_pairs_put(bpe_pairs *m, int32_t left, int32_t right, uint32_t rank, int32_t merged) {
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    size_t i = (h >> 32) & m->mask;
    while (m->slots[i].key != BPE_NO_PAIR && m->slots[i].key != key) i = (i + 1) & m->mask;
    m->slots[i] = (bpe_slot){key, rank, merged};
}

void bpe_scratch_free(bpe_scratch *s) {
    free(s->rank);
    free(s->merged);
    free(s->prev);
    free(s->next);
    free(s->heap);
    memset(s, 0, sizeof *s);
}

int bpe_merge_scan(size_t *out_n, const bpe_pairs *m, int32_t *ids, size_t n, bpe_scratch *s,
                   ct_error *err) {
    size_t cap = s->cap;
    if (grow_to((void **)&s->rank, &cap, n, sizeof *s->rank) != 0 ||
        grow_to((void **)&s->merged, &s->cap, n, sizeof *s->merged) != 0)
        return ct_fail(err, "BPE: out of memory for a word of %zu bytes", n);
    uint32_t *rank = s->rank; // rank[i]: the pair (ids[i], ids[i+1])
    int32_t *merged = s->merged;
    for (size_t i = 0; i + 1 < n; i++) rank[i] = bpe_pairs_get(m, ids[i], ids[i + 1], &merged[i]);
    while (n > 1) {
        uint32_t best = BPE_NO_RANK;
        size_t b = 0;
        for (size_t i = 0; i + 1 < n; i++)
            if (rank[i] < best) { // strict: the leftmost of equal pairs wins
                best = rank[i];
                b = i;
            }
        if (best == BPE_NO_RANK) break;
        ids[b] = merged[b];
        // Drop symbol b+1 and the pair that started at it.
        memmove(ids + b + 1, ids + b + 2, (n - b - 2) * sizeof *ids);
        size_t tail = n > b + 3 ? n - b - 3 : 0; // pairs after the one that disappears
        memmove(rank + b + 1, rank + b + 2, tail * sizeof *rank);
        memmove(merged + b + 1, merged + b + 2, tail * sizeof *merged);
        n--;
        if (b > 0) rank[b - 1] = bpe_pairs_get(m, ids[b - 1], ids[b], &merged[b - 1]);
        if (b + 1 < n) rank[b] = bpe_pairs_get(m, ids[b], ids[b + 1], &merged[b]);
    }
    *out_n = n;
    return 0;
}

static void heap_push(uint64_t *h, size_t *len, uint64_t v) {
    size_t i = (*len)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p] <= v) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static uint64_t heap_pop(uint64_t *h, size_t *len) {
    uint64_t top = h[0], v = h[--*len];
    size_t i = 0, n = *len;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && h[c + 1] < h[c]) c++;
        if (v <= h[c]) break;
        h[i] = h[c];
        i = c;
    }
    if (n) h[i] = v;
    return top;
}

// HF's algorithm (word.rs merge_all): a heap of (rank, position) candidates over a linked list.
// Entries go stale when a neighbour merges; a popped entry is applied only if the pair now at
// its position still has its rank (ranks identify pairs, so this is the same pair).
int bpe_merge_heap(size_t *out_n, const bpe_pairs *m, int32_t *ids, size_t n, bpe_scratch *s,
                   ct_error *err) {
    if (n > INT32_MAX) return ct_fail(err, "BPE: word of %zu bytes is too long", n);
    size_t cap = s->long_cap;
    if (grow_to((void **)&s->prev, &cap, n, sizeof *s->prev) != 0 ||
        grow_to((void **)&s->next, &s->long_cap, n, sizeof *s->next) != 0 ||
        grow_to((void **)&s->heap, &s->heap_cap, 3 * n, sizeof *s->heap) != 0)
        return ct_fail(err, "BPE: out of memory for a word of %zu bytes", n);
    int32_t *prev = s->prev, *next = s->next;
    uint64_t *heap = s->heap;
    size_t len = 0;
    for (size_t i = 0; i < n; i++) {
        prev[i] = (int32_t)i - 1;
        next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    int32_t mg;
    for (size_t i = 0; i + 1 < n; i++) {
        uint32_t r = bpe_pairs_get(m, ids[i], ids[i + 1], &mg);
        if (r != BPE_NO_RANK) heap_push(heap, &len, (uint64_t)r << 32 | i);
    }
    while (len > 0) {
        uint64_t top = heap_pop(heap, &len);
        uint32_t r = (uint32_t)(top >> 32);
        int32_t pos = (int32_t)(uint32_t)top, nx = next[pos];
        if (ids[pos] < 0 || nx < 0 || bpe_pairs_get(m, ids[pos], ids[nx], &mg) != r) continue;
        ids[pos] = mg;
        ids[nx] = -1;
        next[pos] = next[nx];
        if (next[nx] >= 0) prev[next[nx]] = pos;
        int32_t pv = prev[pos], nn = next[pos];
        int32_t unused;
        uint32_t r2;
        if (pv >= 0 && (r2 = bpe_pairs_get(m, ids[pv], ids[pos], &unused)) != BPE_NO_RANK)
            heap_push(heap, &len, (uint64_t)r2 << 32 | (uint32_t)pv);
        if (nn >= 0 && (r2 = bpe_pairs_get(m, ids[pos], ids[nn], &unused)) != BPE_NO_RANK)
            heap_push(heap, &len, (uint64_t)r2 << 32 | (uint32_t)pos);
    }
    // Symbol 0 is never absorbed (merges keep the left position), so the list starts there.
    size_t k = 0;
    for (int32_t i = n ? 0 : -1; i >= 0; i = next[i]) ids[k++] = ids[i];
    *out_n = k;
    return 0;
}

int bpe_merge(size_t *out_n, const bpe_pairs *m, int32_t *ids, size_t n, bpe_scratch *s,
              ct_error *err) {
    if (n <= 1) {
        *out_n = n;
        return 0;
    }
    return n <= BPE_SCAN_MAX ? bpe_merge_scan(out_n, m, ids, n, s, err)
                             : bpe_merge_heap(out_n, m, ids, n, s, err);
}
