// safetensors writer. The output is byte-exact and reproducible (a Python reference writer in
// tests/ref produces the same bytes): compact header with __metadata__ first and tensors sorted
// by name, data in the same order, header padded with spaces to an 8-byte boundary.
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/utf8.h"
#include "io/atomic.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "io/safetensors_internal.h"
#include "core/grow.h"

#define ST_CHUNK 16384 // elements converted per write

typedef struct strbuf {
    char *p;
    size_t len, cap;
    bool oom;
} strbuf;

static void sb_put(strbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (grow_to((void **)&b->p, &b->cap, b->len + n + 1, 1) != 0) {
        b->oom = true;
        return;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void sb_puts(strbuf *b, const char *s) {
    sb_put(b, s, strlen(s));
}

static void sb_printf(strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(strbuf *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    sb_put(b, tmp, n < (int)sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

// Header keys escape as the reference writer does ('"', '\\', control characters as \u00XX,
// other bytes copied); the index must equal Python's json.dumps output (ensure_ascii).
static void sb_json_str(strbuf *b, const char *s, unsigned flags) {
    if (b->oom) return;
    json_buf j = {b->p, b->len, b->cap};
    if (json_quote(&j, s, strlen(s), flags) != 0) b->oom = true;
    b->p = j.p, b->len = j.len, b->cap = j.cap;
}

typedef struct st_item {
    const st_entry *e;
    uint64_t bytes; // in the output dtype
    int shard;
} st_item;

static int st_item_cmp(const void *a, const void *b) {
    return strcmp(((const st_item *)a)->e->name, ((const st_item *)b)->e->name);
}

// Validates the entries and fills items (in the given order) and sorted (by name).
static int st_check_entries(st_item *items, st_item *sorted, const st_entry *entries, int n,
                            ct_dtype dtype, const char *path, ct_error *err) {
    if (dtype != CT_F32 && dtype != CT_BF16 && dtype != CT_F16)
        return ct_fail(err, "%s: cannot write dtype %s (expected F32, BF16 or F16)", path,
                       dtype_name(dtype));
    if (n < 0) return ct_fail(err, "%s: negative tensor count %d", path, n);
    for (int i = 0; i < n; i++) {
        const st_entry *e = &entries[i];
        uint64_t numel;
        if (!e->name) return ct_fail(err, "%s: tensor %d has no name", path, i);
        size_t len = strlen(e->name);
        if (strcmp(e->name, "__metadata__") == 0)
            return ct_fail(err, "%s: tensor name \"__metadata__\" is reserved", path);
        if (utf8_valid_prefix(e->name, len) != len)
            return ct_fail(err, "%s: tensor \"%s\": name is not valid UTF-8", path, e->name);
        if (e->ndim < 0 || e->ndim > ST_MAX_DIMS)
            return ct_fail(err, "%s: tensor \"%s\": ndim %d, expected 0..%d", path, e->name,
                           e->ndim, ST_MAX_DIMS);
        if (st_shape_numel(&numel, &items[i].bytes, e->shape, e->ndim, dtype) != 0)
            return ct_fail(err,
                           "%s: tensor \"%s\": shape has a negative dimension or too many "
                           "elements",
                           path, e->name);
        if (numel > 0 && !e->data && !e->fill)
            return ct_fail(err, "%s: tensor \"%s\": no data", path, e->name);
        items[i].e = e;
        items[i].shard = 0;
    }
    memcpy(sorted, items, (size_t)n * sizeof *items);
    qsort(sorted, (size_t)n, sizeof *sorted, st_item_cmp);
    for (int i = 1; i < n; i++) {
        if (strcmp(sorted[i - 1].e->name, sorted[i].e->name) == 0)
            return ct_fail(err, "%s: tensor \"%s\" given twice", path, sorted[i].e->name);
    }
    return 0;
}

// chunk: room for ST_CHUNK floats converted, then ST_CHUNK floats a fill callback writes.
static int st_write_data(atomic_file *af, const st_entry *e, ct_dtype dtype, float *chunk,
                         ct_error *err) {
    uint64_t numel = 1;
    for (int d = 0; d < e->ndim; d++) numel *= (uint64_t)e->shape[d]; // checked already
    size_t esize = dtype_size(dtype);
    for (uint64_t i = 0; i < numel; i += ST_CHUNK) {
        size_t m = (size_t)(numel - i < ST_CHUNK ? numel - i : ST_CHUNK);
        const float *x = e->data ? e->data + i : chunk + ST_CHUNK;
        if (!e->data && e->fill(chunk + ST_CHUNK, i, m, e->fill_ctx, err) != 0)
            return ct_wrap(err, "tensor \"%s\"", e->name);
        const void *src = x;
        if (dtype != CT_F32) { // F32 goes out as is: the host is little-endian
            dtype_from_f32(chunk, x, dtype, m);
            src = chunk;
        }
        if (atomic_write(af, src, m * esize, err) != 0) return -1;
    }
    return 0;
}

// Writes the (name-sorted) items as one file.
static int st_write_items(const char *path, const st_item *items, int n, ct_dtype dtype,
                          ct_error *err) {
    strbuf h = {0};
    sb_puts(&h, "{\"__metadata__\":{\"format\":\"pt\"}");
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        const st_entry *e = items[i].e;
        sb_puts(&h, ",");
        sb_json_str(&h, e->name, 0);
        sb_printf(&h, ":{\"dtype\":\"%s\",\"shape\":[", dtype_name(dtype));
        for (int d = 0; d < e->ndim; d++)
            sb_printf(&h, "%s%lld", d ? "," : "", (long long)e->shape[d]);
        sb_printf(&h, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                  (unsigned long long)(off + items[i].bytes));
        off += items[i].bytes;
    }
    sb_puts(&h, "}");
    while ((8 + h.len) % 8 != 0) sb_puts(&h, " "); // data region starts 8-byte aligned
    if (h.len > ST_MAX_HEADER) {                   // readers refuse such files; so do we
        free(h.p);
        return ct_fail(err, "%s: header of %zu bytes exceeds the limit of %u", path, h.len,
                       ST_MAX_HEADER);
    }
    float *chunk = malloc(2 * ST_CHUNK * sizeof(float));
    if (h.oom || !chunk) {
        free(h.p);
        free(chunk);
        return ct_fail(err, "%s: out of memory", path);
    }
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)h.len >> (8 * i));
    atomic_file af;
    int rc = atomic_open(&af, path, err);
    if (rc == 0) {
        rc = atomic_write(&af, len8, 8, err);
        if (rc == 0) rc = atomic_write(&af, h.p, h.len, err);
        for (int i = 0; i < n && rc == 0; i++)
            rc = st_write_data(&af, items[i].e, dtype, chunk, err);
        if (rc == 0)
            rc = atomic_commit(&af, err);
        else
            atomic_abort(&af);
    }
    free(chunk);
    free(h.p);
    return rc;
}

int st_write(const char *path, const st_entry *entries, int n, ct_dtype dtype, ct_error *err) {
    size_t cnt = n > 0 ? (size_t)n : 0;
    st_item *items = malloc((cnt + 1) * sizeof *items),
            *sorted = malloc((cnt + 1) * sizeof *sorted);
    int rc = items && sorted ? 0 : ct_fail(err, "%s: out of memory", path);
    if (rc == 0) rc = st_check_entries(items, sorted, entries, n, dtype, path, err);
    if (rc == 0) rc = st_write_items(path, sorted, n, dtype, err);
    free(items);
    free(sorted);
    return rc;
}

// "model-KKKKK-of-NNNNN.safetensors", as written by HF and by us.
static bool st_shard_name(const char *name, int *k, int *n) {
    if (strlen(name) != 32 || strncmp(name, "model-", 6) != 0 ||
        strncmp(name + 11, "-of-", 4) != 0 || strcmp(name + 20, ".safetensors") != 0)
        return false;
    *k = *n = 0;
    for (int i = 0; i < 5; i++) {
        char a = name[6 + i], b = name[15 + i];
        if (a < '0' || a > '9' || b < '0' || b > '9') return false;
        *k = *k * 10 + (a - '0');
        *n = *n * 10 + (b - '0');
    }
    return true;
}

static int st_unlink(const char *dir, const char *name, ct_error *err) {
    char *p = st_path_join(dir, name);
    if (!p) return ct_fail(err, "%s: out of memory", dir);
    int rc = 0;
    if (unlink(p) != 0 && errno != ENOENT)
        rc = ct_fail(err, "%s: cannot remove stale %s: %s", dir, name, strerror(errno));
    free(p);
    return rc;
}

// Removes what a previous save in `dir` left that would shadow or confuse this one: the other
// layout's entry file (model.safetensors vs the index) and shard files not of this save.
static int st_remove_stale(const char *dir, int n_shards, ct_error *err) {
    if (st_unlink(dir, n_shards > 1 ? ST_SINGLE_NAME : ST_INDEX_NAME, err) != 0) return -1;
    DIR *d = opendir(dir);
    if (!d) return ct_fail(err, "%s: cannot list folder: %s", dir, strerror(errno));
    int rc = 0;
    for (struct dirent *de; rc == 0 && (de = readdir(d));) {
        int k, n;
        if (st_shard_name(de->d_name, &k, &n) &&
            !(n_shards > 1 && n == n_shards && k >= 1 && k <= n))
            rc = st_unlink(dir, de->d_name, err);
    }
    closedir(d);
    return rc;
}

// model.safetensors.index.json exactly as Python's
// json.dumps({"metadata": {"total_size": T}, "weight_map": {...}}, indent=2, sort_keys=True) +
// "\n".
static int st_write_index(const char *dir, const st_item *sorted, int n, int n_shards,
                          ct_error *err) {
    uint64_t total = 0;
    for (int i = 0; i < n; i++) total += sorted[i].bytes;
    strbuf b = {0};
    sb_printf(&b, "{\n  \"metadata\": {\n    \"total_size\": %llu\n  },\n  \"weight_map\": {",
              (unsigned long long)total);
    for (int i = 0; i < n; i++) {
        char shard[64];
        snprintf(shard, sizeof shard, "model-%05d-of-%05d.safetensors", sorted[i].shard + 1,
                 n_shards);
        sb_puts(&b, i ? ",\n    " : "\n    ");
        sb_json_str(&b, sorted[i].e->name, JSON_SHORT | JSON_ASCII);
        sb_puts(&b, ": ");
        sb_json_str(&b, shard, JSON_SHORT | JSON_ASCII);
    }
    sb_puts(&b, "\n  }\n}\n");
    char *path = st_path_join(dir, ST_INDEX_NAME);
    atomic_file af;
    int rc = b.oom || !path ? ct_fail(err, "%s: out of memory", dir) : atomic_open(&af, path, err);
    if (rc == 0) {
        if (atomic_write(&af, b.p, b.len, err) == 0)
            rc = atomic_commit(&af, err);
        else
            rc = -1, atomic_abort(&af);
    }
    free(path);
    free(b.p);
    return rc;
}

int st_write_folder(const char *dir, const st_entry *entries, int n, ct_dtype dtype,
                    uint64_t max_shard_bytes, ct_error *err) {
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return ct_fail(err, "%s: cannot create folder: %s", dir, strerror(errno));
    size_t cnt = n > 0 ? (size_t)n : 0;
    st_item *items = malloc((cnt + 1) * sizeof *items),
            *sorted = malloc((cnt + 1) * sizeof *sorted);
    st_item *part = malloc((cnt + 1) * sizeof *part);
    int rc = items && sorted && part ? 0 : ct_fail(err, "%s: out of memory", dir);
    if (rc == 0) rc = st_check_entries(items, sorted, entries, n, dtype, dir, err);
    int n_shards = 1;
    if (rc == 0) {
        // Greedy in the given order: a tensor that would push a non-empty shard past the limit
        // starts the next one (so a tensor over the limit gets a shard of its own).
        uint64_t cur = 0, in_shard = 0;
        for (int i = 0; i < n; i++) {
            if (max_shard_bytes && in_shard > 0 &&
                (cur > max_shard_bytes || items[i].bytes > max_shard_bytes - cur)) {
                n_shards++;
                cur = in_shard = 0;
            }
            items[i].shard = n_shards - 1;
            cur += items[i].bytes;
            in_shard++;
        }
        for (int i = 0; i < n; i++) sorted[i] = items[i];
        qsort(sorted, cnt, sizeof *sorted, st_item_cmp);
    }
    for (int s = 0; s < n_shards && rc == 0; s++) {
        char name[64];
        if (n_shards == 1)
            snprintf(name, sizeof name, ST_SINGLE_NAME);
        else
            snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s + 1, n_shards);
        int m = 0;
        for (int i = 0; i < n; i++) {
            if (sorted[i].shard == s) part[m++] = sorted[i]; // stays sorted by name
        }
        char *path = st_path_join(dir, name);
        rc = path ? st_write_items(path, part, m, dtype, err)
                  : ct_fail(err, "%s: out of memory", dir);
        free(path);
    }
    if (rc == 0 && n_shards > 1) rc = st_write_index(dir, sorted, n, n_shards, err);
    if (rc == 0) rc = st_remove_stale(dir, n_shards, err);
    free(items);
    free(sorted);
    free(part);
    return rc;
}
