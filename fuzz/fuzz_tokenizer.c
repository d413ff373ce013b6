// libFuzzer target for the tokenizer (src/text). The first byte picks what the rest is:
//   0 mod 4: text for the real Qwen3 tokenizer. Encoding must succeed exactly when the bytes
//         are valid UTF-8; after repair (the documented rule) it must succeed, and decoding the
//         ids must give back the NFC form of the repaired text.
//   2 mod 4: a .jsonl line. Where cJSON finds a string "text", json_member_string must find it
//         too and json_unescape must give cJSON's string followed, from the first \u0000 on, by
//         what cJSON's C string cannot hold; the bytes (NUL included) then encode. The same
//         line through the data pipeline's parser (jsonl_doc_parse): a conversation renders
//         with the real Qwen3 chat template or fails with a message, and its assistant mask
//         marks tokens of the ids only; pre-tokenized ids and mask are checked, then copied.
//   odd:  a tokenizer.json, and after a NUL byte (if any) its tokenizer_config.json. Loading
//         must succeed or fail with a message; a loaded one encodes.
// $CTITAN_FUZZ_TOKENIZER_MODE (text, jsonl or json) pins every input to one mode, whatever its
// first byte, so a campaign counts each mode's executions on its own.
// The real tokenizer is read once from $CTITAN_TOKENIZER_DIR, else from the assets folder that
// scripts/fetch-assets fills.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "data/jsonl.h"
#include "io/json.h"
#include "text/chat.h"
#include "text/chat_mask.h"
#include "text/normalize.h"
#include "text/tokenizer.h"
#include "core/utf8.h"
#include "fuzz_msg.h"

#ifndef CTITAN_ASSETS_DIR
#define CTITAN_ASSETS_DIR "assets"
#endif

static tokenizer *qwen;
static tok_encoder *enc;
static nfc_scratch nfc;
static tok_ids ids;
static chat_template *qwen_chat;
static int pinned = -1; // the first byte every input is read with, or -1: its own

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    const char *dir = getenv("CTITAN_TOKENIZER_DIR");
    ct_error err;
    if (!dir) dir = CTITAN_ASSETS_DIR "/qwen3-tokenizer";
    const char *mode = getenv("CTITAN_FUZZ_TOKENIZER_MODE");
    if (mode && *mode) {
        pinned = !strcmp(mode, "text")    ? 0
                 : !strcmp(mode, "jsonl") ? 2
                 : !strcmp(mode, "json")  ? 1
                                          : -2;
        if (pinned == -2) {
            fprintf(stderr,
                    "fuzz_tokenizer: CTITAN_FUZZ_TOKENIZER_MODE is '%s' (expected text, "
                    "jsonl or json)\n",
                    mode);
            exit(1);
        }
    }
    if (tok_load(&qwen, dir, &err) != 0 || tok_encoder_new(&enc, qwen, &err) != 0 ||
        chat_template_load(&qwen_chat, dir, &err) != 0) {
        fprintf(stderr,
                "fuzz_tokenizer: %s (run scripts/fetch-assets, or set "
                "CTITAN_TOKENIZER_DIR)\n",
                err.msg);
        exit(1);
    }
    return 0;
}

static void fuzz_text(const char *data, size_t size) {
    ct_error err;
    bool valid = utf8_valid_prefix(data, size) == size;
    ids.n = 0;
    if ((tok_encode(enc, &ids, data, size, &err) == 0) != valid) abort();
    char *fixed = malloc(utf8_repair_bound(size) + 1);
    size_t n = utf8_repair(fixed, data, size, NULL);
    if (utf8_valid_prefix(fixed, n) != n) abort();
    if (valid && (n != size || memcmp(fixed, data, size) != 0)) abort(); // repair keeps valid text
    if (!valid) { // valid text's ids are already the repaired text's: encode only what changed
        ids.n = 0;
        if (tok_encode(enc, &ids, fixed, n, &err) != 0) abort();
    }
    char *back;
    size_t back_n;
    if (tok_decode(qwen, &back, &back_n, ids.v, ids.n, false, &err) != 0) abort();
    const char *norm;
    size_t norm_n;
    if (nfc_apply(&norm, &norm_n, &nfc, fixed, n, &err) != 0) abort();
    if (back_n != norm_n || memcmp(back, norm, norm_n) != 0) abort();
    free(back);
    free(fixed);
}

static void fuzz_json(const char *data, size_t size) {
    ct_error err;
    tokenizer *t;
    const char *nul = memchr(data, 0, size);
    const size_t json_len = nul ? (size_t)(nul - data) : size;
    if (tok_load_json(&t, data, json_len, nul ? nul + 1 : NULL, nul ? size - json_len - 1 : 0,
                      "fuzz.json", "fuzz_config.json", &err) != 0) {
        if (!fuzz_msg_ok(err.msg, "fuzz")) abort(); // a failure names its file, in one line
        return;
    }
    tok_encoder *e;
    tok_ids out = {0};
    if (tok_encoder_new(&e, t, &err) == 0) {
        tok_encode(e, &out, "Hello, world! <|im_end|> 123", 28, &err);
        tok_encoder_free(e);
    }
    tok_ids_free(&out);
    tok_free(t);
}

// A line as training reads it: one error message, or a document that encodes.
static void fuzz_jsonl_doc(const char *data, size_t size) {
    jsonl_doc d;
    jsonl_buf buf = {0};
    ct_error err = {{0}};
    if (jsonl_doc_parse(&d, &buf, data, size, &err) != 0) {
        if (!err.msg[0] || !fuzz_msg_ok(err.msg, "")) abort();
        jsonl_buf_free(&buf);
        return;
    }
    if (d.kind == JSONL_CHAT) {
        const cJSON *tools = cJSON_GetObjectItemCaseSensitive(d.root, "tools");
        char *text;
        size_t len;
        if (chat_render(qwen_chat, cJSON_GetObjectItemCaseSensitive(d.root, "messages"),
                        cJSON_IsNull(tools) ? NULL : tools, false, -1, &text, &len, &err) == 0) {
            ids.n = 0;
            if (utf8_valid_prefix(text, len) == len &&
                tok_encode(enc, &ids, text, len, &err) == 0) {
                uint8_t *mask = malloc(ids.n + 1);
                int64_t n = chat_assistant_mask(qwen, ids.v, ids.n, mask, &err);
                for (size_t i = 0; i < ids.n; i++) n -= mask[i];
                if (n != 0) abort(); // the count is the mask's
                free(mask);
            }
            free(text);
        } else if (!err.msg[0]) {
            abort();
        }
    } else if (d.kind == JSONL_IDS) {
        size_t n;
        bool has_mask;
        if (jsonl_ids_check(d.root, 151936, &n, &has_mask, &err) == 0) {
            int32_t *v = malloc(n * sizeof *v);
            uint8_t *m = malloc(n);
            jsonl_ids_copy(d.root, v, m);
            for (size_t i = 0; i < n; i++)
                if (v[i] < 0 || v[i] >= 151936 || (has_mask && m[i] > 1)) abort();
            free(v);
            free(m);
        }
    }
    cJSON_Delete(d.root);
    jsonl_buf_free(&buf);
}

static void fuzz_jsonl(const char *data, size_t size) {
    fuzz_jsonl_doc(data, size);
    cJSON *j = cJSON_ParseWithLength(data, size);
    const cJSON *t = cJSON_IsObject(j) ? cJSON_GetObjectItemCaseSensitive(j, "text") : NULL;
    // Members cJSON calls "text": a name with a \u0000 ("text\u0000x") is one to cJSON's strcmp.
    int n_text = 0;
    for (const cJSON *c = j ? j->child : NULL; c; c = c->next)
        n_text += c->string && strcmp(c->string, "text") == 0;
    const char *body;
    size_t body_n;
    bool found = json_member_string(&body, &body_n, data, size, "text");
    if (found && (body < data || body_n > size || body + body_n > data + size)) abort();
    if (cJSON_IsString(t) && n_text == 1 && found) {
        // The same member: the bytes are cJSON's string, then what its C string cut at a NUL.
        char *out = malloc(body_n + 1);
        size_t n, c = strlen(t->valuestring);
        // cJSON reads a \u with a bad hex digit as \u0000, where json_unescape refuses it.
        if (json_unescape(out, &n, body, body_n) != 0) {
            free(out);
            cJSON_Delete(j);
            return;
        }
        if (n > body_n || n < c || memcmp(out, t->valuestring, c) != 0 || (n > c && out[c] != 0))
            abort();
        ct_error err;
        ids.n = 0;
        if (utf8_valid_prefix(out, n) == n && tok_encode(enc, &ids, out, n, &err) != 0) abort();
        free(out);
    }
    cJSON_Delete(j);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    const int kind = pinned >= 0 ? pinned : data[0];
    if (kind & 1)
        fuzz_json((const char *)data + 1, size - 1);
    else if (kind & 2)
        fuzz_jsonl((const char *)data + 1, size - 1);
    else
        fuzz_text((const char *)data + 1, size - 1);
    return 0;
}
