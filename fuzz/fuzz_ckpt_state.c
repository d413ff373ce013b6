// libFuzzer target: a checkpoint's state.json (ckpt_state_parse: the train state, the files'
// sizes and checksums, the optimizer shard list) on arbitrary bytes. Accepted input must be
// consistent (shards named in order, tiling [0, total)) and its text (ckpt_state_text, what a
// save writes) must parse back to the same state. Rejected input must name the file.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "train/checkpoint_internal.h"

#define NAME "fuzz/state.json"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static bool same_state(const ckpt_state *a, const ckpt_state *b) {
    if (memcmp(&a->st, &b->st, sizeof a->st) != 0 || a->n_shards != b->n_shards ||
        a->total != b->total)
        return false;
    for (int k = 0; k < CKPT_N_FILES; k++)
        if (strcmp(a->files[k].name, b->files[k].name) != 0 ||
            a->files[k].bytes != b->files[k].bytes || a->files[k].xxh64 != b->files[k].xxh64)
            return false;
    for (int i = 0; i < a->n_shards; i++)
        if (memcmp(&a->shards[i], &b->shards[i], sizeof a->shards[i]) != 0) return false;
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ckpt_state a, b;
    ct_error err = {{0}};
    if (ckpt_state_parse(&a, (const char *)data, size, NAME, &err) != 0) {
        if (!strstr(err.msg, NAME) || a.shards) __builtin_trap();
        return 0;
    }
    uint64_t end = 0;
    for (int i = 0; i < a.n_shards; i++) {
        char want[64];
        ckpt_shard_name(want, i, a.n_shards);
        if (strcmp(a.shards[i].file, want) != 0 || a.shards[i].offset != end) __builtin_trap();
        end += a.shards[i].numel;
    }
    if (a.n_shards < 1 || end != a.total) __builtin_trap();
    char *text = NULL;
    size_t len = 0;
    if (ckpt_state_text(&text, &len, &a.st, a.files, a.shards, a.n_shards, NAME, &err) != 0)
        __builtin_trap();
    if (ckpt_state_parse(&b, text, len, NAME, &err) != 0 || !same_state(&a, &b)) __builtin_trap();
    free(text);
    ckpt_state_free(&a);
    ckpt_state_free(&b);
    return 0;
}
