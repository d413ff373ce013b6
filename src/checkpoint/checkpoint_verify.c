// Checkpoint verify: a folder's state.json, every file's size and XXH64, the shards' metadata and
// shapes, and the model's tensors against the model's, with nothing copied; the newest complete
// checkpoint under a root. A problem of the folder (CKPT_CORRUPT) is told apart from one that must
// stop the caller (-1).
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "io/json.h"
#include "io/safetensors.h"
#include "checkpoint/checkpoint_internal.h"

// An error that marks the checkpoint corrupt rather than failing the caller.
static int corrupt(ct_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int corrupt(ct_error *err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    ct_vfail(err, fmt, ap);
    va_end(ap);
    return CKPT_CORRUPT;
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
    if (ckpt_join(path, sizeof path, dir, name, err) != 0) return -1;
    struct stat sb;
    if (stat(path, &sb) != 0)
        return corrupt(err, "%s: missing (state.json lists it): %s", path, strerror(errno));
    if ((uint64_t)sb.st_size != bytes)
        return corrupt(err, "%s: %lld bytes, state.json lists %" PRIu64 " (truncated or replaced)",
                       path, (long long)sb.st_size, bytes);
    uint64_t h, size;
    if (sf) {
        if (st_open(sf, path, err) != 0) return CKPT_CORRUPT;
        // The pages leave this process as they are hashed: a load or an export then holds what it
        // copies, not every file it checked.
        h = ct_xxh64_file_map(sf->map, sf->map_size, 0);
    } else if (ckpt_hash_file(&h, &size, path, err) != 0) {
        return CKPT_CORRUPT;
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

// The shard's metadata string `key` equals want.
static int check_meta_text(const cJSON *meta, const char *key, const char *want, const char *path,
                           ct_error *err) {
    const char *s = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(meta, key));
    if (!s || strcmp(s, want) != 0)
        return corrupt(
            err,
            "%s: __metadata__ %s \"%.80s%s\", state.json lists \"%.80s%s\" (the shard is "
            "not the one state.json describes)",
            path, key, s ? s : "(none)", s && strlen(s) > 80 ? "..." : "", want,
            strlen(want) > 80 ? "..." : "");
    return 0;
}

// The shard's metadata and tensors agree with state.json: its format, ranges (one: offset and
// numel; else "ranges") and total, and exactly its tensors ("exp_avg" and "exp_avg_sq", or
// "param"), F32 of shape [numel].
static int check_shard_content(const st_file *f, const ckpt_shard_list *list, int i, bool model,
                               uint64_t total, ct_error *err) {
    const ckpt_shard_info *s = &list->info[i];
    const ckpt_range *r = &list->ranges[list->first[i]];
    int n_ranges = list->first[i + 1] - list->first[i];
    const char *want_format = model ? CKPT_MODEL_SHARD_FORMAT : CKPT_SHARD_FORMAT;
    cJSON *h = cJSON_ParseWithLength((const char *)f->map + 8, (size_t)f->header_len);
    if (!h) return ct_fail(err, "%s: out of memory parsing the header", f->path);
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(h, "__metadata__");
    const char *format = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(meta, "format"));
    int rc = 0;
    if (!format || strcmp(format, want_format) != 0)
        rc = corrupt(err, "%s: __metadata__ format \"%s\", expected \"%s\"", f->path,
                     format ? format : "(none)", want_format);
    if (rc == 0 && n_ranges == 1) rc = check_meta_uint(meta, "offset", r->lo, f->path, err);
    if (rc == 0 && n_ranges != 1) {
        char *want = ckpt_ranges_text(r, n_ranges);
        rc = want ? check_meta_text(meta, "ranges", want, f->path, err)
                  : ct_fail(err, "%s: out of memory", f->path);
        free(want);
    }
    if (rc == 0) rc = check_meta_uint(meta, "numel", s->numel, f->path, err);
    if (rc == 0) rc = check_meta_uint(meta, "total", total, f->path, err);
    cJSON_Delete(h);
    if (rc != 0) return rc;
    static const char *const optim_names[2] = {"exp_avg", "exp_avg_sq"}; // sorted, as f->tensors
    static const char *const model_names[1] = {"param"};
    const char *const *names = model ? model_names : optim_names;
    int n = model ? 1 : 2;
    for (int k = 0; k < n; k++) {
        const st_tensor *t = k < f->n_tensors ? &f->tensors[k] : NULL;
        if (f->n_tensors != n || strcmp(t->name, names[k]) != 0)
            return corrupt(err, "%s: expected exactly the tensor%s %s", f->path, model ? "" : "s",
                           model ? "\"param\"" : "\"exp_avg\" and \"exp_avg_sq\"");
        if (t->dtype != CT_F32 || t->ndim != 1 || (uint64_t)t->shape[0] != s->numel) {
            char got[160];
            return corrupt(err, "%s: tensor \"%s\": expected F32 [%" PRIu64 "], found %s %s",
                           f->path, t->name, s->numel, dtype_name(t->dtype),
                           st_shape_str(got, sizeof got, t->shape, t->ndim));
        }
    }
    return 0;
}

static int check_shard(ckpt_view *v, bool model, int i, ct_error *err) {
    st_file *f = model ? &v->mshards[i] : &v->optim[i];
    if (f->path) return 0; // checked already
    const ckpt_shard_list *list = model ? &v->s.model : &v->s.optim;
    const ckpt_shard_info *s = &list->info[i];
    int rc = check_sum(v->dir, s->file, s->bytes, s->xxh64, f, err);
    if (rc == 0) rc = check_shard_content(f, list, i, model, v->s.total, err);
    if (rc != 0) st_close(f);
    return rc;
}

// Whether the ascending ranges a[0 .. na) and b[0 .. nb) share an element.
static bool ranges_overlap(const ckpt_range *a, int na, const ckpt_range *b, int nb) {
    for (int i = 0, j = 0; i < na && j < nb;) {
        if (a[i].lo < b[j].hi && b[j].lo < a[i].hi && a[i].lo < a[i].hi && b[j].lo < b[j].hi)
            return true;
        if (a[i].hi <= b[j].hi)
            i++;
        else
            j++;
    }
    return false;
}

int ckpt_check_shards(ckpt_view *v, bool model, bool all, const ckpt_range *want, int n_want,
                      ct_error *err) {
    const ckpt_shard_list *list = model ? &v->s.model : &v->s.optim;
    for (int i = 0; i < list->n; i++) {
        const ckpt_range *r = &list->ranges[list->first[i]];
        if (!all && !ranges_overlap(r, list->first[i + 1] - list->first[i], want, n_want)) continue;
        int rc = check_shard(v, model, i, err);
        if (rc != 0) return rc;
    }
    return 0;
}

void ckpt_view_close(ckpt_view *v) {
    st_close(&v->model);
    for (int i = 0; v->optim && i < v->s.optim.n; i++) st_close(&v->optim[i]);
    for (int i = 0; v->mshards && i < v->s.model.n; i++) st_close(&v->mshards[i]);
    free(v->optim);
    free(v->mshards);
    v->optim = v->mshards = NULL;
    ckpt_state_free(&v->s);
}

// Integrity of state.json and the files other than the shards: 0, CKPT_CORRUPT, or -1. On 0
// model.safetensors is open; on error the view is closed.
int ckpt_view_open(ckpt_view *v, const char *dir, ct_error *err) {
    memset(v, 0, sizeof *v);
    v->dir = dir;
    char path[4096];
    if (ckpt_join(path, sizeof path, dir, CKPT_STATE_NAME, err) != 0) return -1;
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return corrupt(err, "%s: not a checkpoint folder", dir);
    if (stat(path, &sb) != 0)
        return corrupt(err, "%s: no %s (an incomplete checkpoint)", dir, CKPT_STATE_NAME);
    char *text = NULL;
    size_t len = 0;
    if (file_read_all(&text, &len, path, CKPT_STATE_MAX_BYTES, err) != 0) return CKPT_CORRUPT;
    int rc = ckpt_state_parse(&v->s, text, len, path, err) == 0 ? 0
             : v->s.other_format                                ? -1
                                                                : CKPT_CORRUPT;
    free(text);
    if (rc == 0 && (!(v->optim = calloc((size_t)v->s.optim.n, sizeof *v->optim)) ||
                    !(v->mshards = calloc((size_t)v->s.model.n + 1, sizeof *v->mshards))))
        rc = ct_fail(err, "%s: out of memory", path);
    int64_t named;
    if (rc == 0 && folder_step(dir, &named) && named != v->s.st.step)
        rc = corrupt(err, "%s: state.json says step %" PRId64 ", the folder name %" PRId64, dir,
                     v->s.st.step, named);
    for (int k = 0; k < CKPT_N_FILES && rc == 0; k++) {
        const ckpt_file_sum *f = &v->s.files[k];
        if (k == CKPT_F_MODEL && v->s.model.n > 0) continue; // in its shards
        rc = check_sum(dir, f->name, f->bytes, f->xxh64, k == CKPT_F_MODEL ? &v->model : NULL, err);
    }
    if (rc != 0) ckpt_view_close(v);
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
int ckpt_view_match(const ckpt_view *v, const qwen3_model *m, bool moments, ct_error *err) {
    // A LoRA run's checkpoint holds its adapter (PEFT's keys), which only a LoRA model's trained
    // table (qwen3_trained) takes.
    const bool adapter = m->n_params > 0 && strncmp(m->params[0].name, "base_model.model.", 17) == 0;
    if (v->s.st.lora_base_hash && !adapter)
        return ct_fail(err,
                       "%s is a LoRA run's checkpoint: it holds the adapter (PEFT's keys), not the "
                       "model; resume it with its [lora] config, or write it as a PEFT adapter "
                       "folder with ctitan export --checkpoint (then train, eval or export "
                       "--merge take --lora.adapter_path)",
                       v->dir);
    if (v->s.model.n == 0 && match_tensors(&v->model, m, err) != 0) return -1;
    if (v->s.model.n > 0 && v->s.total != m->num_params)
        return ct_fail(err,
                       "%s/%s: the model shards hold %" PRIu64 " parameters, the model has %zu "
                       "(a checkpoint of another architecture?)",
                       v->dir, CKPT_STATE_NAME, v->s.total, m->num_params);
    if (moments && v->s.format == CKPT_FORMAT_UNFUSED && m->cfg.attention_bias)
        return ct_fail(err,
                       "%s/%s: checkpoint format %d keeps the optimizer state of a model with "
                       "attention biases in the order before the fused q|k|v projection (this "
                       "ctitan reads formats %d and %d); resume it with the ctitan that wrote "
                       "it, or train into a new job.dump_folder",
                       v->dir, CKPT_STATE_NAME, CKPT_FORMAT_UNFUSED, CKPT_FORMAT_RANGE,
                       CKPT_FORMAT);
    if (moments && v->s.total != m->num_params)
        return corrupt(err,
                       "%s/%s: optimizer_shards cover %" PRIu64 " elements, the model has %zu "
                       "parameters",
                       v->dir, CKPT_STATE_NAME, v->s.total, m->num_params);
    return 0;
}

// ckpt_verify and ckpt_find_latest: every file, every shard.
static int verify_checked(const char *dir, const qwen3_model *m, train_state *st, ct_error *err) {
    ckpt_view v;
    int rc = ckpt_view_open(&v, dir, err);
    if (rc != 0) return rc;
    if (m) rc = ckpt_view_match(&v, m, true, err);
    if (rc == 0) rc = ckpt_check_shards(&v, false, true, NULL, 0, err);
    if (rc == 0) rc = ckpt_check_shards(&v, true, true, NULL, 0, err);
    if (rc == 0 && st) *st = v.s.st;
    ckpt_view_close(&v);
    return rc;
}

int ckpt_verify(const char *dir, const qwen3_model *m, train_state *st, ct_error *err) {
    return verify_checked(dir, m, st, err) == 0 ? 0 : -1;
}

// ---------------------------------------------------------------- find

int ckpt_walk_newest(char *dir_out, size_t cap, const char *root, ckpt_try_fn try, void *ctx,
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
        } else if (rc == CKPT_CORRUPT) {
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
    return ckpt_walk_newest(dir_out, cap, root, try_verify, &c, notes, err);
}
