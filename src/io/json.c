#include "io/json.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/fs.h"
#include "core/grow.h"
#include "core/utf8.h"

#define JSON_FILE_MAX (512u << 20) // tokenizer.json is ~11 MB; anything near this is not config

int file_read_all(char **out, size_t *len, const char *path, size_t max_bytes, ct_error *err) {
    *out = NULL;
    if (len) *len = 0;
    int fd;
    size_t size;
    if (fs_open_regular(&fd, &size, path, err) != 0) return -1;
    if (size > max_bytes) {
        close(fd);
        return ct_fail(err, "%s: file is %zu bytes, more than the limit of %zu", path, size,
                       max_bytes);
    }
    FILE *fp = fdopen(fd, "rb");
    if (!fp) {
        int e = errno;
        close(fd);
        return ct_fail(err, "cannot open %s: %s", path, strerror(e));
    }
    char *buf = malloc(size + 1);
    if (!buf) {
        fclose(fp);
        return ct_fail(err, "%s: out of memory reading %zu bytes", path, size);
    }
    size_t got = fread(buf, 1, size, fp);
    int read_err = ferror(fp) ? errno : 0;
    fclose(fp);
    if (got != size) {
        free(buf);
        if (read_err) return ct_fail(err, "%s: read failed: %s", path, strerror(read_err));
        return ct_fail(err, "%s: expected %zu bytes, read %zu (file changed while reading?)", path,
                       size, got);
    }
    buf[size] = '\0';
    *out = buf;
    if (len) *len = size;
    return 0;
}

int json_parse(cJSON **out, const char *text, size_t len, const char *what, ct_error *err) {
    *out = cJSON_ParseWithLength(text, len);
    if (*out) return 0;
    const char *at = cJSON_GetErrorPtr();
    size_t off = (at && at >= text && at <= text + len) ? (size_t)(at - text) : len;
    int line = 1, col = 1;
    for (size_t i = 0; i < off; i++) {
        if (text[i] == '\n') {
            line++;
            col = 1;
        } else {
            col++;
        }
    }
    return ct_fail(err, "%s: invalid JSON at byte %zu (line %d, column %d)", what, off, line, col);
}

int json_parse_file(cJSON **out, const char *path, ct_error *err) {
    char *text;
    size_t len;
    *out = NULL;
    if (file_read_all(&text, &len, path, JSON_FILE_MAX, err) != 0) return -1;
    int rc = json_parse(out, text, len, path, err);
    free(text);
    return rc;
}

const char *json_type_name(const cJSON *item) {
    if (!item) return "nothing";
    if (cJSON_IsString(item)) return "a string";
    if (cJSON_IsNumber(item)) return "a number";
    if (cJSON_IsBool(item)) return "a boolean";
    if (cJSON_IsNull(item)) return "null";
    if (cJSON_IsArray(item)) return "an array";
    if (cJSON_IsObject(item)) return "an object";
    return "an invalid value";
}

// Looks `key` up; returns 1 if present and not null, 0 if absent and optional, -1 if required
// and absent.
static int json_lookup(const cJSON **item, const cJSON *obj, const char *key, bool required,
                       const char *file, ct_error *err) {
    *item = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (*item && !cJSON_IsNull(*item)) return 1;
    if (required) return ct_fail(err, "%s: missing required key \"%s\"", file, key);
    return 0;
}

int json_get_int(int64_t *out, const cJSON *obj, const char *key, bool required, int64_t min,
                 int64_t max, const char *file, ct_error *err) {
    const cJSON *item;
    int found = json_lookup(&item, obj, key, required, file, err);
    if (found <= 0) return found;
    if (!cJSON_IsNumber(item))
        return ct_fail(err, "%s: key \"%s\": expected an integer, found %s", file, key,
                       json_type_name(item));
    double d = item->valuedouble;
    // 2^63 is exactly representable; anything at or beyond it does not fit an int64.
    if (d != floor(d) || d < -9223372036854775808.0 || d >= 9223372036854775808.0)
        return ct_fail(err, "%s: key \"%s\": expected an integer, found %.17g", file, key, d);
    int64_t v = (int64_t)d;
    if (v < min || v > max)
        return ct_fail(err, "%s: key \"%s\": expected an integer in [%lld, %lld], found %lld", file,
                       key, (long long)min, (long long)max, (long long)v);
    *out = v;
    return 0;
}

int json_get_double(double *out, const cJSON *obj, const char *key, bool required, const char *file,
                    ct_error *err) {
    const cJSON *item;
    int found = json_lookup(&item, obj, key, required, file, err);
    if (found <= 0) return found;
    if (!cJSON_IsNumber(item))
        return ct_fail(err, "%s: key \"%s\": expected a number, found %s", file, key,
                       json_type_name(item));
    *out = item->valuedouble;
    return 0;
}

int json_get_bool(bool *out, const cJSON *obj, const char *key, bool required, const char *file,
                  ct_error *err) {
    const cJSON *item;
    int found = json_lookup(&item, obj, key, required, file, err);
    if (found <= 0) return found;
    if (!cJSON_IsBool(item))
        return ct_fail(err, "%s: key \"%s\": expected true or false, found %s", file, key,
                       json_type_name(item));
    *out = cJSON_IsTrue(item);
    return 0;
}

int json_get_string(char *out, size_t cap, const cJSON *obj, const char *key, bool required,
                    const char *file, ct_error *err) {
    const cJSON *item;
    int found = json_lookup(&item, obj, key, required, file, err);
    if (found <= 0) return found;
    if (!cJSON_IsString(item))
        return ct_fail(err, "%s: key \"%s\": expected a string, found %s", file, key,
                       json_type_name(item));
    size_t n = strlen(item->valuestring);
    if (n >= cap)
        return ct_fail(err, "%s: key \"%s\": string of %zu bytes is longer than the limit of %zu",
                       file, key, n, cap ? cap - 1 : 0);
    memcpy(out, item->valuestring, n + 1);
    return 0;
}

cJSON *json_exact_number(double x) {
    if (!isfinite(x)) return cJSON_CreateNull();
    char text[32];
    snprintf(text, sizeof text, "%.17g", x);
    return cJSON_CreateRaw(text);
}

bool json_is_uint(const cJSON *item, uint64_t *out) {
    if (!cJSON_IsNumber(item)) return false;
    double d = item->valuedouble;
    if (!(d >= 0) || d >= 9007199254740992.0 || d != floor(d)) return false;
    if (out) *out = (uint64_t)d;
    return true;
}

// A scanner over JSON that cJSON has accepted: it only has to find where things end. Whitespace
// is every byte up to 0x20, as cJSON skips it.
static size_t skip_space(const char *t, size_t n, size_t i) {
    while (i < n && (unsigned char)t[i] <= 0x20) i++;
    return i;
}

// t[i] is the opening quote; returns the index of the closing one (n if none).
static size_t string_end(const char *t, size_t n, size_t i) {
    for (i++; i < n; i++) {
        if (t[i] == '\\')
            i++;
        else if (t[i] == '"')
            return i;
    }
    return n;
}

// Returns the index just after the value that starts at t[i].
static size_t skip_value(const char *t, size_t n, size_t i) {
    if (i < n && t[i] == '"') return string_end(t, n, i) + 1;
    if (i < n && (t[i] == '{' || t[i] == '[')) {
        for (size_t depth = 0; i < n; i++) {
            if (t[i] == '"') {
                i = string_end(t, n, i);
            } else if (t[i] == '{' || t[i] == '[') {
                depth++;
            } else if ((t[i] == '}' || t[i] == ']') && --depth == 0) {
                return i + 1;
            }
        }
        return n;
    }
    while (i < n && (unsigned char)t[i] > 0x20 && !strchr(",]}", t[i])) i++; // number, literal
    return i;
}

// The 4 hex digits at p, or -1 if they are not (cJSON reads a bad digit as \u0000).
static int32_t hex4(const char *p) {
    int32_t v = 0;
    for (int k = 0; k < 4; k++) {
        char c = p[k], l = (char)(c | 0x20);
        int d = c >= '0' && c <= '9' ? c - '0' : l >= 'a' && l <= 'f' ? l - 'a' + 10 : -1;
        if (d < 0) return -1;
        v = v << 4 | d;
    }
    return v;
}

int json_unescape(char *out, size_t *out_n, const char *body, size_t n) {
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        const char *bs = memchr(body + i, '\\', n - i);
        size_t run = bs ? (size_t)(bs - (body + i)) : n - i;
        memcpy(out + o, body + i, run);
        o += run;
        i += run;
        if (i >= n) break;
        if (i + 1 >= n) return -1; // a lone '\\' at the end
        char e = body[i + 1];
        i += 2;
        static const char short_esc[] = "bfnrt", short_val[] = "\b\f\n\r\t";
        const char *k = e ? memchr(short_esc, e, 5) : NULL;
        if (k) {
            out[o++] = short_val[k - short_esc];
            continue;
        }
        if (e != 'u') {
            out[o++] = e; // '"', '\\', '/'
            continue;
        }
        int32_t cp = i + 4 <= n ? hex4(body + i) : -1;
        if (cp < 0) return -1;
        i += 4;
        if (cp >= 0xD800 && cp < 0xDC00 && i + 6 <= n && body[i] == '\\' && body[i + 1] == 'u') {
            int32_t lo = hex4(body + i + 2);
            if (lo >= 0xDC00 && lo < 0xE000) {
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                i += 6;
            }
        }
        // cJSON refuses a lone surrogate; should one come here, it is not a character.
        if (cp >= 0xD800 && cp < 0xE000) cp = 0xFFFD;
        o += (size_t)utf8_encode(out + o, (uint32_t)cp);
    }
    *out_n = o;
    return 0;
}

bool json_member_string(const char **body, size_t *len, const char *text, size_t n,
                        const char *key) {
    size_t klen = strlen(key), i = skip_space(text, n, 0);
    if (i >= n || text[i] != '{') return false;
    for (i = skip_space(text, n, i + 1); i < n && text[i] == '"';) {
        size_t ks = i + 1, ke = string_end(text, n, i);
        // A name with escapes is decoded first; it is no longer than its literal.
        char name[64];
        size_t name_n;
        bool match = false;
        if (ke - ks == klen && !memchr(text + ks, '\\', klen))
            match = memcmp(text + ks, key, klen) == 0;
        else if (ke - ks <= sizeof name && memchr(text + ks, '\\', ke - ks))
            match = json_unescape(name, &name_n, text + ks, ke - ks) == 0 && name_n == klen &&
                    memcmp(name, key, klen) == 0;
        i = skip_space(text, n, ke + 1); // the ':'
        i = skip_space(text, n, i + 1);  // the value
        if (match) {
            if (i >= n || text[i] != '"') return false;
            *body = text + i + 1;
            *len = string_end(text, n, i) - (i + 1);
            return true;
        }
        i = skip_space(text, n, skip_value(text, n, i));
        if (i >= n || text[i] != ',') break;
        i = skip_space(text, n, i + 1);
    }
    return false;
}

// Writes the escape of the character at s[0..n) into out (at most 12 bytes, 6 per input byte);
// returns the input bytes it took and sets *len to the bytes written.
static size_t quote_char(char *out, size_t *len, const unsigned char *s, size_t n, unsigned flags) {
    uint32_t cp = s[0];
    size_t took = 1;
    if ((flags & JSON_ASCII) && cp >= 0x80) {
        int k = utf8_decode(&cp, s, n);
        if (k > 0)
            took = (size_t)k;
        else
            cp = 0xfffd; // one ill-formed byte: its callers validate UTF-8 first
    }
    const char *brief =
        cp && cp < 0x20 && (flags & JSON_SHORT) ? strchr("\bb\ff\nn\rr\tt", (int)cp) : NULL;
    if (cp == '"' || cp == '\\') {
        out[0] = '\\';
        out[1] = (char)cp;
        *len = 2;
    } else if (brief) {
        out[0] = '\\';
        out[1] = brief[1];
        *len = 2;
    } else if (cp < 0x20 || ((flags & JSON_ASCII) && cp >= 0x7f && cp < 0x10000)) {
        *len = (size_t)sprintf(out, "\\u%04x", (unsigned)cp);
    } else if ((flags & JSON_ASCII) && cp >= 0x10000) {
        cp -= 0x10000; // a UTF-16 surrogate pair, as Python writes it
        *len = (size_t)sprintf(out, "\\u%04x\\u%04x", 0xd800 + (unsigned)(cp >> 10),
                               0xdc00 + (unsigned)(cp & 0x3ff));
    } else {
        out[0] = (char)cp;
        *len = 1;
    }
    return took;
}

int json_quote(json_buf *b, const char *s, size_t n, unsigned flags) {
    if (n > (SIZE_MAX - b->len - 3) / 6 || grow_to((void **)&b->p, &b->cap, b->len + 6 * n + 3, 1))
        return -1;
    char *o = b->p + b->len;
    *o++ = '"';
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0, k; i < n; o += k) i += quote_char(o, &k, u + i, n - i, flags);
    *o++ = '"';
    *o = '\0';
    b->len = (size_t)(o - b->p);
    return 0;
}

void json_write_string(FILE *f, const char *s, size_t n, unsigned flags) {
    char tmp[512];
    size_t k = 0, len;
    tmp[k++] = '"';
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        if (k > sizeof tmp - 12) fwrite(tmp, 1, k, f), k = 0;
        i += quote_char(tmp + k, &len, u + i, n - i, flags);
        k += len;
    }
    tmp[k++] = '"';
    fwrite(tmp, 1, k, f);
}
