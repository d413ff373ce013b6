// .npy token streams. The header is a Python dict literal; we parse exactly the subset numpy
// writes ({'descr': .., 'fortran_order': .., 'shape': (..)}) and accept only what a token stream
// can be: a 1-D little-endian integer array in C order.
#include "io/npy.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/fs.h"
#include "io/atomic.h"

#define NPY_MAGIC "\x93NUMPY"
#define NPY_MAX_DIMS 32
#define NPY_ALIGN 64
#define NPY_GROWTH_DIGITS 21 // numpy leaves room to grow the first axis in place

typedef struct npy_type {
    const char *descr;
    size_t size;
    int64_t min, max; // representable range
} npy_type;

static const npy_type npy_types[] = {
    {"<u2", 2, 0, UINT16_MAX},
    {"<i4", 4, INT32_MIN, INT32_MAX},
    {"<u4", 4, 0, UINT32_MAX},
    {"<i8", 8, INT64_MIN, INT64_MAX},
};

static const npy_type *npy_type_find(const char *descr) {
    for (size_t i = 0; i < sizeof npy_types / sizeof npy_types[0]; i++) {
        if (strcmp(descr, npy_types[i].descr) == 0) return &npy_types[i];
    }
    return NULL;
}

// A cursor over the header text (not NUL-terminated).
typedef struct npy_lex {
    const char *p, *end;
    const char *path;
} npy_lex;

static void lex_ws(npy_lex *l) {
    while (l->p < l->end && (*l->p == ' ' || *l->p == '\t' || *l->p == '\n' || *l->p == '\r'))
        l->p++;
}

static bool lex_eat(npy_lex *l, char c) {
    lex_ws(l);
    if (l->p < l->end && *l->p == c) {
        l->p++;
        return true;
    }
    return false;
}

static int lex_fail(npy_lex *l, const char *start, const char *what, ct_error *err) {
    return ct_fail(err, "%s: malformed .npy header at byte %zu: expected %s", l->path,
                   (size_t)(l->p - start), what);
}

// A quoted string without escapes (numpy never writes any in these fields).
static int lex_string(char *out, size_t cap, npy_lex *l) {
    lex_ws(l);
    if (l->p >= l->end || (*l->p != '\'' && *l->p != '"')) return -1;
    char q = *l->p++;
    size_t n = 0;
    while (l->p < l->end && *l->p != q) {
        if (*l->p == '\\' || n + 1 >= cap) return -1;
        out[n++] = *l->p++;
    }
    if (l->p >= l->end) return -1;
    l->p++;
    out[n] = '\0';
    return 0;
}

static int lex_uint(uint64_t *out, npy_lex *l) {
    lex_ws(l);
    if (l->p >= l->end || *l->p < '0' || *l->p > '9') return -1;
    uint64_t v = 0;
    while (l->p < l->end && *l->p >= '0' && *l->p <= '9') {
        if (__builtin_mul_overflow(v, 10u, &v) ||
            __builtin_add_overflow(v, (uint64_t)(*l->p - '0'), &v))
            return -1;
        l->p++;
    }
    if (l->p < l->end && *l->p == 'L') l->p++; // Python 2 longs
    *out = v;
    return 0;
}

typedef struct npy_header {
    char descr[16];
    int fortran; // -1: absent
    int ndim;    // -1: absent
    uint64_t shape[NPY_MAX_DIMS];
} npy_header;

static int npy_parse_dict(npy_header *h, npy_lex *l, ct_error *err) {
    const char *start = l->p;
    h->descr[0] = '\0';
    h->fortran = h->ndim = -1;
    if (!lex_eat(l, '{')) return lex_fail(l, start, "'{'", err);
    while (!lex_eat(l, '}')) {
        char key[32];
        if (lex_string(key, sizeof key, l) != 0) return lex_fail(l, start, "a quoted key", err);
        if (!lex_eat(l, ':')) return lex_fail(l, start, "':'", err);
        if (strcmp(key, "descr") == 0) {
            if (lex_string(h->descr, sizeof h->descr, l) != 0)
                return lex_fail(l, start, "a dtype string such as '<i4'", err);
        } else if (strcmp(key, "fortran_order") == 0) {
            lex_ws(l);
            size_t left = (size_t)(l->end - l->p);
            if (left >= 4 && memcmp(l->p, "True", 4) == 0) {
                h->fortran = 1, l->p += 4;
            } else if (left >= 5 && memcmp(l->p, "False", 5) == 0) {
                h->fortran = 0, l->p += 5;
            } else {
                return lex_fail(l, start, "True or False", err);
            }
        } else if (strcmp(key, "shape") == 0) {
            if (!lex_eat(l, '(')) return lex_fail(l, start, "a shape tuple", err);
            h->ndim = 0;
            while (!lex_eat(l, ')')) {
                uint64_t v;
                if (h->ndim >= NPY_MAX_DIMS || lex_uint(&v, l) != 0)
                    return lex_fail(l, start, "a non-negative integer dimension", err);
                h->shape[h->ndim++] = v;
                if (!lex_eat(l, ',')) {
                    if (!lex_eat(l, ')')) return lex_fail(l, start, "',' or ')'", err);
                    break;
                }
            }
        } else {
            return ct_fail(err, "%s: unexpected key '%s' in the .npy header", l->path, key);
        }
        if (!lex_eat(l, ',')) {
            if (!lex_eat(l, '}')) return lex_fail(l, start, "',' or '}'", err);
            break;
        }
    }
    lex_ws(l);
    if (l->p != l->end) return lex_fail(l, start, "only padding after the header dict", err);
    if (!h->descr[0] || h->fortran < 0 || h->ndim < 0)
        return ct_fail(err, "%s: .npy header lacks '%s'", l->path,
                       !h->descr[0]     ? "descr"
                       : h->fortran < 0 ? "fortran_order"
                                        : "shape");
    return 0;
}

static const npy_type *npy_check_descr(const char *descr, const char *path, ct_error *err) {
    const npy_type *ty = npy_type_find(descr);
    if (ty) return ty;
    size_t n = strlen(descr);
    if (n >= 2 && (descr[1] == 'f' || descr[1] == 'c'))
        ct_fail(err, "%s: float dtype %s not supported: token arrays must be integer", path, descr);
    else if (descr[0] == '>' || (descr[0] == '=' && n >= 3 && strcmp(descr + 2, "1") != 0))
        ct_fail(err,
                "%s: byte order of dtype %s not supported: expected little-endian '<' (one of "
                "<u2, <i4, <u4, <i8)",
                path, descr);
    else
        ct_fail(err, "%s: unsupported dtype %s (expected one of <u2, <i4, <u4, <i8)", path, descr);
    return NULL;
}

// Checks a .npy of `size` bytes whose first `have` bytes are in buf (the whole file, or at least
// its header: then *need_more says how many bytes the header needs when buf is too short).
static int npy_validate(npy_tokens *t, const unsigned char *buf, size_t have, size_t size,
                        size_t *need_more, ct_error *err) {
    const char *path = t->path;
    if (have < 12 && have < size) {
        *need_more = 12;
        return 1;
    }
    if (size < 10 || memcmp(buf, NPY_MAGIC, 6) != 0)
        return ct_fail(err,
                       "%s: not a .npy file (expected the magic \\x93NUMPY, file is %zu bytes)",
                       path, size);
    int major = buf[6], minor = buf[7];
    if (major < 1 || major > 3)
        return ct_fail(err, "%s: unsupported .npy format version %d.%d (expected 1.0, 2.0 or 3.0)",
                       path, major, minor);
    size_t hstart = major == 1 ? 10 : 12;
    if (size < hstart) return ct_fail(err, "%s: file ends inside the .npy header length", path);
    uint64_t hlen = major == 1 ? (uint64_t)buf[8] | (uint64_t)buf[9] << 8
                               : (uint64_t)buf[8] | (uint64_t)buf[9] << 8 |
                                     (uint64_t)buf[10] << 16 | (uint64_t)buf[11] << 24;
    if (hlen > size - hstart)
        return ct_fail(err, "%s: .npy header length %llu runs past the end of the file (%zu bytes)",
                       path, (unsigned long long)hlen, size);
    if (hstart + hlen > have) {
        *need_more = hstart + (size_t)hlen;
        return 1;
    }
    npy_lex l = {(const char *)buf + hstart, (const char *)buf + hstart + hlen, path};
    npy_header h;
    if (npy_parse_dict(&h, &l, err) != 0) return -1;
    const npy_type *ty = npy_check_descr(h.descr, path, err);
    if (!ty) return -1;
    if (h.fortran)
        return ct_fail(err, "%s: fortran_order True not supported: token arrays must be C order",
                       path);
    if (h.ndim != 1) {
        char s[128];
        size_t k = (size_t)snprintf(s, sizeof s, "(");
        for (int d = 0; d < h.ndim && k < sizeof s; d++)
            k += (size_t)snprintf(s + k, sizeof s - k, "%llu%s", (unsigned long long)h.shape[d],
                                  h.ndim == 1 || d + 1 < h.ndim ? ", " : "");
        if (k < sizeof s) snprintf(s + k, sizeof s - k, ")");
        return ct_fail(err, "%s: shape %s is %d-D: token arrays must be 1-D (N,)", path, s, h.ndim);
    }
    size_t data_off = hstart + (size_t)hlen, data_bytes = size - data_off;
    uint64_t need;
    bool overflow = __builtin_mul_overflow(h.shape[0], (uint64_t)ty->size, &need);
    if (overflow || need != data_bytes)
        return ct_fail(err, "%s: data is %zu bytes, expected %llu elements of %s%s", path,
                       data_bytes, (unsigned long long)h.shape[0], ty->descr,
                       overflow || data_bytes < need ? " (truncated)" : " (trailing bytes)");
    snprintf(t->descr, sizeof t->descr, "%s", ty->descr);
    t->elem_size = ty->size;
    t->count = h.shape[0];
    t->data_off = data_off;
    if (have == size) t->data = buf + data_off;
    return 0;
}

int npy_parse(npy_tokens *t, const void *buf, size_t size, const char *name, ct_error *err) {
    memset(t, 0, sizeof *t);
    t->fd = -1;
    t->path = strdup(name);
    if (!t->path) return ct_fail(err, "%s: out of memory", name);
    size_t unused;
    if (npy_validate(t, buf, size, size, &unused, err) != 0) {
        npy_close(t);
        return -1;
    }
    return 0;
}

static int read_at(int fd, unsigned char *buf, size_t n, size_t at, const char *path,
                   ct_error *err) {
    for (size_t done = 0; done < n;) {
        ssize_t k = pread(fd, buf + done, n - done, (off_t)(at + done));
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0)
            return ct_fail(err, "%s: read failed at byte %zu: %s", path, at + done,
                           k < 0 ? strerror(errno) : "unexpected end of file");
        done += (size_t)k;
    }
    return 0;
}

// Reads only the header: the tokens are mapped range by range when read (npy_read), so a file
// of any size costs neither memory nor address space until then.
int npy_open(npy_tokens *t, const char *path, ct_error *err) {
    memset(t, 0, sizeof *t);
    t->fd = -1;
    size_t size, have, need = 0;
    if (fs_open_regular(&t->fd, &size, path, err) != 0) {
        t->fd = -1;
        return -1;
    }
    have = size < 12 ? size : 12; // the magic, the version and the header's length
    unsigned char *buf = malloc(have + 1);
    int rc = -1;
    if (!(t->path = strdup(path)) || !buf)
        ct_fail(err, "%s: out of memory", path);
    else if (read_at(t->fd, buf, have, 0, path, err) == 0 &&
             (rc = npy_validate(t, buf, have, size, &need, err)) == 1) {
        unsigned char *grown = realloc(buf, need);
        rc = -1;
        if (!grown)
            ct_fail(err, "%s: out of memory for a .npy header of %zu bytes", path, need);
        else if (buf = grown, read_at(t->fd, buf + have, need - have, have, path, err) == 0)
            rc = npy_validate(t, buf, need, size, &need, err);
    }
    free(buf);
    t->data = NULL; // pointed into buf when the file is all header (no tokens)
    if (rc != 0) npy_close(t);
    return rc == 0 ? 0 : -1;
}

void npy_close(npy_tokens *t) {
    if (t->fd >= 0) close(t->fd);
    free(t->path);
    memset(t, 0, sizeof *t);
    t->fd = -1;
}

// Converts n elements at p to int32, checking each against limit.
static int convert(int32_t *out, const npy_tokens *t, const unsigned char *p, uint64_t start,
                   size_t n, int64_t limit, ct_error *err) {
    for (size_t i = 0; i < n; i++, p += t->elem_size) {
        int64_t v;
        if (t->elem_size == 2) {
            v = (int64_t)p[0] | (int64_t)p[1] << 8;
        } else if (t->elem_size == 4) {
            uint32_t u =
                (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
            v = t->descr[1] == 'i' ? (int64_t)(int32_t)u : (int64_t)u;
        } else {
            uint64_t u = 0;
            for (int b = 7; b >= 0; b--) u = u << 8 | p[b];
            v = (int64_t)u;
        }
        if (v < 0 || v >= limit)
            return ct_fail(err, "%s: token %lld at index %llu is outside [0, %lld)", t->path,
                           (long long)v, (unsigned long long)(start + i), (long long)limit);
        out[i] = (int32_t)v;
    }
    return 0;
}

int npy_read(int32_t *out, const npy_tokens *t, uint64_t start, size_t n, int64_t vocab_size,
             ct_error *err) {
    if (start > t->count || n > t->count - start)
        return ct_fail(err, "%s: tokens [%llu, %llu) requested, the file has %llu", t->path,
                       (unsigned long long)start, (unsigned long long)(start + n),
                       (unsigned long long)t->count);
    int64_t limit = vocab_size > 0 ? vocab_size : (int64_t)INT32_MAX + 1;
    if (t->data || n == 0)
        return convert(out, t, t->data + start * t->elem_size, start, n, limit, err);
    // The pages holding the range, mapped for this read only.
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    uint64_t from = t->data_off + start * t->elem_size, base = from / page * page;
    size_t len = (size_t)(from - base) + n * t->elem_size;
    void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, t->fd, (off_t)base);
    if (map == MAP_FAILED)
        return ct_fail(err, "%s: mmap of tokens [%llu, %llu) failed: %s", t->path,
                       (unsigned long long)start, (unsigned long long)(start + n), strerror(errno));
    int rc = convert(out, t, (const unsigned char *)map + (from - base), start, n, limit, err);
    munmap(map, len);
    return rc;
}

// The header numpy's np.save writes for a 1-D array of n: the dict, room to grow the first axis
// (so a stream's final count is written over its first header in place), then spaces and a
// newline up to a multiple of 64 (a whole extra 64 when already aligned, as numpy does).
// Returns its length, preamble included.
static size_t npy_header_write(unsigned char out[256], const char *descr, uint64_t n) {
    char *hdr = (char *)out + 10;
    int len = snprintf(hdr, 246, "{'descr': '%s', 'fortran_order': False, 'shape': (%llu,), }",
                       descr, (unsigned long long)n);
    int digits = snprintf(NULL, 0, "%llu", (unsigned long long)n);
    for (int i = digits; i < NPY_GROWTH_DIGITS; i++) hdr[len++] = ' ';
    int pad = NPY_ALIGN - (10 + len + 1) % NPY_ALIGN;
    memset(hdr + len, ' ', (size_t)pad);
    len += pad;
    hdr[len++] = '\n';
    memcpy(out, NPY_MAGIC "\x01\x00", 8);
    out[8] = (unsigned char)(len & 0xff);
    out[9] = (unsigned char)(len >> 8);
    return 10 + (size_t)len;
}

int npy_writer_open(npy_writer *w, const char *path, const char *descr, ct_error *err) {
    memset(w, 0, sizeof *w);
    const npy_type *ty = npy_type_find(descr);
    if (!ty)
        return ct_fail(err, "%s: cannot write dtype %s (expected <u2, <i4, <u4 or <i8)", path,
                       descr);
    memcpy(w->descr, ty->descr, strlen(ty->descr) + 1);
    w->elem_size = ty->size;
    w->min = ty->min;
    w->max = ty->max;
    unsigned char hdr[256];
    size_t len = npy_header_write(hdr, w->descr, 0);
    if (atomic_open(&w->f, path, err) != 0) return -1;
    if (atomic_write(&w->f, hdr, len, err) != 0) {
        atomic_abort(&w->f);
        return -1;
    }
    return 0;
}

static int npy_writer_flush(npy_writer *w, ct_error *err) {
    int rc = w->nbuf ? atomic_write(&w->f, w->buf, w->nbuf, err) : 0;
    w->nbuf = 0;
    return rc;
}

int npy_writer_put(npy_writer *w, const int64_t *values, size_t n, ct_error *err) {
    for (size_t i = 0; i < n; i++) {
        if (values[i] < w->min || values[i] > w->max)
            return ct_fail(err, "%s: value %lld at index %llu does not fit %s", w->f.path,
                           (long long)values[i], (unsigned long long)(w->count + i), w->descr);
    }
    for (size_t i = 0; i < n; i++) {
        if (w->nbuf + w->elem_size > sizeof w->buf && npy_writer_flush(w, err) != 0) return -1;
        uint64_t u = (uint64_t)values[i]; // little-endian on every host
        for (size_t b = 0; b < w->elem_size; b++) w->buf[w->nbuf++] = (unsigned char)(u >> (8 * b));
    }
    w->count += n;
    return 0;
}

int npy_writer_commit(npy_writer *w, ct_error *err) {
    unsigned char hdr[256];
    size_t len = npy_header_write(hdr, w->descr, w->count);
    if (npy_writer_flush(w, err) != 0) {
        atomic_abort(&w->f);
        return -1;
    }
    if (fseek(w->f.fp, 0, SEEK_SET) != 0 || atomic_write(&w->f, hdr, len, err) != 0) {
        atomic_abort(&w->f);
        return ct_fail(err, "%s: cannot rewrite the .npy header", w->f.path);
    }
    return atomic_commit(&w->f, err);
}

void npy_writer_abort(npy_writer *w) {
    if (w->f.fp) atomic_abort(&w->f);
}

int npy_write(const char *path, const int64_t *values, size_t n, const char *descr, ct_error *err) {
    const npy_type *ty = npy_type_find(descr);
    if (!ty)
        return ct_fail(err, "%s: cannot write dtype %s (expected <u2, <i4, <u4 or <i8)", path,
                       descr);
    // Checked before the file is created, so a value that does not fit leaves nothing behind.
    for (size_t i = 0; i < n; i++) {
        if (values[i] < ty->min || values[i] > ty->max)
            return ct_fail(err, "%s: value %lld at index %zu does not fit %s", path,
                           (long long)values[i], i, descr);
    }
    npy_writer w;
    if (npy_writer_open(&w, path, descr, err) != 0) return -1;
    if (npy_writer_put(&w, values, n, err) != 0) {
        npy_writer_abort(&w);
        return -1;
    }
    return npy_writer_commit(&w, err);
}
