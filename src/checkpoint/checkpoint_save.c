// Checkpoint save: the shards and state.json written into a temporary folder, checked (the shards
// tile the model, nothing NaN), fsynced and renamed into place; pruning old checkpoints and
// cleaning up what interrupted saves left. Verify and load are checkpoint_verify.c and
// checkpoint_load.c.
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "core/fs.h"
#include "io/atomic.h"
#include "model/hf_adapter.h"
#include "checkpoint/checkpoint_internal.h"

#define NONFINITE_REFUSAL                                                                          \
    "refusing to save a checkpoint: %s \"%s\" holds %g at element %zu (the previous checkpoint "   \
    "is kept)"

// The first non-finite element of buf (a host buffer in param_mem's layout: optimizer moments),
// as an error naming the tensor.
static int check_finite(const qwen3_model *m, const float *buf, const char *what, ct_error *err) {
    for (int i = 0; i < m->n_params; i++) {
        const qwen3_param *p = &m->params[i];
        const float *x = buf + p->offset;
        size_t first = SIZE_MAX;
#pragma omp parallel for reduction(min : first) schedule(static)
        for (size_t k = 0; k < p->numel; k++)
            if (!isfinite(x[k]) && k < first) first = k;
        if (first != SIZE_MAX)
            return ct_fail(err, NONFINITE_REFUSAL, what, p->name, (double)x[first], first);
    }
    return 0;
}

// The model's parameters (the weights go out through the HF adapter).
static int check_params_finite(const qwen3_model *m, ct_error *err) {
    const qwen3_param *p;
    size_t at;
    float value;
    if (!qwen3_params_first_nonfinite(m, &p, &at, &value)) return 0;
    return ct_fail(err, NONFINITE_REFUSAL, "parameter", p->name, (double)value, at);
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

// A shard file's header: its 1-D F32 tensors (names sorted) of numel elements each, back to
// back, and the ranges they hold (one: "offset"; else "ranges"), padded so the data region
// starts 8-byte aligned. *len excludes the 8-byte length field. NULL when out of memory.
static char *shard_header(size_t *len, const char *format, const ckpt_range *ranges, int n_ranges,
                          uint64_t numel, uint64_t total, const char *const *names, int n_tensors) {
    char *text = n_ranges == 1 ? NULL : ckpt_ranges_text(ranges, n_ranges);
    if (n_ranges != 1 && !text) return NULL;
    size_t cap = 256 + (text ? strlen(text) : 0) + 128 * (size_t)n_tensors, n = 0;
    char *h = malloc(cap);
    if (!h) {
        free(text);
        return NULL;
    }
    unsigned long long b = (unsigned long long)numel * sizeof(float);
    n += (size_t)snprintf(h + n, cap - n, "{\"__metadata__\":{\"format\":\"%s\",", format);
    if (text)
        n += (size_t)snprintf(h + n, cap - n, "\"ranges\":\"%s\",", text);
    else
        n += (size_t)snprintf(h + n, cap - n, "\"offset\":\"%" PRIu64 "\",", ranges[0].lo);
    n += (size_t)snprintf(h + n, cap - n, "\"numel\":\"%" PRIu64 "\",\"total\":\"%" PRIu64 "\"}",
                          numel, total);
    for (int k = 0; k < n_tensors; k++)
        n += (size_t)snprintf(
            h + n, cap - n,
            ",\"%s\":{\"dtype\":\"F32\",\"shape\":[%" PRIu64 "],\"data_offsets\":[%llu,%llu]}",
            names[k], numel, (unsigned long long)k * b, (unsigned long long)(k + 1) * b);
    n += (size_t)snprintf(h + n, cap - n, "}");
    while ((8 + n) % 8 != 0) h[n++] = ' ';
    free(text);
    *len = n;
    return h;
}

// Writes one shard file at path (temp file, fsync, rename: durable once this returns): the
// buffers bufs[k] under names[k] (sorted), each numel floats over the ranges. Fills *info.
static int write_shard_file(const char *path, const char *name, const char *format,
                            const ckpt_range *ranges, int n_ranges, uint64_t numel, uint64_t total,
                            const char *const *names, const float *const *bufs, int n_tensors,
                            ckpt_shard_info *info, ct_error *err) {
    size_t hlen;
    char *h = shard_header(&hlen, format, ranges, n_ranges, numel, total, names, n_tensors);
    if (!h) return ct_fail(err, "%s: out of memory", path);
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
    atomic_file af;
    int rc = atomic_open(&af, path, err);
    if (rc != 0) {
        free(h);
        return -1;
    }
    // F32 goes out as is: the host is little-endian (as safetensors_write.c assumes).
    rc = atomic_write(&af, len8, 8, err);
    if (rc == 0) rc = atomic_write(&af, h, hlen, err);
    for (int k = 0; k < n_tensors && rc == 0 && numel > 0; k++)
        rc = atomic_write(&af, bufs[k], numel * sizeof(float), err);
    free(h);
    if (rc != 0) {
        atomic_abort(&af);
        return -1;
    }
    if (atomic_commit(&af, err) != 0) return -1;
    memset(info, 0, sizeof *info);
    snprintf(info->file, sizeof info->file, "%s", name);
    info->offset = n_ranges > 0 ? ranges[0].lo : 0;
    info->numel = numel;
    return ckpt_hash_file(&info->xxh64, &info->bytes, path, err);
}

static const char *const optim_tensors[2] = {"exp_avg", "exp_avg_sq"};

int ckpt_write_optimizer_shard(const char *tmp, int shard, int n_shards, size_t offset,
                               size_t numel, size_t total, const float *exp_avg,
                               const float *exp_avg_sq, ckpt_shard_info *info, ct_error *err) {
    char name[64], path[4096];
    if (n_shards < 1 || n_shards > CKPT_MAX_SHARDS || shard < 0 || shard >= n_shards)
        return ct_fail(err, "%s: optimizer shard %d of %d: expected 0 <= shard < n_shards <= %d",
                       tmp, shard, n_shards, CKPT_MAX_SHARDS);
    ckpt_shard_name(name, shard, n_shards);
    if (ckpt_join(path, sizeof path, tmp, name, err) != 0) return -1;
    if ((double)total >= CKPT_JSON_MAX_UINT / 8 || offset > total || numel > total - offset)
        return ct_fail(err, "%s: range [%zu, %zu + %zu) does not fit in %zu parameters", path,
                       offset, offset, numel, total);
    if (numel > 0 && (!exp_avg || !exp_avg_sq))
        return ct_fail(err, "%s: %zu elements to write but no moment buffers", path, numel);
    if (numel > 0 && (check_finite_flat(exp_avg, numel, offset, "exp_avg", path, err) != 0 ||
                      check_finite_flat(exp_avg_sq, numel, offset, "exp_avg_sq", path, err) != 0))
        return -1;
    const ckpt_range range = {offset, offset + numel};
    const float *bufs[2] = {exp_avg, exp_avg_sq};
    return write_shard_file(path, name, CKPT_SHARD_FORMAT, &range, 1, numel, total, optim_tensors,
                            bufs, 2, info, err);
}

// The first non-finite element of buf (concatenated over ranges), as an error naming the HF
// tensor and its element.
static int check_finite_ranges(const qwen3_model *m, const float *buf, const ckpt_range *ranges,
                               uint64_t numel, const char *what, const char *path, ct_error *err) {
    size_t first = SIZE_MAX;
#pragma omp parallel for reduction(min : first) schedule(static)
    for (size_t k = 0; k < numel; k++)
        if (!isfinite(buf[k]) && k < first) first = k;
    if (first == SIZE_MAX) return 0;
    size_t pos = 0;
    int r = 0;
    while (pos + (ranges[r].hi - ranges[r].lo) <= first) {
        pos += ranges[r].hi - ranges[r].lo;
        r++;
    }
    size_t flat = ranges[r].lo + (first - pos);
    const qwen3_param *p = qwen3_param_at(m, flat);
    return ct_fail(err, "%s: " NONFINITE_REFUSAL, path, what, p->name, (double)buf[first],
                   flat - p->offset);
}

int ckpt_write_shard(const char *tmp, const qwen3_model *m, int shard, int n_shards,
                     const ckpt_range *ranges, int n_ranges, const float *params,
                     const float *exp_avg, const float *exp_avg_sq, ckpt_shard_info *opt_info,
                     ckpt_shard_info *model_info, ct_error *err) {
    char name[64], mname[64], path[4096], mpath[4096];
    if (n_shards < 1 || n_shards > CKPT_MAX_SHARDS || shard < 0 || shard >= n_shards)
        return ct_fail(err, "%s: shard %d of %d: expected 0 <= shard < n_shards <= %d", tmp, shard,
                       n_shards, CKPT_MAX_SHARDS);
    ckpt_shard_name(name, shard, n_shards);
    ckpt_model_shard_name(mname, shard, n_shards);
    if (ckpt_join(path, sizeof path, tmp, name, err) != 0 ||
        ckpt_join(mpath, sizeof mpath, tmp, mname, err) != 0)
        return -1;
    if ((double)m->num_params >= CKPT_JSON_MAX_UINT / 8)
        return ct_fail(err, "%s: %zu parameters is too many", path, m->num_params);
    if (ckpt_check_ranges(ranges, n_ranges, m->num_params, path, err) != 0) return -1;
    uint64_t numel = 0;
    for (int k = 0; k < n_ranges; k++) numel += ranges[k].hi - ranges[k].lo;
    if (numel > 0 && (!exp_avg || !exp_avg_sq))
        return ct_fail(err, "%s: %" PRIu64 " elements to write but no moment buffers", path, numel);
    if (params && !model_info)
        return ct_fail(err, "%s: a model shard to write but nowhere to report it", mpath);
    // Every value checked before anything is written.
    if (numel > 0 &&
        ((params && check_finite_ranges(m, params, ranges, numel, "parameter", mpath, err) != 0) ||
         check_finite_ranges(m, exp_avg, ranges, numel, "optimizer exp_avg of", path, err) != 0 ||
         check_finite_ranges(m, exp_avg_sq, ranges, numel, "optimizer exp_avg_sq of", path, err) !=
             0))
        return -1;
    static const char *const model_tensors[1] = {"param"};
    if (params && write_shard_file(mpath, mname, CKPT_MODEL_SHARD_FORMAT, ranges, n_ranges, numel,
                                   m->num_params, model_tensors, &params, 1, model_info, err) != 0)
        return -1;
    const float *bufs[2] = {exp_avg, exp_avg_sq};
    return write_shard_file(path, name, CKPT_SHARD_FORMAT, ranges, n_ranges, numel, m->num_params,
                            optim_tensors, bufs, 2, opt_info, err);
}

// state.json: the train_state, each other file's size and XXH64 (the shards' as their writers
// reported them: rank 0 does not read the other ranks' shards again), and the shard lists.
static int write_state(const char *dir, const train_state *st, const ckpt_shard_list *optim,
                       const ckpt_shard_list *model, ct_error *err) {
    ckpt_file_sum files[CKPT_N_FILES];
    char path[4096];
    memset(files, 0, sizeof files);
    for (int i = 0; i < CKPT_N_FILES; i++)
        if (!(i == CKPT_F_MODEL && model->n > 0) &&
            (ckpt_join(path, sizeof path, dir, ckpt_file_names[i], err) != 0 ||
             ckpt_hash_file(&files[i].xxh64, &files[i].bytes, path, err) != 0))
            return -1;
    char *text;
    size_t len;
    if (ckpt_state_text(&text, &len, st, files, optim, model, dir, err) != 0) return -1;
    int rc = ckpt_join(path, sizeof path, dir, CKPT_STATE_NAME, err);
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

// Each shard of the list is in `tmp` with the size its writer reported.
static int check_present(const char *tmp, const ckpt_shard_list *list, ct_error *err) {
    for (int i = 0; i < list->n; i++) {
        const ckpt_shard_info *s = &list->info[i];
        char path[4300];
        struct stat sb;
        if (ckpt_join(path, sizeof path, tmp, s->file, err) != 0) return -1;
        if (stat(path, &sb) != 0)
            return ct_fail(err, "%s: missing (its writer reported it): %s", path, strerror(errno));
        if ((uint64_t)sb.st_size != s->bytes)
            return ct_fail(err, "%s: %lld bytes, its writer reported %" PRIu64, path,
                           (long long)sb.st_size, s->bytes);
    }
    return 0;
}

// What a commit checks before writing: the shards' names, ranges (tiling [0, num_params)
// together) and files in `tmp`, and, when model.safetensors is written from m, that its
// parameters are finite.
static int check_commit(const char *tmp, const qwen3_model *m, const ckpt_shard_list *optim,
                        const ckpt_shard_list *model, bool check_params, ct_error *err) {
    int rc = ckpt_shard_list_check(optim, false, m->num_params, tmp, err);
    if (rc == 0 && model->n > 0) rc = ckpt_shard_list_check(model, true, m->num_params, tmp, err);
    if (rc == 0) rc = check_present(tmp, optim, err);
    if (rc == 0) rc = check_present(tmp, model, err);
    if (rc == 0 && check_params && model->n == 0) rc = check_params_finite(m, err);
    return rc;
}

static int commit(const char *root, long tag, const qwen3_model *m, const ckpt_shard_list *optim,
                  const ckpt_shard_list *model, const train_state *st, const char *config_toml,
                  bool check_params, ct_error *err) {
    char final[4096], tmp[4200], aside[4300], path[4400];
    if (st->step < 0 || st->opt_step < 0)
        return ct_fail(err, "%s: cannot save step %" PRId64 " (optimizer step %" PRId64 ")", root,
                       st->step, st->opt_step);
    if (ckpt_step_path(final, sizeof final, root, st->step, err) != 0 ||
        ckpt_tmp_path(tmp, sizeof tmp, root, st->step, tag, err) != 0)
        return -1;
    snprintf(aside, sizeof aside, "%s.old", tmp);
    int rc = config_toml ? 0 : ct_fail(err, "%s: no config text to save", tmp);
    if (rc == 0) rc = check_commit(tmp, m, optim, model, check_params, err);
    // config.json + model, with the buffers (the MoE expert bias), which an HF export leaves out;
    // a model in shards has only its config.json here.
    if (rc == 0 && model->n == 0) rc = hf_save_folder_with_buffers(m, tmp, CT_F32, 0, err);
    if (rc == 0 && model->n > 0) rc = hf_save_config(&m->cfg, tmp, CT_F32, err);
    if (rc == 0) rc = ckpt_join(path, sizeof path, tmp, ckpt_file_names[CKPT_F_CONFIG_TOML], err);
    if (rc == 0) rc = ckpt_write_text(path, config_toml, strlen(config_toml), err);
    if (rc == 0) rc = write_state(tmp, st, optim, model, err);
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

// The commit of shards with one range each (info's offset and numel): ckpt_commit, ckpt_save.
static int commit_one_range(const char *root, long tag, const qwen3_model *m,
                            const ckpt_shard_info *shards, int n_shards, const train_state *st,
                            const char *config_toml, bool check_params, ct_error *err) {
    char tmp[4200];
    if (ckpt_tmp_path(tmp, sizeof tmp, root, st->step, tag, err) != 0) return -1;
    if (n_shards < 1 || n_shards > CKPT_MAX_SHARDS || !shards) {
        ct_fail(err, "%s: %d optimizer shards, expected 1 to %d", tmp, n_shards, CKPT_MAX_SHARDS);
        ckpt_rmtree(tmp, NULL);
        return -1;
    }
    ckpt_range *ranges = malloc((size_t)n_shards * sizeof *ranges);
    const ckpt_range **lists = malloc((size_t)n_shards * sizeof *lists);
    int *counts = malloc((size_t)n_shards * sizeof *counts);
    ckpt_shard_list optim = {0}, model = {0};
    int rc = ranges && lists && counts ? 0 : ct_fail(err, "%s: out of memory", tmp);
    for (int i = 0; i < n_shards && rc == 0; i++) {
        ranges[i] = (ckpt_range){shards[i].offset, shards[i].offset + shards[i].numel};
        if (ranges[i].hi < ranges[i].lo) ranges[i].hi = UINT64_MAX; // refused by the check
        lists[i] = &ranges[i];
        counts[i] = 1;
    }
    if (rc == 0) rc = ckpt_shard_list_make(&optim, shards, n_shards, lists, counts, err);
    if (rc == 0)
        rc = commit(root, tag, m, &optim, &model, st, config_toml, check_params, err);
    else
        ckpt_rmtree(tmp, NULL);
    ckpt_shard_list_free(&optim);
    free(ranges);
    free(lists);
    free(counts);
    return rc;
}

int ckpt_commit(const char *root, long tag, const qwen3_model *m, const ckpt_shard_info *shards,
                int n_shards, const train_state *st, const char *config_toml, ct_error *err) {
    return commit_one_range(root, tag, m, shards, n_shards, st, config_toml, true, err);
}

int ckpt_commit_ranges(const char *root, long tag, const qwen3_model *m,
                       const ckpt_shard_info *optim, const ckpt_shard_info *model, int n_shards,
                       const ckpt_range *const *ranges, const int *n_ranges, const train_state *st,
                       const char *config_toml, ct_error *err) {
    char tmp[4200];
    ckpt_shard_list o = {0}, mo = {0};
    if (ckpt_tmp_path(tmp, sizeof tmp, root, st->step, tag, err) != 0) return -1;
    int rc = ckpt_shard_list_make(&o, optim, n_shards, ranges, n_ranges, err);
    if (rc == 0 && model) rc = ckpt_shard_list_make(&mo, model, n_shards, ranges, n_ranges, err);
    if (rc == 0)
        rc = commit(root, tag, m, &o, &mo, st, config_toml, true, err);
    else {
        ct_wrap(err, "%s", tmp);
        ckpt_rmtree(tmp, NULL);
    }
    ckpt_shard_list_free(&o);
    ckpt_shard_list_free(&mo);
    return rc;
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
    if (check_params_finite(m, err) != 0 ||
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
    return commit_one_range(root, tag, m, &info, 1, st, config_toml, false, err);
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
