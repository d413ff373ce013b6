// Shared by the checkpoint tests: tiny models whose every float is distinct (so a swapped,
// shifted or rounded tensor shows), optimizer moments in the parameters' layout, file helpers.
#pragma once
#include <fcntl.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "model/qwen3.h"

// A few layers of a small Qwen3; `tied` shares embed/lm_head, `bias` adds attention biases.
static inline qwen3_config tiny_config(bool tied, bool bias, int layers, int vocab) {
    qwen3_config c;
    memset(&c, 0, sizeof c);
    c.vocab_size = vocab;
    c.hidden_size = 16;
    c.intermediate_size = 24;
    c.num_hidden_layers = layers;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 6; // NH*D = 24 != C, as in real Qwen3
    c.max_position_embeddings = 64;
    c.rms_norm_eps = 1e-6f;
    c.rope_theta = 1000000.0;
    c.tie_word_embeddings = tied;
    c.attention_bias = bias;
    snprintf(c.torch_dtype, sizeof c.torch_dtype, "float32");
    return c;
}

// Deterministic distinct values from (i, salt); a few elements get edge cases that only a
// bitwise copy keeps (-0, subnormals, the largest float).
static inline float tiny_value(size_t i, uint64_t salt) {
    uint64_t z = (uint64_t)i * 0x9E3779B97F4A7C15ull + salt * 0xBF58476D1CE4E5B9ull + 1;
    z ^= z >> 31;
    z *= 0x94D049BB133111EBull;
    z ^= z >> 29;
    switch (i % 997) {
    case 5:
        return -0.0f;
    case 7:
        return 1e-42f; // subnormal
    case 11:
        return 3.4028235e38f;
    default:
        return (float)((double)(z >> 11) / 9007199254740992.0 - 0.5) * 0.08f;
    }
}

static inline void tiny_fill(float *x, size_t n, uint64_t salt) {
    for (size_t i = 0; i < n; i++) x[i] = tiny_value(i, salt);
}

static inline void tiny_fill_positive(float *x, size_t n, uint64_t salt) {
    for (size_t i = 0; i < n; i++) x[i] = fabsf(tiny_value(i, salt)) * 1e-3f;
}

static inline bool tiny_model(qwen3_model *m, const qwen3_config *c, uint64_t salt) {
    ct_error err = {{0}};
    int rc = qwen3_init(m, c, NULL, &err);
    CHECK(rc == 0, "qwen3_init: %s", err.msg);
    if (rc == 0) tiny_fill(m->param_mem, m->num_params, salt);
    return rc == 0;
}

static inline bool file_exists_at(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

static inline long file_size_at(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 ? (long)sb.st_size : -1;
}

// Overwrites one byte at `offset` with its complement (size unchanged).
static inline bool flip_byte(const char *path, long offset) {
    int fd = open(path, O_RDWR);
    unsigned char b;
    bool ok = fd >= 0 && pread(fd, &b, 1, offset) == 1;
    b = (unsigned char)~b;
    ok = ok && pwrite(fd, &b, 1, offset) == 1;
    if (fd >= 0) close(fd);
    return ok;
}

static inline bool write_file_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f) return false;
    bool ok = fwrite(text, 1, strlen(text), f) == strlen(text);
    return fclose(f) == 0 && ok;
}
