#include "text/bytelevel.h"

#include <string.h>

#include "core/utf8.h"

// Printable Latin-1 bytes ('!'..'~', 0xA1..0xAC, 0xAE..0xFF) show as themselves; the other 68
// bytes, in increasing order (0x00..0x20, 0x7F..0xA0, 0xAD), show as U+0100, U+0101, ...
static int printable(unsigned char b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
}

uint32_t bytelevel_char(unsigned char b) {
    if (printable(b)) return b;
    if (b <= 0x20) return 0x100 + b;
    if (b <= 0xA0) return 0x100 + 33 + (b - 0x7F);
    return 0x100 + 67; // 0xAD, the soft hyphen
}

int bytelevel_byte(uint32_t cp) {
    if (cp < 0x100) return printable((unsigned char)cp) ? (int)cp : -1;
    uint32_t k = cp - 0x100;
    if (k < 33) return (int)k;
    if (k < 67) return (int)(0x7F + k - 33);
    return k == 67 ? 0xAD : -1;
}

size_t bytelevel_encode(char *out, const char *bytes, size_t n) {
    size_t o = 0;
    for (size_t i = 0; i < n; i++)
        o += (size_t)utf8_encode(out + o, bytelevel_char((unsigned char)bytes[i]));
    return o;
}

size_t bytelevel_decode(char *out, const char *tok, size_t n) {
    size_t o = 0, i = 0;
    while (i < n) {
        uint32_t cp;
        int len = utf8_decode(&cp, (const unsigned char *)tok + i, n - i);
        int b = len > 0 ? bytelevel_byte(cp) : -1;
        if (b < 0) {
            memcpy(out, tok, n);
            return n;
        }
        out[o++] = (char)b;
        i += (size_t)len;
    }
    return o;
}
