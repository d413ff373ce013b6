// LoRA merged into base weights (lora_merge.h).
#include <stdio.h>
#include <string.h>

#include "core/fs.h"
#include "model/hf_adapter.h"
#include "model/lora_merge.h"

bool lora_pair_of(const lora_layout *L, const char *name, const lora_tensor **A,
                  const lora_tensor **B) {
    static const char weight[] = ".weight";
    size_t n = strlen(name), nw = sizeof weight - 1;
    char key[256];
    if (n <= nw || strcmp(name + n - nw, weight) != 0 || n + 16 >= sizeof key) return false;
    // The adapter's keys for a base weight are its name with .weight -> .lora_{A,B}.weight.
    snprintf(key, sizeof key, "%.*s.lora_A.weight", (int)(n - nw), name);
    *A = peft_key_tensor(L, key, NULL);
    snprintf(key, sizeof key, "%.*s.lora_B.weight", (int)(n - nw), name);
    *B = peft_key_tensor(L, key, NULL);
    return *A && *B;
}

// Columns summed per block, on the stack: the product's row is never whole in memory.
#define MERGE_BLOCK 512

void lora_merge_range(float *w, uint64_t first, uint64_t count, const lora_tensor *A,
                      const lora_tensor *B, const float *buf, float s) {
    const float *a = buf + A->offset, *b = buf + B->offset; // (r, in), (out, r)
    const uint64_t in = (uint64_t)A->shape[1], r = (uint64_t)A->shape[0];
    float acc[MERGE_BLOCK];
    for (uint64_t at = first; at < first + count;) {
        const uint64_t o = at / in, c0 = at % in;
        const uint64_t c1 = (first + count - o * in) < in ? first + count - o * in : in;
        for (uint64_t c = c0; c < c1; c += MERGE_BLOCK) {
            const uint64_t nc = c1 - c < MERGE_BLOCK ? c1 - c : MERGE_BLOCK;
            for (uint64_t j = 0; j < nc; j++) acc[j] = 0.0f;
            for (uint64_t k = 0; k < r; k++) {
                const float bk = b[o * r + k], *ak = a + k * in + c;
                for (uint64_t j = 0; j < nc; j++) acc[j] += bk * ak[j];
            }
            float *wo = w + (o * in + c - first);
            for (uint64_t j = 0; j < nc; j++) wo[j] += acc[j] * s;
        }
        at = o * in + c1;
    }
}

int lora_merge_tensor(float *w, const char *name, int64_t out, int64_t in, const lora_layout *L,
                      const float *buf, ct_error *err) {
    const lora_tensor *A, *B;
    if (!lora_pair_of(L, name, &A, &B)) return 0;
    if (A->shape[1] != in || B->shape[0] != out)
        return ct_fail(err,
                       "\"%s\": the adapter's %s and %s make a (%lld, %lld) update, the weight "
                       "is (%lld, %lld)",
                       name, A->name, B->name, (long long)B->shape[0], (long long)A->shape[1],
                       (long long)out, (long long)in);
    lora_merge_range(w, 0, (uint64_t)(out * in), A, B, buf, lora_scale(&L->lc));
    return 0;
}

int lora_merge_open(lora_merge_src *s, const char *base_dir, const char *adapter_dir,
                    ct_error *err) {
    memset(s, 0, sizeof *s);
    snprintf(s->base_dir, sizeof s->base_dir, "%s", base_dir);
    char path[4200];
    qwen3_config cfg;
    hf_load_report report;
    snprintf(path, sizeof path, "%s/config.json", base_dir);
    if (qwen3_config_load(&cfg, path, err) != 0) return -1;
    if (qwen3_init_layout(&s->m, &cfg, err) != 0) return -1;
    if (st_set_open(&s->base, base_dir, err) != 0) {
        qwen3_free(&s->m);
        return -1;
    }
    // No range: the checks alone, over every tensor, before a byte is written.
    int rc = hf_load_weights_ranges(&s->m, &report, &s->base, base_dir, NULL, 0, NULL, err);
    hf_report_free(&report);
    if (rc == 0) rc = peft_adapter_load(&s->ad, adapter_dir, &s->m.cfg, err);
    if (rc != 0) {
        st_set_close(&s->base);
        qwen3_free(&s->m);
        memset(s, 0, sizeof *s);
        return -1;
    }
    s->scale = lora_scale(&s->ad.L.lc);
    for (int i = 0; i < s->m.n_params; i++) {
        const lora_tensor *A, *B;
        s->n_merged += lora_pair_of(&s->ad.L, s->m.params[i].name, &A, &B);
    }
    return 0;
}

int lora_merge_read(float *dst, uint64_t lo, uint64_t n, void *ctx, ct_error *err) {
    const lora_merge_src *s = ctx;
    for (uint64_t at = lo; at < lo + n;) {
        const qwen3_param *p = qwen3_param_at(&s->m, at);
        const uint64_t stop = p->offset + p->numel < lo + n ? p->offset + p->numel : lo + n;
        const uint64_t first = at - p->offset, count = stop - at;
        float *out = dst + (at - lo);
        const st_tensor *t = st_set_find(&s->base, p->name);
        if (!t) { // a buffer the folder lacks (checked at open): zero, as after qwen3_init
            memset(out, 0, count * sizeof *out);
        } else {
            if (st_tensor_range_to_f32(out, t, first, count, err) != 0)
                return ct_wrap(err, "%s", s->base_dir);
            if (s->base.files[t->file_index].map) {
                const size_t esize = dtype_size(t->dtype);
                fs_release_read((const char *)t->data + first * esize, count * esize);
            }
        }
        const lora_tensor *A, *B;
        if (p->ndim == 2 && lora_pair_of(&s->ad.L, p->name, &A, &B))
            lora_merge_range(out, first, count, A, B, s->ad.buf, s->scale);
        at = stop;
    }
    return 0;
}

void lora_merge_close(lora_merge_src *s) {
    peft_adapter_free(&s->ad);
    st_set_close(&s->base);
    qwen3_free(&s->m);
    memset(s, 0, sizeof *s);
}
