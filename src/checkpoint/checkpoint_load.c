// Checkpoint load: every check of checkpoint_verify.c before the first copy, then the model (whole,
// or any list of flat ranges of it) and the same ranges of the optimizer moments, from whichever
// files hold them; resume from the newest complete checkpoint.
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/fs.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "checkpoint/checkpoint_internal.h"

// Copies tensor k of each shard file of `list` into dst (concatenated over want): for each shard,
// one merge of its ranges with the wanted ones (both ascend), each overlap copied from its place
// in the shard's data. Linear in the ranges, so a TP rank may ask for one range per row.
static void copy_from_shards(float *dst, const ckpt_shard_list *list, const st_file *files, int k,
                             const ckpt_range *want, int n_want) {
    for (int i = 0; i < list->n; i++) {
        int j = list->first[i], w = 0;
        size_t at = 0, pos = 0; // the shard's data before range j; dst before want[w]
        while (j < list->first[i + 1] && w < n_want) {
            const ckpt_range *r = &list->ranges[j], *x = &want[w];
            uint64_t lo = r->lo > x->lo ? r->lo : x->lo, hi = r->hi < x->hi ? r->hi : x->hi;
            if (lo < hi) { // only the shards that overlap the request are open
                const float *src = (const float *)files[i].tensors[k].data + at + (lo - r->lo);
                memcpy(dst + pos + (lo - x->lo), src, (hi - lo) * sizeof(float));
                fs_release_read(src, (hi - lo) * sizeof(float));
            }
            if (r->hi <= x->hi)
                at += r->hi - r->lo, j++;
            else
                pos += x->hi - x->lo, w++;
        }
    }
}

void ckpt_view_copy_params(float *dst, const ckpt_view *v, const qwen3_model *m,
                           const ckpt_range *want, int n_want) {
    if (v->s.model.n > 0) {
        copy_from_shards(dst, &v->s.model, v->mshards, 0, want, n_want);
        return;
    }
    // model.safetensors: each HF tensor is the flat range [offset, offset + numel).
    size_t pos = 0;
    for (int w = 0; w < n_want; w++) {
        for (uint64_t at = want[w].lo; at < want[w].hi;) {
            const qwen3_param *p = qwen3_param_at(m, at);
            uint64_t end = p->offset + p->numel < want[w].hi ? p->offset + p->numel : want[w].hi;
            const st_tensor *t = st_file_find(&v->model, p->name); // present, F32: matched
            const float *src = (const float *)t->data + (at - p->offset);
            memcpy(dst + pos, src, (end - at) * sizeof(float));
            fs_release_read(src, (end - at) * sizeof(float));
            pos += end - at;
            at = end;
        }
    }
}

void ckpt_view_copy_moments(float *exp_avg, float *exp_avg_sq, const ckpt_view *v,
                            const ckpt_range *want, int n_want) {
    // tensors sorted: exp_avg, exp_avg_sq
    copy_from_shards(exp_avg, &v->s.optim, v->optim, 0, want, n_want);
    copy_from_shards(exp_avg_sq, &v->s.optim, v->optim, 1, want, n_want);
}

// The model's tensors from f into its parameters (through the model's parameter I/O).
static int copy_model(qwen3_model *m, const st_file *f, ct_error *err) {
    for (int i = 0; i < m->n_params; i++) {
        const qwen3_param *p = &m->params[i];
        const st_tensor *t = st_file_find(f, p->name); // present, F32, right shape: checked
        if (qwen3_params_write(m, p->name, 0, p->numel, (const float *)t->data, err) != 0)
            return -1;
    }
    return 0;
}

// What a load asks for: the whole model into `whole`, or the parameters of `want` into params
// (either may be absent); the moments of `want`.
typedef struct load_req {
    const qwen3_model *m; // the layout
    qwen3_model *whole;
    const ckpt_range *want;
    int n_want;
    float *params, *exp_avg, *exp_avg_sq;
    bool all_shards; // verify every shard, not only those the ranges need (resume)
    train_state *st;
    char **config_toml;
} load_req;

// Returns CKPT_CORRUPT when the folder (not the caller) is at fault.
static int load_checked(const char *dir, const load_req *q, ct_error *err) {
    if (!q->exp_avg != !q->exp_avg_sq)
        return ct_fail(err, "%s: load both optimizer moments or neither", dir);
    if (ckpt_check_ranges(q->want, q->n_want, q->m->num_params, dir, err) != 0) return -1;
    const ckpt_range all = {0, q->m->num_params};
    bool moments = q->exp_avg != NULL;
    ckpt_view v;
    int rc = ckpt_view_open(&v, dir, err);
    if (rc != 0) return rc;
    rc = ckpt_view_match(&v, q->m, moments || q->all_shards, err);
    if (rc == 0 && (moments || q->all_shards))
        rc = ckpt_check_shards(&v, false, q->all_shards, q->want, q->n_want, err);
    if (rc == 0 && q->whole)
        rc = ckpt_check_shards(&v, true, q->all_shards, &all, 1, err);
    else if (rc == 0 && (q->params || q->all_shards))
        rc = ckpt_check_shards(&v, true, q->all_shards, q->want, q->n_want, err);
    char *toml = NULL;
    if (rc == 0 && q->config_toml) {
        char path[4096];
        size_t len;
        rc = ckpt_join(path, sizeof path, dir, ckpt_file_names[CKPT_F_CONFIG_TOML], err);
        if (rc == 0) rc = file_read_all(&toml, &len, path, CKPT_STATE_MAX_BYTES, err);
    }
    // Everything checked: the copies below cannot fail but for the whole model's host view.
    if (rc == 0 && q->whole && v.s.model.n == 0) rc = copy_model(q->whole, &v.model, err);
    if (rc == 0 && q->whole && v.s.model.n > 0) {
        float *host = qwen3_params_view(q->whole, false, err);
        if (!host) rc = ct_wrap(err, "%s", dir);
        if (host) ckpt_view_copy_params(host, &v, q->m, &all, 1);
        if (host) qwen3_params_view_release(q->whole, host, true);
    }
    if (rc == 0) {
        if (q->params) ckpt_view_copy_params(q->params, &v, q->m, q->want, q->n_want);
        if (moments) ckpt_view_copy_moments(q->exp_avg, q->exp_avg_sq, &v, q->want, q->n_want);
        if (q->st) *q->st = v.s.st;
        if (q->config_toml) *q->config_toml = toml;
    } else {
        free(toml);
    }
    ckpt_view_close(&v);
    return rc;
}

// ckpt_load's request: the whole model, the moments of [offset, offset + numel).
static int load_request(load_req *q, ckpt_range *range, const char *dir, qwen3_model *m,
                        float *exp_avg, float *exp_avg_sq, size_t offset, size_t numel,
                        train_state *st, char **config_toml, ct_error *err) {
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
    *range = (ckpt_range){offset, offset + numel};
    *q = (load_req){.m = m,
                    .whole = m,
                    .want = range,
                    .n_want = numel > 0,
                    .exp_avg = exp_avg,
                    .exp_avg_sq = exp_avg_sq,
                    .st = st,
                    .config_toml = config_toml};
    return 0;
}

int ckpt_load(const char *dir, qwen3_model *m, float *exp_avg, float *exp_avg_sq, size_t offset,
              size_t numel, train_state *st, char **config_toml, ct_error *err) {
    load_req q;
    ckpt_range range;
    if (load_request(&q, &range, dir, m, exp_avg, exp_avg_sq, offset, numel, st, config_toml,
                     err) != 0)
        return -1;
    return load_checked(dir, &q, err) == 0 ? 0 : -1;
}

// The request of ckpt_load_ranges and ckpt_resume_ranges: a list of ranges, nothing whole.
static load_req ranges_request(const qwen3_model *m, const ckpt_range *ranges, int n_ranges,
                               float *params, float *exp_avg, float *exp_avg_sq, bool all_shards,
                               train_state *st, char **config_toml) {
    return (load_req){.m = m,
                      .want = ranges,
                      .n_want = n_ranges,
                      .params = params,
                      .exp_avg = exp_avg,
                      .exp_avg_sq = exp_avg_sq,
                      .all_shards = all_shards,
                      .st = st,
                      .config_toml = config_toml};
}

int ckpt_load_ranges(const char *dir, const qwen3_model *m, const ckpt_range *ranges, int n_ranges,
                     float *params, float *exp_avg, float *exp_avg_sq, train_state *st,
                     char **config_toml, ct_error *err) {
    load_req q =
        ranges_request(m, ranges, n_ranges, params, exp_avg, exp_avg_sq, false, st, config_toml);
    return load_checked(dir, &q, err) == 0 ? 0 : -1;
}

// ---------------------------------------------------------------- resume

static int try_load(const char *dir, void *ctx, ct_error *err) {
    return load_checked(dir, ctx, err);
}

int ckpt_resume(char *dir_out, size_t cap, qwen3_model *m, float *exp_avg, float *exp_avg_sq,
                size_t offset, size_t numel, train_state *st, char **config_toml, const char *root,
                ckpt_notes *notes, ct_error *err) {
    load_req q;
    ckpt_range range;
    if (load_request(&q, &range, root, m, exp_avg, exp_avg_sq, offset, numel, st, config_toml,
                     err) != 0)
        return -1;
    // Every shard: ranks reading different ranges must skip the same folders.
    q.all_shards = true;
    return ckpt_walk_newest(dir_out, cap, root, try_load, &q, notes, err);
}

int ckpt_resume_ranges(char *dir_out, size_t cap, const qwen3_model *m, const ckpt_range *ranges,
                       int n_ranges, float *params, float *exp_avg, float *exp_avg_sq,
                       train_state *st, char **config_toml, const char *root, ckpt_notes *notes,
                       ct_error *err) {
    if (ckpt_check_ranges(ranges, n_ranges, m->num_params, root, err) != 0) return -1;
    // Every shard: ranks reading different ranges must skip the same folders.
    load_req q =
        ranges_request(m, ranges, n_ranges, params, exp_avg, exp_avg_sq, true, st, config_toml);
    return ckpt_walk_newest(dir_out, cap, root, try_load, &q, notes, err);
}
