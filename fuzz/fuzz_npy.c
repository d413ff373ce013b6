// libFuzzer target: npy_parse (the validation behind npy_open) on arbitrary bytes, then reading
// every token of accepted input with a vocab check.
#include <stdint.h>
#include <string.h>

#include "io/npy.h"
#include "fuzz_msg.h"

#define NAME "fuzz.npy"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    npy_tokens t;
    ct_error err = {{0}};
    if (npy_parse(&t, data, size, NAME, &err) != 0) {
        if (!fuzz_msg_ok(err.msg, NAME)) __builtin_trap();
        return 0;
    }
    if (t.data + t.count * t.elem_size != data + size) __builtin_trap();
    int32_t out[256];
    for (uint64_t start = 0; start < t.count; start += 256) {
        size_t n = t.count - start < 256 ? (size_t)(t.count - start) : 256;
        if (npy_read(out, &t, start, n, 1000, &err) != 0) {
            if (!fuzz_msg_ok(err.msg, NAME)) __builtin_trap();
        } else {
            for (size_t i = 0; i < n; i++)
                if (out[i] < 0 || out[i] >= 1000) __builtin_trap();
        }
    }
    if (npy_read(out, &t, t.count, 1, 0, &err) == 0) __builtin_trap(); // past the end
    npy_close(&t);
    return 0;
}
