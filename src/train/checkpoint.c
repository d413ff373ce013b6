// Checkpoints: save (atomic, never NaN), verify (sizes, XXH64, tensor names and shapes), load
// (all checks before the first copy), resume from the newest complete one, prune, clean up.
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "core/fs.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "model/hf_adapter.h"
#include "train/checkpoint_internal.h"

// Internal return code: the folder is corrupt or incomplete (skip it for an older one), as
// opposed to -1, a failure that must stop the caller (a checkpoint of another architecture,
// out of memory, bad arguments).
#define CK_CORRUPT (-2)

#define STATE_NAME "state.json"
#define STATE_MAX_BYTES (16u << 20)
#define JSON_MAX_UINT 9007199254740992.0 // 2^53: integers above lose precision in JSON

enum { F_MODEL, F_OPTIM, F_CONFIG_JSON, F_CONFIG_TOML, N_FILES };
static const char *const file_names[N_FILES] = {"model.safetensors", "optimizer.safetensors",
                                                "config.json", "config.toml"};

static const char *const moment_prefix[2] = {"exp_avg.", "exp_avg_sq."};

int ckpt_step_path(char *out, size_t cap, const char *root, int64_t step, ct_error *err) {
    int n = snprintf(out, cap, "%s/step-%" PRId64, root, step);
    if (n < 0 || (size_t)n >= cap) return ct_fail(err, "%s: checkpoint path too long", root);
    return 0;
}

static int join(char *out, size_t cap, const char *dir, const char *name, ct_error *err) {
    int n = snprintf(out, cap, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= cap) return ct_fail(err, "%s/%s: path too long", dir, name);
    return 0;
}

// ---------------------------------------------------------------- save

// The first non-finite element of buf (param_mem layout), as an error naming the tensor.
static int check_finite(const qwen3_model *m, const float *buf, const char *what, ct_error *err) {
    for (int i = 0; i < m->n_params; i++) {
        const qwen3_param *p = &m->params[i];
        const float *x = buf + p->offset;
        size_t first = SIZE_MAX;
#pragma omp parallel for reduction(min : first) schedule(static)
        for (size_t k = 0; k < p->numel; k++)
            if (!isfinite(x[k]) && k < first) first = k;
        if (first != SIZE_MAX)
            return ct_fail(err,
                           "refusing to save a checkpoint: %s \"%s\" holds %g at element %zu "
                           "(the previous checkpoint is kept)",
                           what, p->name, (double)x[first], first);
    }
    return 0;
}

static int write_moments(const char *path, const qwen3_model *m, const float *exp_avg,
                         const float *exp_avg_sq, ct_error *err) {
    int n = 2 * m->n_params;
    st_entry *e = calloc((size_t)n + 1, sizeof *e);
    char(*names)[sizeof m->params[0].name + 16] = calloc((size_t)n + 1, sizeof *names);
    if (!e || !names) {
        free(e);
        free(names);
        return ct_fail(err, "%s: out of memory", path);
    }
    const float *bufs[2] = {exp_avg, exp_avg_sq};
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < m->n_params; i++) {
            const qwen3_param *p = &m->params[i];
            int j = k * m->n_params + i;
            snprintf(names[j], sizeof names[j], "%s%s", moment_prefix[k], p->name);
            e[j].name = names[j];
            e[j].data = bufs[k] + p->offset;
            e[j].ndim = p->ndim;
            for (int d = 0; d < p->ndim; d++) e[j].shape[d] = p->shape[d];
        }
    }
    int rc = st_write(path, e, n, CT_F32, err);
    free(e);
    free(names);
    return rc;
}

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

// state.json: the train_state and, for each other file, its size and XXH64.
static int write_state(const char *dir, const train_state *st, ct_error *err) {
    if ((double)st->samples_seen >= JSON_MAX_UINT || st->step < 0 || st->opt_step < 0 ||
        (double)st->step >= JSON_MAX_UINT || (double)st->opt_step >= JSON_MAX_UINT)
        return ct_fail(err,
                       "%s: step %" PRId64 ", optimizer step %" PRId64 " or samples_seen %" PRIu64
                       " out of range",
                       dir, st->step, st->opt_step, st->samples_seen);
    cJSON *o = cJSON_CreateObject();
    char hex[17], path[4096];
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
    cJSON *files = cJSON_AddArrayToObject(o, "files");
    int rc = 0;
    for (int i = 0; i < N_FILES && rc == 0; i++) {
        uint64_t h, size;
        rc = join(path, sizeof path, dir, file_names[i], err);
        if (rc == 0) rc = ckpt_hash_file(&h, &size, path, err);
        if (rc != 0) break;
        cJSON *f = cJSON_CreateObject();
        cJSON_AddStringToObject(f, "name", file_names[i]);
        cJSON_AddNumberToObject(f, "bytes", (double)size);
        hex64(hex, h);
        cJSON_AddStringToObject(f, "xxh64", hex);
        cJSON_AddItemToArray(files, f);
    }
    char *text = rc == 0 ? cJSON_Print(o) : NULL;
    cJSON_Delete(o);
    if (rc != 0) return -1;
    if (!text) return ct_fail(err, "%s: out of memory", dir);
    size_t len = strlen(text);
    text[len] = '\n'; // replaces the terminator; the length below excludes it
    rc = join(path, sizeof path, dir, STATE_NAME, err);
    if (rc == 0) rc = ckpt_write_text(path, text, len + 1, err);
    cJSON_free(text);
    return rc;
}

// Everything into `tmp`, then made durable.
static int save_into(const char *tmp, const qwen3_model *m, const float *exp_avg,
                     const float *exp_avg_sq, const train_state *st, const char *config_toml,
                     ct_error *err) {
    char path[4096];
    if (mkdir(tmp, 0777) != 0)
        return ct_fail(err, "%s: cannot create folder: %s", tmp, strerror(errno));
    if (hf_save_folder(m, tmp, CT_F32, 0, err) != 0) return -1; // config.json + model
    if (join(path, sizeof path, tmp, file_names[F_OPTIM], err) != 0 ||
        write_moments(path, m, exp_avg, exp_avg_sq, err) != 0)
        return -1;
    if (join(path, sizeof path, tmp, file_names[F_CONFIG_TOML], err) != 0 ||
        ckpt_write_text(path, config_toml, strlen(config_toml), err) != 0)
        return -1;
    if (write_state(tmp, st, err) != 0) return -1;
    return ckpt_fsync_folder(tmp, err);
}

// The parent of `dir` is made durable after `dir` was created in it.
static int fsync_parent(const char *dir, ct_error *err) {
    char parent[4096];
    snprintf(parent, sizeof parent, "%s", dir);
    char *slash = strrchr(parent, '/');
    if (!slash) return ckpt_fsync_path(".", true, err);
    if (slash == parent)
        slash[1] = '\0';
    else
        *slash = '\0';
    return ckpt_fsync_path(parent, true, err);
}

int ckpt_save(const char *root, const qwen3_model *m, const float *exp_avg, const float *exp_avg_sq,
              size_t n, const train_state *st, const char *config_toml, ct_error *err) {
    if (!exp_avg || !exp_avg_sq || !config_toml)
        return ct_fail(err, "%s: ckpt_save needs both moments and the config text", root);
    if (n != m->num_params)
        return ct_fail(err, "%s: optimizer state has %zu floats per moment, the model %zu", root, n,
                       m->num_params);
    if (st->step < 0 || st->opt_step < 0)
        return ct_fail(err, "%s: cannot save step %" PRId64 " (optimizer step %" PRId64 ")", root,
                       st->step, st->opt_step);
    if (check_finite(m, m->param_mem, "parameter", err) != 0 ||
        check_finite(m, exp_avg, "optimizer exp_avg of", err) != 0 ||
        check_finite(m, exp_avg_sq, "optimizer exp_avg_sq of", err) != 0)
        return -1;

    struct stat sb;
    bool root_new = stat(root, &sb) != 0;
    if (fs_mkdirs(root, err) != 0) return -1;
    if (root_new && fsync_parent(root, err) != 0) return -1;

    char final[4096], tmp[4200], aside[4200];
    if (ckpt_step_path(final, sizeof final, root, st->step, err) != 0) return -1;
    snprintf(tmp, sizeof tmp, "%s.tmp-%ld", final, (long)getpid());
    snprintf(aside, sizeof aside, "%s.tmp-%ld.old", final, (long)getpid());
    // Our own leftovers from a failed save (or an earlier process with our pid).
    if (ckpt_rmtree(tmp, err) != 0 || ckpt_rmtree(aside, err) != 0) return -1;

    int rc = save_into(tmp, m, exp_avg, exp_avg_sq, st, config_toml, err);
    if (rc != 0) {
        ct_wrap(err, "saving checkpoint %s", final);
        ckpt_rmtree(tmp, NULL);
        return -1;
    }
    // A folder of the same step (a run resumed from an older one) is moved aside, not merged
    // into: until the rename below, the older checkpoints are the newest complete ones.
    bool replaced = false;
    if (lstat(final, &sb) == 0) {
        if (rename(final, aside) != 0) {
            rc = ct_fail(err, "%s: cannot move the existing folder aside: %s", final,
                         strerror(errno));
            ckpt_rmtree(tmp, NULL);
            return rc;
        }
        replaced = true;
    }
    if (rename(tmp, final) != 0) {
        rc = ct_fail(err, "%s: cannot rename %s into place: %s", final, tmp, strerror(errno));
        ckpt_rmtree(tmp, NULL);
        if (replaced) rename(aside, final); // put the old one back
        return rc;
    }
    if (ckpt_fsync_path(root, true, err) != 0) return -1;
    if (replaced && ckpt_rmtree(aside, err) != 0)
        return ct_wrap(err, "checkpoint %s saved, but removing the one it replaced failed", final);
    return 0;
}

// ---------------------------------------------------------------- verify

typedef struct file_sum {
    char name[64];
    uint64_t bytes, xxh64;
} file_sum;

typedef struct ckpt_view {
    const char *dir;
    train_state st;
    file_sum files[N_FILES];
    st_file model, optim; // open (mmap'd) after view_open
} ckpt_view;

// An error that marks the checkpoint corrupt rather than failing the caller.
static int corrupt(ct_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int corrupt(ct_error *err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    ct_vfail(err, fmt, ap);
    va_end(ap);
    return CK_CORRUPT;
}

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

static int parse_files(file_sum *files, const cJSON *arr, const char *path, ct_error *err) {
    if (!cJSON_IsArray(arr)) return ct_fail(err, "%s: \"files\" must be an array", path);
    bool seen[N_FILES] = {false};
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        const char *name = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(it, "name"));
        const char *hex = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(it, "xxh64"));
        int k = -1;
        for (int i = 0; i < N_FILES && name; i++)
            if (strcmp(name, file_names[i]) == 0) k = i;
        if (k < 0) continue; // a file this version does not know: not needed to resume
        uint64_t bytes, h;
        if (get_uint(&bytes, it, "bytes", path, err) != 0) return -1;
        if (!parse_hex64(&h, hex))
            return ct_fail(err, "%s: %s: \"xxh64\" must be 16 lowercase hex digits", path, name);
        snprintf(files[k].name, sizeof files[k].name, "%s", name);
        files[k].bytes = bytes;
        files[k].xxh64 = h;
        seen[k] = true;
    }
    for (int i = 0; i < N_FILES; i++)
        if (!seen[i]) return ct_fail(err, "%s: \"files\" does not list %s", path, file_names[i]);
    return 0;
}

static int parse_state(ckpt_view *v, const char *text, size_t len, const char *path,
                       ct_error *err) {
    cJSON *o = NULL;
    if (json_parse(&o, text, len, path, err) != 0) return -1;
    int64_t format = 0, skipped = 0;
    uint64_t step, opt_step, samples;
    double time_s = 0;
    char hash[32] = "";
    int rc = json_get_int(&format, o, "format", true, 1, INT32_MAX, path, err);
    if (rc == 0 && format != CKPT_FORMAT)
        rc = ct_fail(err, "%s: checkpoint format %" PRId64 ", this ctitan reads format %d", path,
                     format, CKPT_FORMAT);
    if (rc == 0) rc = get_uint(&step, o, "step", path, err);
    if (rc == 0) rc = get_uint(&opt_step, o, "optimizer_step", path, err);
    if (rc == 0) rc = get_uint(&samples, o, "samples_seen", path, err);
    if (rc == 0) rc = json_get_int(&skipped, o, "skipped_in_row", true, 0, INT32_MAX, path, err);
    if (rc == 0) rc = json_get_double(&time_s, o, "time_s", true, path, err);
    if (rc == 0) rc = json_get_string(hash, sizeof hash, o, "config_hash", true, path, err);
    if (rc == 0 && !parse_hex64(&v->st.config_hash, hash))
        rc = ct_fail(err, "%s: \"config_hash\" must be 16 lowercase hex digits", path);
    if (rc == 0)
        rc = parse_files(v->files, cJSON_GetObjectItemCaseSensitive(o, "files"), path, err);
    cJSON_Delete(o);
    if (rc != 0) return -1;
    v->st.step = (int64_t)step;
    v->st.opt_step = (int64_t)opt_step;
    v->st.samples_seen = samples;
    v->st.skipped_in_row = (int32_t)skipped;
    v->st.time_s = time_s;
    return 0;
}

// The folder's own step-<N> name, if it has one (an exported copy may be renamed).
static bool folder_step(const char *dir, int64_t *step) {
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && dir[b - 1] != '/') b--;
    char base[256];
    if (n - b >= sizeof base) return false;
    memcpy(base, dir + b, n - b);
    base[n - b] = '\0';
    return ckpt_parse_step_name(base, step);
}

// Checks one listed file's size and checksum; safetensors files are opened (and validated) and
// hashed through their mapping, which stays open for the copy.
static int check_file(ckpt_view *v, int k, ct_error *err) {
    char path[4096];
    const file_sum *f = &v->files[k];
    if (join(path, sizeof path, v->dir, f->name, err) != 0) return -1;
    struct stat sb;
    if (stat(path, &sb) != 0)
        return corrupt(err, "%s: missing (state.json lists it): %s", path, strerror(errno));
    if ((uint64_t)sb.st_size != f->bytes)
        return corrupt(err, "%s: %lld bytes, state.json lists %" PRIu64 " (truncated or replaced)",
                       path, (long long)sb.st_size, f->bytes);
    uint64_t h, size;
    st_file *sf = k == F_MODEL ? &v->model : k == F_OPTIM ? &v->optim : NULL;
    if (sf) {
        if (st_open(sf, path, err) != 0) return CK_CORRUPT;
        h = ckpt_xxh64(sf->map, sf->map_size, 0);
    } else if (ckpt_hash_file(&h, &size, path, err) != 0) {
        return CK_CORRUPT;
    }
    if (h != f->xxh64)
        return corrupt(
            err, "%s: XXH64 %016" PRIx64 ", state.json lists %016" PRIx64 " (the file is corrupt)",
            path, h, f->xxh64);
    return 0;
}

static void view_close(ckpt_view *v) {
    st_close(&v->model);
    st_close(&v->optim);
}

// Integrity of the folder: 0, CK_CORRUPT, or -1. On 0 the safetensors files are open.
static int view_open(ckpt_view *v, const char *dir, ct_error *err) {
    memset(v, 0, sizeof *v);
    v->dir = dir;
    char path[4096];
    if (join(path, sizeof path, dir, STATE_NAME, err) != 0) return -1;
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return corrupt(err, "%s: not a checkpoint folder", dir);
    if (stat(path, &sb) != 0)
        return corrupt(err, "%s: no %s (an incomplete checkpoint)", dir, STATE_NAME);
    char *text = NULL;
    size_t len = 0;
    if (file_read_all(&text, &len, path, STATE_MAX_BYTES, err) != 0) return CK_CORRUPT;
    int rc = parse_state(v, text, len, path, err);
    free(text);
    if (rc != 0) return CK_CORRUPT;
    int64_t named;
    if (folder_step(dir, &named) && named != v->st.step)
        return corrupt(err, "%s: state.json says step %" PRId64 ", the folder name %" PRId64, dir,
                       v->st.step, named);
    for (int k = 0; k < N_FILES; k++) {
        rc = check_file(v, k, err);
        if (rc != 0) {
            view_close(v);
            return rc;
        }
    }
    return 0;
}

// The tensors of f are exactly the model's parameters under each prefix (prefix + HF name),
// F32, same shapes. A difference is not corruption: the checkpoint belongs to another
// architecture.
static int match_tensors(const st_file *f, const qwen3_model *m, const char *const *prefixes,
                         int n_prefixes, ct_error *err) {
    char name[192];
    for (int k = 0; k < n_prefixes; k++) {
        for (int i = 0; i < m->n_params; i++) {
            const qwen3_param *p = &m->params[i];
            snprintf(name, sizeof name, "%s%s", prefixes[k], p->name);
            const st_tensor *t = st_file_find(f, name);
            if (!t)
                return ct_fail(err,
                               "%s: no tensor \"%s\", which the model has (a checkpoint of "
                               "another architecture?)",
                               f->path, name);
            bool same = t->ndim == p->ndim && t->dtype == CT_F32;
            for (int d = 0; same && d < p->ndim; d++) same = t->shape[d] == p->shape[d];
            if (!same) {
                char want[64], got[160];
                return ct_fail(err, "%s: tensor \"%s\": expected F32 %s (the model's), found %s %s",
                               f->path, name, st_shape_str(want, sizeof want, p->shape, p->ndim),
                               dtype_name(t->dtype),
                               st_shape_str(got, sizeof got, t->shape, t->ndim));
            }
        }
    }
    // All were found and names are unique, so equal counts mean there is nothing else.
    if (f->n_tensors == n_prefixes * m->n_params) return 0;
    for (int i = 0; i < f->n_tensors; i++) {
        const char *tn = f->tensors[i].name;
        bool known = false;
        for (int k = 0; k < n_prefixes && !known; k++) {
            size_t pl = strlen(prefixes[k]);
            known = strncmp(tn, prefixes[k], pl) == 0 && qwen3_find_param(m, tn + pl);
        }
        if (!known)
            return ct_fail(err,
                           "%s: tensor \"%s\" is not a parameter of the model (a checkpoint of "
                           "another architecture?)",
                           f->path, tn);
    }
    return 0;
}

static int view_match(const ckpt_view *v, const qwen3_model *m, bool moments, ct_error *err) {
    static const char *const no_prefix[1] = {""};
    if (match_tensors(&v->model, m, no_prefix, 1, err) != 0) return -1;
    return moments ? match_tensors(&v->optim, m, moment_prefix, 2, err) : 0;
}

int ckpt_verify(const char *dir, const qwen3_model *m, train_state *st, ct_error *err) {
    ckpt_view v;
    if (view_open(&v, dir, err) != 0) return -1;
    int rc = m ? view_match(&v, m, true, err) : 0;
    if (rc == 0 && st) *st = v.st;
    view_close(&v);
    return rc;
}

// ---------------------------------------------------------------- load

static void copy_tensors(float *dst, const st_file *f, const qwen3_model *m, const char *prefix) {
    char name[192];
    for (int i = 0; i < m->n_params; i++) {
        const qwen3_param *p = &m->params[i];
        snprintf(name, sizeof name, "%s%s", prefix, p->name);
        const st_tensor *t = st_file_find(f, name); // present, F32, right shape: checked
        memcpy(dst + p->offset, t->data, p->numel * sizeof(float));
    }
}

// ckpt_load, returning CK_CORRUPT when the folder (not the caller) is at fault.
static int load_checked(const char *dir, qwen3_model *m, float *exp_avg, float *exp_avg_sq,
                        size_t n, train_state *st, char **config_toml, ct_error *err) {
    if (!exp_avg != !exp_avg_sq)
        return ct_fail(err, "%s: load both optimizer moments or neither", dir);
    if (exp_avg && n != m->num_params)
        return ct_fail(err, "%s: optimizer state has %zu floats per moment, the model %zu", dir, n,
                       m->num_params);
    ckpt_view v;
    int rc = view_open(&v, dir, err);
    if (rc != 0) return rc;
    rc = view_match(&v, m, exp_avg != NULL, err);
    char *toml = NULL;
    if (rc == 0 && config_toml) {
        char path[4096];
        size_t len;
        rc = join(path, sizeof path, dir, file_names[F_CONFIG_TOML], err);
        if (rc == 0) rc = file_read_all(&toml, &len, path, STATE_MAX_BYTES, err);
    }
    if (rc == 0) {
        copy_tensors(m->param_mem, &v.model, m, "");
        if (exp_avg) {
            copy_tensors(exp_avg, &v.optim, m, moment_prefix[0]);
            copy_tensors(exp_avg_sq, &v.optim, m, moment_prefix[1]);
        }
        if (st) *st = v.st;
        if (config_toml) *config_toml = toml;
    }
    view_close(&v);
    return rc;
}

int ckpt_load(const char *dir, qwen3_model *m, float *exp_avg, float *exp_avg_sq, size_t n,
              train_state *st, char **config_toml, ct_error *err) {
    return load_checked(dir, m, exp_avg, exp_avg_sq, n, st, config_toml, err) == 0 ? 0 : -1;
}

// ---------------------------------------------------------------- find, resume

// Walks root's checkpoints newest first. try(dir) returns 0 (done: this one), CK_CORRUPT (note
// it and go on) or -1. Returns 1, 0 (none) or -1.
typedef int (*try_fn)(const char *dir, void *ctx, ct_error *err);

static int walk_newest(char *dir_out, size_t cap, const char *root, try_fn try, void *ctx,
                       ckpt_notes *notes, ct_error *err) {
    int64_t *steps;
    int n;
    if (ckpt_list_steps(&steps, &n, root, err) != 0) return -1;
    int found = 0;
    for (int i = 0; i < n && found == 0; i++) {
        char dir[4096];
        if (ckpt_step_path(dir, sizeof dir, root, steps[i], err) != 0) {
            found = -1;
            break;
        }
        ct_error why = {{0}};
        int rc = try(dir, ctx, &why);
        if (rc == 0) {
            if (dir_out && snprintf(dir_out, cap, "%s", dir) >= (int)cap)
                found = ct_fail(err, "%s: path too long", dir);
            else
                found = 1;
        } else if (rc == CK_CORRUPT) {
            ckpt_note(notes, "skipping checkpoint %s: %s", dir, why.msg);
        } else {
            *err = why;
            found = -1;
        }
    }
    free(steps);
    return found;
}

typedef struct find_ctx {
    const qwen3_model *m;
    train_state *st;
} find_ctx;

static int try_verify(const char *dir, void *ctx, ct_error *err) {
    find_ctx *c = ctx;
    ckpt_view v;
    int rc = view_open(&v, dir, err);
    if (rc != 0) return rc;
    if (c->m) rc = view_match(&v, c->m, true, err);
    if (rc == 0 && c->st) *c->st = v.st;
    view_close(&v);
    return rc;
}

int ckpt_find_latest(char *dir_out, size_t cap, train_state *st, const char *root,
                     const qwen3_model *m, ckpt_notes *notes, ct_error *err) {
    find_ctx c = {m, st};
    return walk_newest(dir_out, cap, root, try_verify, &c, notes, err);
}

typedef struct resume_ctx {
    qwen3_model *m;
    float *exp_avg, *exp_avg_sq;
    size_t n;
    train_state *st;
    char **config_toml;
} resume_ctx;

static int try_load(const char *dir, void *ctx, ct_error *err) {
    resume_ctx *c = ctx;
    return load_checked(dir, c->m, c->exp_avg, c->exp_avg_sq, c->n, c->st, c->config_toml, err);
}

int ckpt_resume(char *dir_out, size_t cap, qwen3_model *m, float *exp_avg, float *exp_avg_sq,
                size_t n, train_state *st, char **config_toml, const char *root, ckpt_notes *notes,
                ct_error *err) {
    resume_ctx c = {m, exp_avg, exp_avg_sq, n, st, config_toml};
    return walk_newest(dir_out, cap, root, try_load, &c, notes, err);
}

// ---------------------------------------------------------------- prune, clean

int ckpt_prune(const char *root, int keep_latest_k, int64_t newest_step, ckpt_notes *notes,
               ct_error *err) {
    if (keep_latest_k <= 0) return 0;
    int64_t *steps;
    int n;
    if (ckpt_list_steps(&steps, &n, root, err) != 0) return -1;
    int kept = 1, rc = 0; // step-<newest_step> itself
    for (int i = 0; i < n && rc == 0; i++) {
        if (steps[i] >= newest_step) continue;
        if (kept < keep_latest_k) {
            kept++;
            continue;
        }
        char dir[4096], doomed[4200];
        rc = ckpt_step_path(dir, sizeof dir, root, steps[i], err);
        if (rc != 0) break;
        snprintf(doomed, sizeof doomed, "%s.tmp-%ld.del", dir, (long)getpid());
        if (rename(dir, doomed) != 0) {
            rc = ct_fail(err, "%s: cannot remove old checkpoint: %s", dir, strerror(errno));
            break;
        }
        rc = ckpt_rmtree(doomed, err);
        if (rc == 0)
            ckpt_note(notes, "removed old checkpoint %s (keep_latest_k = %d)", dir, keep_latest_k);
    }
    free(steps);
    return rc;
}

static bool process_alive(long pid) {
    if (pid <= 0 || pid == (long)getpid()) return false; // ours: left by an earlier process
    return kill((pid_t)pid, 0) == 0 || errno == EPERM;
}

int ckpt_clean_stale(const char *root, ckpt_notes *notes, ct_error *err) {
    DIR *d = opendir(root);
    if (!d) {
        if (errno == ENOENT) return 0;
        return ct_fail(err, "%s: cannot list folder: %s", root, strerror(errno));
    }
    // Names first, deletes after: removing entries while readdir walks is unspecified.
    char **names = NULL;
    int n = 0, rc = 0;
    for (struct dirent *de; rc == 0 && (de = readdir(d));) {
        long pid;
        if (!ckpt_parse_tmp_name(de->d_name, &pid)) continue;
        char **grown = realloc(names, (size_t)(n + 1) * sizeof *grown);
        char *copy = strdup(de->d_name);
        if (grown) names = grown;
        if (!grown || !copy) {
            free(copy);
            rc = ct_fail(err, "%s: out of memory", root);
            break;
        }
        names[n++] = copy;
    }
    closedir(d);
    for (int i = 0; i < n && rc == 0; i++) {
        long pid = 0;
        char path[8192];
        ckpt_parse_tmp_name(names[i], &pid);
        snprintf(path, sizeof path, "%s/%s", root, names[i]);
        if (process_alive(pid)) {
            ckpt_note(notes, "leaving %s: process %ld that writes it is running", path, pid);
            continue;
        }
        rc = ckpt_rmtree(path, err);
        if (rc == 0) ckpt_note(notes, "removed %s, left by an interrupted save", path);
    }
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
    return rc;
}
