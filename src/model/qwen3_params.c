// Parameter I/O: the one way host code reads or writes the model's weights, which live on its
// backend. By HF name and element range for single tensors, or as a host view of the whole
// buffer for bulk I/O (checkpoints, exports), which is the buffer itself on the plain CPU
// backend, so nothing is copied there.
#include <inttypes.h>

#include "model/qwen3.h"

static const qwen3_param *param_range(const qwen3_model *m, const char *name, size_t first,
                                      size_t count, ct_error *err) {
    const qwen3_param *p = qwen3_find_param(m, name);
    if (!p) {
        ct_fail(err, "no parameter named \"%s\"", name);
        return NULL;
    }
    if (first > p->numel || count > p->numel - first) {
        ct_fail(err, "\"%s\": elements [%zu, %zu) are outside its %zu", name, first, first + count,
                p->numel);
        return NULL;
    }
    return p;
}

int qwen3_params_write(qwen3_model *m, const char *name, size_t first, size_t count,
                       const float *in, ct_error *err) {
    const qwen3_param *p = param_range(m, name, first, count, err);
    if (!p) return -1;
    m->be->write(m->be, m->param_mem + p->offset + first, in, count * sizeof(float));
    return 0;
}

float *qwen3_params_view(const qwen3_model *m, bool fill, ct_error *err) {
    return m->be->view(m->be, m->param_mem, m->num_params * sizeof(float), fill, err);
}

void qwen3_params_view_release(const qwen3_model *m, float *host, bool write_back) {
    m->be->view_release(m->be, host, m->param_mem, m->num_params * sizeof(float), write_back);
}

int qwen3_params_first_nonfinite(const qwen3_model *m, const qwen3_param **param, size_t *at,
                                 float *value) {
    for (int i = 0; i < m->n_params; i++) {
        const qwen3_param *p = &m->params[i];
        size_t first;
        m->ops->first_nonfinite(&first, m->param_mem + p->offset, p->numel);
        if (first == SIZE_MAX) continue;
        *param = p, *at = first;
        m->be->read(m->be, value, m->param_mem + p->offset + first, sizeof *value);
        return 1;
    }
    return 0;
}

uint64_t qwen3_params_hash(const qwen3_model *m) {
    uint64_t h;
    m->ops->hash_xxh64(&h, m->param_mem, m->num_params * sizeof(float));
    return h;
}
