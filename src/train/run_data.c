#include "train/run_data.h"

#include <string.h>

static bool npy_only(const char *path) {
    const size_t n = strlen(path);
    return n > 4 && strcmp(path + n - 4, ".npy") == 0;
}

bool run_data_block_causal(const ct_config *c) {
    return strcmp(c->model.attn_mask_type, "block_causal") == 0;
}

int run_text_open(run_text *x, const ct_config *c, const char *const *paths, int n,
                  int32_t vocab_size, ct_error *err) {
    memset(x, 0, sizeof *x);
    x->vocab_size = vocab_size;
    x->train_on_all = strcmp(c->training.train_on, "all") == 0;
    bool need_tok = run_data_block_causal(c); // its documents end at the end-of-document id
    for (int i = 0; i < n; i++) need_tok |= !npy_only(paths[i]);
    if (!need_tok) return 0;
    if (tok_load(&x->tok, c->model.tokenizer_path, err) != 0)
        return ct_wrap(err, "model.tokenizer_path");
    if (tok_vocab_size(x->tok) > vocab_size)
        return ct_fail(err,
                       "tokenizer %s has %d ids but the model's vocab_size is %d: token ids "
                       "would fall outside the embedding",
                       c->model.tokenizer_path, tok_vocab_size(x->tok), vocab_size);
    // A folder without a template is an error only if the data holds a conversation.
    if (chat_template_load(&x->chat, c->model.tokenizer_path, &x->no_chat) != 0) x->chat = NULL;
    return 0;
}

void run_text_free(run_text *x) {
    if (x->tok) tok_free(x->tok);
    chat_template_free(x->chat);
    memset(x, 0, sizeof *x);
}

int run_data_open(token_stream *s, data_loader *l, const run_text *x, const char *path, int T,
                  bool shuffle, uint64_t seed, ct_error *err) {
    const stream_options so = {.tok = x->tok,
                               .chat = x->chat,
                               .chat_from = x->no_chat.msg,
                               .vocab_size = x->vocab_size,
                               .train_on_all = x->train_on_all};
    if (stream_open_with(s, path, &so, err) != 0) return -1;
    return loader_init(l, s, T, shuffle, seed, err);
}
