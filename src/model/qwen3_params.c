// Parameter I/O: the one way host code reads or writes the model's weights, which live on its
// backend. By HF name and element range for single tensors, or as a host view of the whole
// buffer for bulk I/O (checkpoints, exports), which is the buffer itself on the plain CPU
// backend, so nothing is copied there. A forward-only bf16 model (weights16) holds its matrices
// in param_bf16 only: writes round them there (to nearest even, as qwen3_refresh_bf16 does), and
// its whole-buffer view is a host copy.
#include <inttypes.h>
#include <stdlib.h>

#include "core/dtype.h"

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

static void write_tensor(const qwen3_model *m, const qwen3_param *p, size_t first, size_t count,
                         const float *in);

int qwen3_params_write(qwen3_model *m, const char *name, size_t first, size_t count,
                       const float *in, ct_error *err) {
    const qwen3_param *p = param_range(m, name, first, count, err);
    if (!p) return -1;
    write_tensor(m, p, first, count, in);
    return 0;
}

// Elements [first, first + count) of p from host fp32, into wherever the model holds p.
static void write_tensor(const qwen3_model *m, const qwen3_param *p, size_t first, size_t count,
                         const float *in) {
    if (!qwen3_param_in_bf16(m, p)) {
        m->be->write(m->be, m->param_mem + p->offset + first, in, count * sizeof(float));
        return;
    }
    uint16_t chunk[4096];
    for (size_t done = 0; done < count;) {
        const size_t n = count - done < 4096 ? count - done : 4096;
        dtype_from_f32(chunk, in + done, CT_BF16, n);
        m->be->write(m->be, m->param_bf16 + p->offset + first + done, chunk, n * sizeof *chunk);
        done += n;
    }
}

float *qwen3_params_view(const qwen3_model *m, bool fill, ct_error *err) {
    if (!m->weights16)
        return m->be->view(m->be, m->param_mem, m->num_params * sizeof(float), fill, err);
    // A host copy in the fp32 layout; the bf16-held tensors widened (exact).
    float *host = malloc(m->num_params * sizeof *host + 1);
    if (!host) {
        ct_fail(err, "out of memory for a host copy of the %zu weights", m->num_params);
        return NULL;
    }
    for (int i = 0; fill && i < m->n_params; i++) {
        const qwen3_param *p = &m->params[i];
        float *x = host + p->offset;
        if (!qwen3_param_in_bf16(m, p)) {
            m->be->read(m->be, x, m->param_mem + p->offset, p->numel * sizeof *x);
            continue;
        }
        // Read into the tensor's upper half, then widen forward: bf16 j only feeds float j.
        uint16_t *x16 = (uint16_t *)(x + p->numel) - p->numel;
        m->be->read(m->be, x16, m->param_bf16 + p->offset, p->numel * sizeof *x16);
        for (size_t j = 0; j < p->numel; j++) x[j] = bf16_to_f32(x16[j]);
    }
    return host;
}

void qwen3_params_view_release(const qwen3_model *m, float *host, bool write_back) {
    if (!m->weights16) {
        m->be->view_release(m->be, host, m->param_mem, m->num_params * sizeof(float), write_back);
        return;
    }
    for (int i = 0; write_back && i < m->n_params; i++)
        write_tensor(m, &m->params[i], 0, m->params[i].numel, host + m->params[i].offset);
    free(host);
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
