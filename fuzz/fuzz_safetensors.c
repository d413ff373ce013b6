// libFuzzer target: st_parse (the validation behind st_open) on arbitrary bytes. Accepted input
// must be internally consistent: every tensor findable, its data inside the buffer, float
// tensors convertible. Rejected input must come with a message naming the file.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"
#include "fuzz_msg.h"

#define NAME "fuzz.safetensors"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    st_file f;
    ct_error err = {{0}};
    if (st_parse(&f, data, size, NAME, &err) != 0) {
        if (!fuzz_msg_ok(err.msg, NAME)) __builtin_trap();
        return 0;
    }
    const uint8_t *region = data + 8 + f.header_len;
    volatile uint8_t sink = 0;
    for (int i = 0; i < f.n_tensors; i++) {
        const st_tensor *t = &f.tensors[i];
        if (st_file_find(&f, t->name) != t) __builtin_trap();
        if (i > 0 && strcmp(f.tensors[i - 1].name, t->name) >= 0) __builtin_trap();
        if ((const uint8_t *)t->data != region + t->begin || region + t->end > data + size)
            __builtin_trap();
        if (t->end > t->begin) sink ^= ((const uint8_t *)t->data)[t->end - t->begin - 1];
        if (t->numel <= (1u << 16)) {
            float *out = malloc((size_t)t->numel * sizeof(float) + 1);
            int rc = st_tensor_to_f32(out, t, &err);
            int is_float = t->dtype == CT_F32 || t->dtype == CT_BF16 || t->dtype == CT_F16 ||
                           t->dtype == CT_F64;
            if ((rc == 0) != is_float) __builtin_trap();
            free(out);
        }
    }
    (void)sink;
    st_close(&f);
    return 0;
}
