// libFuzzer target: PEFT's adapter folder on arbitrary bytes (model/peft_adapter.c).
// - Input not starting with byte 1: adapter_config.json. Accepted input must write
//   (peft_config_text) a config that parses back to the same fields and writes the same bytes
//   again: what ctitan saves, PEFT and ctitan read unchanged. Rejected input must come with one
//   line naming the file.
// - Byte 1, then a safetensors image: the adapter tensors checked against a tiny MoE model's
//   layout (peft_geometry.h). Rejected input must name the file; accepted input must convert.
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/peft_adapter.h"
#include "peft_geometry.h"
#include "fuzz_msg.h"

#define NAME "fuzz/adapter_config.json"
#define ST_NAME "fuzz/adapter_model.safetensors"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static bool same(const peft_config *a, const peft_config *b) {
    return a->lc.rank == b->lc.rank && a->lc.alpha == b->lc.alpha &&
           a->lc.dropout == b->lc.dropout && a->lc.targets == b->lc.targets &&
           a->lc.use_rslora == b->lc.use_rslora && strcmp(a->base_model, b->base_model) == 0;
}

static void tensors(const uint8_t *data, size_t size) {
    static lora_layout L;
    static float *buf;
    ct_error err = {{0}};
    if (!buf) {
        qwen3_config c;
        lora_config lc;
        peft_fuzz_geometry(&c, &lc);
        if (lora_layout_init(&L, &c, &lc, &err) != 0) __builtin_trap();
        buf = malloc(L.num * sizeof *buf);
    }
    st_file f;
    if (st_parse(&f, data, size, ST_NAME, &err) != 0) return;
    if (peft_tensors_read(buf, &L, &f, ST_NAME, &err) != 0 && !fuzz_msg_ok(err.msg, ST_NAME))
        __builtin_trap();
    st_close(&f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 0 && data[0] == 1) {
        tensors(data + 1, size - 1);
        return 0;
    }
    peft_config a, b;
    ct_error err = {{0}};
    if (peft_config_parse(&a, (const char *)data, size, NAME, &err) != 0) {
        if (!fuzz_msg_ok(err.msg, NAME)) __builtin_trap();
        return 0;
    }
    char *t1 = NULL, *t2 = NULL;
    size_t n1 = 0, n2 = 0;
    if (peft_config_text(&t1, &n1, &a, &err) != 0) __builtin_trap();
    if (peft_config_parse(&b, t1, n1, NAME, &err) != 0) __builtin_trap();
    if (!same(&a, &b)) __builtin_trap();
    if (peft_config_text(&t2, &n2, &b, &err) != 0) __builtin_trap();
    if (n1 != n2 || memcmp(t1, t2, n1) != 0) __builtin_trap();
    free(t1);
    free(t2);
    return 0;
}
