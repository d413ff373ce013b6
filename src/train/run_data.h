// A run's data, as train and eval open it: the tokenizer and chat template the dataset needs
// (model.tokenizer_path), the packed token stream (text, .jsonl lines and conversations, .npy
// files and shard folders) and the loader's windows of seq_len + 1 tokens, shuffled or not.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "core/error.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "text/chat.h"
#include "text/tokenizer.h"
#include "train/config.h"

typedef struct run_text {
    tokenizer *tok;      // NULL when the data is .npy alone and nothing needs documents
    chat_template *chat; // NULL when the tokenizer folder has none (a conversation then fails)
    ct_error no_chat;    // why there is no template, for that message
    bool train_on_all;   // training.train_on = "all"
    int32_t vocab_size;  // the model's: every id is checked against it
} run_text;

// Whether c's attention masks documents (model.attn_mask_type = "block_causal").
bool run_data_block_causal(const ct_config *c);
// The tokenizer and template for reading `paths` (n of them): needed unless every path is a .npy
// and block_causal does not need the end-of-document id. A tokenizer with more ids than the
// model's vocabulary is refused.
int run_text_open(run_text *x, const ct_config *c, const char *const *paths, int n,
                  int32_t vocab_size, ct_error *err);
void run_text_free(run_text *x);
// path's stream and a loader over it (windows of T + 1 tokens; shuffle with seed).
int run_data_open(token_stream *s, data_loader *l, const run_text *x, const char *path, int T,
                  bool shuffle, uint64_t seed, ct_error *err);
