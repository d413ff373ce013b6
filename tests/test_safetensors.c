// safetensors: writer/reader round trips (single and sharded, F32/BF16/F16), the exact header
// layout, one malformed file per validation rule, the folder/index rules, byte-for-byte equality
// with the Python reference writer (tests/ref/safetensors_ref.py via make_ref.py's golden files)
// and the Python reader accepting our output.
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "io/json.h"
#include "io/safetensors.h"

static const char *tmp;

static const char *tpath(const char *name) {
    static char buf[8][1024];
    static int k;
    char *p = buf[k++ % 8];
    snprintf(p, sizeof buf[0], "%s/%s", tmp, name);
    return p;
}

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *fp = fopen(path, "wb");
    if (!fp || fwrite(data, 1, n, fp) != n) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(2);
    }
    fclose(fp);
}

// A file with header length `hlen` (normally strlen(header)), the header text and `data_len`
// bytes of data.
static void write_st(const char *path, uint64_t hlen, const char *header, size_t data_len) {
    size_t n = strlen(header), total = 8 + n + data_len;
    unsigned char *buf = calloc(1, total);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)(hlen >> (8 * i));
    memcpy(buf + 8, header, n);
    write_bytes(path, buf, total);
    free(buf);
}

static char *read_file(const char *path, size_t *len) {
    char *buf = NULL;
    ct_error err;
    if (file_read_all(&buf, len, path, 1u << 30, &err) != 0) fprintf(stderr, "%s\n", err.msg);
    return buf;
}

// st_open must fail, naming the file and each of the given details.
static void expect_bad_file(const char *path, const char *d1, const char *d2, int line) {
    st_file f;
    ct_error err = {{0}};
    int rc = st_open(&f, path, &err);
    CHECK(rc == -1, "line %d: %s was accepted", line, path);
    if (rc == 0) {
        st_close(&f);
        return;
    }
    CHECK(strstr(err.msg, path) != NULL, "line %d: message does not name the file: %s", line,
          err.msg);
    CHECK(!d1 || strstr(err.msg, d1), "line %d: message lacks '%s': %s", line, d1, err.msg);
    CHECK(!d2 || strstr(err.msg, d2), "line %d: message lacks '%s': %s", line, d2, err.msg);
}

#define BAD(name, header, data_len, d1, d2)                                                        \
    do {                                                                                           \
        const char *p_ = tpath(name);                                                              \
        write_st(p_, strlen(header), header, data_len);                                            \
        expect_bad_file(p_, d1, d2, __LINE__);                                                     \
    } while (0)

static void test_bad_files(void) {
    const char *p = tpath("short.safetensors");
    write_bytes(p, "\x05\0\0\0\0", 5);
    expect_bad_file(p, "5 bytes", "at least 8", __LINE__);
    p = tpath("empty.safetensors");
    write_bytes(p, "", 0);
    expect_bad_file(p, "0 bytes", NULL, __LINE__);
    expect_bad_file(tpath("missing.safetensors"), "cannot open", "No such file", __LINE__);
    expect_bad_file(tmp, "not a regular file", NULL, __LINE__);

    p = tpath("hlen0.safetensors");
    write_st(p, 0, "{}", 0);
    expect_bad_file(p, "header length is 0", NULL, __LINE__);
    p = tpath("hlen_big.safetensors");
    write_st(p, (uint64_t)ST_MAX_HEADER + 1, "{}", 0);
    expect_bad_file(p, "104857601", "exceeds the limit", __LINE__);
    p = tpath("hlen_eof.safetensors");
    write_st(p, 100, "{}", 10);
    expect_bad_file(p, "header length 100", "runs past the end", __LINE__);
    p = tpath("hlen_huge.safetensors");
    write_st(p, UINT64_MAX, "{}", 0);
    expect_bad_file(p, "exceeds the limit", NULL, __LINE__);

    BAD("json.safetensors", "{\"a\":", 0, "not valid JSON", NULL);
    BAD("array.safetensors", "[1,2]", 0, "must be a JSON object", "an array");
    BAD("garbage.safetensors", "{}  x", 0, "unexpected byte 0x78", NULL);
    BAD("utf8.safetensors", "{\"w\xff\":{}}", 0, "not valid UTF-8", NULL);
    BAD("utf8_overlong.safetensors", "{\"w\xc0\xaf\":{}}", 0, "not valid UTF-8", NULL);
    BAD("entry.safetensors", "{\"w\":5}", 0, "\"w\"", "expected an object");
    // Names and values from the file echo escaped: the message stays one line, and no terminal
    // control sequence passes through.
    BAD("ctl_dtype.safetensors",
        "{\"w\":{\"dtype\":\"X\\nY\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
        "unknown dtype \"X\\nY\"", NULL);
    BAD("ctl_name.safetensors",
        "{\"a\\u001b[31m\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4,
        "tensor \"a\\x1b[31m\"", NULL);
    BAD("no_dtype.safetensors", "{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "\"w\"",
        "missing \"dtype\"");
    BAD("no_shape.safetensors", "{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, "\"w\"",
        "missing \"shape\"");
    BAD("no_offsets.safetensors", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "\"w\"",
        "missing \"data_offsets\"");
    BAD("dtype_num.safetensors", "{\"w\":{\"dtype\":3,\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
        "\"w\"", "dtype: expected a string");
    BAD("dtype_unknown.safetensors",
        "{\"w\":{\"dtype\":\"F8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, "\"w\"",
        "unknown dtype \"F8\"");
    BAD("shape_obj.safetensors", "{\"w\":{\"dtype\":\"F32\",\"shape\":3,\"data_offsets\":[0,4]}}",
        4, "\"w\"", "shape: expected an array");
    BAD("shape_neg.safetensors",
        "{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, "\"w\"",
        "non-negative integer");
    BAD("shape_frac.safetensors",
        "{\"w\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4, "\"w\"",
        "shape[0]");
    BAD("shape_str.safetensors",
        "{\"w\":{\"dtype\":\"F32\",\"shape\":[1,\"2\"],\"data_offsets\":[0,8]}}", 8, "\"w\"",
        "shape[1]: expected an integer, found a string");
    BAD("shape_ndim.safetensors",
        "{\"w\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1,
        "\"w\"", "9 dimensions");
    BAD("shape_overflow.safetensors",
        "{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],"
        "\"data_offsets\":[0,4]}}",
        4, "\"w\"", "too many elements");
    BAD("shape_overflow_bytes.safetensors",
        "{\"w\":{\"dtype\":\"F64\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,4]}}", 4,
        "\"w\"", "too many elements");
    BAD("offs_one.safetensors", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4,
        "\"w\"", "data_offsets: expected two");
    BAD("offs_three.safetensors",
        "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 4, "\"w\"",
        "data_offsets: expected two");
    BAD("offs_str.safetensors",
        "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[\"0\",4]}}", 4, "\"w\"",
        "data_offsets: expected two");
    BAD("offs_neg.safetensors", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}",
        4, "\"w\"", "data_offsets");
    BAD("offs_order.safetensors",
        "{\"w\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,0]}}", 4, "\"w\"",
        "begin is after end");
    BAD("offs_size.safetensors", "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}",
        4, "\"w\"", "hold 4 bytes, expected 8");
    BAD("offs_past.safetensors", "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
        4, "\"w\"", "run past the data region of 4 bytes");
    BAD("overlap.safetensors",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
        "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
        12, "\"a\" [0, 8] and \"b\" [4, 12]", "overlap");
    BAD("overlap_same.safetensors",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
        "\"b\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
        4, "overlap", NULL);
    BAD("gap.safetensors",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
        "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
        12, "gap", "bytes [4, 8) before tensor \"b\"");
    BAD("gap_start.safetensors", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
        8, "gap", "\"a\"");
    BAD("trailing.safetensors", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
        8, "8 bytes but the tensors cover 4", "trailing");
    BAD("trailing_empty.safetensors", "{}", 3, "3 bytes but the tensors cover 0", NULL);
    BAD("dup.safetensors",
        "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
        "\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
        8, "\"w\"", "appears twice");
    BAD("meta_str.safetensors", "{\"__metadata__\":\"pt\"}", 0, "__metadata__",
        "must be an object of strings");
    BAD("meta_val.safetensors", "{\"__metadata__\":{\"format\":1}}", 0, "__metadata__",
        "\"format\": expected a string, found a number");
    BAD("meta_dup.safetensors", "{\"__metadata__\":{},\"__metadata__\":{}}", 0, "__metadata__",
        "twice");
}

static void test_good_files(void) {
    st_file f;
    ct_error err = {{0}};
    const char *p = tpath("good_empty.safetensors");
    write_st(p, 8, "{}      ", 0);
    CHECK(st_open(&f, p, &err) == 0 && f.n_tensors == 0, "empty header: %s", err.msg);
    st_close(&f);
    // Zero-size tensors may sit anywhere; trailing whitespace after the JSON is padding.
    p = tpath("good_mixed.safetensors");
    const char *h = "{\"__metadata__\":{\"k\":\"v\"},"
                    "\"s\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[4,12]},"
                    "\"z\":{\"dtype\":\"BF16\",\"shape\":[3,0],\"data_offsets\":[4,4]},"
                    "\"i\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[0,4]}} \n";
    size_t n = strlen(h);
    unsigned char buf[512] = {0};
    buf[0] = (unsigned char)n;
    memcpy(buf + 8, h, n);
    int32_t iv = -7;
    double sv = 2.5;
    memcpy(buf + 8 + n, &iv, 4);
    memcpy(buf + 8 + n + 4, &sv, 8);
    write_bytes(p, buf, 8 + n + 12);
    int rc = st_open(&f, p, &err);
    CHECK(rc == 0, "mixed file: %s", err.msg);
    if (rc != 0) return;
    CHECK(f.n_tensors == 3 && strcmp(f.tensors[0].name, "i") == 0 &&
              strcmp(f.tensors[1].name, "s") == 0 && strcmp(f.tensors[2].name, "z") == 0,
          "sorted by name");
    const st_tensor *s = st_file_find(&f, "s"), *z = st_file_find(&f, "z"),
                    *i = st_file_find(&f, "i");
    CHECK(s && s->ndim == 0 && s->numel == 1 && s->dtype == CT_F64, "scalar F64");
    CHECK(z && z->ndim == 2 && z->numel == 0 && z->shape[0] == 3, "empty BF16");
    CHECK(st_file_find(&f, "q") == NULL && st_file_find(&f, "") == NULL, "find missing");
    float out[2] = {0};
    CHECK(s && st_tensor_to_f32(out, s, &err) == 0 && out[0] == 2.5f, "F64 -> f32");
    CHECK(i && st_tensor_to_f32(out, i, &err) == -1 && strstr(err.msg, "\"i\"") &&
              strstr(err.msg, "I32"),
          "I32 -> f32 must fail naming the tensor: %s", err.msg);
    CHECK(i && memcmp(i->data, &iv, 4) == 0, "I32 data pointer");
    st_close(&f);
    // The in-memory entry point applies the same rules.
    CHECK(st_parse(&f, buf, 8 + n + 12, "mem", &err) == 0 && f.n_tensors == 3, "st_parse");
    st_close(&f);
    CHECK(st_parse(&f, buf, 8 + n + 11, "mem", &err) == -1 && strstr(err.msg, "mem:"),
          "st_parse of a truncated image: %s", err.msg);
}

// Deterministic, non-trivial values.
static float value_at(int k, size_t i) {
    return (float)((double)((int)((i * 7919 + (size_t)k * 104729) % 2001) - 1000) / 256.0 *
                       (k + 1) +
                   1e-3 * (double)k);
}

typedef struct entry_set {
    st_entry e[16];
    float *data[16];
    int n;
} entry_set;

static void set_add(entry_set *s, const char *name, int ndim, int64_t d0, int64_t d1) {
    st_entry *e = &s->e[s->n];
    e->name = name;
    e->ndim = ndim;
    e->shape[0] = d0;
    e->shape[1] = d1;
    size_t numel = ndim == 0 ? 1 : ndim == 1 ? (size_t)d0 : (size_t)(d0 * d1);
    s->data[s->n] = malloc((numel + 1) * sizeof(float));
    for (size_t i = 0; i < numel; i++) s->data[s->n][i] = value_at(s->n, i);
    e->data = s->data[s->n];
    s->n++;
}

static void set_free(entry_set *s) {
    for (int i = 0; i < s->n; i++) free(s->data[i]);
}

static float rounded(float v, ct_dtype t) {
    return t == CT_BF16 ? bf16_to_f32(f32_to_bf16(v)) : t == CT_F16 ? f16_to_f32(f32_to_f16(v)) : v;
}

static size_t numel_of(const st_entry *e) {
    size_t n = 1;
    for (int d = 0; d < e->ndim; d++) n *= (size_t)e->shape[d];
    return n;
}

// Every entry is in the set with its shape, dtype and (rounded) values.
static void check_set_values(const st_set *s, const st_entry *e, int n, ct_dtype t,
                             const char *what) {
    CHECK(s->n_tensors == n, "%s: %d tensors, expected %d", what, s->n_tensors, n);
    for (int i = 0; i < n; i++) {
        const st_tensor *x = st_set_find(s, e[i].name);
        CHECK(x != NULL, "%s: %s missing", what, e[i].name);
        if (!x) continue;
        CHECK(x->dtype == t && x->ndim == e[i].ndim, "%s: %s dtype/ndim", what, e[i].name);
        size_t numel = numel_of(&e[i]);
        CHECK(x->numel == numel, "%s: %s numel", what, e[i].name);
        CHECK((uintptr_t)x->data % dtype_size(t) == 0, "%s: %s data not aligned", what, e[i].name);
        for (int d = 0; d < e[i].ndim; d++) CHECK(x->shape[d] == e[i].shape[d], "%s: shape", what);
        float *got = malloc((numel + 1) * sizeof(float));
        ct_error err;
        CHECK(st_tensor_to_f32(got, x, &err) == 0, "%s: convert", what);
        int bad = 0;
        for (size_t k = 0; k < numel; k++) bad += got[k] != rounded(e[i].data[k], t);
        CHECK(bad == 0, "%s: %s has %d wrong values", what, e[i].name, bad);
        free(got);
    }
}

static uint64_t le64(const char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | (unsigned char)p[i];
    return v;
}

static void test_round_trip(void) {
    entry_set s = {0};
    set_add(&s, "b.weight", 2, 3, 5);
    set_add(&s, "a.bias", 1, 5, 0);
    set_add(&s, "c", 0, 0, 0);
    set_add(&s, "z.empty", 2, 0, 4);
    set_add(&s, "a.odd", 1, 3, 0); // odd element count: later tensors must still align
    const ct_dtype types[3] = {CT_F32, CT_BF16, CT_F16};
    for (int ti = 0; ti < 3; ti++) {
        ct_dtype t = types[ti];
        char name[64];
        snprintf(name, sizeof name, "rt_%s.safetensors", dtype_name(t));
        const char *p = tpath(name);
        ct_error err = {{0}};
        CHECK(st_write(p, s.e, s.n, t, &err) == 0, "write %s: %s", p, err.msg);
        st_set set;
        CHECK(st_set_open(&set, p, &err) == 0, "open %s: %s", p, err.msg);
        check_set_values(&set, s.e, s.n, t, p);
        st_set_close(&set);
        size_t len;
        char *raw = read_file(p, &len);
        uint64_t hl = le64(raw);
        size_t es = dtype_size(t);
        CHECK((8 + hl) % 8 == 0, "data region aligned");
        // The exact header: metadata first, tensors sorted, compact, padded with spaces.
        char expect[2048];
        snprintf(expect, sizeof expect,
                 "{\"__metadata__\":{\"format\":\"pt\"},"
                 "\"a.bias\":{\"dtype\":\"%s\",\"shape\":[5],\"data_offsets\":[0,%zu]},"
                 "\"a.odd\":{\"dtype\":\"%s\",\"shape\":[3],\"data_offsets\":[%zu,%zu]},"
                 "\"b.weight\":{\"dtype\":\"%s\",\"shape\":[3,5],\"data_offsets\":[%zu,%zu]},"
                 "\"c\":{\"dtype\":\"%s\",\"shape\":[],\"data_offsets\":[%zu,%zu]},"
                 "\"z.empty\":{\"dtype\":\"%s\",\"shape\":[0,4],\"data_offsets\":[%zu,%zu]}}",
                 dtype_name(t), 5 * es, dtype_name(t), 5 * es, 8 * es, dtype_name(t), 8 * es,
                 23 * es, dtype_name(t), 23 * es, 24 * es, dtype_name(t), 24 * es, 24 * es);
        size_t el = strlen(expect);
        CHECK(hl >= el && hl < el + 8 && memcmp(raw + 8, expect, el) == 0,
              "header of %s:\n%.*s\nexpected\n%s", p, (int)hl, raw + 8, expect);
        for (size_t k = el; k < hl; k++) CHECK(raw[8 + k] == ' ', "padding is spaces");
        CHECK(len == 8 + hl + 24 * es, "file size");
        // Data follows in sorted order: a.bias first.
        for (int k = 0; k < 5 && t == CT_BF16; k++) {
            uint16_t h;
            memcpy(&h, raw + 8 + hl + 2 * k, 2);
            CHECK(h == f32_to_bf16(s.data[1][k]), "bf16 data of a.bias[%d]", k);
        }
        free(raw);
    }
    set_free(&s);
}

// ct_escape, which every error message passes through (ct_fail).
static void test_error_escape(void) {
    char out[16];
    CHECK(ct_escape(out, sizeof out, "a\n\t\x1b\x7f") == 13 &&
              strcmp(out, "a\\n\\t\\x1b\\x7f") == 0,
          "escaped: %s", out);
    CHECK(ct_escape(out, 8, "abcde\x01") == 5 && strcmp(out, "abcde") == 0,
          "truncated before an escape that does not fit: %s", out);
    CHECK(ct_escape(out, sizeof out, "ab\rc") == 5 && strcmp(out, "ab\\rc") == 0, "\\r: %s", out);
    CHECK(ct_escape(out, sizeof out, "\xc3\xbc\\") == 3 && strcmp(out, "\xc3\xbc\\") == 0,
          "UTF-8 and backslash as they are: %s", out);
    ct_error err;
    ct_fail(&err, "tensor \"%s\": %d", "x\ny", 3);
    CHECK(strcmp(err.msg, "tensor \"x\\ny\": 3") == 0, "ct_fail escapes: %s", err.msg);
    ct_fail(&err, "first");
    ct_wrap(&err, "file \"%s\"", "p\x01");
    CHECK(strcmp(err.msg, "file \"p\\x01\": first") == 0, "ct_wrap escapes its prefix: %s",
          err.msg);
}

static void test_escaping(void) {
    entry_set s = {0};
    set_add(&s, "q\"uote", 1, 2, 0);
    set_add(&s, "back\\slash", 1, 1, 0);
    set_add(&s, "new\nline\x01", 1, 1, 0);
    set_add(&s, "\xc3\xbcn\xc3\xaf \xf0\x9f\x98\x80", 1, 1, 0); // "ünï 😀"
    const char *p = tpath("escape.safetensors");
    ct_error err = {{0}};
    CHECK(st_write(p, s.e, s.n, CT_F32, &err) == 0, "write: %s", err.msg);
    size_t len;
    char *raw = read_file(p, &len);
    CHECK(raw && strstr(raw + 8, "\"q\\\"uote\":"), "quote escaped");
    CHECK(raw && strstr(raw + 8, "\"back\\\\slash\":"), "backslash escaped");
    CHECK(raw && strstr(raw + 8, "\"new\\u000aline\\u0001\":"), "control characters escaped");
    CHECK(raw && strstr(raw + 8, "\"\xc3\xbcn\xc3\xaf \xf0\x9f\x98\x80\":"), "UTF-8 kept as is");
    // Python's json module decodes our escapes to the same names.
    const char *script = tpath("escape_check.py");
    FILE *fp = fopen(script, "w");
    fputs("import json, struct, sys\n"
          "d = open(sys.argv[1], 'rb').read()\n"
          "h = json.loads(d[8:8 + struct.unpack('<Q', d[:8])[0]])\n"
          "want = {'__metadata__', 'q\"uote', 'back\\\\slash', 'new\\nline\\x01',\n"
          "        '\\u00fcn\\u00ef \\U0001f600'}\n"
          "assert set(h) == want, sorted(h)\n",
          fp);
    fclose(fp);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s %s %s", check_env("CTITAN_PYTHON"), script, p);
    CHECK(system(cmd) == 0, "python json disagrees on escaped names: %s", cmd);
    free(raw);
    st_set set;
    CHECK(st_set_open(&set, p, &err) == 0, "open: %s", err.msg);
    check_set_values(&set, s.e, s.n, CT_F32, p);
    st_set_close(&set);
    set_free(&s);
}

static int count_files(const char *dir, const char *prefix) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *de; d && (de = readdir(d));)
        n += de->d_name[0] != '.' && strncmp(de->d_name, prefix, strlen(prefix)) == 0;
    if (d) closedir(d);
    return n;
}

static int exists(const char *dir, const char *name) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return access(p, F_OK) == 0;
}

static void test_write_errors(void) {
    entry_set s = {0};
    set_add(&s, "w", 1, 4, 0);
    set_add(&s, "w", 1, 4, 0);
    ct_error err = {{0}};
    const char *p = tpath("dup_write.safetensors");
    CHECK(st_write(p, s.e, 2, CT_F32, &err) == -1 && strstr(err.msg, p) && strstr(err.msg, "\"w\""),
          "duplicate names: %s", err.msg);
    CHECK(access(p, F_OK) != 0, "nothing written");
    CHECK(st_write(p, s.e, 1, CT_I32, &err) == -1 && strstr(err.msg, "I32"), "I32 output: %s",
          err.msg);
    p = tpath("no/such/dir/x.safetensors");
    CHECK(st_write(p, s.e, 1, CT_F32, &err) == -1 && strstr(err.msg, p) &&
              strstr(err.msg, "No such file or directory"),
          "missing folder: %s", err.msg);
    // Renaming over a directory fails after the data is written: the temp file must go.
    p = tpath("isdir.safetensors");
    mkdir(p, 0755);
    CHECK(st_write(p, s.e, 1, CT_F32, &err) == -1 && strstr(err.msg, p) &&
              strstr(err.msg, "rename"),
          "rename failure: %s", err.msg);
    CHECK(count_files(tmp, "isdir.safetensors.tmp") == 0, "temp file left behind");
    s.e[1].name = "__metadata__";
    CHECK(st_write(tpath("meta.safetensors"), s.e, 2, CT_F32, &err) == -1 &&
              strstr(err.msg, "reserved"),
          "__metadata__ as a name: %s", err.msg);
    s.e[1].name = "bad\xff";
    CHECK(st_write(tpath("u.safetensors"), s.e, 2, CT_F32, &err) == -1 && strstr(err.msg, "UTF-8"),
          "invalid UTF-8 name: %s", err.msg);
    s.e[1].name = "neg";
    s.e[1].shape[0] = -1;
    CHECK(st_write(tpath("neg.safetensors"), s.e, 2, CT_F32, &err) == -1 &&
              strstr(err.msg, "\"neg\""),
          "negative dim: %s", err.msg);
    s.e[1].shape[0] = 4;
    s.e[1].ndim = ST_MAX_DIMS + 1;
    CHECK(st_write(tpath("ndim.safetensors"), s.e, 2, CT_F32, &err) == -1 &&
              strstr(err.msg, "ndim 9"),
          "ndim: %s", err.msg);
    set_free(&s);
}

static void write_text(const char *dir, const char *name, const char *text) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    write_bytes(p, text, strlen(text));
}

static void test_sharded(void) {
    entry_set s = {0};
    set_add(&s, "model.embed_tokens.weight", 2, 8, 4); // 128 B in F32
    set_add(&s, "model.norm.weight", 1, 4, 0);         // 16
    set_add(&s, "lm_head.weight", 2, 8, 4);            // 128
    set_add(&s, "model.layers.0.w", 2, 2, 4);          // 32
    set_add(&s, "a.first", 1, 2, 0);                   // 8
    const char *dir = tpath("sharded");
    ct_error err = {{0}};
    // Start from a single-file save, plus a file that is not ours.
    CHECK(st_write_folder(dir, s.e, s.n, CT_F32, 0, &err) == 0, "single: %s", err.msg);
    CHECK(exists(dir, "model.safetensors") && !exists(dir, "model.safetensors.index.json"),
          "no limit gives one file");
    write_text(dir, "README.md", "keep me");
    // 144 B limit, given order: [embed 128, norm 16] [lm_head 128] [layers.0 32, a.first 8].
    CHECK(st_write_folder(dir, s.e, s.n, CT_F32, 144, &err) == 0, "sharded: %s", err.msg);
    CHECK(!exists(dir, "model.safetensors"), "stale model.safetensors would shadow the index");
    CHECK(count_files(dir, "model-") == 3 && exists(dir, "model-00003-of-00003.safetensors"),
          "3 shards");
    size_t len;
    char *idx = read_file(tpath("sharded/model.safetensors.index.json"), &len);
    const char *expect =
        "{\n"
        "  \"metadata\": {\n"
        "    \"total_size\": 312\n"
        "  },\n"
        "  \"weight_map\": {\n"
        "    \"a.first\": \"model-00003-of-00003.safetensors\",\n"
        "    \"lm_head.weight\": \"model-00002-of-00003.safetensors\",\n"
        "    \"model.embed_tokens.weight\": \"model-00001-of-00003.safetensors\",\n"
        "    \"model.layers.0.w\": \"model-00003-of-00003.safetensors\",\n"
        "    \"model.norm.weight\": \"model-00001-of-00003.safetensors\"\n"
        "  }\n"
        "}\n";
    CHECK(idx && strcmp(idx, expect) == 0, "index:\n%s\nexpected:\n%s", idx, expect);
    free(idx);
    st_set set;
    CHECK(st_set_open(&set, dir, &err) == 0, "open sharded: %s", err.msg);
    check_set_values(&set, s.e, s.n, CT_F32, "sharded F32");
    CHECK(set.n_files == 3, "3 files open");
    const st_tensor *t = st_set_find(&set, "model.norm.weight");
    CHECK(t && strstr(set.files[t->file_index].path, "model-00001-of-00003"), "norm in shard 1");
    st_set_close(&set);
    // Fewer shards in BF16 (halves the bytes): the old shard 3 must go.
    CHECK(st_write_folder(dir, s.e, s.n, CT_BF16, 144, &err) == 0, "bf16: %s", err.msg);
    CHECK(count_files(dir, "model-") == 2 && !exists(dir, "model-00003-of-00003.safetensors"),
          "stale shards removed");
    CHECK(st_set_open(&set, dir, &err) == 0, "open bf16: %s", err.msg);
    check_set_values(&set, s.e, s.n, CT_BF16, "sharded BF16");
    st_set_close(&set);
    // A tensor larger than the limit gets a shard of its own.
    CHECK(st_write_folder(dir, s.e, s.n, CT_F16, 40, &err) == 0, "f16: %s", err.msg);
    CHECK(count_files(dir, "model-") == 4, "f16 shards: [64] [8] [64] [16 4]");
    CHECK(st_set_open(&set, dir, &err) == 0, "open f16: %s", err.msg);
    check_set_values(&set, s.e, s.n, CT_F16, "sharded F16");
    CHECK(set.n_files == 4, "4 files open");
    st_set_close(&set);
    // Python's reader must accept our sharded folder.
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s %s/tests/ref/safetensors_ref.py --check %s",
             check_env("CTITAN_PYTHON"), check_env("CTITAN_SOURCE_DIR"), dir);
    CHECK(system(cmd) == 0, "python reader rejects %s", dir);

    // Back to one file: the index and the shards go.
    CHECK(st_write_folder(dir, s.e, s.n, CT_F32, 1 << 20, &err) == 0, "single again: %s", err.msg);
    CHECK(exists(dir, "model.safetensors") && !exists(dir, "model.safetensors.index.json") &&
              count_files(dir, "model-") == 0 && exists(dir, "README.md"),
          "single save cleans the sharded one");
    CHECK(st_set_open(&set, dir, &err) == 0, "open single: %s", err.msg);
    check_set_values(&set, s.e, s.n, CT_F32, "single F32");
    st_set_close(&set);
    // An empty model is one file with no tensors.
    const char *edir = tpath("empty_model");
    CHECK(st_write_folder(edir, s.e, 0, CT_F32, 10, &err) == 0 &&
              st_set_open(&set, edir, &err) == 0 && set.n_tensors == 0,
          "empty model: %s", err.msg);
    st_set_close(&set);
    set_free(&s);
}

// st_set_open must fail with a message containing both details.
static void expect_bad_set(const char *path, const char *d1, const char *d2, int line) {
    st_set s;
    ct_error err = {{0}};
    int rc = st_set_open(&s, path, &err);
    CHECK(rc == -1, "line %d: %s accepted", line, path);
    if (rc == 0) st_set_close(&s);
    CHECK(!d1 || strstr(err.msg, d1), "line %d: lacks '%s': %s", line, d1, err.msg);
    CHECK(!d2 || strstr(err.msg, d2), "line %d: lacks '%s': %s", line, d2, err.msg);
}

static void test_bad_sets(void) {
    entry_set s = {0};
    set_add(&s, "x", 1, 2, 0);
    set_add(&s, "y", 1, 2, 0);
    ct_error err;
    const char *dir = tpath("badset");
    mkdir(dir, 0755);
    expect_bad_set(dir, dir, "neither model.safetensors nor model.safetensors.index.json",
                   __LINE__);
    expect_bad_set(tpath("nonexistent_dir"), "nonexistent_dir", "No such file", __LINE__);
    CHECK(st_write(tpath("badset/s1.safetensors"), s.e, 2, CT_F32, &err) == 0, "s1");
    CHECK(st_write(tpath("badset/s2.safetensors"), s.e + 1, 1, CT_F32, &err) == 0, "s2");
    const char *index = tpath("badset/model.safetensors.index.json");
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\": 3}");
    expect_bad_set(dir, index, "\"weight_map\" object", __LINE__);
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\": {\"x\": ");
    expect_bad_set(dir, index, "invalid JSON", __LINE__);
    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\": {\"x\": \"s1.safetensors\", \"y\": \"s1.safetensors\", "
               "\"z\": \"s1.safetensors\"}}");
    expect_bad_set(dir, "\"z\"", "s1.safetensors, which has no such tensor", __LINE__);
    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\": {\"x\": \"s1.safetensors\"}}");
    expect_bad_set(dir, "\"y\"", "not listed in weight_map", __LINE__);
    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\": {\"x\": \"s1.safetensors\", \"y\": \"s2.safetensors\"}}");
    expect_bad_set(dir, "\"y\"", "in two shards", __LINE__);
    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\": {\"x\": \"s1.safetensors\", \"y\": \"gone.safetensors\"}}");
    expect_bad_set(dir, "gone.safetensors", "No such file", __LINE__);
    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\": {\"x\": \"../s1.safetensors\"}}");
    expect_bad_set(dir, "\"../s1.safetensors\"", "same folder", __LINE__);
    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\": {\"x\": \"s1.safetensors\", \"x\": \"s1.safetensors\"}}");
    expect_bad_set(dir, "\"x\"", "twice", __LINE__);
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\": {\"x\": 1}}");
    expect_bad_set(dir, "\"x\"", "shard file name", __LINE__);
    // weight_map names a shard for y, but y is in the other shard.
    CHECK(st_write(tpath("badset/s3.safetensors"), s.e, 1, CT_F32, &err) == 0, "s3");
    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\": {\"x\": \"s2.safetensors\", \"y\": \"s3.safetensors\"}}");
    expect_bad_set(dir, "\"x\"", "(it is in", __LINE__);
    // A corrupt shard is reported with its own path.
    write_text(dir, "s3.safetensors", "junk");
    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\": {\"x\": \"s3.safetensors\", \"y\": \"s2.safetensors\"}}");
    expect_bad_set(dir, "s3.safetensors", "4 bytes", __LINE__);
    // A good index works, and a path to a single file works.
    write_text(dir, "model.safetensors.index.json",
               "{\"metadata\": {\"total_size\": 16}, \"weight_map\": {\"x\": \"s1.safetensors\", "
               "\"y\": \"s1.safetensors\"}}");
    st_set set;
    CHECK(st_set_open(&set, dir, &err) == 0 && set.n_files == 1, "index with one shard: %s",
          err.msg);
    check_set_values(&set, s.e, 2, CT_F32, "badset good");
    st_set_close(&set);
    CHECK(st_set_open(&set, tpath("badset/s2.safetensors"), &err) == 0 && set.n_tensors == 1,
          "single file path: %s", err.msg);
    st_set_close(&set);
    set_free(&s);
}

// The fixed tensor set of tests/ref/make_ref.py's golden files.
static void golden_entries(entry_set *s) {
    static const struct {
        const char *name;
        int ndim;
        int64_t d0, d1;
    } g[4] = {{"model.embed_tokens.weight", 2, 7, 4},
              {"model.norm.weight", 1, 4, 0},
              {"lm_head.weight", 2, 7, 4},
              {"model.layers.0.mlp.up_proj.weight", 2, 6, 4}};
    for (int k = 0; k < 4; k++) {
        set_add(s, g[k].name, g[k].ndim, g[k].d0, g[k].d1);
        size_t n = numel_of(&s->e[k]);
        for (size_t i = 0; i < n; i++)
            s->data[k][i] = (float)((double)((int)((i * 7919 + (size_t)k * 104729) % 2001) - 1000) /
                                    256.0 * (k + 1));
    }
}

static void compare_folders(const char *ours, const char *golden) {
    DIR *d = opendir(golden);
    CHECK(d != NULL, "cannot list %s", golden);
    int n = 0;
    for (struct dirent *de; d && (de = readdir(d));) {
        if (de->d_name[0] == '.') continue;
        char a[4096], b[4096];
        snprintf(a, sizeof a, "%s/%s", ours, de->d_name);
        snprintf(b, sizeof b, "%s/%s", golden, de->d_name);
        size_t la = 0, lb = 0;
        char *x = access(a, F_OK) == 0 ? read_file(a, &la) : NULL, *y = read_file(b, &lb);
        CHECK(x && y && la == lb && memcmp(x, y, la) == 0, "%s differs from %s (%zu vs %zu bytes)",
              a, b, la, lb);
        free(x);
        free(y);
        n++;
    }
    if (d) closedir(d);
    CHECK(n > 0 && n == count_files(ours, ""), "%s has %d files, %s has %d", golden, n, ours,
          count_files(ours, ""));
}

static void test_golden(void) {
    char golden[1024];
    snprintf(golden, sizeof golden, "%s/golden", check_env("CTITAN_REF_DIR"));
    struct stat st;
    CHECK(stat(golden, &st) == 0 && S_ISDIR(st.st_mode),
          "%s missing: the ref fixture (tests/ref/make_ref.py) must produce it", golden);
    if (stat(golden, &st) != 0) return;
    entry_set s = {0};
    golden_entries(&s);
    const struct {
        const char *name;
        ct_dtype t;
        uint64_t max;
    } cases[] = {{"single_f32", CT_F32, 0},
                 {"single_bf16", CT_BF16, 0},
                 {"single_f16", CT_F16, 0},
                 {"sharded_f32", CT_F32, 100},
                 {"sharded_bf16", CT_BF16, 100}};
    mkdir(tpath("golden"), 0755);
    for (int c = 0; c < 5; c++) {
        char ours[2048], ref[2048];
        snprintf(ours, sizeof ours, "%s/golden/%s", tmp, cases[c].name);
        snprintf(ref, sizeof ref, "%s/%s", golden, cases[c].name);
        ct_error err = {{0}};
        CHECK(st_write_folder(ours, s.e, s.n, cases[c].t, cases[c].max, &err) == 0, "%s: %s", ours,
              err.msg);
        compare_folders(ours, ref);
        st_set set;
        CHECK(st_set_open(&set, ref, &err) == 0, "open %s: %s", ref, err.msg);
        check_set_values(&set, s.e, s.n, cases[c].t, ref);
        st_set_close(&set);
    }
    CHECK(count_files(tpath("golden/sharded_f32"), "model-") == 4, "f32 golden: 4 shards");
    CHECK(count_files(tpath("golden/sharded_bf16"), "model-") == 3, "bf16 golden: 3 shards");
    set_free(&s);
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

int main(void) {
    // A fresh folder each run: several checks are about which files a save leaves behind.
    static char root[1024];
    snprintf(root, sizeof root, "%s/run", check_env("CTITAN_TMP"));
    nftw(root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    if (mkdir(root, 0755) != 0) {
        fprintf(stderr, "cannot create %s: %s\n", root, strerror(errno));
        return 2;
    }
    tmp = root;
    test_bad_files();
    test_good_files();
    test_round_trip();
    test_error_escape();
    test_escaping();
    test_write_errors();
    test_sharded();
    test_bad_sets();
    test_golden();
    return check_summary();
}
