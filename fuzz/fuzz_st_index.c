// libFuzzer target: a sharded folder's model.safetensors.index.json (io/safetensors_set.c), over
// two fixed shards written at start (a.safetensors: x, y; b.safetensors: z) in a folder of its
// own. Each input is written as the folder's index, then the folder opened as a model's weights
// are. Rejected input must come with a message naming a file of the folder; accepted input must
// hold exactly the tensors of the shards it names, each findable by name in its own shard.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/safetensors.h"
#include "fuzz_msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char dir[64], index_path[128];

static void cleanup(void) {
    static const char *const files[] = {"a.safetensors", "b.safetensors",
                                        "model.safetensors.index.json"};
    char path[128];
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        unlink(path);
    }
    rmdir(dir);
}

static void setup(void) {
    snprintf(dir, sizeof dir, "/tmp/ctitan-fuzz-st-index-XXXXXX");
    if (!mkdtemp(dir)) __builtin_trap();
    atexit(cleanup);
    snprintf(index_path, sizeof index_path, "%s/model.safetensors.index.json", dir);
    static const float v[6] = {1, 2, 3, 4, 5, 6};
    const st_entry a[2] = {{.name = "x", .data = v, .ndim = 2, .shape = {2, 2}},
                           {.name = "y", .data = v, .ndim = 1, .shape = {2}}},
                   b[1] = {{.name = "z", .data = v, .ndim = 1, .shape = {6}}};
    char path[128];
    ct_error err;
    snprintf(path, sizeof path, "%s/a.safetensors", dir);
    if (st_write(path, a, 2, CT_F32, &err) != 0) __builtin_trap();
    snprintf(path, sizeof path, "%s/b.safetensors", dir);
    if (st_write(path, b, 1, CT_BF16, &err) != 0) __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!dir[0]) setup();
    FILE *fp = fopen(index_path, "wb");
    if (!fp || fwrite(data, 1, size, fp) != size || fclose(fp) != 0) __builtin_trap();
    st_set s;
    ct_error err = {{0}};
    if (st_set_open(&s, dir, &err) != 0) {
        // Every refusal names the index or a shard, both in the folder. (Not always one line: a
        // shard or tensor name the index gives is quoted as it is, newlines included.)
        if (!fuzz_msg_ok(err.msg, dir)) __builtin_trap();
        return 0;
    }
    // Only x, y (in a.safetensors) and z (in b.safetensors) exist, so an accepted index maps the
    // tensors of the shards it names: x and y, z, or all three, each in its own shard.
    static const char *const names[3] = {"x", "y", "z"}, *const shards[3] = {"a", "a", "b"};
    int found = 0;
    for (int i = 0; i < 3; i++) {
        const st_tensor *t = st_set_find(&s, names[i]);
        if (!t) continue;
        found |= 1 << i;
        const char *base = strrchr(s.files[t->file_index].path, '/');
        if (strcmp(t->name, names[i]) != 0 || !base || base[1] != shards[i][0] ||
            strcmp(base + 2, ".safetensors") != 0)
            __builtin_trap();
    }
    if (s.n_tensors != __builtin_popcount(found) || (found & 3) == 1 || (found & 3) == 2)
        __builtin_trap();
    st_set_close(&s);
    return 0;
}
