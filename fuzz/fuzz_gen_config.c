// libFuzzer target: generation_config.json (gen/gen_config.c), which generate reads from a model
// folder. Rejected input must come with one line naming the file; accepted input must give at
// most GEN_MAX_EOS stop ids and a named, bounded list of unsupported settings, and parse the same
// a second time.
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "gen/gen_config.h"
#include "fuzz_msg.h"

#define NAME "fuzz/generation_config.json"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static bool same_number(double a, double b) {
    return (isnan(a) && isnan(b)) || a == b;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    gen_file_config a, b;
    ct_error err = {{0}};
    if (gen_config_parse(&a, (const char *)data, size, NAME, &err) != 0) {
        if (!fuzz_msg_ok(err.msg, NAME)) __builtin_trap();
        return 0;
    }
    if (a.n_eos < 0 || a.n_eos > GEN_MAX_EOS || a.n_unsupported < 0 ||
        a.n_unsupported > GEN_MAX_UNSUPPORTED)
        __builtin_trap();
    for (int i = 0; i < a.n_unsupported; i++)
        if (!a.unsupported[i] || !a.unsupported[i][0]) __builtin_trap();
    if (gen_config_parse(&b, (const char *)data, size, NAME, &err) != 0) __builtin_trap();
    if (a.n_eos != b.n_eos || memcmp(a.eos, b.eos, sizeof a.eos) != 0 ||
        a.do_sample != b.do_sample || !same_number(a.temperature, b.temperature) ||
        !same_number(a.top_k, b.top_k) || !same_number(a.top_p, b.top_p) ||
        !same_number(a.min_p, b.min_p) ||
        !same_number(a.repetition_penalty, b.repetition_penalty) ||
        a.n_unsupported != b.n_unsupported)
        __builtin_trap();
    return 0;
}
