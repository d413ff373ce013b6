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
#include "train/checkpoint_internal.h"

const char *const ckpt_file_names[CKPT_N_FILES] = {"model.safetensors", "config.json",
                                                   "config.toml"};

void ckpt_shard_name(char out[64], int shard, int n_shards) {
    snprintf(out, 64, "optimizer-%05d-of-%05d.safetensors", shard, n_shards);
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

int ckpt_state_text(char **text, size_t *len, const train_state *st,
                    const ckpt_file_sum files[CKPT_N_FILES], const ckpt_shard_info *shards,
                    int n_shards, const char *where, ct_error *err) {
    *text = NULL;
    if ((double)st->samples_seen >= CKPT_JSON_MAX_UINT || st->step < 0 || st->opt_step < 0 ||
        (double)st->step >= CKPT_JSON_MAX_UINT || (double)st->opt_step >= CKPT_JSON_MAX_UINT)
        return ct_fail(err,
                       "%s: step %" PRId64 ", optimizer step %" PRId64 " or samples_seen %" PRIu64
                       " out of range",
                       where, st->step, st->opt_step, st->samples_seen);
    cJSON *o = cJSON_CreateObject();
    char hex[17];
    cJSON_AddNumberToObject(o, "format", CKPT_FORMAT);
    cJSON_AddStringToObject(o, "ctitan_version", CTITAN_VERSION);
    add_u64(o, "step", (uint64_t)st->step);
    add_u64(o, "optimizer_step", (uint64_t)st->opt_step);
    add_u64(o, "samples_seen", st->samples_seen);
    hex64(hex, st->config_hash);
    cJSON_AddStringToObject(o, "config_hash", hex);
    cJSON_AddNumberToObject(o, "skipped_in_row", st->skipped_in_row);
    char num[40];
    snprintf(num, sizeof num, "%.17g", isfinite(st->time_s) ? st->time_s : 0.0);
    cJSON_AddRawToObject(o, "time_s", num); // 17 digits: strtod gives the same double back
    cJSON_AddStringToObject(o, "checksum", "xxh64");
    cJSON *list = cJSON_AddArrayToObject(o, "files");
    for (int i = 0; i < CKPT_N_FILES; i++)
        add_file(list, ckpt_file_names[i], files[i].bytes, files[i].xxh64);
    cJSON *shard_list = cJSON_AddArrayToObject(o, "optimizer_shards");
    for (int i = 0; i < n_shards; i++) {
        add_file(list, shards[i].file, shards[i].bytes, shards[i].xxh64);
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "file", shards[i].file);
        add_u64(e, "offset", shards[i].offset);
        add_u64(e, "numel", shards[i].numel);
        cJSON_AddItemToArray(shard_list, e);
    }
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

// "optimizer_shards": every entry under its own name, in order, tiling [0, total).
static int parse_shards(ckpt_state *s, const cJSON *arr, const char *path, ct_error *err) {
    if (!cJSON_IsArray(arr))
        return ct_fail(err, "%s: \"optimizer_shards\": expected an array, found %s", path,
                       json_type_name(arr));
    int n = cJSON_GetArraySize(arr);
    if (n < 1 || n > CKPT_MAX_SHARDS)
        return ct_fail(err, "%s: \"optimizer_shards\" has %d entries, expected 1 to %d", path, n,
                       CKPT_MAX_SHARDS);
    s->shards = calloc((size_t)n, sizeof *s->shards);
    if (!s->shards) return ct_fail(err, "%s: out of memory", path);
    s->n_shards = n;
    uint64_t end = 0;
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        ckpt_shard_info *sh = &s->shards[i];
        const char *file = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(it, "file"));
        ckpt_shard_name(sh->file, i, n);
        if (!file || strcmp(file, sh->file) != 0)
            return ct_fail(err, "%s: optimizer_shards[%d]: file \"%s\", expected \"%s\"", path, i,
                           file ? file : "(none)", sh->file);
        if (get_uint(&sh->offset, it, "offset", path, err) != 0 ||
            get_uint(&sh->numel, it, "numel", path, err) != 0)
            return ct_wrap(err, "optimizer_shards[%d]", i);
        if (sh->offset != end)
            return ct_fail(err,
                           "%s: optimizer_shards[%d] (%s) starts at %" PRIu64 ", expected %" PRIu64
                           " where the previous one ends (the shards do not tile)",
                           path, i, sh->file, sh->offset, end);
        end += sh->numel; // both below 2^53: no overflow
        if ((double)end >= CKPT_JSON_MAX_UINT)
            return ct_fail(err, "%s: optimizer_shards cover more than 2^53 elements", path);
        i++;
    }
    s->total = end;
    return 0;
}

static int parse_files(ckpt_state *s, const cJSON *arr, const char *path, ct_error *err) {
    if (!cJSON_IsArray(arr)) return ct_fail(err, "%s: \"files\" must be an array", path);
    bool seen[CKPT_N_FILES] = {false};
    bool *seen_shard = calloc((size_t)s->n_shards, sizeof *seen_shard);
    if (!seen_shard) return ct_fail(err, "%s: out of memory", path);
    int rc = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        const char *name = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(it, "name"));
        const char *hex = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(it, "xxh64"));
        int k = -1, sh = -1;
        for (int i = 0; i < CKPT_N_FILES && name && k < 0; i++)
            if (strcmp(name, ckpt_file_names[i]) == 0) k = i;
        for (int i = 0; i < s->n_shards && name && k < 0 && sh < 0; i++)
            if (strcmp(name, s->shards[i].file) == 0) sh = i;
        if (k < 0 && sh < 0) continue; // a file this version does not know: not needed to resume
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
            s->shards[sh].bytes = bytes;
            s->shards[sh].xxh64 = h;
            seen_shard[sh] = true;
        }
    }
    for (int i = 0; i < CKPT_N_FILES && rc == 0; i++)
        if (!seen[i]) rc = ct_fail(err, "%s: \"files\" does not list %s", path, ckpt_file_names[i]);
    for (int i = 0; i < s->n_shards && rc == 0; i++)
        if (!seen_shard[i])
            rc = ct_fail(err, "%s: \"files\" does not list %s", path, s->shards[i].file);
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
    s->other_format = rc == 0 && format != CKPT_FORMAT && format != CKPT_FORMAT_UNFUSED;
    if (s->other_format)
        rc = ct_fail(err,
                     "%s: checkpoint format %" PRId64 "%s, this ctitan reads format %d; resume it "
                     "with the ctitan that wrote it, or train into a new job.dump_folder",
                     path, format,
                     format == 1 ? " (written before ctitan had sharded optimizer state)" : "",
                     CKPT_FORMAT);
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
    if (rc == 0)
        rc = parse_shards(s, cJSON_GetObjectItemCaseSensitive(o, "optimizer_shards"), path, err);
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
    free(s->shards);
    s->shards = NULL;
    s->n_shards = 0;
}
