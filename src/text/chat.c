#include "text/chat.h"

#include <stdlib.h>
#include <string.h>

static const char im_start[] = "<|im_start|>", im_end[] = "<|im_end|>\n";

static char *put(char *p, const char *s, size_t n) {
    memcpy(p, s, n);
    return p + n;
}

int chat_format(char **out, size_t *out_len, const chat_message *msgs, size_t n,
                bool add_generation_prompt, ct_error *err) {
    *out = NULL;
    *out_len = 0;
    size_t total = 1;
    for (size_t i = 0; i < n; i++) {
        const char *role = msgs[i].role;
        if (!role || !role[0] || strchr(role, '\n') || strstr(role, "<|"))
            return ct_fail(err,
                           "chat message %zu: role \"%s\" must be non-empty, one line, "
                           "without \"<|\"",
                           i, role ? role : "(null)");
        if (!msgs[i].content) return ct_fail(err, "chat message %zu (%s): no content", i, role);
        total += strlen(im_start) + strlen(role) + 1 + strlen(msgs[i].content) + strlen(im_end);
    }
    if (add_generation_prompt) total += strlen(im_start) + strlen("assistant\n");
    char *buf = malloc(total), *p = buf;
    if (!buf) return ct_fail(err, "chat: out of memory for %zu bytes", total);
    for (size_t i = 0; i < n; i++) {
        p = put(p, im_start, strlen(im_start));
        p = put(p, msgs[i].role, strlen(msgs[i].role));
        p = put(p, "\n", 1);
        p = put(p, msgs[i].content, strlen(msgs[i].content));
        p = put(p, im_end, strlen(im_end));
    }
    if (add_generation_prompt) {
        p = put(p, im_start, strlen(im_start));
        p = put(p, "assistant\n", strlen("assistant\n"));
    }
    *p = 0;
    *out = buf;
    *out_len = (size_t)(p - buf);
    return 0;
}
