// What every fuzzed parser's refusal must be: a message that names the input and is one line of
// text with no control character (ct_fail escapes what it formats: a name from the input is
// shown, never obeyed by a terminal).
#pragma once
#include <string.h>

static inline int fuzz_msg_ok(const char *msg, const char *name) {
    if (!strstr(msg, name)) return 0;
    for (const unsigned char *p = (const unsigned char *)msg; *p; p++)
        if (*p < 0x20 || *p == 0x7f) return 0;
    return 1;
}
