// libFuzzer target: jinja_parse on arbitrary bytes, and jinja_render of what parses with a small
// chat-like set of variables, under tight limits (runaway loops, recursion and output must end
// in an error, never a hang or a crash). Every error names the template and a position.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "text/jinja.h"
#include "fuzz_msg.h"

#define NAME "fuzz_tpl"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static cJSON *vars;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!vars)
        vars = cJSON_Parse(
            "{\"messages\": [{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", "
            "\"content\": \"h\\u00e9 {{ x }} <think>a</think>b\"}, {\"role\": \"assistant\", "
            "\"content\": \"\", \"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": "
            "\"f\", \"arguments\": {\"a\": [1, 2.5, null, true]}}}]}, {\"role\": \"tool\", "
            "\"content\": \"r\"}], \"tools\": [{\"name\": \"f\"}], \"add_generation_prompt\": "
            "true, \"enable_thinking\": false, \"eos_token\": \"<|im_end|>\", \"n\": 3}");
    ct_error err = {{0}};
    jinja_template *t;
    if (jinja_parse(&t, (const char *)data, size, NAME, &err) != 0) {
        if (strncmp(err.msg, NAME ":", strlen(NAME) + 1) != 0 || !fuzz_msg_ok(err.msg, NAME))
            __builtin_trap();
        return 0;
    }
    // The limits are reached as often at these sizes, at a tenth of the cost: with 1 MiB of
    // output and 20,000 steps, renders running to a limit took most of the time (nested loops
    // writing the output, every comparison traced) and the rate fell to 1,500 a second.
    jinja_set_limits(
        t, &(jinja_limits){
               .max_output = 64 << 10, .max_memory = 4 << 20, .max_steps = 2000, .max_depth = 40});
    char *out = NULL;
    size_t n = 0;
    if (jinja_render(t, vars, &out, &n, &err) != 0) {
        if (strncmp(err.msg, NAME ":", strlen(NAME) + 1) != 0 || !fuzz_msg_ok(err.msg, NAME))
            __builtin_trap();
    } else if (!out || strlen(out) > n) {
        __builtin_trap();
    }
    free(out);
    jinja_free(t);
    return 0;
}
