// Writes the fuzz seed corpus: valid files from the real writers (so seeds follow the format
// exactly) and a few hand-made variants the writers never produce.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io/npy.h"
#include "io/safetensors.h"

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
    return 0;
}
