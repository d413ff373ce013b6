// .npy token streams: round trips for every accepted dtype, byte equality with numpy's np.save,
// the streaming writer's files equal npy_write's, numpy-written v1/v2/v3 files read back, and
// one malformed file per validation rule.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "io/json.h"
#include "io/npy.h"

static const char *tmp;
static const char *descrs[4] = {"<u2", "<i4", "<u4", "<i8"};
enum { N = 1000 };

static const char *tpath(const char *name) {
    static char buf[8][1024];
    static int k;
    char *p = buf[k++ % 8];
    snprintf(p, sizeof buf[0], "%s/%s", tmp, name);
    return p;
}

static int64_t value_at(int d, size_t i) {
    static const int64_t top[4] = {65535, INT32_MAX, 151935, INT32_MAX};
    return (int64_t)((i * 2654435761u) % ((uint64_t)top[d] + 1)) * (i % 7 != 3) + (i == 3) * top[d];
}

// Reads every token of `path` and compares with value_at(d, .).
static void check_tokens(const char *path, int d, int line) {
    npy_tokens t;
    ct_error err = {{0}};
    int rc = npy_open(&t, path, &err);
    CHECK(rc == 0, "line %d: open %s: %s", line, path, err.msg);
    if (rc != 0) return;
    CHECK(t.count == N && strcmp(t.descr, descrs[d]) == 0, "line %d: %s: count %llu descr %s", line,
          path, (unsigned long long)t.count, t.descr);
    int32_t *out = malloc(N * sizeof *out);
    CHECK(npy_read(out, &t, 0, N, 0, &err) == 0, "line %d: read: %s", line, err.msg);
    int bad = 0;
    for (size_t i = 0; i < N; i++) bad += out[i] != value_at(d, i);
    CHECK(bad == 0, "line %d: %s: %d wrong tokens", line, path, bad);
    CHECK(npy_read(out, &t, 990, 10, 0, &err) == 0 && out[9] == value_at(d, 999), "tail read");
    CHECK(npy_read(out, &t, 995, 10, 0, &err) == -1 && strstr(err.msg, path) &&
              strstr(err.msg, "[995, 1005)"),
          "read past the end: %s", err.msg);
    free(out);
    npy_close(&t);
}

// Fills v with value_at(d, .) and writes it with npy_write to PREFIX_<descr>.npy; its path.
static const char *write_values(int64_t *v, int d, const char *prefix) {
    for (size_t i = 0; i < N; i++) v[i] = value_at(d, i);
    char name[64];
    snprintf(name, sizeof name, "%s_%c%c.npy", prefix, descrs[d][1], descrs[d][2]);
    const char *p = tpath(name);
    ct_error err = {{0}};
    CHECK(npy_write(p, v, N, descrs[d], &err) == 0, "write %s: %s", p, err.msg);
    return p;
}

static void test_round_trip(void) {
    int64_t *v = malloc(N * sizeof *v);
    for (int d = 0; d < 4; d++) {
        const char *p = write_values(v, d, "rt");
        ct_error err = {{0}};
        size_t len;
        char *raw = NULL;
        CHECK(file_read_all(&raw, &len, p, 1 << 20, &err) == 0, "read back");
        size_t hl = raw ? (size_t)(unsigned char)raw[8] | (size_t)(unsigned char)raw[9] << 8 : 0;
        CHECK(raw && memcmp(raw, "\x93NUMPY\x01\x00", 8) == 0, "v1.0 magic");
        CHECK((10 + hl) % 64 == 0 && raw && raw[10 + hl - 1] == '\n',
              "header aligned, ends in \\n");
        char expect[128];
        snprintf(expect, sizeof expect, "{'descr': '%s', 'fortran_order': False, 'shape': (%d,), }",
                 descrs[d], N);
        CHECK(raw && strncmp(raw + 10, expect, strlen(expect)) == 0, "header dict");
        free(raw);
        check_tokens(p, d, __LINE__);
    }
    // Empty arrays are valid.
    ct_error err;
    npy_tokens t;
    CHECK(npy_write(tpath("empty.npy"), v, 0, "<i4", &err) == 0 &&
              npy_open(&t, tpath("empty.npy"), &err) == 0 && t.count == 0,
          "empty: %s", err.msg);
    npy_close(&t);
    free(v);
}

// numpy loads our files, re-saves them with np.save (must be byte-identical) and writes
// v2.0 and v3.0 copies, which we must read.
// npy_writer (ctitan tokenize's output) writes the bytes npy_write writes, whatever the pieces
// the values come in: the header written first for 0 values keeps its length when the count
// replaces it. A value that does not fit is refused; abort leaves no file.
static void test_writer(void) {
    int64_t *v = malloc(N * sizeof *v);
    for (int d = 0; d < 4; d++) {
        const char *whole = write_values(v, d, "whole");
        char name[64];
        snprintf(name, sizeof name, "stream_%c%c.npy", descrs[d][1], descrs[d][2]);
        const char *stream = tpath(name);
        ct_error err = {{0}};
        npy_writer w;
        int rc = npy_writer_open(&w, stream, descrs[d], &err);
        for (size_t at = 0, k = 1; rc == 0 && at < N; at += k, k = k * 3 % 1024 + 1)
            rc = npy_writer_put(&w, v + at, at + k <= N ? k : N - at, &err);
        if (rc == 0) rc = npy_writer_commit(&w, &err);
        CHECK(rc == 0, "stream %s: %s", stream, err.msg);
        char *a = NULL, *b = NULL;
        size_t na = 0, nb = 0;
        file_read_all(&a, &na, whole, 1 << 20, &err);
        file_read_all(&b, &nb, stream, 1 << 20, &err);
        CHECK(a && b && na == nb && memcmp(a, b, na) == 0, "%s: %zu bytes, npy_write's %zu", stream,
              nb, na);
        free(a);
        free(b);
    }
    ct_error err = {{0}};
    npy_writer w;
    const char *p = tpath("refused.npy");
    int64_t big = 70000;
    CHECK(npy_writer_open(&w, p, "<u2", &err) == 0, "open: %s", err.msg);
    CHECK(npy_writer_put(&w, &big, 1, &err) == -1 && strstr(err.msg, "70000") &&
              strstr(err.msg, "<u2"),
          "a value that does not fit: %s", err.msg);
    npy_writer_abort(&w);
    FILE *f = fopen(p, "rb");
    CHECK(f == NULL, "abort left %s", p);
    if (f) fclose(f);
    CHECK(npy_writer_open(&w, p, "<f4", &err) == -1 && strstr(err.msg, "<f4"), "dtype: %s",
          err.msg);
    free(v);
}

static void test_numpy(void) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "%s -c \"import numpy as np, numpy.lib.format as F\n"
             "for c in ['u2', 'i4', 'u4', 'i8']:\n"
             "    a = np.load('%s/rt_' + c + '.npy')\n"
             "    assert a.dtype == np.dtype('<' + c) and a.shape == (%d,), (a.dtype, a.shape)\n"
             "    np.save('%s/np_' + c + '.npy', a)\n"
             "    for v in [(2, 0), (3, 0)]:\n"
             "        with open('%s/np%%d_%%s.npy' %% (v[0], c), 'wb') as f:\n"
             "            F.write_array(f, a, version=v)\n\"",
             check_env("CTITAN_PYTHON"), tmp, N, tmp, tmp);
    CHECK(system(cmd) == 0, "numpy failed: %s", cmd);
    for (int d = 0; d < 4; d++) {
        char a[64], b[64];
        snprintf(a, sizeof a, "rt_%s.npy", descrs[d] + 1);
        snprintf(b, sizeof b, "np_%s.npy", descrs[d] + 1);
        char *x = NULL, *y = NULL;
        size_t lx = 0, ly = 0;
        ct_error err;
        file_read_all(&x, &lx, tpath(a), 1 << 20, &err);
        file_read_all(&y, &ly, tpath(b), 1 << 20, &err);
        CHECK(x && y && lx == ly && memcmp(x, y, lx) == 0, "%s differs from numpy's %s", a, b);
        free(x);
        free(y);
        check_tokens(tpath(b), d, __LINE__);
        for (int v = 2; v <= 3; v++) {
            snprintf(b, sizeof b, "np%d_%s.npy", v, descrs[d] + 1);
            check_tokens(tpath(b), d, __LINE__);
        }
    }
}

// A file with the given version, header dict (padded with spaces and '\n' to 64 bytes) and data.
static const char *make_npy(const char *name, int major, const char *dict, const void *data,
                            size_t data_len) {
    const char *p = tpath(name);
    size_t pre = major == 1 ? 10 : 12, dl = strlen(dict);
    size_t hl = dl + 1;
    while ((pre + hl) % 64) hl++;
    unsigned char *buf = calloc(1, pre + hl + data_len + 1);
    memcpy(buf, "\x93NUMPY", 6);
    buf[6] = (unsigned char)major;
    for (size_t i = 0; i < pre - 8; i++) buf[8 + i] = (unsigned char)(hl >> (8 * i));
    memcpy(buf + pre, dict, dl);
    memset(buf + pre + dl, ' ', hl - dl - 1);
    buf[pre + hl - 1] = '\n';
    if (data_len) memcpy(buf + pre + hl, data, data_len);
    FILE *fp = fopen(p, "wb");
    fwrite(buf, 1, pre + hl + data_len, fp);
    fclose(fp);
    free(buf);
    return p;
}

static void expect_bad(const char *path, const char *d1, const char *d2, int line) {
    npy_tokens t;
    ct_error err = {{0}};
    int rc = npy_open(&t, path, &err);
    CHECK(rc == -1, "line %d: %s accepted", line, path);
    if (rc == 0) npy_close(&t);
    CHECK(strstr(err.msg, path), "line %d: message lacks the file name: %s", line, err.msg);
    CHECK(!d1 || strstr(err.msg, d1), "line %d: lacks '%s': %s", line, d1, err.msg);
    CHECK(!d2 || strstr(err.msg, d2), "line %d: lacks '%s': %s", line, d2, err.msg);
}

#define BAD(name, major, dict, data, n, d1, d2)                                                    \
    expect_bad(make_npy(name, major, dict, data, n), d1, d2, __LINE__)

static void test_bad(void) {
    int32_t d4[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    BAD("f4.npy", 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (8,), }", d4, 32,
        "float dtype <f4 not supported: token arrays must be integer", NULL);
    BAD("f8.npy", 1, "{'descr': '<f8', 'fortran_order': False, 'shape': (4,), }", d4, 32,
        "float dtype <f8", NULL);
    BAD("2d.npy", 1, "{'descr': '<i4', 'fortran_order': False, 'shape': (2, 4), }", d4, 32,
        "shape (2, 4) is 2-D", "must be 1-D");
    BAD("0d.npy", 1, "{'descr': '<i4', 'fortran_order': False, 'shape': (), }", d4, 4, "0-D", NULL);
    BAD("be.npy", 1, "{'descr': '>i4', 'fortran_order': False, 'shape': (8,), }", d4, 32,
        "byte order", ">i4");
    BAD("native.npy", 1, "{'descr': '=u2', 'fortran_order': False, 'shape': (8,), }", d4, 16,
        "byte order", "=u2");
    BAD("u1.npy", 1, "{'descr': '|u1', 'fortran_order': False, 'shape': (8,), }", d4, 8,
        "unsupported dtype |u1", NULL);
    BAD("i2.npy", 1, "{'descr': '<i2', 'fortran_order': False, 'shape': (8,), }", d4, 16,
        "unsupported dtype <i2", NULL);
    BAD("fortran.npy", 1, "{'descr': '<i4', 'fortran_order': True, 'shape': (8,), }", d4, 32,
        "fortran_order True", NULL);
    BAD("trunc.npy", 1, "{'descr': '<i4', 'fortran_order': False, 'shape': (8,), }", d4, 30,
        "data is 30 bytes, expected 8 elements of <i4", "truncated");
    BAD("trail.npy", 1, "{'descr': '<i4', 'fortran_order': False, 'shape': (7,), }", d4, 32,
        "trailing bytes", NULL);
    BAD("huge.npy", 1,
        "{'descr': '<i8', 'fortran_order': False, 'shape': (4611686018427387904,), }", d4, 32,
        "truncated", NULL);
    BAD("overflow.npy", 1,
        "{'descr': '<i8', 'fortran_order': False, 'shape': (99999999999999999999999,), }", d4, 32,
        "malformed .npy header", NULL);
    BAD("nokey.npy", 1, "{'descr': '<i4', 'shape': (8,), }", d4, 32, "lacks 'fortran_order'", NULL);
    BAD("extrakey.npy", 1, "{'descr': '<i4', 'fortran_order': False, 'shape': (8,), 'x': 1}", d4,
        32, "unexpected key 'x'", NULL);
    BAD("nodict.npy", 1, "[1, 2]", d4, 32, "malformed .npy header at byte 0", "'{'");
    BAD("unterminated.npy", 1, "{'descr': '<i4", d4, 32, "malformed", NULL);
    BAD("junk.npy", 1, "{'descr': '<i4', 'fortran_order': False, 'shape': (8,), } x", d4, 32,
        "only padding", NULL);
    BAD("bool.npy", 1, "{'descr': '<i4', 'fortran_order': 1, 'shape': (8,), }", d4, 32,
        "True or False", NULL);
    BAD("v4.npy", 4, "{'descr': '<i4', 'fortran_order': False, 'shape': (8,), }", d4, 32,
        "version 4.0", NULL);
    // Accepted variants: v2 header, double quotes, keys in another order, Python 2 long.
    const char *p = make_npy(
        "v2.npy", 2, "{\"shape\": (8L,), \"fortran_order\": False, \"descr\": \"<i4\"}", d4, 32);
    npy_tokens t;
    ct_error err = {{0}};
    int32_t out[8];
    CHECK(npy_open(&t, p, &err) == 0 && t.count == 8 && npy_read(out, &t, 0, 8, 9, &err) == 0 &&
              out[7] == 8,
          "v2 header: %s", err.msg);
    CHECK(npy_read(out, &t, 0, 8, 8, &err) == -1 && strstr(err.msg, p) &&
              strstr(err.msg, "index 7") && strstr(err.msg, "token 8"),
          "token >= vocab: %s", err.msg);
    npy_close(&t);

    p = tpath("magic.npy");
    FILE *fp = fopen(p, "wb");
    fwrite("\x93NUMPZ\x01\x00\x10\x00{}", 1, 12, fp);
    fclose(fp);
    expect_bad(p, "not a .npy file", NULL, __LINE__);
    p = tpath("tiny.npy");
    fp = fopen(p, "wb");
    fwrite("\x93NUM", 1, 4, fp);
    fclose(fp);
    expect_bad(p, "4 bytes", NULL, __LINE__);
    p = tpath("hlen.npy");
    fp = fopen(p, "wb");
    fwrite("\x93NUMPY\x01\x00\xff\x00{'descr'", 1, 18, fp);
    fclose(fp);
    expect_bad(p, "header length 255 runs past the end", NULL, __LINE__);
    p = tpath("hlen2.npy");
    fp = fopen(p, "wb");
    fwrite("\x93NUMPY\x02\x00\x00\x00\x00\x01{}", 1, 14, fp);
    fclose(fp);
    expect_bad(p, "header length 16777216 runs past the end", NULL, __LINE__);
    expect_bad(tpath("absent.npy"), "No such file", NULL, __LINE__);

    // Negative tokens, and values that do not fit int32 even with the vocab check off.
    int64_t neg[3] = {5, -1, 7};
    p = tpath("neg.npy");
    CHECK(npy_write(p, neg, 3, "<i8", &err) == 0, "write negative");
    CHECK(npy_open(&t, p, &err) == 0, "open negative");
    CHECK(npy_read(out, &t, 0, 3, 0, &err) == -1 && strstr(err.msg, "index 1") &&
              strstr(err.msg, "token -1"),
          "negative token: %s", err.msg);
    CHECK(npy_read(out, &t, 2, 1, 8, &err) == 0 && out[0] == 7, "range read after the bad one");
    npy_close(&t);
    int64_t big[2] = {1, 4294967295ll};
    p = tpath("big.npy");
    CHECK(npy_write(p, big, 2, "<u4", &err) == 0 && npy_open(&t, p, &err) == 0, "write big");
    CHECK(npy_read(out, &t, 0, 2, 0, &err) == -1 && strstr(err.msg, "index 1"),
          "u4 beyond int32: %s", err.msg);
    npy_close(&t);

    // Writer errors.
    CHECK(npy_write(tpath("w.npy"), big, 2, "<u2", &err) == -1 && strstr(err.msg, "4294967295") &&
              strstr(err.msg, "<u2"),
          "value does not fit: %s", err.msg);
    CHECK(npy_write(tpath("w.npy"), big, 2, "<f4", &err) == -1 && strstr(err.msg, "<f4"),
          "bad descr: %s", err.msg);
    p = tpath("nodir/w.npy");
    CHECK(npy_write(p, big, 2, "<i8", &err) == -1 && strstr(err.msg, p) &&
              strstr(err.msg, "No such file"),
          "missing folder: %s", err.msg);
}

int main(void) {
    tmp = check_env("CTITAN_TMP");
    test_round_trip();
    test_writer();
    test_numpy();
    test_bad();
    return check_summary();
}
