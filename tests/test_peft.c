// PEFT's adapter folder (model/peft_adapter.c) and the merge (model/lora_merge.c): the config
// both ways (PEFT's own JSON read; ours written with sorted keys and read back the same), every
// refusal in one line naming the key or tensor, the tensors bit-identical through a write and a
// read, values from a file in any key order landing at the layout's offsets, and the merge equal
// to a float64 W + s * B @ A (tests/peft_merge.py checks the merged export against numpy).
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "check.h"
#include "core/rng.h"
#include "model/flavors.h"
#include "model/lora_merge.h"
#include "model/peft_adapter.h"

static const char *tmp;

// PEFT 0.17's save_pretrained output for a Qwen3 adapter (json.dumps indent=2, sort_keys).
static const char peft_json[] =
    "{\n  \"alpha_pattern\": {},\n  \"auto_mapping\": null,\n"
    "  \"base_model_name_or_path\": \"Qwen/Qwen3-0.6B\",\n  \"bias\": \"none\",\n"
    "  \"corda_config\": null,\n  \"eva_config\": null,\n  \"exclude_modules\": null,\n"
    "  \"fan_in_fan_out\": false,\n  \"inference_mode\": true,\n  \"init_lora_weights\": true,\n"
    "  \"layer_replication\": null,\n  \"layers_pattern\": null,\n"
    "  \"layers_to_transform\": null,\n  \"loftq_config\": {},\n  \"lora_alpha\": 32,\n"
    "  \"lora_bias\": false,\n  \"lora_dropout\": 0.05,\n  \"megatron_config\": null,\n"
    "  \"megatron_core\": \"megatron.core\",\n  \"modules_to_save\": null,\n"
    "  \"peft_type\": \"LORA\",\n  \"peft_version\": \"0.17.1\",\n  \"qalora_group_size\": 16,\n"
    "  \"r\": 16,\n  \"rank_pattern\": {},\n  \"revision\": null,\n  \"target_modules\": [\n"
    "    \"v_proj\",\n    \"q_proj\",\n    \"down_proj\"\n  ],\n  \"target_parameters\": null,\n"
    "  \"task_type\": \"CAUSAL_LM\",\n  \"trainable_token_indices\": null,\n"
    "  \"use_dora\": false,\n  \"use_qalora\": false,\n  \"use_rslora\": false\n}";

// peft_json with `from` replaced by `to`.
static char *edited(const char *from, const char *to) {
    static char buf[4096];
    const char *at = strstr(peft_json, from);
    if (!at) {
        fprintf(stderr, "test bug: %s not in the config\n", from);
        exit(2);
    }
    snprintf(buf, sizeof buf, "%.*s%s%s", (int)(at - peft_json), peft_json, to, at + strlen(from));
    return buf;
}

static void test_config(void) {
    peft_config pc, back;
    ct_error err = {{0}};
    CHECK(peft_config_parse(&pc, peft_json, strlen(peft_json), "a.json", &err) == 0, "%s", err.msg);
    CHECK(pc.lc.rank == 16 && pc.lc.alpha == 32.0f && pc.lc.dropout == 0.05f && !pc.lc.use_rslora,
          "r %d alpha %g dropout %g", pc.lc.rank, (double)pc.lc.alpha, (double)pc.lc.dropout);
    CHECK(pc.lc.targets == ((1u << LORA_Q) | (1u << LORA_V) | (1u << LORA_DOWN)), "targets %#x",
          pc.lc.targets);
    CHECK(strcmp(pc.base_model, "Qwen/Qwen3-0.6B") == 0, "base %s", pc.base_model);

    // Ours: keys sorted, target_modules an explicit sorted list, read back the same, stable.
    pc.lc.targets = LORA_ALL_LINEAR, pc.lc.use_rslora = true, pc.lc.alpha = 7.5f;
    char *t1 = NULL, *t2 = NULL;
    size_t n1 = 0, n2 = 0;
    CHECK(peft_config_text(&t1, &n1, &pc, &err) == 0, "%s", err.msg);
    CHECK(peft_config_parse(&back, t1, n1, "ours.json", &err) == 0, "%s", err.msg);
    CHECK(memcmp(&back.lc, &pc.lc, sizeof pc.lc) == 0 &&
              strcmp(back.base_model, pc.base_model) == 0,
          "read back differently");
    CHECK(peft_config_text(&t2, &n2, &back, &err) == 0 && n1 == n2 && memcmp(t1, t2, n1) == 0,
          "not stable");
    CHECK(strstr(t1, "\"target_modules\": [\n    \"down_proj\",\n    \"gate_proj\",\n    "
                     "\"k_proj\",\n    \"o_proj\",\n    \"q_proj\",\n    \"up_proj\",\n    "
                     "\"v_proj\"\n  ],") != NULL,
          "%s", t1);
    CHECK(strstr(t1, "\"lora_alpha\": 7.5,") && strstr(t1, "\"lora_dropout\": 0.05,") &&
              strstr(t1, "\"use_rslora\": true\n}") && strstr(t1, "\"task_type\": \"CAUSAL_LM\""),
          "%s", t1);
    cJSON *root = cJSON_Parse(t1);
    int sorted = root != NULL, n_keys = 0;
    for (const cJSON *x = root ? root->child : NULL; x; x = x->next, n_keys++)
        if (x->next && strcmp(x->string, x->next->string) >= 0) sorted = 0;
    CHECK(sorted && n_keys == 25, "keys not sorted (%d keys)", n_keys);
    cJSON_Delete(root);
    free(t1);
    free(t2);

    // PEFT's defaults fill what is absent; unknown fields are ignored.
    const char *small = "{\"peft_type\": \"LORA\", \"target_modules\": \"all-linear\", "
                        "\"some_future_field\": {\"x\": [1]}, \"task_type\": null}";
    CHECK(peft_config_parse(&pc, small, strlen(small), "s.json", &err) == 0, "%s", err.msg);
    CHECK(pc.lc.rank == 8 && pc.lc.alpha == 8.0f && pc.lc.dropout == 0.0f &&
              pc.lc.targets == LORA_ALL_LINEAR && pc.base_model[0] == '\0',
          "defaults");

    // Each refusal: one line naming the file and the key, with what was found.
    static const struct {
        const char *from, *to, *needle;
    } bad[] = {
        {"\"LORA\"", "\"IA3\"", "\"peft_type\": expected \"LORA\", found \"IA3\""},
        {"\"CAUSAL_LM\"", "\"SEQ_CLS\"", "\"task_type\": expected \"CAUSAL_LM\""},
        {"\"bias\": \"none\"", "\"bias\": \"lora_only\"", "\"bias\": expected \"none\""},
        {"[\n    \"v_proj\",\n    \"q_proj\",\n    \"down_proj\"\n  ]", "\".*(q|v)_proj\"",
         "regular expression \".*(q|v)_proj\""},
        {"\"q_proj\"", "\"lm_head\"", "unknown module \"lm_head\""},
        {"\"use_dora\": false", "\"use_dora\": true", "\"use_dora\": true is not supported"},
        {"\"modules_to_save\": null", "\"modules_to_save\": [\"lm_head\"]", "\"modules_to_save\""},
        {"\"rank_pattern\": {}", "\"rank_pattern\": {\"q_proj\": 4}", "\"rank_pattern\""},
        {"\"alpha_pattern\": {}", "\"alpha_pattern\": {\"q_proj\": 4}", "\"alpha_pattern\""},
        {"\"layers_to_transform\": null", "\"layers_to_transform\": [0]", "layers_to_transform"},
        {"\"fan_in_fan_out\": false", "\"fan_in_fan_out\": true", "\"fan_in_fan_out\""},
        {"\"lora_bias\": false", "\"lora_bias\": true", "\"lora_bias\""},
        {"\"r\": 16", "\"r\": 0", "\"r\""},
        {"\"lora_dropout\": 0.05", "\"lora_dropout\": 1.5", "dropout"},
        {"\"target_modules\"", "\"target_modules_\"", "\"target_modules\": absent"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *text = edited(bad[i].from, bad[i].to);
        err.msg[0] = '\0';
        int rc = peft_config_parse(&pc, text, strlen(text), "bad.json", &err);
        CHECK(rc != 0 && strstr(err.msg, "bad.json") && strstr(err.msg, bad[i].needle) &&
                  !strchr(err.msg, '\n'),
              "case %zu (%s): %s", i, bad[i].needle, err.msg);
    }
}

// Uniform in [-1, 1): element k of a splitmix64 stream.
static float rand_sym(uint64_t *k) {
    return (float)(ct_splitmix64_uniform_at(31, (*k)++) * 2.0 - 1.0);
}

// A small geometry of `flavor`: layers cut to 3 (an MoE one with its middle layer dense).
static void tiny(qwen3_config *c, const char *flavor) {
    ct_error err;
    if (flavor_lookup(c, flavor, &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        exit(2);
    }
    c->num_hidden_layers = 3;
    if (c->num_experts) c->n_mlp_only_layers = 1, c->mlp_only_layers[0] = 1;
}

static int open_written(st_file *f, const char *path, const st_entry *e, int n, ct_dtype dt) {
    ct_error err;
    if (st_write(path, e, n, dt, &err) != 0 || st_open(f, path, &err) != 0) {
        CHECK(0, "%s", err.msg);
        return -1;
    }
    return 0;
}

// The layout's tensors as entries (key spelled with or without PeftModel's prefix).
static st_entry *entries_of(const lora_layout *L, const float *buf, char (*names)[200],
                            bool prefixed) {
    st_entry *e = calloc((size_t)L->n, sizeof *e);
    for (int i = 0; i < L->n; i++) {
        snprintf(names[i], 200, "%s",
                 prefixed ? L->t[i].name : L->t[i].name + strlen("base_model.model."));
        e[i] = (st_entry){.name = names[i],
                          .data = buf + L->t[i].offset,
                          .ndim = 2,
                          .shape = {L->t[i].shape[0], L->t[i].shape[1]}};
    }
    return e;
}

static void test_tensors(const char *flavor, unsigned targets) {
    qwen3_config cfg;
    tiny(&cfg, flavor);
    lora_config lc = {.rank = 4, .alpha = 8, .dropout = 0, .targets = targets};
    lora_layout L;
    ct_error err = {{0}};
    if (lora_layout_init(&L, &cfg, &lc, &err) != 0) {
        CHECK(0, "%s", err.msg);
        return;
    }
    uint64_t r = 0;
    float *buf = malloc(L.num * sizeof *buf), *back = malloc(L.num * sizeof *back);
    for (size_t i = 0; i < L.num; i++) buf[i] = rand_sym(&r);
    char dir[1024], path[1100];
    snprintf(dir, sizeof dir, "%s/%s", tmp, flavor);
    peft_config pc = {.lc = lc};
    snprintf(pc.base_model, sizeof pc.base_model, "tiny/%s", flavor);

    // Folder round trip: bit-identical.
    CHECK(peft_adapter_save(dir, &pc, &L, buf, &err) == 0, "%s", err.msg);
    peft_adapter a;
    CHECK(peft_adapter_load(&a, dir, &cfg, &err) == 0, "%s: %s", flavor, err.msg);
    CHECK(a.L.num == L.num && a.buf && memcmp(a.buf, buf, L.num * sizeof *buf) == 0 &&
              strcmp(a.pc.base_model, pc.base_model) == 0,
          "%s: round trip differs", flavor);
    peft_adapter_free(&a);

    // Keys without the prefix, as BF16, in the file's (sorted) order: each value at its offset.
    char(*names)[200] = calloc((size_t)L.n + 1, sizeof *names);
    st_entry *e = entries_of(&L, buf, names, false);
    st_file f;
    snprintf(path, sizeof path, "%s/bf16.safetensors", dir);
    if (open_written(&f, path, e, L.n, CT_BF16) == 0) {
        CHECK(peft_tensors_read(back, &L, &f, path, &err) == 0, "%s", err.msg);
        int wrong = 0;
        for (size_t i = 0; i < L.num; i++) wrong += back[i] != bf16_to_f32(f32_to_bf16(buf[i]));
        CHECK(wrong == 0, "%s: %d bf16 values misplaced", flavor, wrong);
        st_close(&f);
    }

    // Each bad file: one line naming the tensor; the buffer untouched.
    const int k = L.n / 2; // a middle tensor
    const lora_tensor *t = &L.t[k];
    free(e);
    e = entries_of(&L, buf, names, true);
    float *zeros = calloc(L.num + 4096, sizeof *zeros);
    // Missing (the last entry left out), a wrong shape, a wrong rank.
    static const char *const labels[3] = {"missing", "shape", "rank"};
    const char *needles[3] = {"is missing", "expected shape", "but adapter_config.json's r is 4"};
    const int64_t bad_shape[3][2] = {
        {0, 0},
        {t->shape[0] + 1, t->shape[1] + 1},
        {t->is_b ? t->shape[0] : 3, t->is_b ? 3 : t->shape[1]},
    };
    for (int c = 0; c < 3; c++) {
        if (c > 0)
            e[k] = (st_entry){.name = names[k],
                              .data = zeros,
                              .ndim = 2,
                              .shape = {bad_shape[c][0], bad_shape[c][1]}};
        for (size_t i = 0; i < L.num; i++) back[i] = -7.0f;
        snprintf(path, sizeof path, "%s/bad_%s.safetensors", dir, labels[c]);
        if (open_written(&f, path, e, c == 0 ? L.n - 1 : L.n, CT_F32) != 0) continue;
        err.msg[0] = '\0';
        int rc = peft_tensors_read(back, &L, &f, path, &err);
        CHECK(rc != 0 && strstr(err.msg, path) && strstr(err.msg, needles[c]) &&
                  strstr(err.msg, c == 0 ? L.t[L.n - 1].name : t->name) && !strchr(err.msg, '\n'),
              "%s %s: %s", flavor, labels[c], err.msg);
        CHECK(back[0] == -7.0f && back[L.num - 1] == -7.0f, "%s: buffer written", labels[c]);
        st_close(&f);
        e[k] = (st_entry){.name = names[k],
                          .data = buf + t->offset,
                          .ndim = 2,
                          .shape = {t->shape[0], t->shape[1]}};
    }
    static const struct {
        const char *name, *needle;
    } extras[] = {
        {"base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight",
         "adapts k_proj, which adapter_config.json's target_modules does not name"},
        {"base_model.model.lm_head.lora_A.weight", "unexpected tensor"},
        {"base_model.model.model.layers.00.self_attn.q_proj.lora_A.weight", "unexpected tensor"},
        {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight",
         "unexpected tensor"},
        {"model.layers.0.self_attn.q_proj.lora_A.weight", "given twice"},
    };
    st_entry *more = calloc((size_t)L.n + 1, sizeof *more);
    memcpy(more, e, (size_t)L.n * sizeof *e);
    const lora_tensor *q0 = lora_layout_tensor(&L, 0, LORA_Q, -1, false);
    // (k_proj is untargeted only in the first geometry's adapter.)
    for (size_t c = (targets >> LORA_K) & 1u; c < sizeof extras / sizeof extras[0]; c++) {
        more[L.n] = (st_entry){.name = extras[c].name,
                               .data = zeros,
                               .ndim = 2,
                               .shape = {q0->shape[0], q0->shape[1]}};
        snprintf(path, sizeof path, "%s/extra_%zu.safetensors", dir, c);
        if (open_written(&f, path, more, L.n + 1, CT_F32) != 0) continue;
        err.msg[0] = '\0';
        CHECK(peft_tensors_check(&L, &f, path, &err) != 0 && strstr(err.msg, extras[c].name) &&
                  strstr(err.msg, extras[c].needle) && !strchr(err.msg, '\n'),
              "%s extra %zu: %s", flavor, c, err.msg);
        st_close(&f);
    }
    free(more);

    // adapter_model.bin alone: refused, saying to convert.
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    char bin[1100];
    snprintf(bin, sizeof bin, "%s/adapter_model.bin", dir);
    rename(path, bin);
    err.msg[0] = '\0';
    CHECK(peft_adapter_load(&a, dir, &cfg, &err) != 0 && strstr(err.msg, "adapter_model.bin") &&
              strstr(err.msg, "convert") && !strchr(err.msg, '\n'),
          "pickle: %s", err.msg);

    // The merge: whole tensors against float64, and chunked ranges against the whole.
    double worst = 0;
    for (int i = 0; i < L.n; i += 2) {
        const lora_tensor *A = &L.t[i], *B = &L.t[i + 1];
        const int64_t out = B->shape[0], in = A->shape[1];
        char name[200];
        snprintf(name, sizeof name, "%.*s.weight",
                 (int)(strlen(A->name) - strlen(".lora_A.weight") - strlen("base_model.model.")),
                 A->name + strlen("base_model.model."));
        float *w = malloc((size_t)(out * in) * sizeof *w),
              *w2 = malloc((size_t)(out * in) * sizeof *w2);
        for (int64_t j = 0; j < out * in; j++) w[j] = w2[j] = rand_sym(&r);
        const float s = lora_scale(&lc);
        double amax = 0, emax = 0;
        float *want_src = malloc((size_t)(out * in) * sizeof *w);
        memcpy(want_src, w, (size_t)(out * in) * sizeof *w);
        CHECK(lora_merge_tensor(w, name, out, in, &L, buf, &err) == 0, "%s", err.msg);
        for (int64_t o = 0; o < out; o++)
            for (int64_t c = 0; c < in; c++) {
                double d = 0;
                for (int64_t q = 0; q < lc.rank; q++)
                    d += (double)buf[B->offset + o * lc.rank + q] * buf[A->offset + q * in + c];
                double want = want_src[o * in + c] + d * s;
                amax = fmax(amax, fabs(want));
                emax = fmax(emax, fabs(w[o * in + c] - want));
            }
        worst = fmax(worst, emax / amax);
        // Chunks that cut rows anywhere give the same bits.
        for (uint64_t at = 0, step = 37; at < (uint64_t)(out * in);
             at += step, step = step * 3 % 101 + 1) {
            uint64_t n = at + step < (uint64_t)(out * in) ? step : (uint64_t)(out * in) - at;
            lora_merge_range(w2 + at, at, n, A, B, buf, s);
        }
        CHECK(memcmp(w, w2, (size_t)(out * in) * sizeof *w) == 0, "%s: chunked merge differs",
              name);
        free(w), free(w2), free(want_src);
    }
    // Measured: 1.3e-7 (fp32 sums of 4 products, then the scale and the add).
    CHECK(worst < 1e-6, "%s: merge error %.3g", flavor, worst);
    printf("%s: %d adapter tensors, merge error %.3g\n", flavor, L.n, worst);
    // A weight the adapter leaves alone is not touched; a shape that disagrees is an error.
    float one = 1.0f;
    CHECK(lora_merge_tensor(&one, "model.norm.weight", 1, 1, &L, buf, &err) == 0 && one == 1.0f,
          "norm touched");
    CHECK(lora_merge_tensor(&one, "model.layers.0.self_attn.q_proj.weight", 1, 1, &L, buf, &err) !=
                  0 &&
              strstr(err.msg, "q_proj"),
          "shape: %s", err.msg);
    free(e);
    free(zeros);
    free(names);
    free(buf);
    free(back);
    lora_layout_free(&L);
}

int main(void) {
    tmp = check_env("CTITAN_TMP");
    test_config();
    test_tensors("debugmodel", (1u << LORA_Q) | (1u << LORA_V) | (1u << LORA_DOWN));
    test_tensors("debugmodel_moe", LORA_ALL_LINEAR);
    return check_summary();
}
