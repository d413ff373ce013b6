// A checkpoint's state.json, both ways: the text a save writes from the train_state, the files'
// sizes and checksums and the optimizer shard list; and the parser that reads it back, which
// trusts nothing (it is fuzzed: fuzz/fuzz_ckpt_state.c). Only JSON here, no files, so the fuzz
// target links core and io alone.
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "io/json.h"
#include "checkpoint/checkpoint_internal.h"

const char *const ckpt_file_names[CKPT_N_FILES] = {"model.safetensors", "config.json",
                                                   "config.toml"};

void ckpt_shard_name(char out[64], int shard, int n_shards) {
    snprintf(out, 64, "optimizer-%05d-of-%05d.safetensors", shard, n_shards);
}

void ckpt_model_shard_name(char out[64], int shard, int n_shards) {
    snprintf(out, 64, "model-%05d-of-%05d.safetensors", shard, n_shards);
}

// ---------------------------------------------------------------- shard lists

void ckpt_shard_list_free(ckpt_shard_list *list) {
    free(list->info);
    free(list->ranges);
    free(list->first);
    memset(list, 0, sizeof *list);
}

// Room for n shards and n_ranges ranges in all.
static int list_alloc(ckpt_shard_list *list, int n, size_t n_ranges, const char *where,
                      ct_error *err) {
    memset(list, 0, sizeof *list);
    list->info = calloc((size_t)n + 1, sizeof *list->info);
    list->ranges = calloc(n_ranges + 1, sizeof *list->ranges);
    list->first = calloc((size_t)n + 1, sizeof *list->first);
    list->n = n;
    if (list->info && list->ranges && list->first) return 0;
    ckpt_shard_list_free(list);
    return ct_fail(err, "%s: out of memory", where);
}

int ckpt_shard_list_make(ckpt_shard_list *list, const ckpt_shard_info *info, int n,
                         const ckpt_range *const *ranges, const int *n_ranges, ct_error *err) {
    size_t total = 0;
    memset(list, 0, sizeof *list);
    if (n < 1 || n > CKPT_MAX_SHARDS || !info || !ranges || !n_ranges)
        return ct_fail(err, "%d shards, expected 1 to %d, each with its ranges", n,
                       CKPT_MAX_SHARDS);
    for (int i = 0; i < n; i++) {
        if (n_ranges[i] < 0 || (n_ranges[i] > 0 && !ranges[i]))
            return ct_fail(err, "shard %d: %d ranges", i, n_ranges[i]);
        total += (size_t)n_ranges[i];
    }
    if (list_alloc(list, n, total, "shard list", err) != 0) return -1;
    int k = 0;
    for (int i = 0; i < n; i++) {
        list->info[i] = info[i];
        list->first[i] = k;
        for (int j = 0; j < n_ranges[i]; j++) list->ranges[k++] = ranges[i][j];
    }
    list->first[n] = k;
    return 0;
}

int ckpt_check_ranges(const ckpt_range *want, int n_want, uint64_t total, const char *where,
                      ct_error *err) {
    uint64_t end = 0;
    if (n_want < 0 || (n_want > 0 && !want))
        return ct_fail(err, "%s: %d ranges asked for", where, n_want);
    for (int k = 0; k < n_want; k++) {
        if (want[k].lo < end || want[k].hi < want[k].lo || want[k].hi > total)
            return ct_fail(err,
                           "%s: range %d [%" PRIu64 ", %" PRIu64 "): expected ascending, "
                           "disjoint ranges within the model's %" PRIu64 " parameters",
                           where, k, want[k].lo, want[k].hi, total);
        end = want[k].hi;
    }
    return 0;
}

uint64_t ckpt_shard_list_total(const ckpt_shard_list *list) {
    uint64_t sum = 0;
    for (int k = 0; k < (list->n ? list->first[list->n] : 0); k++) {
        const ckpt_range *r = &list->ranges[k];
        if (r->hi < r->lo || (double)r->hi >= CKPT_JSON_MAX_UINT) return UINT64_MAX;
        sum += r->hi - r->lo;
        if ((double)sum >= CKPT_JSON_MAX_UINT) return UINT64_MAX;
    }
    return sum;
}

char *ckpt_ranges_text(const ckpt_range *r, int n) {
    size_t cap = (size_t)n * 42 + 1, len = 0;
    char *out = malloc(cap);
    if (!out) return NULL;
    out[0] = '\0';
    for (int i = 0; i < n; i++)
        len += (size_t)snprintf(out + len, cap - len, "%s%" PRIu64 ":%" PRIu64, i ? "," : "",
                                r[i].lo, r[i].hi);
    return out;
}

typedef struct range_at {
    uint64_t lo, hi;
    int shard;
} range_at;

static int range_at_cmp(const void *a, const void *b) {
    const range_at *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo ? 1 : x->shard - y->shard;
}

int ckpt_shard_list_check(const ckpt_shard_list *list, bool model, uint64_t total,
                          const char *where, ct_error *err) {
    const char *kind = model ? "model" : "optimizer";
    if (list->n < 1 || list->n > CKPT_MAX_SHARDS)
        return ct_fail(err, "%s: %d %s shards, expected 1 to %d", where, list->n, kind,
                       CKPT_MAX_SHARDS);
    int n_all = list->first[list->n];
    for (int i = 0; i < list->n; i++) {
        const ckpt_shard_info *s = &list->info[i];
        char want[64];
        (model ? ckpt_model_shard_name : ckpt_shard_name)(want, i, list->n);
        if (strncmp(s->file, want, sizeof s->file) != 0)
            return ct_fail(err, "%s: %s shard %d of %d is \"%.64s\", expected \"%s\"", where, kind,
                           i, list->n, s->file, want);
        uint64_t end = 0, held = 0;
        for (int k = list->first[i]; k < list->first[i + 1]; k++) {
            const ckpt_range *r = &list->ranges[k];
            if (r->lo < end || r->hi < r->lo || r->hi > total)
                return ct_fail(err,
                               "%s: %s: range [%" PRIu64 ", %" PRIu64 ") %s (a shard's ranges "
                               "are ascending, disjoint and within the %" PRIu64 " elements)",
                               where, s->file, r->lo, r->hi,
                               r->hi > total ? "runs past the end" : "is out of order", total);
            end = r->hi;
            held += r->hi - r->lo;
        }
        if (held != s->numel)
            return ct_fail(err,
                           "%s: %s holds %" PRIu64 " elements, its ranges %" PRIu64
                           " (the shard is not the one its ranges describe)",
                           where, s->file, s->numel, held);
    }
    // All the ranges in order of their start: each starts where the one before it ends.
    range_at *all = malloc(((size_t)n_all + 1) * sizeof *all);
    if (!all) return ct_fail(err, "%s: out of memory", where);
    int m = 0;
    for (int i = 0; i < list->n; i++)
        for (int k = list->first[i]; k < list->first[i + 1]; k++)
            if (list->ranges[k].hi > list->ranges[k].lo)
                all[m++] = (range_at){list->ranges[k].lo, list->ranges[k].hi, i};
    qsort(all, (size_t)m, sizeof *all, range_at_cmp);
    uint64_t end = 0;
    int rc = 0, prev = -1;
    for (int k = 0; k < m && rc == 0; k++) {
        if (all[k].lo != end) {
            char before[96] = "the start";
            if (prev >= 0) snprintf(before, sizeof before, "a range of %s", list->info[prev].file);
            rc = ct_fail(err,
                         "%s: %s: range [%" PRIu64 ", %" PRIu64 ") starts at flat element %" PRIu64
                         ", expected %" PRIu64 " where %s ends (the shards %s)",
                         where, list->info[all[k].shard].file, all[k].lo, all[k].hi, all[k].lo, end,
                         before, all[k].lo < end ? "overlap" : "leave a gap");
        }
        end = all[k].hi;
        prev = all[k].shard;
    }
    free(all);
    if (rc == 0 && end != total)
        rc = ct_fail(
            err, "%s: the %s shards cover [0, %" PRIu64 "), the model has %" PRIu64 " parameters",
            where, kind, end, total);
    return rc;
}

// ---------------------------------------------------------------- write

static void hex64(char out[17], uint64_t v) {
    snprintf(out, 17, "%016" PRIx64, v);
}

// cJSON prints numbers with 15 digits when that is "close enough" (relative DBL_EPSILON), which
// can move an integer near 2^53 by one; integers go out exactly, as raw JSON.
static void add_u64(cJSON *o, const char *key, uint64_t v) {
    char num[24];
    snprintf(num, sizeof num, "%" PRIu64, v);
    cJSON_AddRawToObject(o, key, num);
}

static void add_file(cJSON *files, const char *name, uint64_t bytes, uint64_t h) {
    char hex[17];
    cJSON *f = cJSON_CreateObject();
    cJSON_AddStringToObject(f, "name", name);
    add_u64(f, "bytes", bytes);
    hex64(hex, h);
    cJSON_AddStringToObject(f, "xxh64", hex);
    cJSON_AddItemToArray(files, f);
}

// Format 3 can say the layout: the model whole, one range per optimizer shard, in order.
static bool fits_format3(const ckpt_shard_list *optim, const ckpt_shard_list *model) {
    if (model && model->n > 0) return false;
    uint64_t end = 0;
    for (int i = 0; i < optim->n; i++) {
        if (optim->first[i + 1] - optim->first[i] != 1) return false;
        const ckpt_range *r = &optim->ranges[optim->first[i]];
        if (r->lo != end) return false;
        end = r->hi;
    }
    return true;
}

// A shard list: its files into "files", its entries into key (format 3: {file, offset, numel};
// format 4: {file, ranges}).
static void add_shards(cJSON *o, cJSON *files, const char *key, const ckpt_shard_list *list,
                       bool format3) {
    cJSON *arr = cJSON_AddArrayToObject(o, key);
    for (int i = 0; i < list->n; i++) {
        const ckpt_shard_info *s = &list->info[i];
        add_file(files, s->file, s->bytes, s->xxh64);
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "file", s->file);
        if (format3) {
            const ckpt_range *r = &list->ranges[list->first[i]];
            add_u64(e, "offset", r->lo);
            add_u64(e, "numel", r->hi - r->lo);
        } else {
            cJSON *ranges = cJSON_AddArrayToObject(e, "ranges");
            for (int k = list->first[i]; k < list->first[i + 1]; k++) {
                cJSON *pair = cJSON_CreateArray();
                char num[24];
                for (int j = 0; j < 2; j++) {
                    snprintf(num, sizeof num, "%" PRIu64,
                             j ? list->ranges[k].hi : list->ranges[k].lo);
                    cJSON_AddItemToArray(pair, cJSON_CreateRaw(num));
                }
                cJSON_AddItemToArray(ranges, pair);
            }
        }
        cJSON_AddItemToArray(arr, e);
    }
}

int ckpt_state_text(char **text, size_t *len, const train_state *st,
                    const ckpt_file_sum files[CKPT_N_FILES], const ckpt_shard_list *optim,
                    const ckpt_shard_list *model, const char *where, ct_error *err) {
    *text = NULL;
    if ((double)st->samples_seen >= CKPT_JSON_MAX_UINT || st->step < 0 || st->opt_step < 0 ||
        (double)st->step >= CKPT_JSON_MAX_UINT || (double)st->opt_step >= CKPT_JSON_MAX_UINT)
        return ct_fail(err,
                       "%s: step %" PRId64 ", optimizer step %" PRId64 " or samples_seen %" PRIu64
                       " out of range",
                       where, st->step, st->opt_step, st->samples_seen);
    bool sharded = model && model->n > 0, format3 = fits_format3(optim, model);
    cJSON *o = cJSON_CreateObject();
    char hex[17];
    cJSON_AddNumberToObject(o, "format", format3 ? CKPT_FORMAT_RANGE : CKPT_FORMAT);
    cJSON_AddStringToObject(o, "ctitan_version", CTITAN_VERSION);
    add_u64(o, "step", (uint64_t)st->step);
    add_u64(o, "optimizer_step", (uint64_t)st->opt_step);
    add_u64(o, "samples_seen", st->samples_seen);
    hex64(hex, st->config_hash);
    cJSON_AddStringToObject(o, "config_hash", hex);
    cJSON_AddNumberToObject(o, "skipped_in_row", st->skipped_in_row);
    if (st->lora_base_hash) { // a LoRA run's: the base it trains on, the dropout counter
        cJSON *lora = cJSON_AddObjectToObject(o, "lora");
        hex64(hex, st->lora_base_hash);
        cJSON_AddStringToObject(lora, "base_xxh64", hex);
        add_u64(lora, "forwards", st->lora_forwards);
    }
    char num[40];
    snprintf(num, sizeof num, "%.17g", isfinite(st->time_s) ? st->time_s : 0.0);
    cJSON_AddRawToObject(o, "time_s", num); // 17 digits: strtod gives the same double back
    cJSON_AddStringToObject(o, "checksum", "xxh64");
    cJSON *list = cJSON_AddArrayToObject(o, "files");
    for (int i = 0; i < CKPT_N_FILES; i++)
        if (i != CKPT_F_MODEL || !sharded)
            add_file(list, ckpt_file_names[i], files[i].bytes, files[i].xxh64);
    add_shards(o, list, "optimizer_shards", optim, format3);
    if (sharded) add_shards(o, list, "model_shards", model, false);
    char *printed = cJSON_Print(o);
    cJSON_Delete(o);
    if (!printed) return ct_fail(err, "%s: out of memory", where);
    *len = strlen(printed);
    printed[*len] = '\n'; // replaces the terminator; *len + 1 bytes are the file
    *len += 1;
    *text = printed;
    return 0;
}

// ---------------------------------------------------------------- parse

static bool parse_hex64(uint64_t *out, const char *s) {
    if (!s || strlen(s) != 16) return false;
    uint64_t v = 0;
    for (int i = 0; i < 16; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return false;
        v = v << 4 | (uint64_t)d;
    }
    *out = v;
    return true;
}

static int get_uint(uint64_t *out, const cJSON *o, const char *key, const char *path,
                    ct_error *err) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!json_is_uint(it, out))
        return ct_fail(err, "%s: \"%s\": expected a non-negative integer, found %s", path, key,
                       json_type_name(it));
    return 0;
}

// A format 4 entry's "ranges": [[lo, hi], ...] into list->ranges from *k on.
static int parse_ranges(ckpt_shard_list *list, int *k, const cJSON *arr, const char *key, int i,
                        const char *path, ct_error *err) {
    const cJSON *pair;
    cJSON_ArrayForEach(pair, arr) {
        uint64_t v[2];
        const cJSON *lo = cJSON_GetArrayItem(pair, 0), *hi = cJSON_GetArrayItem(pair, 1);
        if (!cJSON_IsArray(pair) || cJSON_GetArraySize(pair) != 2 || !json_is_uint(lo, &v[0]) ||
            !json_is_uint(hi, &v[1]) || v[1] < v[0])
            return ct_fail(err,
                           "%s: %s[%d]: \"ranges\": expected [lo, hi] pairs of integers, lo <= hi",
                           path, key, i);
        list->ranges[(*k)++] = (ckpt_range){v[0], v[1]};
    }
    return 0;
}

// One kind of shards (key "optimizer_shards" or "model_shards"): every entry under its own name,
// in order; format 3 and 2 {file, offset, numel} tiling [0, total) in order, format 4 {file,
// ranges} whose union tiles it. s->total is set by the optimizer shards.
static int parse_shards(ckpt_state *s, ckpt_shard_list *list, bool model, const cJSON *arr,
                        const char *path, ct_error *err) {
    const char *key = model ? "model_shards" : "optimizer_shards";
    bool ranged = s->format >= CKPT_FORMAT;
    if (!cJSON_IsArray(arr))
        return ct_fail(err, "%s: \"%s\": expected an array, found %s", path, key,
                       json_type_name(arr));
    int n = cJSON_GetArraySize(arr);
    if (n < 1 || n > CKPT_MAX_SHARDS)
        return ct_fail(err, "%s: \"%s\" has %d entries, expected 1 to %d", path, key, n,
                       CKPT_MAX_SHARDS);
    size_t n_ranges = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(it, "ranges");
        n_ranges += ranged && cJSON_IsArray(r) ? (size_t)cJSON_GetArraySize(r) : 1;
    }
    if (list_alloc(list, n, n_ranges, path, err) != 0) return -1;
    uint64_t end = 0;
    int i = 0, k = 0;
    cJSON_ArrayForEach(it, arr) {
        ckpt_shard_info *sh = &list->info[i];
        const char *file = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(it, "file"));
        (model ? ckpt_model_shard_name : ckpt_shard_name)(sh->file, i, n);
        list->first[i] = k;
        if (!file || strcmp(file, sh->file) != 0)
            return ct_fail(err, "%s: %s[%d]: file \"%s\", expected \"%s\"", path, key, i,
                           file ? file : "(none)", sh->file);
        if (ranged) {
            const cJSON *r = cJSON_GetObjectItemCaseSensitive(it, "ranges");
            if (!cJSON_IsArray(r))
                return ct_fail(err, "%s: %s[%d]: \"ranges\": expected an array, found %s", path,
                               key, i, json_type_name(r));
            if (parse_ranges(list, &k, r, key, i, path, err) != 0) return -1;
            for (int j = list->first[i]; j < k; j++) {
                sh->numel += list->ranges[j].hi - list->ranges[j].lo;
                if ((double)sh->numel >= CKPT_JSON_MAX_UINT)
                    return ct_fail(err, "%s: %s cover more than 2^53 elements", path, key);
            }
            sh->offset = k > list->first[i] ? list->ranges[list->first[i]].lo : 0;
            i++;
            continue;
        }
        if (get_uint(&sh->offset, it, "offset", path, err) != 0 ||
            get_uint(&sh->numel, it, "numel", path, err) != 0)
            return ct_wrap(err, "%s[%d]", key, i);
        if (sh->offset != end)
            return ct_fail(err,
                           "%s: %s[%d] (%s) starts at %" PRIu64 ", expected %" PRIu64
                           " where the previous one ends (the shards do not tile)",
                           path, key, i, sh->file, sh->offset, end);
        end += sh->numel; // both below 2^53: no overflow
        if ((double)end >= CKPT_JSON_MAX_UINT)
            return ct_fail(err, "%s: %s cover more than 2^53 elements", path, key);
        list->ranges[k++] = (ckpt_range){sh->offset, end};
        i++;
    }
    list->first[n] = k;
    uint64_t total = ckpt_shard_list_total(list);
    if (total == UINT64_MAX) return ct_fail(err, "%s: %s cover more than 2^53 elements", path, key);
    if (!model) s->total = total;
    return ckpt_shard_list_check(list, model, s->total, path, err);
}

// Shard file `name` of the list, or -1.
static int shard_index(const ckpt_shard_list *list, const char *name) {
    for (int i = 0; i < list->n; i++)
        if (strcmp(name, list->info[i].file) == 0) return i;
    return -1;
}

static int parse_files(ckpt_state *s, const cJSON *arr, const char *path, ct_error *err) {
    if (!cJSON_IsArray(arr)) return ct_fail(err, "%s: \"files\" must be an array", path);
    bool sharded = s->model.n > 0;
    bool seen[CKPT_N_FILES] = {false};
    bool *seen_shard = calloc((size_t)s->optim.n + (size_t)s->model.n + 1, sizeof *seen_shard);
    if (!seen_shard) return ct_fail(err, "%s: out of memory", path);
    int rc = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        const char *name = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(it, "name"));
        const char *hex = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(it, "xxh64"));
        int k = -1, sh = -1;
        ckpt_shard_info *info = NULL;
        for (int i = 0; i < CKPT_N_FILES && name && k < 0; i++)
            if (strcmp(name, ckpt_file_names[i]) == 0 && !(i == CKPT_F_MODEL && sharded)) k = i;
        if (name && k < 0 && (sh = shard_index(&s->optim, name)) >= 0) {
            info = &s->optim.info[sh];
        } else if (name && k < 0 && (sh = shard_index(&s->model, name)) >= 0) {
            info = &s->model.info[sh];
            sh += s->optim.n;
        }
        if (k < 0 && !info) continue; // a file this version does not know: not needed to resume
        uint64_t bytes, h;
        if (get_uint(&bytes, it, "bytes", path, err) != 0) {
            rc = -1;
            break;
        }
        if (!parse_hex64(&h, hex)) {
            rc = ct_fail(err, "%s: %s: \"xxh64\" must be 16 lowercase hex digits", path, name);
            break;
        }
        if (k >= 0) {
            snprintf(s->files[k].name, sizeof s->files[k].name, "%s", name);
            s->files[k].bytes = bytes;
            s->files[k].xxh64 = h;
            seen[k] = true;
        } else {
            info->bytes = bytes;
            info->xxh64 = h;
            seen_shard[sh] = true;
        }
    }
    for (int i = 0; i < CKPT_N_FILES && rc == 0; i++)
        if (!seen[i] && !(i == CKPT_F_MODEL && sharded))
            rc = ct_fail(err, "%s: \"files\" does not list %s", path, ckpt_file_names[i]);
    for (int i = 0; i < s->optim.n + s->model.n && rc == 0; i++)
        if (!seen_shard[i])
            rc = ct_fail(err, "%s: \"files\" does not list %s", path,
                         i < s->optim.n ? s->optim.info[i].file
                                        : s->model.info[i - s->optim.n].file);
    free(seen_shard);
    return rc;
}

int ckpt_state_parse(ckpt_state *s, const char *text, size_t len, const char *path, ct_error *err) {
    memset(s, 0, sizeof *s);
    cJSON *o = NULL;
    if (json_parse(&o, text, len, path, err) != 0) return -1;
    int64_t format = 0, skipped = 0;
    uint64_t step, opt_step, samples;
    double time_s = 0;
    char hash[32] = "";
    int rc = json_get_int(&format, o, "format", true, 1, INT32_MAX, path, err);
    // Another format is not damage: skipping it for an older checkpoint, or starting afresh,
    // would let this run overwrite the other version's steps.
    s->format = format;
    s->other_format = rc == 0 && format != CKPT_FORMAT && format != CKPT_FORMAT_RANGE &&
                      format != CKPT_FORMAT_UNFUSED;
    if (s->other_format)
        rc = ct_fail(err,
                     "%s: checkpoint format %" PRId64 "%s, this ctitan reads formats %d to %d; "
                     "resume it with the ctitan that wrote it, or train into a new "
                     "job.dump_folder",
                     path, format,
                     format == 1 ? " (written before ctitan had sharded optimizer state)" : "",
                     CKPT_FORMAT_UNFUSED, CKPT_FORMAT);
    if (rc == 0) rc = get_uint(&step, o, "step", path, err);
    if (rc == 0) rc = get_uint(&opt_step, o, "optimizer_step", path, err);
    if (rc == 0) rc = get_uint(&samples, o, "samples_seen", path, err);
    if (rc == 0) rc = json_get_int(&skipped, o, "skipped_in_row", true, 0, INT32_MAX, path, err);
    if (rc == 0) rc = json_get_double(&time_s, o, "time_s", true, path, err);
    // JSON has no infinity, but cJSON reads 1e999 as one; a save could not write it back.
    if (rc == 0 && !isfinite(time_s))
        rc = ct_fail(err, "%s: \"time_s\": expected a finite number, found %g", path, time_s);
    if (rc == 0) rc = json_get_string(hash, sizeof hash, o, "config_hash", true, path, err);
    if (rc == 0 && !parse_hex64(&s->st.config_hash, hash))
        rc = ct_fail(err, "%s: \"config_hash\" must be 16 lowercase hex digits", path);
    const cJSON *lora = cJSON_GetObjectItemCaseSensitive(o, "lora");
    s->st.lora_base_hash = s->st.lora_forwards = 0;
    if (rc == 0 && lora) {
        char base[32];
        rc = json_get_string(base, sizeof base, lora, "base_xxh64", true, path, err);
        if (rc == 0 && !parse_hex64(&s->st.lora_base_hash, base))
            rc = ct_fail(err, "%s: \"lora\": \"base_xxh64\" must be 16 lowercase hex digits",
                         path);
        if (rc == 0) rc = get_uint(&s->st.lora_forwards, lora, "forwards", path, err);
    }
    if (rc == 0)
        rc = parse_shards(s, &s->optim, false,
                          cJSON_GetObjectItemCaseSensitive(o, "optimizer_shards"), path, err);
    // Format 4 only: the model in shards of its own (absent: model.safetensors).
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(o, "model_shards");
    if (rc == 0 && model && format >= CKPT_FORMAT)
        rc = parse_shards(s, &s->model, true, model, path, err);
    if (rc == 0) rc = parse_files(s, cJSON_GetObjectItemCaseSensitive(o, "files"), path, err);
    cJSON_Delete(o);
    if (rc != 0) {
        ckpt_state_free(s); // keeps format and other_format for the caller
        return -1;
    }
    s->st.step = (int64_t)step;
    s->st.opt_step = (int64_t)opt_step;
    s->st.samples_seen = samples;
    s->st.skipped_in_row = (int32_t)skipped;
    s->st.time_s = time_s;
    return 0;
}

void ckpt_state_free(ckpt_state *s) {
    ckpt_shard_list_free(&s->optim);
    ckpt_shard_list_free(&s->model);
}
