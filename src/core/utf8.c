#include "core/utf8.h"

#include <stdlib.h>
#include <string.h>

// Well-formed sequences, Unicode Table 3-7. The second byte's range depends on the first byte;
// this is what excludes overlongs (C0, C1, E0 80..9F, F0 80..8F), surrogates (ED A0..BF) and
// code points above U+10FFFF (F4 90.., F5..FF).
int utf8_decode(uint32_t *cp, const unsigned char *s, size_t n) {
    unsigned char b = s[0];
    if (b < 0x80) {
        *cp = b;
        return 1;
    }
    int len;
    unsigned char lo = 0x80, hi = 0xBF;
    uint32_t c;
    if (b >= 0xC2 && b <= 0xDF) {
        len = 2;
        c = b & 0x1F;
    } else if (b >= 0xE0 && b <= 0xEF) {
        len = 3;
        c = b & 0x0F;
        if (b == 0xE0) lo = 0xA0;
        if (b == 0xED) hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
        len = 4;
        c = b & 0x07;
        if (b == 0xF0) lo = 0x90;
        if (b == 0xF4) hi = 0x8F;
    } else {
        return -1;
    }
    for (int i = 1; i < len; i++) {
        // A missing or wrong continuation ends the maximal subpart before this byte.
        if ((size_t)i >= n) return -i;
        unsigned char t = s[i];
        if (t < lo || t > hi) return -i;
        lo = 0x80;
        hi = 0xBF;
        c = c << 6 | (t & 0x3F);
    }
    *cp = c;
    return len;
}

size_t utf8_valid_prefix(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        // ASCII runs dominate real text: check 8 bytes at a time.
        while (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, u + i, 8);
            if (w & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= n) break;
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        int len = utf8_decode(&cp, u + i, n - i);
        if (len < 0) return i;
        i += (size_t)len;
    }
    return n;
}

size_t utf8_incomplete_tail(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t k = 1; k <= 3 && k <= n; k++) {
        const unsigned char lead = u[n - k];
        if (lead < 0xC2 || lead > 0xF4) continue; // not a lead byte: look further back
        const size_t need = lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
        uint32_t cp;
        // The k bytes are the maximal subpart of a valid sequence that needs more of them.
        return need > k && utf8_decode(&cp, u + n - k, k) == -(int)k ? k : 0;
    }
    return 0;
}

int utf8_encode(char out[4], uint32_t cp) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | cp >> 12);
        out[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | cp >> 18);
    out[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    out[2] = (char)(0x80 | (cp >> 6 & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

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

int utf8_repair_text(utf8_scratch *scratch, const char **text, size_t *len, uint64_t *n_replaced,
                     size_t *first_bad) {
    size_t bad = utf8_valid_prefix(*text, *len);
    if (bad == *len) return 0;
    // Sized exactly, not doubled: the bound is three times the text, and texts vary widely.
    size_t need = utf8_repair_bound(*len), n_bad;
    if (need > scratch->cap) {
        free(scratch->p);
        scratch->p = malloc(need);
        scratch->cap = scratch->p ? need : 0;
        if (!scratch->p) return -1;
    }
    *len = utf8_repair(scratch->p, *text, *len, &n_bad);
    *text = scratch->p;
    *n_replaced += n_bad;
    if (first_bad) *first_bad = bad;
    return 0;
}

void utf8_scratch_free(utf8_scratch *scratch) {
    free(scratch->p);
    *scratch = (utf8_scratch){0};
}
