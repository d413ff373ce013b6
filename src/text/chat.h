// A model's chat template (Hugging Face's tokenizer_config.json "chat_template" or
// chat_template.jinja), rendered as transformers' apply_chat_template renders it (jinja.h).
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

#include "core/error.h"

typedef struct chat_template chat_template;

// From a Hugging Face tokenizer folder: chat_template.jinja if present, else
// tokenizer_config.json's "chat_template" (a string, or a list of {"name", "template"}: the one
// named "default"). Also reads the special tokens the template sees (bos_token, eos_token,
// pad_token, unk_token from tokenizer_config.json: strings or {"content": ...}). An error names
// the folder and the files looked at when there is no template.
int chat_template_load(chat_template **out, const char *dir, ct_error *err);
// A template given as text (no special tokens).
int chat_template_from_string(chat_template **out, const char *src, size_t len, ct_error *err);
void chat_template_free(chat_template *t);

// Renders messages (a JSON array of {"role", "content", ...}) as apply_chat_template(messages,
// tools=tools, add_generation_prompt=..., enable_thinking=...) does; tools may be NULL (the
// template then sees None). enable_thinking: -1 = not passed, 0 = False, 1 = True. The messages
// are checked first: a non-empty array of objects whose role is system, user, assistant or tool
// and whose content is a string (null only in an assistant message with tool_calls).
int chat_render(const chat_template *t, const cJSON *messages, const cJSON *tools,
                bool add_generation_prompt, int enable_thinking, char **out, size_t *out_len,
                ct_error *err);
