// Which tokens of a rendered conversation are the assistant's: what `training.train_on =
// "assistant"` trains on.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "text/tokenizer.h"

// Sets mask[i] = 1 for each token of an assistant turn, from the one holding the first byte
// after "<|im_start|>assistant\n" through that turn's "<|im_end|>" (or the end of ids when it
// has none), and 0 elsewhere. A token that straddles the "\n" and the content (content that
// begins with a newline) counts as the content's, as HF's char_to_token does for a
// {% generation %} span. Returns the number of trained tokens; -1 with err when the tokenizer
// has no <|im_start|> or <|im_end|>.
int64_t chat_assistant_mask(const tokenizer *t, const int32_t *ids, size_t n, uint8_t *mask,
                            ct_error *err);
