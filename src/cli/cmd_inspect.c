// ctitan inspect PATH: list the tensors of a safetensors file or HF folder, validating it.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "cli/cli.h"
#include "io/safetensors.h"
#include "model/qwen3_config.h"

static const cli_option inspect_options[] = {
    {"json", "false", "print one JSON object (tensors and totals) instead of a table", true},
};

// A folder with config.json gets its architecture summarised and validated too.
static int inspect_config(const char *path, bool json, ct_error *err) {
    char cfg_path[4096];
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode)) return 0;
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", path);
    if (stat(cfg_path, &sb) != 0) return 0;
    qwen3_config c;
    if (qwen3_config_load(&c, cfg_path, err) != 0) return -1;
    if (!json)
        printf("config: Qwen3 hidden %d, layers %d, heads %d/%d kv, head_dim %d, ffn %d, "
               "vocab %d, %s embeddings, dtype %s\n",
               c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads,
               c.head_dim, c.intermediate_size, c.vocab_size,
               c.tie_word_embeddings ? "tied" : "untied", c.torch_dtype);
    return 0;
}

int cmd_inspect(int argc, char **argv) {
    const int n_opts = sizeof inspect_options / sizeof inspect_options[0];
    if (cli_wants_help(argc, argv)) {
        cli_print_help("ctitan inspect PATH [--json]",
                       "Lists name, dtype and shape of every tensor in a .safetensors file or an "
                       "HF folder\n(single file or sharded with model.safetensors.index.json), "
                       "then the totals.\nThe file is fully validated; any problem is an error.",
                       inspect_options, n_opts);
        return 0;
    }
    ct_error err;
    cli_args args;
    if (cli_parse(&args, inspect_options, n_opts, argc, argv, 1, &err) != 0)
        return cli_report(&err);
    if (args.n_positional != 1) {
        ct_fail(&err, "inspect needs one PATH (a .safetensors file or an HF folder)");
        return cli_report(&err);
    }
    const char *path = args.positional[0];
    bool json = cli_flag(&args, "json");
    if (inspect_config(path, json, &err) != 0) return cli_report(&err);
    st_set set;
    if (st_set_open(&set, path, &err) != 0) return cli_report(&err);

    uint64_t total_elems = 0, total_bytes = 0, per_dtype[CT_DTYPE_COUNT] = {0};
    cJSON *out = cJSON_CreateObject(), *list = cJSON_AddArrayToObject(out, "tensors");
    cJSON_AddStringToObject(out, "path", path);
    for (int i = 0; i < set.n_tensors; i++) {
        const st_tensor *t = set.by_name[i];
        if (json) {
            cJSON *item = cJSON_CreateObject(), *shape = cJSON_AddArrayToObject(item, "shape");
            cJSON_AddStringToObject(item, "name", t->name);
            cJSON_AddStringToObject(item, "dtype", dtype_name(t->dtype));
            for (int d = 0; d < t->ndim; d++)
                cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->shape[d]));
            cJSON_AddItemToArray(list, item);
        } else {
            // A name's control characters escaped, as in errors (the file may be anyone's).
            const size_t cap = 4 * strlen(t->name) + 1; // each byte at most "\xHH"
            char shape[160], *name = malloc(cap);
            if (name) ct_escape(name, cap, t->name);
            printf("%-60s %-5s %s\n", name ? name : "?", dtype_name(t->dtype),
                   st_shape_str(shape, sizeof shape, t->shape, t->ndim));
            free(name);
        }
        total_elems += t->numel;
        total_bytes += t->end - t->begin;
        per_dtype[t->dtype] += t->numel;
    }
    if (json) {
        cJSON_AddNumberToObject(out, "num_tensors", set.n_tensors);
        cJSON_AddNumberToObject(out, "num_elements", (double)total_elems);
        cJSON_AddNumberToObject(out, "bytes", (double)total_bytes);
        cJSON_AddNumberToObject(out, "files", set.n_files);
        char *text = cJSON_PrintUnformatted(out);
        printf("%s\n", text);
        cJSON_free(text);
    } else {
        printf("total: %d tensors, %llu elements (%.3f M), %llu bytes, %d file(s);", set.n_tensors,
               (unsigned long long)total_elems, total_elems / 1e6, (unsigned long long)total_bytes,
               set.n_files);
        for (int t = 0; t < CT_DTYPE_COUNT; t++)
            if (per_dtype[t])
                printf(" %s %llu", dtype_name((ct_dtype)t), (unsigned long long)per_dtype[t]);
        printf("\nvalid: yes\n");
    }
    cJSON_Delete(out);
    st_set_close(&set);
    return 0;
}
