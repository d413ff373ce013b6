// A checkpoint's model as a Hugging Face folder (config.json, safetensors in the export dtype,
// the tokenizer files), and the small parsers the export command and the trainer share.
#include <ctype.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "core/utf8.h"
#include "io/json.h"
#include "model/hf_adapter.h"
#include "checkpoint/checkpoint_internal.h"

#define TOKENIZER_MAX_BYTES (512u << 20)

int ckpt_parse_dtype(ct_dtype *out, const char *name, ct_error *err) {
    static const struct {
        const char *name;
        ct_dtype dt;
    } names[] = {{"float32", CT_F32}, {"bfloat16", CT_BF16}, {"float16", CT_F16}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (strcmp(name, names[i].name) == 0) {
            *out = names[i].dt;
            return 0;
        }
    }
    return ct_fail(err, "dtype '%s': expected float32, bfloat16 or float16", name);
}

int ckpt_parse_size(uint64_t *bytes, const char *text, ct_error *err) {
    static const struct {
        const char *unit;
        uint64_t scale;
    } units[] = {{"", 1},
                 {"B", 1},
                 {"KB", 1000},
                 {"MB", 1000000},
                 {"GB", 1000000000},
                 {"TB", 1000000000000},
                 {"KiB", 1ull << 10},
                 {"MiB", 1ull << 20},
                 {"GiB", 1ull << 30},
                 {"TiB", 1ull << 40}};
    const char *p = text;
    uint64_t v = 0;
    if (!isdigit((unsigned char)*p))
        return ct_fail(
            err, "size '%s': expected bytes or an integer with a unit (500MB, 5GB, 2GiB)", text);
    for (; isdigit((unsigned char)*p); p++) {
        if (v > (UINT64_MAX - (uint64_t)(*p - '0')) / 10)
            return ct_fail(err, "size '%s': too large", text);
        v = v * 10 + (uint64_t)(*p - '0');
    }
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcasecmp(p, units[i].unit) != 0) continue;
        if (v > UINT64_MAX / units[i].scale) return ct_fail(err, "size '%s': too large", text);
        *bytes = v * units[i].scale;
        return 0;
    }
    return ct_fail(err,
                   "size '%s': unknown unit '%s' (expected B, KB, MB, GB, TB, KiB, MiB, GiB "
                   "or TiB)",
                   text, p);
}

// --- a minimal lookup of `key = "string"` under [section] in TOML text

static const char *skip_ws(const char *p) {
    while (*p == ' ' || *p == '\t') p++;
    return p;
}

// Parses a basic ("...") or literal ('...') string at p into out. False if it is not one.
static bool parse_string(char *out, size_t cap, const char *p) {
    char q = *p++;
    if ((q != '"' && q != '\'') || cap == 0) return false;
    size_t n = 0;
    while (*p && *p != q && *p != '\n') {
        char buf[4];
        size_t k = 1;
        buf[0] = *p++;
        if (q == '"' && buf[0] == '\\') {
            char e = *p;
            if (!e) return false;
            p++;
            char simple = e == 'b'    ? '\b'
                          : e == 't'  ? '\t'
                          : e == 'n'  ? '\n'
                          : e == 'f'  ? '\f'
                          : e == 'r'  ? '\r'
                          : e == '"'  ? '"'
                          : e == '\\' ? '\\'
                                      : 0;
            if (simple) {
                buf[0] = simple;
            } else if (e == 'u' || e == 'U') {
                int digits = e == 'u' ? 4 : 8;
                uint32_t cp = 0;
                for (int i = 0; i < digits; i++, p++) {
                    if (!isxdigit((unsigned char)*p)) return false;
                    cp = cp * 16 +
                         (uint32_t)(isdigit((unsigned char)*p) ? *p - '0' : (*p | 0x20) - 'a' + 10);
                }
                if (cp > 0x10ffff || (cp >= 0xd800 && cp < 0xe000)) return false;
                k = (size_t)utf8_encode(buf, cp);
            } else {
                return false;
            }
        }
        if (n + k >= cap) return false;
        memcpy(out + n, buf, k);
        n += k;
    }
    if (*p != q) return false;
    out[n] = '\0';
    return true;
}

// The string value of `key` in [section]; false if absent or not a string.
static bool toml_lookup(char *out, size_t cap, const char *text, const char *section,
                        const char *key) {
    bool in_section = false;
    size_t sl = strlen(section), kl = strlen(key);
    for (const char *line = text; line && *line;) {
        const char *p = skip_ws(line);
        const char *next = strchr(line, '\n');
        if (*p == '[') {
            p = skip_ws(p + 1);
            in_section = strncmp(p, section, sl) == 0 && *skip_ws(p + sl) == ']';
        } else if (in_section && strncmp(p, key, kl) == 0) {
            p = skip_ws(p + kl);
            if (*p == '=' && parse_string(out, cap, skip_ws(p + 1))) return true;
        }
        line = next ? next + 1 : NULL;
    }
    return false;
}

void ckpt_tokenizer_dir(char *out, size_t cap, const char *config_toml) {
    char backend[32] = "";
    if (cap == 0) return;
    out[0] = '\0';
    if (config_toml && toml_lookup(out, cap, config_toml, "model", "tokenizer_path") && out[0])
        return;
    if (config_toml && toml_lookup(backend, sizeof backend, config_toml, "model", "backend") &&
        strcmp(backend, "hf") == 0 && toml_lookup(out, cap, config_toml, "model", "hf_path") &&
        out[0])
        return;
    snprintf(out, cap, "assets/qwen3-tokenizer");
}

// --- export

static const char *const tokenizer_files[] = {"tokenizer.json", "tokenizer_config.json",
                                              "special_tokens_map.json", "vocab.json",
                                              "merges.txt"};

// Copies dir/name to out_dir/name if it exists: 1 copied, 0 absent, -1 error.
static int copy_if_present(const char *out_dir, const char *dir, const char *name, ct_error *err) {
    char src[4096], dst[4096];
    struct stat sb;
    int a = snprintf(src, sizeof src, "%s/%s", dir, name);
    int b = snprintf(dst, sizeof dst, "%s/%s", out_dir, name);
    if (a < 0 || b < 0 || (size_t)a >= sizeof src || (size_t)b >= sizeof dst)
        return ct_fail(err, "%s: path too long", dir);
    if (stat(src, &sb) != 0) return 0;
    char *buf = NULL;
    size_t len = 0;
    if (file_read_all(&buf, &len, src, TOKENIZER_MAX_BYTES, err) != 0) return -1;
    int rc = ckpt_write_text(dst, buf, len, err);
    free(buf);
    return rc == 0 ? 1 : -1;
}

// The tokenizer files and generation_config.json, after the weights: the number of tokenizer
// files copied, or -1.
static int copy_tokenizer(const char *out_dir, const char *tokenizer_dir, ct_error *err) {
    if (!tokenizer_dir || !tokenizer_dir[0]) return 0;
    if (copy_if_present(out_dir, tokenizer_dir, "generation_config.json", err) < 0)
        return ct_wrap(err, "copying generation_config.json");
    char probe[4096];
    struct stat sb;
    snprintf(probe, sizeof probe, "%s/tokenizer.json", tokenizer_dir);
    if (stat(probe, &sb) != 0) return 0; // no tokenizer there: the caller says so
    int copied = 0;
    for (size_t i = 0; i < sizeof tokenizer_files / sizeof tokenizer_files[0]; i++) {
        int rc = copy_if_present(out_dir, tokenizer_dir, tokenizer_files[i], err);
        if (rc < 0) return ct_wrap(err, "copying the tokenizer");
        copied += rc;
    }
    return copied;
}

int ckpt_export_hf(const qwen3_model *m, const char *out_dir, ct_dtype dtype,
                   uint64_t max_shard_bytes, const char *tokenizer_dir, ct_error *err) {
    if (hf_save_folder(m, out_dir, dtype, max_shard_bytes, err) != 0) return -1;
    return copy_tokenizer(out_dir, tokenizer_dir, err);
}

int ckpt_export_hf_from(const qwen3_model *m, const char *out_dir, ct_dtype dtype,
                        uint64_t max_shard_bytes, const char *tokenizer_dir, hf_read_fn read,
                        void *ctx, ct_error *err) {
    if (hf_save_folder_from(m, out_dir, dtype, max_shard_bytes, false, read, ctx, err) != 0)
        return -1;
    return copy_tokenizer(out_dir, tokenizer_dir, err);
}

// The source of a streamed export: a checked view of the checkpoint, in the layout m.
typedef struct export_src {
    const ckpt_view *v;
    const qwen3_model *m;
} export_src;

static int export_read(float *dst, uint64_t lo, uint64_t n, void *ctx, ct_error *err) {
    const export_src *src = ctx;
    (void)err; // the view is checked: copying cannot fail
    const ckpt_range r = {lo, lo + n};
    ckpt_view_copy_params(dst, src->v, src->m, &r, 1);
    return 0;
}

int ckpt_export_hf_streaming_info(const char *ckpt_dir, const char *out_dir, ct_dtype dtype,
                                  uint64_t max_shard_bytes, const char *tokenizer_dir,
                                  train_state *st, size_t *num_params, ct_error *err) {
    char cfg_path[4096];
    qwen3_config cfg;
    qwen3_model m;
    ckpt_view v;
    if (ckpt_join(cfg_path, sizeof cfg_path, ckpt_dir, ckpt_file_names[CKPT_F_CONFIG_JSON], err) !=
            0 ||
        qwen3_config_load(&cfg, cfg_path, err) != 0 || qwen3_init_layout(&m, &cfg, err) != 0)
        return -1;
    // Every file checked, as ckpt_verify, before the first byte is written.
    int rc = ckpt_view_open(&v, ckpt_dir, err) == 0 ? 0 : -1;
    if (rc == 0) {
        rc = ckpt_view_match(&v, &m, true, err) == 0 &&
                     ckpt_check_shards(&v, false, true, NULL, 0, err) == 0 &&
                     ckpt_check_shards(&v, true, true, NULL, 0, err) == 0
                 ? 0
                 : -1;
        export_src src = {&v, &m};
        if (rc == 0)
            rc = hf_save_folder_from(&m, out_dir, dtype, max_shard_bytes, false, export_read, &src,
                                     err);
        if (rc == 0 && st) *st = v.s.st;
        ckpt_view_close(&v);
    }
    if (rc == 0 && num_params) *num_params = m.num_params;
    qwen3_free(&m);
    return rc == 0 ? copy_tokenizer(out_dir, tokenizer_dir, err) : -1;
}

int ckpt_export_hf_streaming(const char *ckpt_dir, const char *out_dir, ct_dtype dtype,
                             uint64_t max_shard_bytes, const char *tokenizer_dir, ct_error *err) {
    return ckpt_export_hf_streaming_info(ckpt_dir, out_dir, dtype, max_shard_bytes, tokenizer_dir,
                                         NULL, NULL, err);
}
