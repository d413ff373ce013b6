// A model folder as one set of tensors: model.safetensors, or HF's sharded layout
// (model.safetensors.index.json + shards). The index and the shards must agree exactly.
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io/json.h"
#include "io/safetensors.h"
#include "io/safetensors_internal.h"

typedef struct wm_entry {
    const char *name;  // tensor name (points into the parsed index)
    const char *shard; // shard file name (points into the parsed index)
    int file;          // index into st_set.files
} wm_entry;

static int wm_cmp_name(const void *a, const void *b) {
    return strcmp(((const wm_entry *)a)->name, ((const wm_entry *)b)->name);
}
static int str_cmp(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}
static int tensor_ptr_cmp(const void *a, const void *b) {
    const st_tensor *x = *(const st_tensor *const *)a, *y = *(const st_tensor *const *)b;
    int c = strcmp(x->name, y->name);
    return c ? c : x->file_index - y->file_index;
}

static int tensor_ptr_name_cmp(const void *a, const void *b) {
    return strcmp((*(const st_tensor *const *)a)->name, (*(const st_tensor *const *)b)->name);
}

char *st_path_join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static bool is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

// Collects every tensor of every file, sorted by name; a name in two files is an error.
static int st_set_index_tensors(st_set *s, ct_error *err) {
    size_t total = 0;
    for (int i = 0; i < s->n_files; i++) total += (size_t)s->files[i].n_tensors;
    s->by_name = malloc((total + 1) * sizeof *s->by_name);
    if (!s->by_name) return ct_fail(err, "out of memory");
    for (int i = 0; i < s->n_files; i++) {
        for (int j = 0; j < s->files[i].n_tensors; j++) {
            s->files[i].tensors[j].file_index = i;
            s->by_name[s->n_tensors++] = &s->files[i].tensors[j];
        }
    }
    qsort(s->by_name, total, sizeof *s->by_name, tensor_ptr_cmp);
    for (int i = 1; i < s->n_tensors; i++) {
        const st_tensor *a = s->by_name[i - 1], *b = s->by_name[i];
        if (strcmp(a->name, b->name) == 0)
            return ct_fail(err, "tensor \"%s\" is in two shards: %s and %s", a->name,
                           s->files[a->file_index].path, s->files[b->file_index].path);
    }
    return 0;
}

static int st_set_open_single(st_set *s, const char *path, ct_error *err) {
    s->files = calloc(1, sizeof *s->files);
    if (!s->files) return ct_fail(err, "%s: out of memory", path);
    if (st_open(&s->files[0], path, err) != 0) return -1;
    s->n_files = 1;
    return st_set_index_tensors(s, err);
}

// Reads weight_map into a name-sorted array; *shards gets the distinct shard names, sorted.
static int st_read_weight_map(wm_entry **out, int *n_out, const char ***shards, int *n_shards,
                              const cJSON *root, const char *index, ct_error *err) {
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(root) || !cJSON_IsObject(wm))
        return ct_fail(err, "%s: expected an object with a \"weight_map\" object", index);
    int n = cJSON_GetArraySize(wm);
    wm_entry *e = calloc((size_t)n + 1, sizeof *e);
    const char **names = calloc((size_t)n + 1, sizeof *names);
    *out = e;
    *shards = names;
    if (!e || !names) return ct_fail(err, "%s: out of memory", index);
    int k = 0;
    for (const cJSON *it = wm->child; it; it = it->next, k++) {
        if (!cJSON_IsString(it))
            return ct_fail(err, "%s: weight_map entry \"%s\": expected a shard file name", index,
                           it->string);
        const char *sh = it->valuestring;
        // Shards live in the folder itself; a path would let an index point anywhere.
        if (!*sh || strchr(sh, '/') || strcmp(sh, ".") == 0 || strcmp(sh, "..") == 0)
            return ct_fail(err,
                           "%s: weight_map entry \"%s\": shard \"%s\" must be a file name in the "
                           "same folder",
                           index, it->string, sh);
        e[k] = (wm_entry){.name = it->string, .shard = sh};
        names[k] = sh;
    }
    *n_out = n;
    qsort(e, (size_t)n, sizeof *e, wm_cmp_name);
    for (int i = 1; i < n; i++) {
        if (strcmp(e[i - 1].name, e[i].name) == 0)
            return ct_fail(err, "%s: weight_map lists tensor \"%s\" twice", index, e[i].name);
    }
    qsort(names, (size_t)n, sizeof *names, str_cmp);
    int u = 0;
    for (int i = 0; i < n; i++) {
        if (u == 0 || strcmp(names[u - 1], names[i]) != 0) names[u++] = names[i];
    }
    *n_shards = u;
    for (int i = 0; i < n; i++) {
        const char **hit = bsearch(&e[i].shard, names, (size_t)u, sizeof *names, str_cmp);
        e[i].file = (int)(hit - names);
    }
    return 0;
}

// Walks the sorted weight_map and the sorted tensors together: each must have the other.
static int st_set_match_index(const st_set *s, const wm_entry *wm, int n, const char *index,
                              ct_error *err) {
    int i = 0, j = 0;
    while (i < n || j < s->n_tensors) {
        int c = i == n ? 1 : j == s->n_tensors ? -1 : strcmp(wm[i].name, s->by_name[j]->name);
        if (c < 0)
            return ct_fail(err, "%s: weight_map puts tensor \"%s\" in %s, which has no such tensor",
                           index, wm[i].name, s->files[wm[i].file].path);
        if (c > 0)
            return ct_fail(err, "%s: tensor \"%s\" in %s is not listed in weight_map", index,
                           s->by_name[j]->name, s->files[s->by_name[j]->file_index].path);
        if (wm[i].file != s->by_name[j]->file_index)
            return ct_fail(err,
                           "%s: weight_map puts tensor \"%s\" in %s, which has no such tensor "
                           "(it is in %s)",
                           index, wm[i].name, s->files[wm[i].file].path,
                           s->files[s->by_name[j]->file_index].path);
        i++, j++;
    }
    return 0;
}

static int st_set_open_index(st_set *s, const char *dir, const char *index, ct_error *err) {
    cJSON *root = NULL;
    wm_entry *wm = NULL;
    const char **shards = NULL;
    int n = 0, n_shards = 0, rc = json_parse_file(&root, index, err);
    if (rc == 0) rc = st_read_weight_map(&wm, &n, &shards, &n_shards, root, index, err);
    if (rc == 0) {
        s->files = calloc((size_t)n_shards + 1, sizeof *s->files);
        if (!s->files) rc = ct_fail(err, "%s: out of memory", index);
    }
    for (int i = 0; i < n_shards && rc == 0; i++) {
        char *p = st_path_join(dir, shards[i]);
        rc = p ? st_open(&s->files[i], p, err) : ct_fail(err, "%s: out of memory", index);
        if (rc == 0) s->n_files++;
        if (rc != 0 && p) ct_wrap(err, "shard listed in %s", index);
        free(p);
    }
    if (rc == 0) rc = st_set_index_tensors(s, err);
    if (rc == 0) rc = st_set_match_index(s, wm, n, index, err);
    free(wm);
    free(shards);
    cJSON_Delete(root);
    return rc;
}

int st_set_open(st_set *s, const char *path, ct_error *err) {
    memset(s, 0, sizeof *s);
    struct stat st;
    if (stat(path, &st) != 0) return ct_fail(err, "cannot open %s: %s", path, strerror(errno));
    int rc;
    if (!S_ISDIR(st.st_mode)) {
        rc = st_set_open_single(s, path, err);
    } else {
        char *single = st_path_join(path, ST_SINGLE_NAME),
             *index = st_path_join(path, ST_INDEX_NAME);
        // The same precedence as transformers: a model.safetensors wins over an index.
        if (!single || !index)
            rc = ct_fail(err, "%s: out of memory", path);
        else if (is_file(single))
            rc = st_set_open_single(s, single, err);
        else if (is_file(index))
            rc = st_set_open_index(s, path, index, err);
        else
            rc = ct_fail(err, "%s: folder has neither " ST_SINGLE_NAME " nor " ST_INDEX_NAME, path);
        free(single);
        free(index);
    }
    if (rc != 0) st_set_close(s);
    return rc;
}

void st_set_close(st_set *s) {
    for (int i = 0; i < s->n_files; i++) st_close(&s->files[i]);
    free(s->files);
    free(s->by_name);
    memset(s, 0, sizeof *s);
}

const st_tensor *st_set_find(const st_set *s, const char *name) {
    st_tensor key = {.name = (char *)name}, *kp = &key;
    st_tensor **hit =
        bsearch(&kp, s->by_name, (size_t)s->n_tensors, sizeof kp, tensor_ptr_name_cmp);
    return hit ? *hit : NULL;
}
