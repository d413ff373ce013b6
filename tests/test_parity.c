// Loss parity with PyTorch, the merge gate: for every reference variant (tests/ref/make_ref.py),
// load the HF folder, run one forward and backward on the same tokens, and compare logits,
// loss and every parameter gradient with the fp32 PyTorch reference. MoE variants run with both
// expert kernels (grouped and loop) and also compare the cross-entropy, the aux loss and every
// sparse layer's expert load (the router's discrete choices must be HF's exactly).
//
// Tolerances: about 10x the worst error measured over all variants and both expert kernels
// (figures beside each; the reference in fp32 itself sits ~1e-6 from an fp64 run of the same
// model, meta.json "fp32_vs_f64"). Tight enough that a model ignoring rms_norm_eps (1e-6 or
// 1e-5 here) fails: it moves the logits by up to 5.9e-4, the loss by up to 2.6e-6 relative and
// gradients by up to 2.9e-4.
#include <stdint.h>

#include <cjson/cJSON.h>

#include "check.h"
#include "io/json.h"
#include "io/npy.h"
#include "io/safetensors.h"
#include "model/hf_adapter.h"
#include "model/moe_balance.h"

#define LOGITS_MAX_ABS 3e-5 // measured 2.6e-6 (gqa3_hd4_tied_f32_sharded)
#define LOSS_REL 1.5e-6     // loss, ce and aux; measured 1.5e-7 (moe_e8k8_nonorm_aux_tied)
#define GRAD_REL_L2 3e-5    // each tensor; measured 2.4e-6 (moe_e8k8_nonorm_aux_tied, loop)

typedef struct variant_meta {
    int B, T;
    double loss;
    int64_t n_valid;
    cJSON *root; // owns the lists below
    const cJSON *ignore, *params;
    char weights_dtype[8];
    bool moe;
    double ce, aux;        // MoE: the loss's parts
    const cJSON *moe_load; // MoE: per sparse layer, tokens per expert
} variant_meta;

static int meta_load(variant_meta *vm, const char *path, ct_error *err) {
    memset(vm, 0, sizeof *vm);
    if (json_parse_file(&vm->root, path, err) != 0) return -1;
    int64_t B = 0, T = 0, nv = 0;
    if (json_get_int(&B, vm->root, "B", true, 1, 64, path, err) ||
        json_get_int(&T, vm->root, "T", true, 1, 4096, path, err) ||
        json_get_int(&nv, vm->root, "n_valid", true, 1, INT32_MAX, path, err) ||
        json_get_double(&vm->loss, vm->root, "loss", true, path, err) ||
        json_get_string(vm->weights_dtype, sizeof vm->weights_dtype, vm->root, "weights_dtype",
                        true, path, err))
        return -1;
    vm->B = (int)B, vm->T = (int)T, vm->n_valid = nv;
    vm->ignore = cJSON_GetObjectItemCaseSensitive(vm->root, "ignore_positions");
    vm->params = cJSON_GetObjectItemCaseSensitive(vm->root, "params");
    if (!cJSON_IsArray(vm->ignore) || !cJSON_IsArray(vm->params))
        return ct_fail(err, "%s: ignore_positions and params must be arrays", path);
    if (json_get_bool(&vm->moe, vm->root, "moe", false, path, err) != 0) return -1;
    if (!vm->moe) return 0;
    vm->moe_load = cJSON_GetObjectItemCaseSensitive(vm->root, "moe_load");
    if (json_get_double(&vm->ce, vm->root, "ce", true, path, err) ||
        json_get_double(&vm->aux, vm->root, "aux", true, path, err))
        return -1;
    if (!cJSON_IsArray(vm->moe_load))
        return ct_fail(err, "%s: moe_load must be an array of per-layer counts", path);
    return 0;
}

// torchtitan windows: sample b = tokens[b*(T+1), (b+1)*(T+1)); input its first T, labels its
// last T; then the listed target positions are ignored.
static int make_batch(int32_t *inputs, int32_t *targets, const char *npy_path,
                      const variant_meta *vm, int vocab, ct_error *err) {
    npy_tokens tok;
    if (npy_open(&tok, npy_path, err) != 0) return -1;
    size_t win = (size_t)vm->T + 1, need = (size_t)vm->B * win;
    int32_t *stream = malloc(need * sizeof *stream);
    int rc = stream ? npy_read(stream, &tok, 0, need, vocab, err) : ct_fail(err, "oom");
    npy_close(&tok);
    if (rc == 0) {
        for (int b = 0; b < vm->B; b++) {
            memcpy(inputs + (size_t)b * vm->T, stream + b * win, vm->T * sizeof *inputs);
            memcpy(targets + (size_t)b * vm->T, stream + b * win + 1, vm->T * sizeof *targets);
        }
        const cJSON *it;
        cJSON_ArrayForEach(it, vm->ignore) {
            uint64_t i;
            if (!json_is_uint(it, &i) || i >= (uint64_t)vm->B * vm->T) {
                rc = ct_fail(err, "bad ignore position");
                break;
            }
            targets[i] = QWEN3_IGNORE_INDEX;
        }
    }
    free(stream);
    return rc;
}

// Tensors the reference has gradients for: every parameter but buffers (the expert bias).
static int trained_tensors(const qwen3_model *m) {
    int n = 0;
    for (int i = 0; i < m->n_params; i++) n += !m->params[i].buffer;
    return n;
}

// Compares the model's gradients with expected.safetensors, tensor by tensor.
static void compare_grads(double *worst, char *worst_name, size_t cap, const qwen3_model *m,
                          const st_file *exp, const variant_meta *vm, const char *variant) {
    const cJSON *it;
    int n = 0;
    float *buf = NULL;
    cJSON_ArrayForEach(it, vm->params) {
        n++;
        const char *name = cJSON_GetStringValue(it);
        const qwen3_param *p = name ? qwen3_find_param(m, name) : NULL;
        const st_tensor *t = name ? st_file_find(exp, name) : NULL;
        CHECK(p && t, "%s: parameter %s: in model %d, in reference %d", variant, name ? name : "?",
              p != NULL, t != NULL);
        if (!p || !t) continue;
        CHECK(t->numel == p->numel, "%s: %s numel %zu vs %llu", variant, name, p->numel,
              (unsigned long long)t->numel);
        if (t->numel != p->numel) continue;
        float *grown = realloc(buf, p->numel * sizeof *buf);
        if (!grown) break;
        buf = grown;
        ct_error err;
        if (st_tensor_to_f32(buf, t, &err) != 0) continue;
        double rel = check_rel_l2(m->grad_mem + p->offset, buf, p->numel);
        CHECK(rel <= GRAD_REL_L2, "%s: grad %s: rel L2 %.3e > %.0e", variant, name, rel,
              GRAD_REL_L2);
        if (!(rel <= *worst)) {
            *worst = rel;
            snprintf(worst_name, cap, "%s", name);
        }
    }
    free(buf);
    CHECK(n == trained_tensors(m), "%s: reference has %d parameters, model %d", variant, n,
          trained_tensors(m));
}

// Loads per sparse layer and expert must equal the reference's counts exactly.
static void compare_moe_load(const qwen3_model *m, const moe_balance *bal, const variant_meta *vm,
                             const char *variant) {
    const int E = m->cfg.num_experts;
    CHECK(cJSON_GetArraySize(vm->moe_load) == m->n_sparse, "%s: %d sparse layers, reference %d",
          variant, m->n_sparse, cJSON_GetArraySize(vm->moe_load));
    int s = 0, bad = 0;
    const cJSON *layer, *count;
    cJSON_ArrayForEach(layer, vm->moe_load) {
        int e = 0;
        cJSON_ArrayForEach(count, layer) {
            if (s < m->n_sparse && e < E && bal->load[(size_t)s * E + e] != count->valuedouble)
                bad++;
            e++;
        }
        CHECK(e == E, "%s: sparse layer %d: %d experts in the reference, model %d", variant, s, e,
              E);
        s++;
    }
    CHECK(bad == 0, "%s: %d (layer, expert) loads differ from the reference's routing", variant,
          bad);
}

static void run_variant(const char *ref, const char *variant, const char *moe_impl) {
    char path[4096], hf[4096];
    ct_error err;
    variant_meta vm;
    snprintf(path, sizeof path, "%s/%s/meta.json", ref, variant);
    int rc = meta_load(&vm, path, &err);
    CHECK(rc == 0, "%s", err.msg);
    if (rc != 0) {
        cJSON_Delete(vm.root);
        return;
    }
    qwen3_model m;
    hf_load_report rep;
    ct_ops ops;
    CHECK(ct_ops_with_moe_impl(&ops, &ct_ops_cpu, moe_impl) == 0, "moe_impl %s", moe_impl);
    snprintf(hf, sizeof hf, "%s/%s/hf", ref, variant);
    rc = hf_load_folder(&m, &rep, hf, &ops, &err);
    CHECK(rc == 0, "%s: %s", variant, err.msg);
    if (rc != 0) {
        hf_report_free(&rep);
        cJSON_Delete(vm.root);
        return;
    }
    CHECK(rep.n_missing == 0 && rep.n_unexpected == 0 && rep.n_loaded == trained_tensors(&m),
          "%s: loaded %d of %d, missing %d, unexpected %d", variant, rep.n_loaded,
          trained_tensors(&m), rep.n_missing, rep.n_unexpected);
    CHECK(vm.moe == (m.n_sparse > 0), "%s: reference says moe %d, model has %d sparse layers",
          variant, vm.moe, m.n_sparse);
    CHECK(strcmp(dtype_name(rep.source_dtype), vm.weights_dtype) == 0 && !rep.mixed_dtypes,
          "%s: source dtype %s, expected %s", variant, dtype_name(rep.source_dtype),
          vm.weights_dtype);

    size_t N = (size_t)vm.B * vm.T, V = (size_t)m.cfg.vocab_size;
    int32_t *inputs = malloc(N * sizeof *inputs), *targets = malloc(N * sizeof *targets);
    float *logits_nt = malloc(N * V * sizeof *logits_nt);
    st_file exp = {0};
    snprintf(path, sizeof path, "%s/%s/tokens.npy", ref, variant);
    rc = make_batch(inputs, targets, path, &vm, m.cfg.vocab_size, &err);
    if (rc == 0) rc = qwen3_plan(&m, vm.B, vm.T, &err);
    // MoE: the balance component counts the routing; HF's loss adds router_aux_loss_coef * aux
    // when output_router_logits, and the backward then its gradient.
    moe_balance bal = {0};
    if (rc == 0)
        rc = moe_balance_init(&bal, &m, 1, NULL, NULL,
                              m.cfg.output_router_logits ? (float)m.cfg.router_aux_loss_coef : 0.0f,
                              &err);
    if (rc == 0) {
        snprintf(path, sizeof path, "%s/%s/expected.safetensors", ref, variant);
        rc = st_open(&exp, path, &err);
    }
    CHECK(rc == 0, "%s: %s", variant, err.msg);
    const st_tensor *lt = rc == 0 ? st_file_find(&exp, "logits") : NULL;
    CHECK(rc != 0 || (lt && lt->dtype == CT_F32 && lt->numel == N * V),
          "%s: expected.safetensors has no (B,T,V) F32 logits", variant);
    if (rc == 0 && lt && lt->numel == N * V && lt->dtype == CT_F32) {
        // Logits alone first (no targets), then the loss pass; both must match.
        qwen3_forward(&m, &(qwen3_batch){.inputs = inputs}, NULL);
        memcpy(logits_nt, m.logits, N * V * sizeof *logits_nt);
        int64_t n_valid = 0;
        double sum =
            qwen3_forward(&m, &(qwen3_batch){.inputs = inputs, .targets = targets}, &n_valid);
        double ce = n_valid ? sum / (double)n_valid : NAN, loss = ce, aux = 0;
        if (vm.moe) compare_moe_load(&m, &bal, &vm, variant); // the forward's routing
        float *want = malloc(N * V * sizeof *want);
        st_tensor_to_f32(want, lt, &err);
        double lmax = check_max_abs(m.logits, want, N * V);
        double lmax_nt = check_max_abs(logits_nt, want, N * V);
        free(want);

        qwen3_zero_grad(&m);
        qwen3_backward(&m, 1.0f / (float)n_valid);
        if (vm.moe) {
            aux = moe_balance_aux(&bal); // of the statistics the backward reduced
            if (m.cfg.output_router_logits) loss += m.cfg.router_aux_loss_coef * aux;
            double ce_rel = fabs(ce - vm.ce) / fabs(vm.ce);
            double aux_rel = fabs(aux - vm.aux) / fabs(vm.aux);
            CHECK(ce_rel <= LOSS_REL, "%s/%s: ce %.8f vs %.8f (rel %.3e)", variant, moe_impl, ce,
                  vm.ce, ce_rel);
            CHECK(aux_rel <= LOSS_REL, "%s/%s: aux %.8f vs %.8f (rel %.3e)", variant, moe_impl, aux,
                  vm.aux, aux_rel);
        }
        double loss_rel = fabs(loss - vm.loss) / fabs(vm.loss);
        CHECK(n_valid == vm.n_valid, "%s: n_valid %lld, expected %lld", variant, (long long)n_valid,
              (long long)vm.n_valid);
        CHECK(lmax <= LOGITS_MAX_ABS, "%s: logits max abs err %.3e", variant, lmax);
        CHECK(lmax_nt <= LOGITS_MAX_ABS, "%s: logits (no targets) max abs err %.3e", variant,
              lmax_nt);
        CHECK(loss_rel <= LOSS_REL, "%s: loss %.8f vs %.8f (rel %.3e)", variant, loss, vm.loss,
              loss_rel);
        double gworst = 0;
        char gname[128] = "";
        compare_grads(&gworst, gname, sizeof gname, &m, &exp, &vm, variant);
        printf("%-34s %-4s %-7s logits max abs %.2e  loss %.6f rel %.2e  grads max rel L2 %.2e "
               "(%s)\n",
               variant, vm.weights_dtype, vm.moe ? moe_impl : "", lmax, loss, loss_rel, gworst,
               gname);
    }
    st_close(&exp);
    moe_balance_free(&bal);
    free(inputs);
    free(targets);
    free(logits_nt);
    qwen3_free(&m);
    hf_report_free(&rep);
    cJSON_Delete(vm.root);
}

int main(void) {
    const char *ref = check_env("CTITAN_REF_DIR");
    char path[4096];
    ct_error err;
    cJSON *index = NULL;
    snprintf(path, sizeof path, "%s/index.json", ref);
    int rc = json_parse_file(&index, path, &err);
    CHECK(rc == 0, "reference data missing (did ref_generate run?): %s", err.msg);
    const cJSON *vs = rc == 0 ? cJSON_GetObjectItemCaseSensitive(index, "variants") : NULL;
    int n = cJSON_IsArray(vs) ? cJSON_GetArraySize(vs) : 0;
    CHECK(n > 0, "%s: no variants", path);
    const cJSON *it;
    if (n > 0) {
        cJSON_ArrayForEach(it, vs) {
            const char *name = cJSON_GetStringValue(it);
            CHECK(name != NULL, "%s: variant name is not a string", path);
            if (!name) continue;
            run_variant(ref, name, "grouped");
            // A MoE variant also runs the reference expert kernel.
            snprintf(path, sizeof path, "%s/%s/hf/config.json", ref, name);
            qwen3_config cfg;
            if (qwen3_config_load(&cfg, path, &err) == 0 && cfg.num_experts > 0)
                run_variant(ref, name, "loop");
        }
    }
    cJSON_Delete(index);
    return check_summary();
}
