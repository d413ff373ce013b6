// The parallelize plan: the units from the layout walk, each tensor's unit and split.
#include "model/qwen3_parallelize.h"

#include <stdlib.h>
#include <string.h>

int qwen3_parallelize(qwen3_parallel_plan *p, const qwen3_config *cfg, const qwen3_model *m,
                      ct_error *err) {
    memset(p, 0, sizeof *p);
    const int n = qwen3_n_units(cfg), nt = m ? m->n_params : 0;
    p->unit_lo = malloc(2 * (size_t)n * sizeof *p->unit_lo);
    p->tensors = nt ? malloc((size_t)nt * sizeof *p->tensors) : NULL;
    if (!p->unit_lo || (nt && !p->tensors)) {
        qwen3_parallel_plan_free(p);
        return ct_fail(err, "out of memory for the parallelize plan");
    }
    p->n_units = n;
    p->unit_hi = p->unit_lo + n;
    p->tied = cfg->tie_word_embeddings;
    qwen3_units(cfg, p->unit_lo, p->unit_hi);
    p->n_tensors = nt;
    for (int i = 0, u = 0; i < nt; i++) {
        const qwen3_param *q = &m->params[i];
        while (q->offset >= p->unit_hi[u]) u++;
        p->tensors[i] = (qwen3_plan_tensor){q->offset, q->offset + q->numel, u,
                                            q->buffer ? QWEN3_SPLIT_WHOLE : QWEN3_SPLIT_SHARD};
        if (q->buffer) p->n_whole += q->numel;
    }
    return 0;
}

void qwen3_parallel_plan_free(qwen3_parallel_plan *p) {
    free(p->unit_lo);
    free(p->tensors);
    memset(p, 0, sizeof *p);
}
