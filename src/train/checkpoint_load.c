// Checkpoint load: every check of checkpoint_verify.c before the first copy, then the model and any
// flat range of the optimizer moments; resume from the newest complete checkpoint.
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "io/json.h"
#include "io/safetensors.h"
#include "train/checkpoint_internal.h"

// The model's tensors from f into its parameters: the only place a load writes them (through the
// model's parameter I/O).
static int copy_model(qwen3_model *m, const st_file *f, ct_error *err) {
    for (int i = 0; i < m->n_params; i++) {
        const qwen3_param *p = &m->params[i];
        const st_tensor *t = st_file_find(f, p->name); // present, F32, right shape: checked
        if (qwen3_params_write(m, p->name, 0, p->numel, (const float *)t->data, err) != 0)
            return -1;
    }
    return 0;
}

// dst[k] = moment (k = 0: exp_avg, 1: exp_avg_sq) at flat element offset + k, from the shards
// (all overlapping ones open and checked).
static void copy_moments(float *exp_avg, float *exp_avg_sq, const ckpt_view *v, size_t offset,
                         size_t numel) {
    for (int i = 0; i < v->s.n_shards; i++) {
        const ckpt_shard_info *s = &v->s.shards[i];
        if (!ckpt_shard_overlaps(s, offset, numel)) continue;
        size_t lo = s->offset > offset ? s->offset : offset;
        size_t hi = s->offset + s->numel < offset + numel ? s->offset + s->numel : offset + numel;
        const st_file *f = &v->optim[i];
        float *dst[2] = {exp_avg, exp_avg_sq};
        for (int k = 0; k < 2; k++) // tensors sorted: exp_avg, exp_avg_sq
            memcpy(dst[k] + (lo - offset), (const float *)f->tensors[k].data + (lo - s->offset),
                   (hi - lo) * sizeof(float));
    }
}

// ckpt_load, returning CKPT_CORRUPT when the folder (not the caller) is at fault. all_shards:
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
    int rc = ckpt_view_open(&v, dir, err);
    if (rc != 0) return rc;
    rc = ckpt_view_match(&v, m, exp_avg != NULL || all_shards, err);
    if (rc == 0 && (exp_avg || all_shards))
        rc = ckpt_check_shards(&v, all_shards, offset, numel, err);
    char *toml = NULL;
    if (rc == 0 && config_toml) {
        char path[4096];
        size_t len;
        rc = ckpt_join(path, sizeof path, dir, ckpt_file_names[CKPT_F_CONFIG_TOML], err);
        if (rc == 0) rc = file_read_all(&toml, &len, path, CKPT_STATE_MAX_BYTES, err);
    }
    if (rc == 0) rc = copy_model(m, &v.model, err);
    if (rc == 0) {
        if (exp_avg) copy_moments(exp_avg, exp_avg_sq, &v, offset, numel);
        if (st) *st = v.s.st;
        if (config_toml) *config_toml = toml;
    } else {
        free(toml);
    }
    ckpt_view_close(&v);
    return rc;
}

int ckpt_load(const char *dir, qwen3_model *m, float *exp_avg, float *exp_avg_sq, size_t offset,
              size_t numel, train_state *st, char **config_toml, ct_error *err) {
    return load_checked(dir, m, exp_avg, exp_avg_sq, offset, numel, false, st, config_toml, err) ==
                   0
               ? 0
               : -1;
}

// ---------------------------------------------------------------- resume

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
    return ckpt_walk_newest(dir_out, cap, root, try_load, &c, notes, err);
}
