// Qwen's ChatML layout for SFT data: each message as
//   <|im_start|>{role}\n{content}<|im_end|>\n
// and, when a reply is to follow, "<|im_start|>assistant\n". This is what Qwen's chat template
// renders for plain messages; its extras (tools, <think> handling of past assistant turns) are
// not reproduced, as this is not a Jinja engine.
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "core/error.h"

typedef struct chat_message {
    const char *role; // "system", "user", "assistant", "tool", ...
    const char *content;
} chat_message;

// Renders msgs[0..n) into a malloc'd, NUL-terminated *out. A role must be non-empty and free of
// newlines and of "<|" (it would corrupt the layout); content may be anything.
int chat_format(char **out, size_t *out_len, const chat_message *msgs, size_t n,
                bool add_generation_prompt, ct_error *err);
