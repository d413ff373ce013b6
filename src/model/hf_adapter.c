// HF folder <-> model. Native names are HF names today, so loading is a walk over the model's
// parameter table with a lookup by name; the checks are what make it safe: shapes, dtypes,
// missing and unexpected keys, all named.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fs.h"
#include "model/hf_adapter.h"

static int str_ptr_cmp(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int report_add(char ***list, int *n, const char *name, ct_error *err) {
    char **grown = realloc(*list, (size_t)(*n + 1) * sizeof *grown);
    char *copy = strdup(name);
    if (!grown || !copy) {
        free(copy);
        if (grown) *list = grown;
        return ct_fail(err, "out of memory listing tensor names");
    }
    grown[*n] = copy;
    *list = grown;
    (*n)++;
    return 0;
}

void hf_report_free(hf_load_report *r) {
    for (int i = 0; i < r->n_missing; i++) free(r->missing[i]);
    for (int i = 0; i < r->n_unexpected; i++) free(r->unexpected[i]);
    free(r->missing);
    free(r->unexpected);
    memset(r, 0, sizeof *r);
}

// The tensor on disk has the parameter's shape and a dtype that converts to fp32.
static int check_param(const qwen3_param *p, const st_tensor *t, const char *source,
                       ct_error *err) {
    bool same = t->ndim == p->ndim;
    for (int d = 0; same && d < p->ndim; d++) same = t->shape[d] == p->shape[d];
    if (!same) {
        char want[64], got[160];
        return ct_fail(err, "%s: tensor \"%s\": expected shape %s, found %s", source, p->name,
                       st_shape_str(want, sizeof want, p->shape, p->ndim),
                       st_shape_str(got, sizeof got, t->shape, t->ndim));
    }
    if (t->dtype != CT_F32 && t->dtype != CT_BF16 && t->dtype != CT_F16 && t->dtype != CT_F64)
        return ct_fail(err,
                       "%s: tensor \"%s\": dtype %s cannot be converted to fp32 (expected F32, "
                       "BF16, F16 or F64)",
                       source, p->name, dtype_name(t->dtype));
    return 0;
}

// "a, b, c (and 7 more)" within the error message's room.
static int missing_error(const hf_load_report *r, const char *source, ct_error *err) {
    char list[768];
    size_t used = 0;
    int shown = 0;
    list[0] = '\0';
    for (; shown < r->n_missing; shown++) {
        size_t need = strlen(r->missing[shown]) + 2;
        if (used + need + 24 >= sizeof list) break;
        used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", shown ? ", " : "",
                                 r->missing[shown]);
    }
    if (shown < r->n_missing)
        snprintf(list + used, sizeof list - used, " (and %d more)", r->n_missing - shown);
    return ct_fail(err, "%s: %d tensor(s) the model needs are missing: %s", source, r->n_missing,
                   list);
}

// Every check of a load, before anything is copied: each parameter's tensor (found[i], NULL
// when absent) has its shape and a convertible dtype; the report lists missing (a buffer is not
// HF's, so never missing) and unexpected tensors and the dtypes. Missing ones are an error.
static int check_tensors(const st_tensor **found, const qwen3_model *m, hf_load_report *r,
                         const st_set *s, const char *source, ct_error *err) {
    memset(r, 0, sizeof *r);
    r->n_files = s->n_files;
    int rc = 0;
    bool have_dtype = false;
    for (int i = 0; i < m->n_params && rc == 0; i++) {
        const qwen3_param *p = &m->params[i];
        const st_tensor *t = found[i] = st_set_find(s, p->name);
        if (!t) {
            if (!p->buffer) rc = report_add(&r->missing, &r->n_missing, p->name, err);
            continue;
        }
        rc = check_param(p, t, source, err);
        if (rc != 0) break;
        r->n_loaded++;
        if (!have_dtype) {
            r->source_dtype = t->dtype;
            have_dtype = true;
        } else if (t->dtype != r->source_dtype) {
            r->mixed_dtypes = true;
        }
    }
    if (rc != 0) return -1;

    // Unexpected: on disk, unknown to the model. Both name lists sorted, then merged, so a
    // 100k-tensor MoE checkpoint costs n log n, not n^2.
    const char **names = malloc(((size_t)m->n_params + 1) * sizeof *names);
    if (!names) return ct_fail(err, "%s: out of memory", source);
    for (int i = 0; i < m->n_params; i++) names[i] = m->params[i].name;
    qsort(names, (size_t)m->n_params, sizeof *names, str_ptr_cmp);
    int j = 0;
    for (int i = 0; i < s->n_tensors && rc == 0; i++) {
        const char *name = s->by_name[i]->name;
        while (j < m->n_params && strcmp(names[j], name) < 0) j++;
        if (j == m->n_params || strcmp(names[j], name) != 0)
            rc = report_add(&r->unexpected, &r->n_unexpected, name, err);
    }
    free(names);
    if (rc != 0) return -1;
    if (r->n_missing > 0) return missing_error(r, source, err);
    return 0;
}

// Values converted per chunk on the host: what the streaming load holds beside the weights.
#define LOAD_CHUNK (1u << 20)

int hf_load_weights(qwen3_model *m, hf_load_report *r, const st_set *s, const char *source,
                    ct_error *err) {
    const st_tensor **found = calloc((size_t)m->n_params + 1, sizeof *found);
    if (!found) return ct_fail(err, "%s: out of memory", source);
    int rc = check_tensors(found, m, r, s, source, err);
    // Tensor by tensor, a chunk at a time, into wherever the model holds each (fp32, or bf16 in
    // a forward-only bf16 model); the file's pages leave the process as each chunk is copied (a
    // page that two chunks share, once the tensor is done), so the load holds the weights and
    // one chunk. A buffer the folder lacks keeps its value.
    float *chunk = rc == 0 ? malloc(LOAD_CHUNK * sizeof *chunk) : NULL;
    if (rc == 0 && !chunk) rc = ct_fail(err, "%s: out of memory", source);
    for (int i = 0; i < m->n_params && rc == 0; i++) {
        const st_tensor *t = found[i];
        if (!t) continue;
        const size_t esize = dtype_size(t->dtype);
        const bool mapped = s->files[t->file_index].map != NULL;
        for (uint64_t at = 0; at < t->numel && rc == 0; at += LOAD_CHUNK) {
            const uint64_t n = t->numel - at < LOAD_CHUNK ? t->numel - at : LOAD_CHUNK;
            if (st_tensor_range_to_f32(chunk, t, at, n, err) != 0 ||
                qwen3_params_write(m, m->params[i].name, at, n, chunk, err) != 0)
                rc = ct_wrap(err, "%s", source);
            if (mapped) fs_release_read((const char *)t->data + at * esize, n * esize);
        }
        if (mapped) fs_release_read(t->data, t->numel * esize);
    }
    free(chunk);
    free(found);
    return rc;
}

int hf_load_weights_ranges(const qwen3_model *m, hf_load_report *r, const st_set *s,
                           const char *source, const qwen3_range *ranges, int n_ranges, float *out,
                           ct_error *err) {
    memset(r, 0, sizeof *r);
    uint64_t end = 0;
    for (int k = 0; k < n_ranges; k++) {
        if (ranges[k].lo < end || ranges[k].hi < ranges[k].lo || ranges[k].hi > m->num_params)
            return ct_fail(err,
                           "%s: range %d [%llu, %llu): expected ascending, disjoint ranges "
                           "within the model's %zu parameters",
                           source, k, (unsigned long long)ranges[k].lo,
                           (unsigned long long)ranges[k].hi, m->num_params);
        end = ranges[k].hi;
    }
    const st_tensor **found = calloc((size_t)m->n_params + 1, sizeof *found);
    if (!found) return ct_fail(err, "%s: out of memory", source);
    int rc = check_tensors(found, m, r, s, source, err);
    // Each range, tensor by tensor: only the elements inside it are read and converted.
    size_t pos = 0;
    for (int k = 0; k < n_ranges && rc == 0; k++) {
        uint64_t at = ranges[k].lo;
        while (at < ranges[k].hi && rc == 0) {
            const qwen3_param *p = qwen3_param_at(m, at);
            uint64_t stop =
                p->offset + p->numel < ranges[k].hi ? p->offset + p->numel : ranges[k].hi;
            const st_tensor *t = found[p - m->params];
            if (!t) // a buffer the folder lacks: zero, as after qwen3_init
                memset(out + pos, 0, (stop - at) * sizeof(float));
            else if (st_tensor_range_to_f32(out + pos, t, at - p->offset, stop - at, err) != 0)
                rc = ct_wrap(err, "%s", source);
            pos += stop - at;
            at = stop;
        }
    }
    free(found);
    return rc;
}

static void path_join(char *out, size_t cap, const char *dir, const char *name) {
    snprintf(out, cap, "%s/%s", dir, name);
}

static int load_folder(qwen3_model *m, hf_load_report *r, const char *dir, const ct_ops *ops,
                       bool grads, ct_error *err) {
    char cfg_path[4096];
    qwen3_config cfg;
    st_set set;
    memset(m, 0, sizeof *m);
    memset(r, 0, sizeof *r);
    path_join(cfg_path, sizeof cfg_path, dir, "config.json");
    if (qwen3_config_load(&cfg, cfg_path, err) != 0) return -1;
    if (st_set_open(&set, dir, err) != 0) return -1;
    int rc =
        grads ? qwen3_init(m, &cfg, ops, err) : qwen3_init_forward_only(m, &cfg, NULL, ops, NULL, err);
    if (rc == 0) rc = hf_load_weights(m, r, &set, dir, err);
    st_set_close(&set);
    if (rc != 0) {
        // The report stays for the caller to print; the half-built model does not.
        qwen3_free(m);
        memset(m, 0, sizeof *m);
    }
    return rc;
}

int hf_load_folder(qwen3_model *m, hf_load_report *r, const char *dir, const ct_ops *ops,
                   ct_error *err) {
    return load_folder(m, r, dir, ops, true, err);
}

int hf_load_folder_forward_only(qwen3_model *m, hf_load_report *r, const char *dir,
                                const ct_ops *ops, ct_error *err) {
    return load_folder(m, r, dir, ops, false, err);
}

// HF's save_pretrained walks the state_dict in module order, and sharding follows that walk:
// embed_tokens, then per layer self_attn (q, k, v, o with their biases, q_norm, k_norm), mlp,
// input_layernorm, post_attention_layernorm; then norm, lm_head. A dense mlp is gate_proj,
// up_proj, down_proj; a sparse one is the router (gate) then experts 0, 1, ... each gate_proj,
// up_proj, down_proj. Saving in the same order gives the same shards as transformers would write.
static const char *const hf_layer_order[] = {
    "self_attn.q_proj.weight",
    "self_attn.q_proj.bias",
    "self_attn.k_proj.weight",
    "self_attn.k_proj.bias",
    "self_attn.v_proj.weight",
    "self_attn.v_proj.bias",
    "self_attn.o_proj.weight",
    "self_attn.o_proj.bias",
    "self_attn.q_norm.weight",
    "self_attn.k_norm.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
    "mlp.gate.weight",
    "mlp.experts.",
    "mlp.expert_bias", // a buffer: in checkpoints only
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
};
// Within "mlp.experts.{e}.", by expert e (numerically: experts.10 after experts.9), then these.
static const char *const hf_expert_order[] = {"gate_proj.weight", "up_proj.weight",
                                              "down_proj.weight"};
#define N_LAYER_ORDER ((int)(sizeof hf_layer_order / sizeof hf_layer_order[0]))
#define N_EXPERT_ORDER ((int)(sizeof hf_expert_order / sizeof hf_expert_order[0]))

typedef struct save_item {
    st_entry e;
    // (group, layer, position, expert slot); unknown names keep their table order, after the
    // known ones of their layer
    long long key[4];
} save_item;

// Where an expert tensor's suffix ("{e}.up_proj.weight") sorts among a layer's experts, or -1.
static long long expert_rank(const char *suffix) {
    int e, used = 0;
    if (sscanf(suffix, "%d.%n", &e, &used) != 1 || used == 0 || e < 0) return -1;
    for (int k = 0; k < N_EXPERT_ORDER; k++)
        if (strcmp(suffix + used, hf_expert_order[k]) == 0)
            return (long long)e * N_EXPERT_ORDER + k;
    return -1;
}

static void save_rank(long long key[4], const char *name, int index) {
    int layer, used = 0;
    key[0] = 3, key[1] = 0, key[2] = index, key[3] = 0;
    if (strcmp(name, "model.embed_tokens.weight") == 0) {
        key[0] = 0;
    } else if (sscanf(name, "model.layers.%d.%n", &layer, &used) == 1 && used > 0) {
        const char *rest = name + used;
        key[0] = 1, key[1] = layer, key[2] = N_LAYER_ORDER + index;
        for (int k = 0; k < N_LAYER_ORDER; k++) {
            size_t n = strlen(hf_layer_order[k]);
            bool prefix = hf_layer_order[k][n - 1] == '.';
            if (prefix ? strncmp(rest, hf_layer_order[k], n) != 0
                       : strcmp(rest, hf_layer_order[k]) != 0)
                continue;
            long long slot = prefix ? expert_rank(rest + n) : 0;
            if (slot >= 0) key[2] = k, key[3] = slot;
            break;
        }
    } else if (strcmp(name, "model.norm.weight") == 0) {
        key[0] = 2;
    } else if (strcmp(name, "lm_head.weight") == 0) {
        key[0] = 4;
    }
}

static int save_item_cmp(const void *a, const void *b) {
    const save_item *x = a, *y = b;
    for (int i = 0; i < 4; i++)
        if (x->key[i] != y->key[i]) return x->key[i] < y->key[i] ? -1 : 1;
    return 0;
}

static const char *torch_dtype_name(ct_dtype dtype) {
    switch (dtype) {
    case CT_BF16:
        return "bfloat16";
    case CT_F16:
        return "float16";
    default:
        return "float32";
    }
}

// A tensor whose values come from a hf_read_fn: its flat offset in param_mem's layout.
typedef struct save_fill {
    hf_read_fn read;
    void *ctx;
    size_t offset;
} save_fill;

static int save_fill_tensor(float *dst, uint64_t first, uint64_t count, void *ctx, ct_error *err) {
    const save_fill *f = ctx;
    return f->read(dst, f->offset + first, count, f->ctx, err);
}

int hf_save_config(const qwen3_config *cfg, const char *dir, ct_dtype dtype, ct_error *err) {
    if (dtype != CT_F32 && dtype != CT_BF16 && dtype != CT_F16)
        return ct_fail(err, "%s: cannot save weights as %s (expected F32, BF16 or F16)", dir,
                       dtype_name(dtype));
    if (fs_mkdirs(dir, err) != 0) return -1;
    qwen3_config c = *cfg;
    snprintf(c.torch_dtype, sizeof c.torch_dtype, "%s", torch_dtype_name(dtype));
    char cfg_path[4096];
    path_join(cfg_path, sizeof cfg_path, dir, "config.json");
    return qwen3_config_save(&c, cfg_path, err);
}

// The weights come from the model's own buffer (read NULL) or, tensor by tensor, from read.
static int save_folder(const qwen3_model *m, const char *dir, ct_dtype dtype,
                       uint64_t max_shard_bytes, bool buffers, hf_read_fn read, void *ctx,
                       ct_error *err) {
    if (hf_save_config(&m->cfg, dir, dtype, err) != 0) return -1;
    save_item *items = calloc((size_t)m->n_params + 1, sizeof *items);
    st_entry *entries = calloc((size_t)m->n_params + 1, sizeof *entries);
    save_fill *fills = read ? calloc((size_t)m->n_params + 1, sizeof *fills) : NULL;
    bool ok = items && entries && (!read || fills);
    float *host = ok && !read ? qwen3_params_view(m, true, err) : NULL;
    if (!ok || (!read && !host)) {
        free(items);
        free(entries);
        free(fills);
        return ok ? ct_wrap(err, "%s", dir) : ct_fail(err, "%s: out of memory", dir);
    }
    int n = 0;
    for (int i = 0; i < m->n_params; i++) {
        const qwen3_param *p = &m->params[i];
        // A tied head is the embedding; HF checkpoints leave it out. Buffers are not HF's.
        if (m->cfg.tie_word_embeddings && strcmp(p->name, "lm_head.weight") == 0) continue;
        if (p->buffer && !buffers) continue;
        st_entry *e = &items[n].e;
        e->name = p->name;
        if (read) {
            fills[i] = (save_fill){read, ctx, p->offset};
            e->fill = save_fill_tensor;
            e->fill_ctx = &fills[i];
        } else {
            e->data = host + p->offset;
        }
        e->ndim = p->ndim;
        for (int d = 0; d < p->ndim; d++) e->shape[d] = p->shape[d];
        save_rank(items[n].key, p->name, i);
        n++;
    }
    qsort(items, (size_t)n, sizeof *items, save_item_cmp);
    for (int i = 0; i < n; i++) entries[i] = items[i].e;
    free(items);
    int rc = st_write_folder(dir, entries, n, dtype, max_shard_bytes, err);
    free(entries);
    free(fills);
    if (host) qwen3_params_view_release(m, host, false);
    return rc;
}

int hf_save_folder(const qwen3_model *m, const char *dir, ct_dtype dtype, uint64_t max_shard_bytes,
                   ct_error *err) {
    return save_folder(m, dir, dtype, max_shard_bytes, false, NULL, NULL, err);
}

int hf_save_folder_with_buffers(const qwen3_model *m, const char *dir, ct_dtype dtype,
                                uint64_t max_shard_bytes, ct_error *err) {
    return save_folder(m, dir, dtype, max_shard_bytes, true, NULL, NULL, err);
}

int hf_save_folder_from(const qwen3_model *m, const char *dir, ct_dtype dtype,
                        uint64_t max_shard_bytes, bool buffers, hf_read_fn read, void *ctx,
                        ct_error *err) {
    if (!read) return ct_fail(err, "%s: no source for the weights", dir);
    return save_folder(m, dir, dtype, max_shard_bytes, buffers, read, ctx, err);
}
