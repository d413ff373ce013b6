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

static bool ends_with(const char *s, const char *suffix) {
    const size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

qwen3_tp_cut qwen3_tp_cut_of(const char *name) {
    if (ends_with(name, "o_proj.weight") || ends_with(name, "down_proj.weight"))
        return QWEN3_TP_COLUMNS;
    static const char *const rows[] = {"embed_tokens.weight", "lm_head.weight", "q_proj.weight",
                                       "k_proj.weight",       "v_proj.weight",  "q_proj.bias",
                                       "k_proj.bias",         "v_proj.bias",    "gate_proj.weight",
                                       "up_proj.weight"};
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++)
        if (ends_with(name, rows[i])) return QWEN3_TP_ROWS;
    return QWEN3_TP_WHOLE;
}

int qwen3_tp_config(qwen3_config *local, const qwen3_config *global, int tp, int etp,
                    ct_error *err) {
    const qwen3_config *g = global;
    const struct {
        const char *what;
        int n, by;
    } cut[] = {{"num_attention_heads", g->num_attention_heads, tp},
               {"num_key_value_heads", g->num_key_value_heads, tp},
               {"intermediate_size", g->intermediate_size, tp},
               {"vocab_size", g->vocab_size, tp},
               // MoE without EP: every expert's gate/up rows and down columns are cut, as the
               // dense MLP's (the router stays whole).
               {"moe_intermediate_size", g->num_experts > 0 ? g->moe_intermediate_size : 0, etp}};
    for (size_t i = 0; i < sizeof cut / sizeof *cut; i++)
        if (cut[i].n % cut[i].by != 0)
            return ct_fail(err,
                           "parallelism.tensor_parallel_degree = %d does not divide the model's "
                           "%s = %d",
                           cut[i].by, cut[i].what, cut[i].n);
    *local = *g;
    local->num_attention_heads /= tp;
    local->num_key_value_heads /= tp;
    local->intermediate_size /= tp;
    local->vocab_size /= tp;
    local->moe_intermediate_size /= etp;
    return 0;
}
