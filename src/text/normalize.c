#include "text/normalize.h"

#include <string.h>

#include <utf8proc.h>

#include "core/grow.h"

// NFC works on units that start at a character that can never combine with what precedes it.
// Every ASCII character is such a boundary: it is its own NFC form (quick check Yes), has
// combining class 0 and is never the second half of a canonical composition. So only the
// non-ASCII runs, each with the one ASCII character before it (an "e" before U+0301), go through
// utf8proc; the ASCII between them is copied. English text is thus nearly free.

static const utf8proc_option_t nfc_options = UTF8PROC_STABLE | UTF8PROC_COMPOSE;

static int out_append(nfc_scratch *s, size_t *len, const void *p, size_t n, ct_error *err) {
    if (n == 0) return 0;
    if (grow_to((void **)&s->out, &s->out_cap, *len + n, 1) != 0)
        return ct_fail(err, "NFC: out of memory (%zu bytes)", *len + n);
    memcpy(s->out + *len, p, n);
    *len += n;
    return 0;
}

static int nfc_unit(nfc_scratch *s, size_t *len, const char *u, size_t n, ct_error *err) {
    // Decomposition can lengthen the text (U+0344 -> 2 code points, a Hangul syllable -> 3);
    // utf8proc reports the size it needs when the buffer is short, and we retry once.
    size_t want = n + 1;
    for (int attempt = 0; attempt < 2; attempt++) {
        // +1: utf8proc_reencode writes a terminating NUL after up to 4 bytes per code point.
        if (grow_to((void **)&s->cps, &s->cps_cap, want + 1, sizeof *s->cps) != 0)
            return ct_fail(err, "NFC: out of memory (%zu code points)", want);
        utf8proc_ssize_t got = utf8proc_decompose((const utf8proc_uint8_t *)u, (utf8proc_ssize_t)n,
                                                  s->cps, (utf8proc_ssize_t)want, nfc_options);
        if (got < 0) return ct_fail(err, "NFC: %s", utf8proc_errmsg(got));
        if ((size_t)got > want) {
            want = (size_t)got;
            continue;
        }
        utf8proc_ssize_t bytes = utf8proc_reencode(s->cps, got, nfc_options);
        if (bytes < 0) return ct_fail(err, "NFC: %s", utf8proc_errmsg(bytes));
        return out_append(s, len, s->cps, (size_t)bytes, err);
    }
    return ct_fail(err, "NFC: decomposition of %zu bytes did not fit", n);
}

int nfc_apply(const char **out, size_t *out_len, nfc_scratch *s, const char *text, size_t n,
              ct_error *err) {
    const unsigned char *t = (const unsigned char *)text;
    size_t i = 0;
    while (i < n && t[i] < 0x80) i++;
    if (i == n) {
        *out = text;
        *out_len = n;
        return 0;
    }
    size_t len = 0, done = 0; // text[0..done) has been written
    while (i < n) {
        // i is a non-ASCII byte; the unit starts at the ASCII character before it, if any.
        size_t start = i > done ? i - 1 : i;
        if (out_append(s, &len, text + done, start - done, err) != 0) return -1;
        size_t end = i;
        while (end < n && t[end] >= 0x80) end++;
        if (nfc_unit(s, &len, text + start, end - start, err) != 0) return -1;
        done = end;
        i = end;
        while (i < n && t[i] < 0x80) i++;
    }
    if (out_append(s, &len, text + done, n - done, err) != 0) return -1;
    *out = s->out;
    *out_len = len;
    return 0;
}

void nfc_scratch_free(nfc_scratch *s) {
    free(s->out);
    free(s->cps);
    memset(s, 0, sizeof *s);
}
