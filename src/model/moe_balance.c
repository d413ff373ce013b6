// MoE load balancing (moe_balance.h). All arithmetic here is on host copies of the statistics;
// the backend buffers are read in collect, and the model's memory written in add_expert_bias,
// nowhere else.
#include "model/moe_balance.h"

#include <stdlib.h>
#include <string.h>

#include "model/qwen3_internal.h"

static size_t stat_count(const moe_balance *b) {
    return (size_t)b->n_sparse * b->E;
}

int moe_balance_init(moe_balance *b, qwen3_model *m, int ranks, moe_balance_sum_fn sum,
                     void *sum_ctx, float aux_scale, ct_error *err) {
    *b = (moe_balance){0};
    if (m->n_sparse == 0) return 0;
    b->m = m;
    b->n_sparse = m->n_sparse;
    b->E = m->cfg.num_experts;
    b->sum = sum;
    b->sum_ctx = sum_ctx;
    b->aux_scale = aux_scale;
    const size_t n = stat_count(b);
    ct_backend *be = m->be;
    if (!(b->load = be->alloc(be, n * sizeof(double), "MoE loads", err)) ||
        !(b->prob = be->alloc(be, n * sizeof(double), "MoE probs", err))) {
        moe_balance_free(b);
        return -1;
    }
    b->stats = calloc(2 * n + 1, sizeof *b->stats);
    b->step_load = calloc(n, sizeof *b->step_load);
    b->balance = calloc((size_t)b->n_sparse, sizeof *b->balance);
    b->scratch = calloc((2 * n + 1) * (size_t)(ranks > 1 ? ranks : 1), sizeof *b->scratch);
    b->dprob = calloc((size_t)b->E, sizeof *b->dprob);
    b->sums = calloc(MOE_SUMS(b->E), sizeof *b->sums);
    b->bias_delta = calloc(n, sizeof *b->bias_delta);
    if (!b->stats || !b->step_load || !b->balance || !b->scratch || !b->dprob || !b->sums ||
        !b->bias_delta) {
        moe_balance_free(b);
        return ct_fail(err, "out of memory for the MoE routing statistics");
    }
    m->balance = b;
    return 0;
}

void moe_balance_free(moe_balance *b) {
    if (b->m) {
        if (b->m->balance == b) b->m->balance = NULL;
        ct_backend *be = b->m->be;
        if (b->n_sets == 0) be->free(be, b->load), be->free(be, b->prob);
        for (int j = 0; j < b->n_sets; j++) // the init's pair among them
            be->free(be, b->set_load[j]), be->free(be, b->set_prob[j]);
    }
    free(b->set_load);
    free(b->set_prob);
    free(b->stats);
    free(b->step_load);
    free(b->balance);
    free(b->scratch);
    free(b->dprob);
    free(b->sums);
    free(b->bias_delta);
    *b = (moe_balance){0};
}

int moe_balance_sets(moe_balance *b, int n, ct_error *err) {
    if (n <= 1 || b->n_sparse == 0) return 0;
    if (b->n_sets) return ct_fail(err, "moe_balance_sets: the sets are made once");
    b->set_load = calloc((size_t)n, sizeof *b->set_load);
    b->set_prob = calloc((size_t)n, sizeof *b->set_prob);
    if (!b->set_load || !b->set_prob) {
        free(b->set_load);
        free(b->set_prob);
        b->set_load = b->set_prob = NULL;
        return ct_fail(err, "out of memory for the MoE routing statistics' sets");
    }
    b->set_load[0] = b->load, b->set_prob[0] = b->prob;
    b->n_sets = n; // from here moe_balance_free frees the pairs made
    const size_t bytes = stat_count(b) * sizeof(double);
    ct_backend *be = b->m->be;
    for (int j = 1; j < n; j++)
        if (!(b->set_load[j] = be->alloc(be, bytes, "MoE loads", err)) ||
            !(b->set_prob[j] = be->alloc(be, bytes, "MoE probs", err)))
            return -1;
    return 0;
}

void moe_balance_use_set(moe_balance *b, int j) {
    if (j < 0 || j >= b->n_sets) return; // one pair: always it
    b->load = b->set_load[j];
    b->prob = b->set_prob[j];
}

void moe_balance_forward_begin(moe_balance *b, int64_t tokens) {
    if (b->n_sparse == 0) return;
    const size_t n = stat_count(b);
    ct_backend *be = b->m->be;
    be->zero(be, b->load, n * sizeof *b->load);
    be->zero(be, b->prob, n * sizeof *b->prob);
    b->tokens = (double)tokens;
}

// The one reader of the routers' statistics: the last forward's load, prob and token count into
// b->stats.
static void collect(moe_balance *b) {
    const size_t n = stat_count(b);
    ct_backend *be = b->m->be;
    be->read(be, b->stats, b->load, n * sizeof *b->stats);
    be->read(be, b->stats + n, b->prob, n * sizeof *b->stats);
    b->stats[2 * n] = b->tokens;
}

// Sums the collected statistics over the ranks, so they are the global micro-batch's, then adds
// its loads to the step's.
static int reduce(moe_balance *b) {
    const size_t n = stat_count(b);
    if (b->sum && b->sum(b->sum_ctx, b->stats, (int)(2 * n + 1), b->scratch, &b->err) != 0)
        return -1;
    for (size_t i = 0; i < n; i++) b->step_load[i] += b->stats[i];
    return 0;
}

int moe_balance_status(moe_balance *b, ct_error *err) {
    if (!b->failed) return 0;
    b->failed = 0;
    if (err) *err = b->err;
    return -1;
}

// Expert e's statistic summed over the sparse layers (layout of b->stats).
static double over_layers(const moe_balance *b, const double *stat, int e) {
    double sum = 0;
    for (int s = 0; s < b->n_sparse; s++) sum += stat[(size_t)s * b->E + e];
    return sum;
}

double moe_balance_aux_of(int E, const double *sums) {
    const double rows = sums[2 * E];
    if (!(rows > 0)) return 0.0;
    double sum = 0;
    for (int e = 0; e < E; e++) sum += sums[e] * sums[E + e];
    return E * sum / (rows * rows);
}

double moe_balance_aux(const moe_balance *b) {
    return b->n_sparse ? moe_balance_aux_of(b->E, b->whole ? b->whole : b->sums) : 0.0;
}

void moe_balance_add_sums(moe_balance *b, double *sums) {
    if (b->n_sparse == 0) return;
    const size_t n = stat_count(b);
    ct_backend *be = b->m->be;
    double *raw = b->scratch; // (2n + 1) at least
    be->read(be, raw, b->load, n * sizeof *raw);
    be->read(be, raw + n, b->prob, n * sizeof *raw);
    for (int e = 0; e < b->E; e++) {
        sums[e] += over_layers(b, raw, e);
        sums[b->E + e] += over_layers(b, raw + n, e);
    }
    sums[2 * b->E] += b->tokens * b->n_sparse;
}

// The last forward's statistics, read and summed over the ranks (the step's loads grow by
// them). 0, or -1 with b->failed set.
static int take_forward(moe_balance *b) {
    collect(b);
    if (reduce(b) != 0) {
        b->failed = 1;
        return -1;
    }
    const size_t n = stat_count(b);
    for (int e = 0; e < b->E; e++) {
        b->sums[e] = over_layers(b, b->stats, e);
        b->sums[b->E + e] = over_layers(b, b->stats + n, e);
    }
    b->sums[2 * b->E] = b->stats[2 * n] * b->n_sparse;
    return 0;
}

int moe_balance_forward_end(moe_balance *b, ct_error *err) {
    if (b->n_sparse == 0 || take_forward(b) == 0) return 0;
    return moe_balance_status(b, err);
}

const float *moe_balance_backward_begin(moe_balance *b) {
    if (b->n_sparse == 0 || take_forward(b) != 0) return NULL;
    const int E = b->E;
    const double *sums = b->whole ? b->whole : b->sums;
    const double rows = sums[2 * E];
    if (b->aux_scale == 0.0f || !(rows > 0)) return NULL;
    // d aux / d probs[n, e] = E * load_e / rows^2 for every token of every sparse layer: the
    // one-hot counts are constants, as in HF.
    for (int e = 0; e < E; e++) b->dprob[e] = (float)(b->aux_scale * E * sums[e] / (rows * rows));
    return b->dprob;
}

// Writes model memory: every sparse layer's expert_bias += its row of delta, in layer order,
// through `row` (E floats of host scratch).
static void add_expert_bias(qwen3_model *m, const float *delta, float *row, int E) {
    int s = 0;
    for (int l = 0; l < m->cfg.num_hidden_layers; l++) {
        float *bias = m->w.layers[l].expert_bias;
        if (!bias) continue;
        const float *d = delta + (size_t)s++ * E;
        m->be->read(m->be, row, bias, (size_t)E * sizeof *row);
        for (int e = 0; e < E; e++) row[e] += d[e];
        m->be->write(m->be, bias, row, (size_t)E * sizeof *row);
    }
}

static void update_bias(moe_balance *b, float coeff) {
    const int E = b->E;
    for (int s = 0; s < b->n_sparse; s++) {
        const double *count = b->step_load + (size_t)s * E;
        float *delta = b->bias_delta + (size_t)s * E;
        double total = 0;
        for (int e = 0; e < E; e++) total += count[e];
        const float mean = (float)(total / E);
        float dsum = 0;
        for (int e = 0; e < E; e++) {
            const float diff = mean - (float)count[e];
            dsum += coeff * (float)((diff > 0) - (diff < 0));
        }
        const float dmean = dsum / (float)E;
        for (int e = 0; e < E; e++) {
            const float diff = mean - (float)count[e];
            delta[e] = coeff * (float)((diff > 0) - (diff < 0)) - dmean;
        }
    }
    if (b->add_bias)
        b->add_bias(b->add_bias_ctx, b->bias_delta);
    else
        add_expert_bias(b->m, b->bias_delta, b->dprob, E);
}

void moe_balance_end_step(moe_balance *b, bool update, float coeff) {
    if (b->n_sparse == 0) return;
    const int E = b->E;
    for (int s = 0; s < b->n_sparse; s++) {
        const double *load = b->step_load + (size_t)s * E;
        double sum = 0, most = 0;
        for (int e = 0; e < E; e++) {
            sum += load[e];
            if (load[e] > most) most = load[e];
        }
        b->balance[s] = sum > 0 ? most / (sum / E) : 0;
    }
    if (update) update_bias(b, coeff);
    memset(b->step_load, 0, stat_count(b) * sizeof *b->step_load);
}

const double *moe_balance_metric(const moe_balance *b) {
    return b->balance;
}
