// libFuzzer target: qwen3_config_parse (an HF config.json) on arbitrary bytes. Accepted input
// must save (qwen3_config_text) to a config.json that parses back to the same model fields and
// saves again to the same bytes: what an export writes, a later export reads unchanged.
// Rejected input must come with a message naming the file.
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/qwen3_config.h"
#include "fuzz_msg.h"

#define NAME "fuzz/config.json"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static qwen3_config a, b; // 32 KiB each
    ct_error err = {{0}};
    if (qwen3_config_parse(&a, (const char *)data, size, NAME, &err) != 0) {
        if (!fuzz_msg_ok(err.msg, NAME)) __builtin_trap();
        return 0;
    }
    char *t1 = NULL, *t2 = NULL;
    size_t n1 = 0, n2 = 0;
    if (qwen3_config_text(&t1, &n1, &a, NAME, &err) != 0) __builtin_trap();
    if (qwen3_config_parse(&b, t1, n1, NAME, &err) != 0) __builtin_trap();
    // An unstated dtype is saved as float32.
    if (!a.torch_dtype[0]) memcpy(a.torch_dtype, "float32", sizeof "float32");
    if (memcmp(&a, &b, offsetof(qwen3_config, hf_source)) != 0) __builtin_trap();
    if (qwen3_config_text(&t2, &n2, &b, NAME, &err) != 0) __builtin_trap();
    if (n1 != n2 || memcmp(t1, t2, n1) != 0) __builtin_trap();
    free(t1);
    free(t2);
    return 0;
}
