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
#include "io/atomic.h"
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

#define SHARD_FORMAT "ctitan-optimizer-shard"

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

// The first non-finite element of a shard's moments, as an error naming its flat index.
static int check_finite_flat(const float *x, size_t n, size_t offset, const char *what,
                             const char *path, ct_error *err) {
    size_t first = SIZE_MAX;
#pragma omp parallel for reduction(min : first) schedule(static)
    for (size_t k = 0; k < n; k++)
        if (!isfinite(x[k]) && k < first) first = k;
    if (first != SIZE_MAX)
        return ct_fail(err,
                       "%s: refusing to save a checkpoint: optimizer %s holds %g at flat element "
                       "%zu (the previous checkpoint is kept)",
                       path, what, (double)x[first], offset + first);
    return 0;
}

int ckpt_tmp_path(char *out, size_t cap, const char *root, int64_t step, long tag, ct_error *err) {
    int n = snprintf(out, cap, "%s/step-%" PRId64 ".tmp-%ld", root, step, tag);
    if (n < 0 || (size_t)n >= cap) return ct_fail(err, "%s: checkpoint path too long", root);
    return 0;
}

// The header of a shard: two 1-D F32 tensors and the range they hold, padded so the data region
// starts 8-byte aligned. Returns its length (excluding the 8-byte length field).
static size_t shard_header(char *h, size_t cap, size_t offset, size_t numel, size_t total) {
    unsigned long long b = (unsigned long long)numel * sizeof(float);
    int n = snprintf(h, cap,
                     "{\"__metadata__\":{\"format\":\"" SHARD_FORMAT "\",\"offset\":\"%zu\","
                     "\"numel\":\"%zu\",\"total\":\"%zu\"},"
                     "\"exp_avg\":{\"dtype\":\"F32\",\"shape\":[%zu],\"data_offsets\":[0,%llu]},"
                     "\"exp_avg_sq\":{\"dtype\":\"F32\",\"shape\":[%zu],"
                     "\"data_offsets\":[%llu,%llu]}}",
                     offset, numel, total, numel, b, numel, b, 2 * b);
    size_t len = (size_t)n;
    while ((8 + len) % 8 != 0) h[len++] = ' ';
    return len;
}

int ckpt_write_optimizer_shard(const char *tmp, int shard, int n_shards, size_t offset,
                               size_t numel, size_t total, const float *exp_avg,
                               const float *exp_avg_sq, ckpt_shard_info *info, ct_error *err) {
    char name[64], path[4096];
    if (n_shards < 1 || n_shards > CKPT_MAX_SHARDS || shard < 0 || shard >= n_shards)
        return ct_fail(err, "%s: optimizer shard %d of %d: expected 0 <= shard < n_shards <= %d",
                       tmp, shard, n_shards, CKPT_MAX_SHARDS);
    ckpt_shard_name(name, shard, n_shards);
    if (join(path, sizeof path, tmp, name, err) != 0) return -1;
    if ((double)total >= CKPT_JSON_MAX_UINT / 8 || offset > total || numel > total - offset)
        return ct_fail(err, "%s: range [%zu, %zu + %zu) does not fit in %zu parameters", path,
                       offset, offset, numel, total);
    if (numel > 0 && (!exp_avg || !exp_avg_sq))
        return ct_fail(err, "%s: %zu elements to write but no moment buffers", path, numel);
    if (numel > 0 && (check_finite_flat(exp_avg, numel, offset, "exp_avg", path, err) != 0 ||
                      check_finite_flat(exp_avg_sq, numel, offset, "exp_avg_sq", path, err) != 0))
        return -1;

    char h[512];
    size_t hlen = shard_header(h, sizeof h - 8, offset, numel, total);
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
    atomic_file af; // temp file, fsync, rename: the shard is durable once this returns
    if (atomic_open(&af, path, err) != 0) return -1;
    // F32 goes out as is: the host is little-endian (as safetensors_write.c assumes).
    int rc = atomic_write(&af, len8, 8, err);
    if (rc == 0) rc = atomic_write(&af, h, hlen, err);
    if (rc == 0 && numel > 0) rc = atomic_write(&af, exp_avg, numel * sizeof(float), err);
    if (rc == 0 && numel > 0) rc = atomic_write(&af, exp_avg_sq, numel * sizeof(float), err);
    if (rc != 0) {
        atomic_abort(&af);
        return -1;
    }
    if (atomic_commit(&af, err) != 0) return -1;
    memset(info, 0, sizeof *info);
    snprintf(info->file, sizeof info->file, "%s", name);
    info->offset = offset;
    info->numel = numel;
    return ckpt_hash_file(&info->xxh64, &info->bytes, path, err);
}

// state.json: the train_state, each other file's size and XXH64 (the shards' as their writers
// reported them: rank 0 does not read the other ranks' shards again), and the shard list.
static int write_state(const char *dir, const train_state *st, const ckpt_shard_info *shards,
                       int n_shards, ct_error *err) {
    ckpt_file_sum files[CKPT_N_FILES];
    char path[4096];
    for (int i = 0; i < CKPT_N_FILES; i++)
        if (join(path, sizeof path, dir, ckpt_file_names[i], err) != 0 ||
            ckpt_hash_file(&files[i].xxh64, &files[i].bytes, path, err) != 0)
            return -1;
    char *text;
    size_t len;
    if (ckpt_state_text(&text, &len, st, files, shards, n_shards, dir, err) != 0) return -1;
    int rc = join(path, sizeof path, dir, STATE_NAME, err);
    if (rc == 0) rc = ckpt_write_text(path, text, len, err);
    cJSON_free(text);
    return rc;
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

int ckpt_begin(const char *root, int64_t step, long tag, ct_error *err) {
    char tmp[4200], aside[4300];
    if (step < 0) return ct_fail(err, "%s: cannot save step %" PRId64, root, step);
    if (ckpt_tmp_path(tmp, sizeof tmp, root, step, tag, err) != 0) return -1;
    snprintf(aside, sizeof aside, "%s.old", tmp);
    struct stat sb;
    bool root_new = stat(root, &sb) != 0;
    if (fs_mkdirs(root, err) != 0) return -1;
    if (root_new && fsync_parent(root, err) != 0) return -1;
    // Our own leftovers from a failed save (or an earlier process with our pid).
    if (ckpt_rmtree(tmp, err) != 0 || ckpt_rmtree(aside, err) != 0) return -1;
    if (mkdir(tmp, 0777) != 0)
        return ct_fail(err, "%s: cannot create folder: %s", tmp, strerror(errno));
    return 0;
}

void ckpt_abandon(const char *root, int64_t step, long tag) {
    char tmp[4200];
    if (ckpt_tmp_path(tmp, sizeof tmp, root, step, tag, NULL) == 0) ckpt_rmtree(tmp, NULL);
}

// What ckpt_commit checks before writing: the shards tile [0, num_params) in order under their
// own names, each is in `tmp` with the size its writer reported, and the parameters are finite.
static int check_commit(const char *tmp, const qwen3_model *m, const ckpt_shard_info *shards,
                        int n_shards, bool check_params, ct_error *err) {
    if (n_shards < 1 || n_shards > CKPT_MAX_SHARDS || !shards)
        return ct_fail(err, "%s: %d optimizer shards, expected 1 to %d", tmp, n_shards,
                       CKPT_MAX_SHARDS);
    uint64_t end = 0;
    for (int i = 0; i < n_shards; i++) {
        const ckpt_shard_info *s = &shards[i];
        char want[64], path[4300];
        ckpt_shard_name(want, i, n_shards);
        if (strncmp(s->file, want, sizeof s->file) != 0)
            return ct_fail(err, "%s: optimizer shard %d of %d is \"%.64s\", expected \"%s\"", tmp,
                           i, n_shards, s->file, want);
        if (join(path, sizeof path, tmp, want, err) != 0) return -1;
        if (s->offset != end)
            return ct_fail(err,
                           "%s: starts at flat element %" PRIu64 ", expected %" PRIu64
                           " where the previous shard ends (the shards %s)",
                           path, s->offset, end, s->offset < end ? "overlap" : "leave a gap");
        if (s->numel > m->num_params - end)
            return ct_fail(err,
                           "%s: range [%" PRIu64 ", %" PRIu64 " + %" PRIu64
                           ") runs past the model's %zu parameters",
                           path, s->offset, s->offset, s->numel, m->num_params);
        end += s->numel;
        struct stat sb;
        if (stat(path, &sb) != 0)
            return ct_fail(err, "%s: missing (its writer reported it): %s", path, strerror(errno));
        if ((uint64_t)sb.st_size != s->bytes)
            return ct_fail(err, "%s: %lld bytes, its writer reported %" PRIu64, path,
                           (long long)sb.st_size, s->bytes);
    }
    if (end != m->num_params)
        return ct_fail(err,
                       "%s: the optimizer shards cover [0, %" PRIu64 "), the model has %zu "
                       "parameters",
                       tmp, end, m->num_params);
    return check_params ? check_finite(m, m->param_mem, "parameter", err) : 0;
}

static int commit(const char *root, long tag, const qwen3_model *m, const ckpt_shard_info *shards,
                  int n_shards, const train_state *st, const char *config_toml, bool check_params,
                  ct_error *err) {
    char final[4096], tmp[4200], aside[4300], path[4400];
    if (st->step < 0 || st->opt_step < 0)
        return ct_fail(err, "%s: cannot save step %" PRId64 " (optimizer step %" PRId64 ")", root,
                       st->step, st->opt_step);
    if (ckpt_step_path(final, sizeof final, root, st->step, err) != 0 ||
        ckpt_tmp_path(tmp, sizeof tmp, root, st->step, tag, err) != 0)
        return -1;
    snprintf(aside, sizeof aside, "%s.old", tmp);
    int rc = config_toml ? 0 : ct_fail(err, "%s: no config text to save", tmp);
    if (rc == 0) rc = check_commit(tmp, m, shards, n_shards, check_params, err);
    // config.json + model, with the buffers (the MoE expert bias), which an HF export leaves out
    if (rc == 0) rc = hf_save_folder_with_buffers(m, tmp, CT_F32, 0, err);
    if (rc == 0) rc = join(path, sizeof path, tmp, ckpt_file_names[CKPT_F_CONFIG_TOML], err);
    if (rc == 0) rc = ckpt_write_text(path, config_toml, strlen(config_toml), err);
    if (rc == 0) rc = write_state(tmp, st, shards, n_shards, err);
    if (rc == 0) rc = ckpt_fsync_folder(tmp, err);
    if (rc != 0) {
        ct_wrap(err, "saving checkpoint %s", final);
        ckpt_rmtree(tmp, NULL);
        return -1;
    }
    // A folder of the same step (a run resumed from an older one) is moved aside, not merged
    // into: until the rename below, the older checkpoints are the newest complete ones.
    struct stat sb;
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

int ckpt_commit(const char *root, long tag, const qwen3_model *m, const ckpt_shard_info *shards,
                int n_shards, const train_state *st, const char *config_toml, ct_error *err) {
    return commit(root, tag, m, shards, n_shards, st, config_toml, true, err);
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
    // Checked here, per tensor, so that the error names the tensor and nothing is written.
    if (check_finite(m, m->param_mem, "parameter", err) != 0 ||
        check_finite(m, exp_avg, "optimizer exp_avg of", err) != 0 ||
        check_finite(m, exp_avg_sq, "optimizer exp_avg_sq of", err) != 0)
        return -1;
    long tag = (long)getpid();
    char tmp[4200];
    ckpt_shard_info info;
    if (ckpt_tmp_path(tmp, sizeof tmp, root, st->step, tag, err) != 0 ||
        ckpt_begin(root, st->step, tag, err) != 0)
        return -1;
    if (ckpt_write_optimizer_shard(tmp, 0, 1, 0, n, n, exp_avg, exp_avg_sq, &info, err) != 0) {
        ckpt_abandon(root, st->step, tag);
        return ct_wrap(err, "saving checkpoint step %" PRId64 " in %s", st->step, root);
    }
    return commit(root, tag, m, &info, 1, st, config_toml, false, err);
}

// ---------------------------------------------------------------- verify

typedef struct ckpt_view {
    const char *dir;
    ckpt_state s;   // state.json
    st_file model;  // open (mmap'd) after view_open
    st_file *optim; // [s.n_shards]; one with a path is open and checked
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

// Checks a listed file's size and checksum. A safetensors file (sf non-NULL) is opened (and
// validated) and hashed through its mapping, which stays open for the copy.
static int check_sum(const char *dir, const char *name, uint64_t bytes, uint64_t xxh64, st_file *sf,
                     ct_error *err) {
    char path[4096];
    if (join(path, sizeof path, dir, name, err) != 0) return -1;
    struct stat sb;
    if (stat(path, &sb) != 0)
        return corrupt(err, "%s: missing (state.json lists it): %s", path, strerror(errno));
    if ((uint64_t)sb.st_size != bytes)
        return corrupt(err, "%s: %lld bytes, state.json lists %" PRIu64 " (truncated or replaced)",
                       path, (long long)sb.st_size, bytes);
    uint64_t h, size;
    if (sf) {
        if (st_open(sf, path, err) != 0) return CK_CORRUPT;
        h = ct_xxh64(sf->map, sf->map_size, 0);
    } else if (ckpt_hash_file(&h, &size, path, err) != 0) {
        return CK_CORRUPT;
    }
    if (h != xxh64) {
        if (sf) st_close(sf);
        return corrupt(
            err, "%s: XXH64 %016" PRIx64 ", state.json lists %016" PRIx64 " (the file is corrupt)",
            path, h, xxh64);
    }
    return 0;
}

// A decimal string of the shard's __metadata__ equal to state.json's value.
static int check_meta_uint(const cJSON *meta, const char *key, uint64_t want, const char *path,
                           ct_error *err) {
    const char *s = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(meta, key));
    uint64_t v = 0;
    bool ok = s && *s && strlen(s) <= 19;
    for (const char *p = s; ok && *p; p++) {
        ok = *p >= '0' && *p <= '9';
        v = v * 10 + (uint64_t)(*p - '0');
    }
    if (!ok)
        return corrupt(err, "%s: __metadata__ \"%s\": expected a decimal string, found %s", path,
                       key, s ? s : "nothing");
    if (v != want)
        return corrupt(err,
                       "%s: __metadata__ %s %" PRIu64 ", state.json lists %" PRIu64
                       " (the shard is not the one state.json describes)",
                       path, key, v, want);
    return 0;
}

// The shard's metadata and tensors agree with state.json: its format, range and total, and
// exactly "exp_avg" and "exp_avg_sq", F32 of shape [numel].
static int check_shard_content(const st_file *f, const ckpt_shard_info *s, uint64_t total,
                               ct_error *err) {
    cJSON *h = cJSON_ParseWithLength((const char *)f->map + 8, (size_t)f->header_len);
    if (!h) return ct_fail(err, "%s: out of memory parsing the header", f->path);
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(h, "__metadata__");
    const char *format = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(meta, "format"));
    int rc = 0;
    if (!format || strcmp(format, SHARD_FORMAT) != 0)
        rc = corrupt(err, "%s: __metadata__ format \"%s\", expected \"" SHARD_FORMAT "\"", f->path,
                     format ? format : "(none)");
    if (rc == 0) rc = check_meta_uint(meta, "offset", s->offset, f->path, err);
    if (rc == 0) rc = check_meta_uint(meta, "numel", s->numel, f->path, err);
    if (rc == 0) rc = check_meta_uint(meta, "total", total, f->path, err);
    cJSON_Delete(h);
    if (rc != 0) return rc;
    static const char *const names[2] = {"exp_avg", "exp_avg_sq"}; // sorted, as f->tensors
    for (int k = 0; k < 2; k++) {
        const st_tensor *t = k < f->n_tensors ? &f->tensors[k] : NULL;
        if (f->n_tensors != 2 || strcmp(t->name, names[k]) != 0)
            return corrupt(err, "%s: expected exactly the tensors \"exp_avg\" and \"exp_avg_sq\"",
                           f->path);
        if (t->dtype != CT_F32 || t->ndim != 1 || (uint64_t)t->shape[0] != s->numel) {
            char got[160];
            return corrupt(err, "%s: tensor \"%s\": expected F32 [%" PRIu64 "], found %s %s",
                           f->path, t->name, s->numel, dtype_name(t->dtype),
                           st_shape_str(got, sizeof got, t->shape, t->ndim));
        }
    }
    return 0;
}

static int check_shard(ckpt_view *v, int i, ct_error *err) {
    st_file *f = &v->optim[i];
    if (f->path) return 0; // checked already
    const ckpt_shard_info *s = &v->s.shards[i];
    int rc = check_sum(v->dir, s->file, s->bytes, s->xxh64, f, err);
    if (rc == 0) rc = check_shard_content(f, s, v->s.total, err);
    if (rc != 0) st_close(f);
    return rc;
}

static bool overlaps(const ckpt_shard_info *s, size_t offset, size_t numel) {
    return s->numel > 0 && numel > 0 && s->offset < offset + numel && offset < s->offset + s->numel;
}

// The shards that overlap [offset, offset + numel), or all of them.
static int check_shards(ckpt_view *v, bool all, size_t offset, size_t numel, ct_error *err) {
    for (int i = 0; i < v->s.n_shards; i++) {
        if (!all && !overlaps(&v->s.shards[i], offset, numel)) continue;
        int rc = check_shard(v, i, err);
        if (rc != 0) return rc;
    }
    return 0;
}

static void view_close(ckpt_view *v) {
    st_close(&v->model);
    for (int i = 0; v->optim && i < v->s.n_shards; i++) st_close(&v->optim[i]);
    free(v->optim);
    v->optim = NULL;
    ckpt_state_free(&v->s);
}

// Integrity of state.json and the files other than the shards: 0, CK_CORRUPT, or -1. On 0
// model.safetensors is open; on error the view is closed.
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
    int rc = ckpt_state_parse(&v->s, text, len, path, err) == 0 ? 0
             : v->s.other_format                                ? -1
                                                                : CK_CORRUPT;
    free(text);
    if (rc == 0 && !(v->optim = calloc((size_t)v->s.n_shards, sizeof *v->optim)))
        rc = ct_fail(err, "%s: out of memory", path);
    int64_t named;
    if (rc == 0 && folder_step(dir, &named) && named != v->s.st.step)
        rc = corrupt(err, "%s: state.json says step %" PRId64 ", the folder name %" PRId64, dir,
                     v->s.st.step, named);
    for (int k = 0; k < CKPT_N_FILES && rc == 0; k++) {
        const ckpt_file_sum *f = &v->s.files[k];
        rc = check_sum(dir, f->name, f->bytes, f->xxh64, k == CKPT_F_MODEL ? &v->model : NULL, err);
    }
    if (rc != 0) view_close(v);
    return rc;
}

// The tensors of f are exactly the model's parameters, F32, same shapes. A difference is not
// corruption: the checkpoint belongs to another architecture.
static int match_tensors(const st_file *f, const qwen3_model *m, ct_error *err) {
    for (int i = 0; i < m->n_params; i++) {
        const qwen3_param *p = &m->params[i];
        const st_tensor *t = st_file_find(f, p->name);
        if (!t)
            return ct_fail(err,
                           "%s: no tensor \"%s\", which the model has (a checkpoint of "
                           "another architecture?)",
                           f->path, p->name);
        bool same = t->ndim == p->ndim && t->dtype == CT_F32;
        for (int d = 0; same && d < p->ndim; d++) same = t->shape[d] == p->shape[d];
        if (!same) {
            char want[64], got[160];
            return ct_fail(err, "%s: tensor \"%s\": expected F32 %s (the model's), found %s %s",
                           f->path, p->name, st_shape_str(want, sizeof want, p->shape, p->ndim),
                           dtype_name(t->dtype), st_shape_str(got, sizeof got, t->shape, t->ndim));
        }
    }
    // All were found and names are unique, so equal counts mean there is nothing else.
    if (f->n_tensors == m->n_params) return 0;
    for (int i = 0; i < f->n_tensors; i++) {
        if (!qwen3_find_param(m, f->tensors[i].name))
            return ct_fail(err,
                           "%s: tensor \"%s\" is not a parameter of the model (a checkpoint of "
                           "another architecture?)",
                           f->path, f->tensors[i].name);
    }
    return 0;
}

// The model matches m (else -1: another architecture); with `moments`, the shards cover its
// parameters (else corrupt: the model matched, so state.json's shard list is wrong).
static int view_match(const ckpt_view *v, const qwen3_model *m, bool moments, ct_error *err) {
    if (match_tensors(&v->model, m, err) != 0) return -1;
    if (moments && v->s.format == CKPT_FORMAT_UNFUSED && m->cfg.attention_bias)
        return ct_fail(err,
                       "%s/%s: checkpoint format %d keeps the optimizer state of a model with "
                       "attention biases in the order before the fused q|k|v projection (this "
                       "ctitan reads format %d); resume it with the ctitan that wrote it, or "
                       "train into a new job.dump_folder",
                       v->dir, STATE_NAME, CKPT_FORMAT_UNFUSED, CKPT_FORMAT);
    if (moments && v->s.total != m->num_params)
        return corrupt(err,
                       "%s/%s: optimizer_shards cover %" PRIu64 " elements, the model has %zu "
                       "parameters",
                       v->dir, STATE_NAME, v->s.total, m->num_params);
    return 0;
}

// ckpt_verify and ckpt_find_latest: every file, every shard.
static int verify_checked(const char *dir, const qwen3_model *m, train_state *st, ct_error *err) {
    ckpt_view v;
    int rc = view_open(&v, dir, err);
    if (rc != 0) return rc;
    if (m) rc = view_match(&v, m, true, err);
    if (rc == 0) rc = check_shards(&v, true, 0, 0, err);
    if (rc == 0 && st) *st = v.s.st;
    view_close(&v);
    return rc;
}

int ckpt_verify(const char *dir, const qwen3_model *m, train_state *st, ct_error *err) {
    return verify_checked(dir, m, st, err) == 0 ? 0 : -1;
}

// ---------------------------------------------------------------- load

static void copy_model(float *dst, const st_file *f, const qwen3_model *m) {
    for (int i = 0; i < m->n_params; i++) {
        const qwen3_param *p = &m->params[i];
        const st_tensor *t = st_file_find(f, p->name); // present, F32, right shape: checked
        memcpy(dst + p->offset, t->data, p->numel * sizeof(float));
    }
}

// dst[k] = moment (k = 0: exp_avg, 1: exp_avg_sq) at flat element offset + k, from the shards
// (all overlapping ones open and checked).
static void copy_moments(float *exp_avg, float *exp_avg_sq, const ckpt_view *v, size_t offset,
                         size_t numel) {
    for (int i = 0; i < v->s.n_shards; i++) {
        const ckpt_shard_info *s = &v->s.shards[i];
        if (!overlaps(s, offset, numel)) continue;
        size_t lo = s->offset > offset ? s->offset : offset;
        size_t hi = s->offset + s->numel < offset + numel ? s->offset + s->numel : offset + numel;
        const st_file *f = &v->optim[i];
        float *dst[2] = {exp_avg, exp_avg_sq};
        for (int k = 0; k < 2; k++) // tensors sorted: exp_avg, exp_avg_sq
            memcpy(dst[k] + (lo - offset), (const float *)f->tensors[k].data + (lo - s->offset),
                   (hi - lo) * sizeof(float));
    }
}

// ckpt_load, returning CK_CORRUPT when the folder (not the caller) is at fault. all_shards:
// verify every shard, not only those the range needs.
static int load_checked(const char *dir, qwen3_model *m, float *exp_avg, float *exp_avg_sq,
                        size_t offset, size_t numel, bool all_shards, train_state *st,
                        char **config_toml, ct_error *err) {
    if (!exp_avg != !exp_avg_sq)
        return ct_fail(err, "%s: load both optimizer moments or neither", dir);
    if (!exp_avg && numel != 0)
        return ct_fail(err, "%s: %zu optimizer elements asked for but no moment buffers given", dir,
                       numel);
    if (offset > m->num_params || numel > m->num_params - offset)
        return ct_fail(err,
                       "%s: optimizer range [%zu, %zu + %zu) runs past the model's %zu "
                       "parameters",
                       dir, offset, offset, numel, m->num_params);
    ckpt_view v;
    int rc = view_open(&v, dir, err);
    if (rc != 0) return rc;
    rc = view_match(&v, m, exp_avg != NULL || all_shards, err);
    if (rc == 0 && (exp_avg || all_shards)) rc = check_shards(&v, all_shards, offset, numel, err);
    char *toml = NULL;
    if (rc == 0 && config_toml) {
        char path[4096];
        size_t len;
        rc = join(path, sizeof path, dir, ckpt_file_names[CKPT_F_CONFIG_TOML], err);
        if (rc == 0) rc = file_read_all(&toml, &len, path, STATE_MAX_BYTES, err);
    }
    if (rc == 0) {
        copy_model(m->param_mem, &v.model, m);
        if (exp_avg) copy_moments(exp_avg, exp_avg_sq, &v, offset, numel);
        if (st) *st = v.s.st;
        if (config_toml) *config_toml = toml;
    }
    view_close(&v);
    return rc;
}

int ckpt_load(const char *dir, qwen3_model *m, float *exp_avg, float *exp_avg_sq, size_t offset,
              size_t numel, train_state *st, char **config_toml, ct_error *err) {
    return load_checked(dir, m, exp_avg, exp_avg_sq, offset, numel, false, st, config_toml, err) ==
                   0
               ? 0
               : -1;
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
    return verify_checked(dir, c->m, c->st, err);
}

int ckpt_find_latest(char *dir_out, size_t cap, train_state *st, const char *root,
                     const qwen3_model *m, ckpt_notes *notes, ct_error *err) {
    find_ctx c = {m, st};
    return walk_newest(dir_out, cap, root, try_verify, &c, notes, err);
}

typedef struct resume_ctx {
    qwen3_model *m;
    float *exp_avg, *exp_avg_sq;
    size_t offset, numel;
    train_state *st;
    char **config_toml;
} resume_ctx;

static int try_load(const char *dir, void *ctx, ct_error *err) {
    resume_ctx *c = ctx;
    // Every shard: ranks reading different ranges must skip the same folders.
    return load_checked(dir, c->m, c->exp_avg, c->exp_avg_sq, c->offset, c->numel, true, c->st,
                        c->config_toml, err);
}

int ckpt_resume(char *dir_out, size_t cap, qwen3_model *m, float *exp_avg, float *exp_avg_sq,
                size_t offset, size_t numel, train_state *st, char **config_toml, const char *root,
                ckpt_notes *notes, ct_error *err) {
    resume_ctx c = {m, exp_avg, exp_avg_sq, offset, numel, st, config_toml};
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
