// Growable arrays for scratch buffers that are reused across calls (so the encode loop does not
// allocate once they have reached their working size).
#pragma once
#include <stdlib.h>

// Makes room for `need` elements of `elem` bytes in *p (capacity *cap elements). 0 or -1.
static inline int grow_to(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q) return -1;
    *p = q;
    *cap = c;
    return 0;
}
