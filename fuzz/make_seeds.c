// Writes the fuzz seed corpus: valid files from the real writers (so seeds follow the format
// exactly) and a few hand-made variants the writers never produce.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io/npy.h"
#include "io/safetensors.h"
#include "model/peft_adapter.h"
#include "model/qwen3_config.h"
#include "peft_geometry.h"
#include "checkpoint/checkpoint_internal.h"

static char path[4096];
static const char *root;

static const char *at(const char *sub, const char *name) {
    snprintf(path, sizeof path, "%s/%s/%s", root, sub, name);
    return path;
}

static void raw(const char *sub, const char *name, const void *data, size_t n) {
    FILE *fp = fopen(at(sub, name), "wb");
    if (!fp || fwrite(data, 1, n, fp) != n) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(1);
    }
    fclose(fp);
}

static void text(const char *sub, const char *name, const char *t) {
    raw(sub, name, t, strlen(t));
}

static void check(int rc, const ct_error *err) {
    if (rc != 0) {
        fprintf(stderr, "%s\n", err->msg);
        exit(1);
    }
}

static void raw_st(const char *name, const char *header, size_t data_len) {
    size_t n = strlen(header);
    unsigned char buf[1024] = {0};
    buf[0] = (unsigned char)n;
    memcpy(buf + 8, header, n);
    raw("safetensors", name, buf, 8 + n + data_len);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: fuzz_make_seeds OUT_DIR\n");
        return 2;
    }
    root = argv[1];
    mkdir(root, 0755);
    mkdir(at("safetensors", ""), 0755);
    mkdir(at("npy", ""), 0755);
    mkdir(at("hf_config", ""), 0755);
    mkdir(at("ckpt_state", ""), 0755);
    mkdir(at("peft_config", ""), 0755);
    mkdir(at("gen_config", ""), 0755);
    mkdir(at("st_index", ""), 0755);
    ct_error err;
    float v[12] = {1, -2, 0.5f, 3.25f, -0.125f, 65504, 1e-8f, 7, 8, 9, 10, 11};
    st_entry e[3] = {
        {.name = "model.embed_tokens.weight", .data = v, .ndim = 2, .shape = {3, 4}},
        {.name = "model.norm.weight", .data = v, .ndim = 1, .shape = {4}},
        {.name = "s", .data = v, .ndim = 0},
    };
    check(st_write(at("safetensors", "f32.safetensors"), e, 3, CT_F32, &err), &err);
    check(st_write(at("safetensors", "bf16.safetensors"), e, 3, CT_BF16, &err), &err);
    check(st_write(at("safetensors", "f16.safetensors"), e + 1, 2, CT_F16, &err), &err);
    check(st_write(at("safetensors", "empty.safetensors"), e, 0, CT_F32, &err), &err);
    raw_st(
        "mixed.safetensors",
        "{\"__metadata__\":{\"a\":\"b\"},\"i\":{\"dtype\":\"I64\",\"shape\":[1],"
        "\"data_offsets\":[0,8]},\"z\":{\"dtype\":\"U8\",\"shape\":[0,2],\"data_offsets\":[8,8]},"
        "\"d\":{\"dtype\":\"F64\",\"shape\":[1,1],\"data_offsets\":[8,16]}}  ",
        16);
    raw_st("escaped.safetensors",
           "{\"a\\\"\\u00e9\\n\":{\"dtype\":\"BOOL\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2);

    int64_t tok[6] = {0, 1, 2, 999, 65535, 7}, big[2] = {151643, 5};
    check(npy_write(at("npy", "u2.npy"), tok, 6, "<u2", &err), &err);
    check(npy_write(at("npy", "i4.npy"), tok, 6, "<i4", &err), &err);
    check(npy_write(at("npy", "u4.npy"), tok, 6, "<u4", &err), &err);
    check(npy_write(at("npy", "i8.npy"), big, 2, "<i8", &err), &err);
    check(npy_write(at("npy", "empty.npy"), tok, 0, "<i4", &err), &err);
    // Version 2.0 (32-bit header length), double quotes, other key order, a Python 2 long.
    const char *dict = "{\"shape\": (1L,), \"descr\": \"<i4\", \"fortran_order\": False}\n";
    unsigned char v2[256] = {0x93, 'N', 'U', 'M', 'P', 'Y', 2, 0, (unsigned char)strlen(dict)};
    memcpy(v2 + 12, dict, strlen(dict));
    v2[12 + strlen(dict)] = 5;
    raw("npy", "v2.npy", v2, 12 + strlen(dict) + 4);

    // config.json: Qwen3-0.6B's as published, Qwen3-30B-A3B's, a transformers 5 MoE one, and a
    // config saved by ctitan from a flavor-like config (no source).
    // model.safetensors.index.json over fuzz_st_index's shards (a: x, y; b: z), as HF writes it,
    // and one that misplaces z.
    text("st_index", "hf.json",
         "{\"metadata\": {\"total_size\": 36}, \"weight_map\": {\"x\": \"a.safetensors\", "
         "\"y\": \"a.safetensors\", \"z\": \"b.safetensors\"}}");
    text("st_index", "misplaced.json",
         "{\"weight_map\": {\"x\": \"a.safetensors\", \"y\": \"a.safetensors\", \"z\": "
         "\"a.safetensors\"}}");
    // generation_config.json: Qwen3's as published (sampling, two stop ids), one with settings
    // ctitan names as unsupported, and nulls.
    text("gen_config", "qwen3.json",
         "{\"bos_token_id\": 151643, \"do_sample\": true, \"eos_token_id\": [151645, 151643], "
         "\"pad_token_id\": 151643, \"temperature\": 0.6, \"top_k\": 20, \"top_p\": 0.95, "
         "\"transformers_version\": \"4.51.0\"}");
    text("gen_config", "unsupported.json",
         "{\"eos_token_id\": 2, \"num_beams\": 4, \"suppress_tokens\": [1, 2], "
         "\"bad_words_ids\": [], \"repetition_penalty\": 1.05, \"min_p\": 0.1}");
    text("gen_config", "nulls.json",
         "{\"eos_token_id\": null, \"temperature\": null, \"do_sample\": false}");
    text("hf_config", "qwen3_0.6b.json",
         "{\"architectures\": [\"Qwen3ForCausalLM\"], \"attention_bias\": false, "
         "\"attention_dropout\": 0.0, \"bos_token_id\": 151643, \"eos_token_id\": 151645, "
         "\"head_dim\": 128, \"hidden_act\": \"silu\", \"hidden_size\": 1024, "
         "\"initializer_range\": 0.02, \"intermediate_size\": 3072, "
         "\"max_position_embeddings\": 40960, \"max_window_layers\": 28, "
         "\"model_type\": \"qwen3\", \"num_attention_heads\": 16, \"num_hidden_layers\": 28, "
         "\"num_key_value_heads\": 8, \"rms_norm_eps\": 1e-06, \"rope_scaling\": null, "
         "\"rope_theta\": 1000000, \"sliding_window\": null, \"tie_word_embeddings\": true, "
         "\"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.51.0\", "
         "\"use_cache\": true, \"use_sliding_window\": false, \"vocab_size\": 151936}\n");
    text("hf_config", "qwen3_30b_a3b.json",
         "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"bos_token_id\": 151643, "
         "\"decoder_sparse_step\": 1, \"eos_token_id\": 151645, \"head_dim\": 128, "
         "\"hidden_size\": 2048, \"intermediate_size\": 6144, \"max_position_embeddings\": "
         "40960, \"mlp_only_layers\": [], \"model_type\": \"qwen3_moe\", "
         "\"moe_intermediate_size\": 768, \"norm_topk_prob\": true, \"num_attention_heads\": "
         "32, \"num_experts\": 128, \"num_experts_per_tok\": 8, \"num_hidden_layers\": 48, "
         "\"num_key_value_heads\": 4, \"output_router_logits\": false, \"rms_norm_eps\": "
         "1e-06, \"rope_theta\": 1000000.0, \"router_aux_loss_coef\": 0.001, "
         "\"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\", \"vocab_size\": "
         "151936}\n");
    text("hf_config", "transformers5_moe.json",
         "{\"model_type\": \"qwen3_moe\", \"dtype\": \"float16\", \"rope_parameters\": "
         "{\"rope_theta\": 500000.0, \"rope_type\": \"default\"}, \"num_local_experts\": 4, "
         "\"num_experts_per_tok\": 2, \"mlp_only_layers\": [0, 2], \"decoder_sparse_step\": 2, "
         "\"vocab_size\": 64, \"hidden_size\": 16, \"intermediate_size\": 24, \"head_dim\": "
         "null, \"num_hidden_layers\": 3, \"num_attention_heads\": 4, "
         "\"num_key_value_heads\": null, \"layer_types\": [\"full_attention\"], "
         "\"eos_token_id\": [2, 3], \"x_\\u00e9\\\"\": {\"a\": [1e-300, -0.0, true]}}\n");
    qwen3_config c;
    memset(&c, 0, sizeof c);
    c.vocab_size = 151936, c.hidden_size = 8, c.intermediate_size = 8, c.num_hidden_layers = 2;
    c.num_attention_heads = 2, c.num_key_value_heads = 1, c.head_dim = 4;
    c.max_position_embeddings = 16, c.rms_norm_eps = 1e-5f, c.rope_theta = 10000.0;
    c.num_experts = 4, c.num_experts_per_tok = 2, c.moe_intermediate_size = 2;
    c.decoder_sparse_step = 1, c.n_mlp_only_layers = 1, c.mlp_only_layers[0] = 1;
    c.router_aux_loss_coef = 0.001;
    check(qwen3_config_save(&c, at("hf_config", "saved_flavor.json"), &err), &err);

    // state.json as a save writes it: one shard, and three (one empty).
    train_state st = {.step = 7,
                      .opt_step = 6,
                      .samples_seen = 56,
                      .config_hash = 0x0123456789abcdefull,
                      .skipped_in_row = 1,
                      .time_s = 12.5};
    ckpt_file_sum files[CKPT_N_FILES] = {{"", 100, 0xef46db3751d8e999ull}, {"", 7, 1}, {"", 3, 2}};
    ckpt_shard_info shards[3] = {{"", 0, 10, 96, 5}, {"", 10, 0, 64, 6}, {"", 10, 5, 80, 7}};
    for (int n = 1; n <= 3; n += 2) {
        ckpt_range r[3] = {{0, 10}, {10, 10}, {10, 15}};
        const ckpt_range *lists[3] = {&r[0], &r[1], &r[2]};
        int counts[3] = {1, 1, 1};
        for (int i = 0; i < n; i++) ckpt_shard_name(shards[i].file, i, n);
        if (n == 1) shards[0].numel = 15, r[0].hi = 15;
        ckpt_shard_list optim;
        check(ckpt_shard_list_make(&optim, shards, n, lists, counts, &err), &err);
        char *t;
        size_t len;
        check(ckpt_state_text(&t, &len, &st, files, &optim, NULL, "seed", &err), &err);
        raw("ckpt_state", n == 1 ? "one_shard.json" : "three_shards.json", t, len);
        free(t);
        ckpt_shard_list_free(&optim);
    }
    // Format 4: two FSDP "ranks" holding interleaved pieces of two units, optimizer shards
    // alone and with model shards; one more with a rank holding nothing.
    {
        ckpt_range r0[2] = {{0, 4}, {10, 12}}, r1[2] = {{4, 10}, {12, 20}};
        const ckpt_range *lists[3] = {r0, r1, NULL};
        int counts[3] = {2, 2, 0};
        ckpt_shard_info opt[3] = {{"", 0, 6, 120, 8}, {"", 4, 14, 160, 9}, {"", 0, 0, 80, 10}};
        ckpt_shard_info mod[3] = {{"", 0, 6, 90, 11}, {"", 4, 14, 130, 12}, {"", 0, 0, 60, 13}};
        for (int n = 2; n <= 3; n++) {
            for (int i = 0; i < n; i++) {
                ckpt_shard_name(opt[i].file, i, n);
                ckpt_model_shard_name(mod[i].file, i, n);
            }
            for (int with_model = 0; with_model < 2; with_model++) {
                ckpt_shard_list optim, model = {0};
                check(ckpt_shard_list_make(&optim, opt, n, lists, counts, &err), &err);
                if (with_model)
                    check(ckpt_shard_list_make(&model, mod, n, lists, counts, &err), &err);
                char *t, name[64];
                size_t len;
                check(ckpt_state_text(&t, &len, &st, files, &optim, &model, "seed", &err), &err);
                snprintf(name, sizeof name, "ranges_%d%s.json", n, with_model ? "_model" : "");
                raw("ckpt_state", name, t, len);
                free(t);
                ckpt_shard_list_free(&optim);
                ckpt_shard_list_free(&model);
            }
        }
    }

    // adapter_config.json: PEFT's save_pretrained output, ctitan's, a small one with PEFT's
    // defaults, and refusals; then (after byte 1) adapter tensors for peft_geometry.h's model.
    text("peft_config", "peft.json",
         "{\n  \"alpha_pattern\": {},\n  \"auto_mapping\": null,\n  \"base_model_name_or_path\": "
         "\"Qwen/Qwen3-0.6B\",\n  \"bias\": \"none\",\n  \"fan_in_fan_out\": false,\n  "
         "\"inference_mode\": true,\n  \"init_lora_weights\": true,\n  \"layers_to_transform\": "
         "null,\n  \"loftq_config\": {},\n  \"lora_alpha\": 32,\n  \"lora_dropout\": 0.05,\n  "
         "\"modules_to_save\": null,\n  \"peft_type\": \"LORA\",\n  \"r\": 16,\n  "
         "\"rank_pattern\": {},\n  \"target_modules\": [\n    \"v_proj\",\n    \"q_proj\"\n  "
         "],\n  \"task_type\": \"CAUSAL_LM\",\n  \"use_dora\": false,\n  \"use_rslora\": "
         "false\n}");
    text("peft_config", "small.json",
         "{\"peft_type\": \"LORA\", \"target_modules\": \"all-linear\", \"r\": 4, "
         "\"lora_alpha\": 1e-3, \"use_rslora\": true, \"x\": [1, {\"y\": null}]}");
    text("peft_config", "regex.json",
         "{\"peft_type\": \"LORA\", \"target_modules\": \".*\\\\.(q|v)_proj\"}");
    text("peft_config", "dora.json",
         "{\"peft_type\": \"LORA\", \"target_modules\": [\"q_proj\"], \"use_dora\": true, "
         "\"rank_pattern\": {\"q_proj\": 2}}");
    qwen3_config gc;
    peft_config pc = {.base_model = "tiny/\u00e9"};
    peft_fuzz_geometry(&gc, &pc.lc);
    char *t = NULL;
    size_t len = 0;
    check(peft_config_text(&t, &len, &pc, &err), &err);
    raw("peft_config", "ctitan.json", t, len);
    free(t);
    lora_layout L;
    check(lora_layout_init(&L, &gc, &pc.lc, &err), &err);
    float *buf = calloc(L.num, sizeof *buf);
    for (size_t i = 0; i < L.num; i++) buf[i] = (float)i / 8.0f - 3.0f;
    char st_path[4200];
    snprintf(st_path, sizeof st_path, "%s/peft_config/adapter.tmp", root);
    check(peft_tensors_write(st_path, &L, buf, &err), &err);
    FILE *fp = fopen(st_path, "rb");
    static unsigned char img[1u << 16];
    img[0] = 1;
    size_t n = fp ? fread(img + 1, 1, sizeof img - 1, fp) : 0;
    if (fp) fclose(fp);
    remove(st_path);
    if (n == 0 || n == sizeof img - 1) {
        fprintf(stderr, "cannot read back %s\n", st_path);
        return 1;
    }
    raw("peft_config", "adapter_tensors", img, n + 1);
    free(buf);
    lora_layout_free(&L);
    return 0;
}
