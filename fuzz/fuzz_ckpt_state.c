// libFuzzer target: a checkpoint's state.json (ckpt_state_parse: the train state, the files'
// sizes and checksums, the optimizer and model shard lists with their ranges) on arbitrary
// bytes. Accepted input must be consistent (shards named in order, each kind's ranges tiling
// [0, total)) and its text (ckpt_state_text, what a save writes) must parse back to the same
// state. Rejected input must name the file.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint/checkpoint_internal.h"
#include "fuzz_msg.h"

#define NAME "fuzz/state.json"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static bool same_list(const ckpt_shard_list *a, const ckpt_shard_list *b) {
    if (a->n != b->n) return false;
    if (a->n == 0) return true;
    if (memcmp(a->first, b->first, ((size_t)a->n + 1) * sizeof *a->first) != 0) return false;
    for (int i = 0; i < a->n; i++)
        if (memcmp(&a->info[i], &b->info[i], sizeof a->info[i]) != 0) return false;
    return memcmp(a->ranges, b->ranges, (size_t)a->first[a->n] * sizeof *a->ranges) == 0;
}

static bool same_state(const ckpt_state *a, const ckpt_state *b) {
    if (memcmp(&a->st, &b->st, sizeof a->st) != 0 || a->total != b->total ||
        !same_list(&a->optim, &b->optim) || !same_list(&a->model, &b->model))
        return false;
    for (int k = 0; k < CKPT_N_FILES; k++)
        if (strcmp(a->files[k].name, b->files[k].name) != 0 ||
            a->files[k].bytes != b->files[k].bytes || a->files[k].xxh64 != b->files[k].xxh64)
            return false;
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ckpt_state a, b;
    ct_error err = {{0}};
    if (ckpt_state_parse(&a, (const char *)data, size, NAME, &err) != 0) {
        if (!fuzz_msg_ok(err.msg, NAME) || a.optim.info || a.model.info) __builtin_trap();
        return 0;
    }
    // Each list tiles [0, total), whatever order its ranges come in.
    if (a.optim.n < 1 || ckpt_shard_list_check(&a.optim, false, a.total, NAME, &err) != 0 ||
        (a.model.n > 0 && ckpt_shard_list_check(&a.model, true, a.total, NAME, &err) != 0) ||
        ckpt_shard_list_total(&a.optim) != a.total)
        __builtin_trap();
    char *text = NULL;
    size_t len = 0;
    if (ckpt_state_text(&text, &len, &a.st, a.files, &a.optim, &a.model, NAME, &err) != 0)
        __builtin_trap();
    if (ckpt_state_parse(&b, text, len, NAME, &err) != 0 || !same_state(&a, &b)) __builtin_trap();
    free(text);
    ckpt_state_free(&a);
    ckpt_state_free(&b);
    return 0;
}
