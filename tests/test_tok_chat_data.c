// Conversations in the data pipeline (issue 20), on the real Qwen3 tokenizer and chat template:
// which tokens are trained (checked against the rendered text: each assistant span, found by
// string search, is what the trained tokens decode to), the loader's -100 targets, block-causal
// positions and the targets across a document boundary, pre-tokenized lines reading back as
// the conversations, text beside conversations in a folder, and train_on_all.
#include <sys/stat.h>

#include "check.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "text/chat.h"
#include "text/chat_mask.h"

#define VOCAB 151936

static const char *tmp;
static tokenizer *tok;
static chat_template *tmpl;

static char *tmp_path(const char *name) {
    static char buf[4][1024];
    static int k;
    char *p = buf[k++ % 4];
    snprintf(p, sizeof buf[0], "%s/%s", tmp, name);
    return p;
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(text, 1, strlen(text), f) != strlen(text) || fclose(f) != 0) exit(2);
}

static const char *convs =
    "{\"messages\": [{\"role\": \"user\", \"content\": \"What is 2+2?\"}, {\"role\": "
    "\"assistant\", \"content\": \"4.\"}]}\n"
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", "
    "\"content\": \"Name a colour.\"}, {\"role\": \"assistant\", \"content\": \"\\nBlue, "
    "of course\"}, {\"role\": \"user\", \"content\": \"Another, in Japanese?\"}, {\"role\": "
    "\"assistant\", \"content\": \"<think>\\nAka is red.\\n</think>\\n\\n赤 (aka).\"}]}\n"
    "{\"messages\": [{\"role\": \"user\", \"content\": \"\"}, {\"role\": \"assistant\", "
    "\"content\": \"\"}]}\n";

static void open_ok(token_stream *s, const char *path, bool all) {
    stream_options o = {
        .tok = tok, .chat = tmpl, .vocab_size = VOCAB, .threads = 2, .train_on_all = all};
    ct_error err = {{0}};
    CHECK(stream_open_with(s, path, &o, &err) == 0, "%s: %s", path, err.msg);
}

// The text of the trained runs of the stream, "|" after each run, and the rendered
// conversations' assistant spans the same way: they must be equal.
static void trained_matches_rendered(const token_stream *s) {
    int32_t *ids = malloc(s->n_tokens * sizeof *ids);
    uint8_t *flags = malloc(s->n_tokens);
    ct_error err;
    CHECK(stream_read(s, 0, s->n_tokens, ids, flags, &err) == 0, "%s", err.msg);
    char got[8192] = "", want[8192] = "";
    for (size_t i = 0; i < s->n_tokens;) {
        if (!(flags[i] & STREAM_TRAIN)) {
            i++;
            continue;
        }
        size_t j = i;
        while (j < s->n_tokens && (flags[j] & STREAM_TRAIN)) j++;
        char *text;
        size_t len;
        CHECK(tok_decode(tok, &text, &len, ids + i, j - i, false, &err) == 0, "%s", err.msg);
        strncat(got, text, sizeof got - strlen(got) - 2);
        strcat(got, "|");
        free(text);
        i = j;
    }
    // The spans of the rendered text, by string search.
    cJSON *lines[3];
    const char *p = convs;
    for (int k = 0; k < 3; k++) {
        const char *nl = strchr(p, '\n');
        lines[k] = cJSON_ParseWithLength(p, (size_t)(nl - p));
        p = nl + 1;
        char *r;
        size_t n;
        CHECK(chat_render(tmpl, cJSON_GetObjectItem(lines[k], "messages"), NULL, false, -1, &r, &n,
                          &err) == 0,
              "%s", err.msg);
        const char *head = "<|im_start|>assistant\n";
        for (const char *a = r; (a = strstr(a, head));) {
            a += strlen(head);
            const char *end = strstr(a, "<|im_end|>") + strlen("<|im_end|>");
            strncat(want, a, (size_t)(end - a));
            strcat(want, "|");
            a = end;
        }
        free(r);
        cJSON_Delete(lines[k]);
    }
    // The content "\nBlue": its newline shares a token with the header's (HF's char_to_token),
    // so the decoded run starts one "\n" early there.
    const char *blue = strstr(want, "\nBlue");
    CHECK(blue != NULL, "rendered: %s", want);
    char want2[8192];
    snprintf(want2, sizeof want2, "%.*s\n%s", (int)(blue - want), want, blue);
    CHECK(strcmp(got, want2) == 0, "trained runs\n%s\nrendered spans\n%s", got, want2);
    free(ids);
    free(flags);
}

static void test_conversations(void) {
    write_file(tmp_path("c.jsonl"), convs);
    token_stream s;
    open_ok(&s, tmp_path("c.jsonl"), false);
    CHECK(s.n_chats == 3 && s.n_docs == 0 && s.flags != NULL, "%llu chats",
          (unsigned long long)s.n_chats);
    trained_matches_rendered(&s);

    // The loader: a target is -100 unless trained; the same windows with positions restart them
    // at each conversation and drop the target across it.
    data_loader l;
    ct_error err;
    int T = (int)s.n_tokens - 1;
    CHECK(loader_init(&l, &s, T, false, 0, &err) == 0, "%s", err.msg);
    int32_t *in = malloc((size_t)T * 4), *tg = malloc((size_t)T * 4), *pos = malloc((size_t)T * 4);
    int32_t *tg2 = malloc((size_t)T * 4);
    uint8_t *flags = malloc(s.n_tokens);
    int32_t *ids = malloc(s.n_tokens * 4);
    CHECK(stream_read(&s, 0, s.n_tokens, ids, flags, &err) == 0, "%s", err.msg);
    CHECK(loader_sample(&l, in, tg, NULL, 0, &err) == 0, "%s", err.msg);
    CHECK(loader_sample(&l, in, tg2, pos, 0, &err) == 0, "%s", err.msg);
    int bad = 0, starts = 0, dropped = 0;
    for (int t = 0; t < T; t++) {
        bool train = flags[t + 1] & STREAM_TRAIN, start = flags[t + 1] & STREAM_DOC_START;
        bad += tg[t] != (train ? ids[t + 1] : -100);
        bad += tg2[t] != (train && !start ? ids[t + 1] : -100);
        dropped += train && start;
        starts += pos[t] == 0;
        bad += t > 0 && pos[t] != ((flags[t] & STREAM_DOC_START) ? 0 : pos[t - 1] + 1);
    }
    CHECK(bad == 0 && starts == 3 && dropped == 0, "%d wrong, %d starts, %d dropped", bad, starts,
          dropped);
    loader_free(&l);

    // train_on_all: every token trained, the same ids.
    token_stream all;
    open_ok(&all, tmp_path("c.jsonl"), true);
    int32_t *ids_all = malloc(all.n_tokens * 4);
    uint8_t *flags_all = malloc(all.n_tokens);
    CHECK(all.n_tokens == s.n_tokens &&
              stream_read(&all, 0, all.n_tokens, ids_all, flags_all, &err) == 0,
          "train_on_all stream");
    int untrained = 0;
    for (size_t i = 0; i < all.n_tokens; i++) untrained += !(flags_all[i] & STREAM_TRAIN);
    CHECK(untrained == 0 && memcmp(ids, ids_all, s.n_tokens * 4) == 0, "%d untrained", untrained);

    // Pre-tokenized lines (what `ctitan tokenize` writes) read back as the conversations.
    FILE *f = fopen(tmp_path("pre.jsonl"), "w");
    size_t at = 0;
    for (size_t i = 1; i <= s.n_tokens; i++) {
        if (i < s.n_tokens && !(flags[i] & STREAM_DOC_START)) continue;
        fputs("{\"ids\": [", f);
        for (size_t k = at; k < i; k++) fprintf(f, "%s%d", k > at ? "," : "", ids[k]);
        fputs("], \"mask\": [", f);
        for (size_t k = at; k < i; k++) fprintf(f, "%s%d", k > at ? "," : "", flags[k] & 1);
        fputs("]}\n", f);
        at = i;
    }
    fclose(f);
    token_stream pre;
    open_ok(&pre, tmp_path("pre.jsonl"), false);
    int32_t *ids_pre = malloc(pre.n_tokens * 4);
    uint8_t *flags_pre = malloc(pre.n_tokens);
    CHECK(pre.n_tokens == s.n_tokens && pre.n_chats == 3 &&
              stream_read(&pre, 0, pre.n_tokens, ids_pre, flags_pre, &err) == 0 &&
              memcmp(ids_pre, ids, s.n_tokens * 4) == 0 &&
              memcmp(flags_pre, flags, s.n_tokens) == 0,
          "pre-tokenized lines differ from the conversations");

    free(in), free(tg), free(tg2), free(pos), free(flags), free(ids), free(ids_all);
    free(flags_all), free(ids_pre), free(flags_pre);
    stream_free(&s);
    stream_free(&all);
    stream_free(&pre);
}

// Text beside conversations: its documents are trained whole and end with <|endoftext|>,
// after which a document starts.
static void test_text_beside_chat(void) {
    char *dir = tmp_path("mixed");
    mkdir(dir, 0755);
    char p[1200];
    snprintf(p, sizeof p, "%s/a.jsonl", dir);
    write_file(p, "{\"text\": \"plain one\"}\n{\"text\": \"plain two\"}\n");
    snprintf(p, sizeof p, "%s/b.jsonl", dir);
    write_file(p, convs);
    token_stream s;
    open_ok(&s, dir, false);
    int32_t *ids = malloc(s.n_tokens * 4);
    uint8_t *flags = malloc(s.n_tokens);
    ct_error err;
    CHECK(s.n_docs == 2 && s.n_chats == 3 && stream_read(&s, 0, s.n_tokens, ids, flags, &err) == 0,
          "%llu docs %llu chats", (unsigned long long)s.n_docs, (unsigned long long)s.n_chats);
    int32_t eos = tok_eos_id(tok);
    size_t first_eos = 0;
    while (ids[first_eos] != eos) first_eos++;
    int bad = 0;
    for (size_t i = 0; i <= first_eos; i++)
        bad += !(flags[i] & STREAM_TRAIN) || ((flags[i] & STREAM_DOC_START) != 0) != (i == 0);
    CHECK(bad == 0 && (flags[first_eos + 1] & STREAM_DOC_START), "text flags: %d wrong", bad);
    free(ids);
    free(flags);
    stream_free(&s);
}

// The mask alone: a turn without <|im_end|> is trained to the end; user turns never.
static void test_mask_edges(void) {
    tok_encoder *e;
    ct_error err;
    tok_ids ids = {0};
    CHECK(tok_encoder_new(&e, tok, &err) == 0, "%s", err.msg);
    const char *text = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello there";
    CHECK(tok_encode(e, &ids, text, strlen(text), &err) == 0, "%s", err.msg);
    uint8_t mask[64];
    int64_t n = chat_assistant_mask(tok, ids.v, ids.n, mask, &err);
    char *dec;
    size_t len;
    size_t first = 0;
    while (first < ids.n && !mask[first]) first++;
    CHECK(tok_decode(tok, &dec, &len, ids.v + first, ids.n - first, false, &err) == 0, "%s",
          err.msg);
    CHECK(n == (int64_t)(ids.n - first) && strcmp(dec, "hello there") == 0, "%lld: '%s'",
          (long long)n, dec);
    free(dec);
    tok_ids_free(&ids);
    tok_encoder_free(e);
}

int main(void) {
    tmp = check_env("CTITAN_TMP");
    mkdir(tmp, 0755);
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/qwen3-tokenizer", check_env("CTITAN_ASSETS_DIR"));
    ct_error err;
    if (tok_load(&tok, dir, &err) != 0 || chat_template_load(&tmpl, dir, &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        return 77;
    }
    test_conversations();
    test_text_beside_chat();
    test_mask_edges();
    chat_template_free(tmpl);
    tok_free(tok);
    return check_summary();
}
