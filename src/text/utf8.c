#include "text/utf8.h"

#include <string.h>

size_t utf8_repair(char *out, const char *s, size_t n, size_t *n_replaced) {
    size_t o = 0, i = 0, bad = 0;
    while (i < n) {
        size_t good = utf8_valid_prefix(s + i, n - i);
        memcpy(out + o, s + i, good);
        o += good;
        i += good;
        if (i >= n) break;
        uint32_t cp;
        int len = utf8_decode(&cp, (const unsigned char *)s + i, n - i);
        memcpy(out + o, UTF8_REPLACEMENT, 3);
        o += 3;
        i += (size_t)-len;
        bad++;
    }
    if (n_replaced) *n_replaced = bad;
    return o;
}
