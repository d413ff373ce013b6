// safetensors reader: every structural rule is checked once, in st_validate, which both the
// mmap path (st_open) and the in-memory path (st_parse, used by the fuzzer) go through.
#include "io/safetensors.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fs.h"
#include "core/utf8.h"
#include "io/json.h"
#include "io/safetensors_internal.h"

#define ST_META_KEY "__metadata__"

static uint64_t read_le64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

const char *st_shape_str(char *buf, size_t cap, const int64_t *shape, int ndim) {
    size_t k = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < ndim && k < cap; d++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (k < cap) snprintf(buf + k, cap - k, "]");
    return buf;
}

int st_shape_numel(uint64_t *numel, uint64_t *bytes, const int64_t *shape, int ndim, ct_dtype t) {
    uint64_t n = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0 || __builtin_mul_overflow(n, (uint64_t)shape[d], &n)) return -1;
    }
    if (__builtin_mul_overflow(n, (uint64_t)dtype_size(t), bytes)) return -1;
    *numel = n;
    return 0;
}

static int st_cmp_name(const void *a, const void *b) {
    return strcmp(((const st_tensor *)a)->name, ((const st_tensor *)b)->name);
}

static int st_cmp_offsets(const void *a, const void *b) {
    const st_tensor *x = *(const st_tensor *const *)a, *y = *(const st_tensor *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

static int st_parse_metadata(const char *path, const cJSON *meta, bool seen, ct_error *err) {
    if (seen) return ct_fail(err, "%s: key \"" ST_META_KEY "\" appears twice in the header", path);
    if (!cJSON_IsObject(meta))
        return ct_fail(err, "%s: \"" ST_META_KEY "\" must be an object of strings, found %s", path,
                       json_type_name(meta));
    for (const cJSON *m = meta->child; m; m = m->next) {
        if (!cJSON_IsString(m))
            return ct_fail(err, "%s: \"" ST_META_KEY "\" key \"%s\": expected a string, found %s",
                           path, m->string, json_type_name(m));
    }
    return 0;
}

// Fills t from one header entry; checks everything that concerns this tensor alone.
static int st_parse_entry(st_tensor *t, const char *path, const cJSON *e, uint64_t data_size,
                          ct_error *err) {
    const char *name = e->string;
    if (!cJSON_IsObject(e))
        return ct_fail(err, "%s: tensor \"%s\": expected an object, found %s", path, name,
                       json_type_name(e));
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!dtype || !shape || !offs)
        return ct_fail(err, "%s: tensor \"%s\": missing \"%s\"", path, name,
                       !dtype   ? "dtype"
                       : !shape ? "shape"
                                : "data_offsets");
    if (!cJSON_IsString(dtype))
        return ct_fail(err, "%s: tensor \"%s\": dtype: expected a string, found %s", path, name,
                       json_type_name(dtype));
    if (dtype_from_name(&t->dtype, dtype->valuestring) != 0)
        return ct_fail(
            err,
            "%s: tensor \"%s\": unknown dtype \"%s\" (expected F64, F32, F16, BF16, I64, "
            "I32, I16, I8, U64, U32, U16, U8 or BOOL)",
            path, name, dtype->valuestring);
    if (!cJSON_IsArray(shape))
        return ct_fail(err, "%s: tensor \"%s\": shape: expected an array, found %s", path, name,
                       json_type_name(shape));
    int ndim = cJSON_GetArraySize(shape);
    if (ndim > ST_MAX_DIMS)
        return ct_fail(err, "%s: tensor \"%s\": shape has %d dimensions, at most %d supported",
                       path, name, ndim, ST_MAX_DIMS);
    t->ndim = ndim;
    int d = 0;
    for (const cJSON *s = shape->child; s; s = s->next, d++) {
        uint64_t v;
        if (!json_is_uint(s, &v)) {
            if (cJSON_IsNumber(s))
                return ct_fail(err,
                               "%s: tensor \"%s\": shape[%d]: expected a non-negative integer, "
                               "found %.17g",
                               path, name, d, s->valuedouble);
            return ct_fail(err, "%s: tensor \"%s\": shape[%d]: expected an integer, found %s", path,
                           name, d, json_type_name(s));
        }
        t->shape[d] = (int64_t)v;
    }
    uint64_t bytes;
    char sbuf[256];
    if (st_shape_numel(&t->numel, &bytes, t->shape, ndim, t->dtype) != 0)
        return ct_fail(err, "%s: tensor \"%s\": shape %s of %s has too many elements", path, name,
                       st_shape_str(sbuf, sizeof sbuf, t->shape, ndim), dtype->valuestring);
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 ||
        !json_is_uint(offs->child, &t->begin) || !json_is_uint(offs->child->next, &t->end))
        return ct_fail(err,
                       "%s: tensor \"%s\": data_offsets: expected two non-negative integers "
                       "[begin, end], found %s%s",
                       path, name, json_type_name(offs),
                       cJSON_IsArray(offs) ? " of other length or content" : "");
    if (t->begin > t->end)
        return ct_fail(err, "%s: tensor \"%s\": data_offsets [%llu, %llu]: begin is after end",
                       path, name, (unsigned long long)t->begin, (unsigned long long)t->end);
    if (t->end - t->begin != bytes)
        return ct_fail(err,
                       "%s: tensor \"%s\": data_offsets [%llu, %llu] hold %llu bytes, expected "
                       "%llu (shape %s of %s)",
                       path, name, (unsigned long long)t->begin, (unsigned long long)t->end,
                       (unsigned long long)(t->end - t->begin), (unsigned long long)bytes,
                       st_shape_str(sbuf, sizeof sbuf, t->shape, ndim), dtype->valuestring);
    if (t->end > data_size)
        return ct_fail(err,
                       "%s: tensor \"%s\": data_offsets [%llu, %llu] run past the data region "
                       "of %llu bytes",
                       path, name, (unsigned long long)t->begin, (unsigned long long)t->end,
                       (unsigned long long)data_size);
    t->name = strdup(name);
    if (!t->name) return ct_fail(err, "%s: out of memory", path);
    return 0;
}

// Tensors must tile the data region: sorted by offset, each begins where the previous ended,
// and the last ends at the end of the file.
static int st_check_coverage(const st_file *f, uint64_t data_size, ct_error *err) {
    int rc = 0;
    const st_tensor **by_off = malloc(((size_t)f->n_tensors + 1) * sizeof *by_off);
    if (!by_off) return ct_fail(err, "%s: out of memory", f->path);
    for (int i = 0; i < f->n_tensors; i++) by_off[i] = &f->tensors[i];
    qsort(by_off, (size_t)f->n_tensors, sizeof *by_off, st_cmp_offsets);
    uint64_t cursor = 0;
    for (int i = 0; i < f->n_tensors && rc == 0; i++) {
        const st_tensor *t = by_off[i];
        if (t->begin < cursor)
            rc = ct_fail(err, "%s: tensors \"%s\" [%llu, %llu] and \"%s\" [%llu, %llu] overlap",
                         f->path, by_off[i - 1]->name, (unsigned long long)by_off[i - 1]->begin,
                         (unsigned long long)by_off[i - 1]->end, t->name,
                         (unsigned long long)t->begin, (unsigned long long)t->end);
        else if (t->begin > cursor)
            rc =
                ct_fail(err,
                        "%s: gap in the data region: bytes [%llu, %llu) before tensor \"%s\" "
                        "belong to no tensor",
                        f->path, (unsigned long long)cursor, (unsigned long long)t->begin, t->name);
        cursor = t->end;
    }
    if (rc == 0 && cursor != data_size)
        rc = ct_fail(err,
                     "%s: data region has %llu bytes but the tensors cover %llu (trailing bytes)",
                     f->path, (unsigned long long)data_size, (unsigned long long)cursor);
    free(by_off);
    return rc;
}

static int st_validate(st_file *f, const unsigned char *buf, size_t size, ct_error *err) {
    const char *path = f->path;
    if (size < 8)
        return ct_fail(err, "%s: file is %zu bytes, expected at least 8 (the header length)", path,
                       size);
    uint64_t n = read_le64(buf);
    if (n == 0) return ct_fail(err, "%s: header length is 0", path);
    if (n > ST_MAX_HEADER)
        return ct_fail(err, "%s: header length %llu exceeds the limit of %u bytes", path,
                       (unsigned long long)n, ST_MAX_HEADER);
    if (n > size - 8)
        return ct_fail(err,
                       "%s: header length %llu runs past the end of the file (%zu bytes after the "
                       "length field)",
                       path, (unsigned long long)n, size - 8);
    f->header_len = n;
    const char *hdr = (const char *)buf + 8;
    size_t bad = utf8_valid_prefix(hdr, n);
    if (bad != n) return ct_fail(err, "%s: header is not valid UTF-8 at byte %zu", path, bad);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(hdr, n, &end, 0);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        size_t off = (at && at >= hdr && at <= hdr + n) ? (size_t)(at - hdr) : n;
        return ct_fail(err, "%s: header is not valid JSON (error at byte %zu of the header)", path,
                       off);
    }
    int rc = 0;
    // Only whitespace may follow the JSON value (the writer pads with spaces).
    for (const char *p = end; p < hdr + n && rc == 0; p++) {
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r')
            rc = ct_fail(err, "%s: unexpected byte 0x%02x after the header JSON at byte %zu", path,
                         (unsigned char)*p, (size_t)(p - hdr));
    }
    if (rc == 0 && !cJSON_IsObject(root))
        rc = ct_fail(err, "%s: header must be a JSON object, found %s", path, json_type_name(root));
    if (rc != 0) {
        cJSON_Delete(root);
        return rc;
    }
    uint64_t data_size = size - 8 - n;
    int count = cJSON_GetArraySize(root);
    f->tensors = calloc((size_t)count + 1, sizeof *f->tensors);
    if (!f->tensors) rc = ct_fail(err, "%s: out of memory", path);
    bool seen_meta = false;
    for (const cJSON *e = root->child; e && rc == 0; e = e->next) {
        if (strcmp(e->string, ST_META_KEY) == 0) {
            rc = st_parse_metadata(path, e, seen_meta, err);
            seen_meta = true;
            continue;
        }
        st_tensor *t = &f->tensors[f->n_tensors];
        rc = st_parse_entry(t, path, e, data_size, err);
        if (rc == 0) {
            t->data = buf + 8 + n + t->begin;
            f->n_tensors++;
        }
    }
    cJSON_Delete(root);
    if (rc != 0) return rc;
    qsort(f->tensors, (size_t)f->n_tensors, sizeof *f->tensors, st_cmp_name);
    // cJSON keeps duplicate keys as siblings; after sorting they are neighbours.
    for (int i = 1; i < f->n_tensors; i++) {
        if (strcmp(f->tensors[i - 1].name, f->tensors[i].name) == 0)
            return ct_fail(err, "%s: tensor \"%s\" appears twice in the header", path,
                           f->tensors[i].name);
    }
    return st_check_coverage(f, data_size, err);
}

int st_parse(st_file *f, const void *buf, size_t size, const char *name, ct_error *err) {
    memset(f, 0, sizeof *f);
    f->path = strdup(name);
    if (!f->path) return ct_fail(err, "%s: out of memory", name);
    if (st_validate(f, buf, size, err) != 0) {
        st_close(f);
        return -1;
    }
    return 0;
}

int st_open(st_file *f, const char *path, ct_error *err) {
    void *map;
    size_t size;
    memset(f, 0, sizeof *f);
    if (fs_map_readonly(&map, &size, path, err) != 0) return -1;
    // A 0-byte file has no mapping; it is validated (and refused) as an empty buffer.
    if (st_parse(f, map ? map : (const void *)"", size, path, err) != 0) {
        fs_unmap(map, size);
        return -1;
    }
    f->map = map;
    f->map_size = size;
    return 0;
}

void st_close(st_file *f) {
    if (f->tensors) {
        for (int i = 0; i < f->n_tensors; i++) free(f->tensors[i].name);
        free(f->tensors);
    }
    fs_unmap(f->map, f->map_size);
    free(f->path);
    memset(f, 0, sizeof *f);
}

const st_tensor *st_file_find(const st_file *f, const char *name) {
    st_tensor key = {.name = (char *)name};
    return bsearch(&key, f->tensors, (size_t)f->n_tensors, sizeof key, st_cmp_name);
}

int st_tensor_to_f32(float *dst, const st_tensor *t, ct_error *err) {
    return st_tensor_range_to_f32(dst, t, 0, t->numel, err);
}

int st_tensor_range_to_f32(float *dst, const st_tensor *t, uint64_t first, uint64_t count,
                           ct_error *err) {
    if (first > t->numel || count > t->numel - first)
        return ct_fail(err, "tensor \"%s\": elements [%llu, %llu) are outside its %llu", t->name,
                       (unsigned long long)first, (unsigned long long)(first + count),
                       (unsigned long long)t->numel);
    const char *src = (const char *)t->data + first * dtype_size(t->dtype);
    if (dtype_to_f32(dst, src, t->dtype, (size_t)count) != 0)
        return ct_fail(err,
                       "tensor \"%s\": dtype %s cannot be converted to fp32 (expected F32, BF16, "
                       "F16 or F64)",
                       t->name, dtype_name(t->dtype));
    return 0;
}
