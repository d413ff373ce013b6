// Parity with Hugging Face: ctitan's ids must equal HF tokenizers' ids on every case that
// tests/ref/tok_ref.mjs writes (hand-written hard cases, a sweep over Unicode, and every sentence
// of several nlp-corpus files), and decoding must give back HF's text.
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "check.h"
#include "io/json.h"
#include "text/chat.h"
#include "text/tokenizer.h"

static bool ids_equal(const tok_ids *got, const cJSON *want) {
    if (!cJSON_IsArray(want) || (size_t)cJSON_GetArraySize(want) != got->n) return false;
    size_t i = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, want) {
        if ((int32_t)v->valuedouble != got->v[i++]) return false;
    }
    return true;
}

static void show_diff(const char *name, const tok_ids *got, const cJSON *want) {
    size_t i = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, want) {
        if (i >= got->n || (int32_t)v->valuedouble != got->v[i]) break;
        i++;
    }
    fprintf(stderr, "  %s: %zu ids vs HF %d; first difference at index %zu (ctitan %d, HF %d)\n",
            name, got->n, cJSON_GetArraySize(want), i, i < got->n ? got->v[i] : -1,
            cJSON_GetArrayItem(want, (int)i) ? (int)cJSON_GetArrayItem(want, (int)i)->valuedouble
                                             : -1);
}

// Runs the node reference once per build folder (it is regenerated when missing).
static int make_reference(const char *out, const char *assets, const char *src) {
    struct stat st;
    char stamp[4096];
    snprintf(stamp, sizeof stamp, "%s/.fetch-assets-stamp", assets);
    if (stat(stamp, &st) != 0) {
        printf("FAIL: %s has no assets: run scripts/fetch-assets (it needs node and npm)\n",
               assets);
        return 1;
    }
    char cmd[16384];
    snprintf(cmd, sizeof cmd, "node '%s/tests/ref/tok_ref.mjs' --assets '%s' --out '%s'", src,
             assets, out);
    fprintf(stderr, "running: %s\n", cmd);
    if (system(cmd) != 0) {
        fprintf(stderr, "the node reference failed: %s\n", cmd);
        return 1;
    }
    return 0;
}

int main(void) {
    const char *assets = check_env("CTITAN_ASSETS_DIR"), *tmp = check_env("CTITAN_TMP");
    const char *src = check_env("CTITAN_SOURCE_DIR");
    char ref_path[4096], tok_dir[4096];
    snprintf(ref_path, sizeof ref_path, "%s/tok_ref.jsonl", tmp);
    snprintf(tok_dir, sizeof tok_dir, "%s/qwen3-tokenizer", assets);
    int rc = make_reference(ref_path, assets, src);
    if (rc != 0) return rc;

    ct_error err;
    tokenizer *tok;
    if (tok_load(&tok, tok_dir, &err) != 0) {
        fprintf(stderr, "tok_load: %s\n", err.msg);
        return 1;
    }
    tok_encoder *enc;
    CHECK(tok_encoder_new(&enc, tok, &err) == 0, "%s", err.msg);

    char *text;
    size_t len;
    if (file_read_all(&text, &len, ref_path, (size_t)1 << 30, &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    int n_cases = 0, same_hf = 0, same_js = 0, js_wrong = 0, decoded_ok = 0, roundtrip_ok = 0;
    int nfc_changed = 0;
    bool saw_chat = false;
    tok_ids ids = {0};
    for (char *line = text, *nl; line < text + len; line = nl + 1) {
        nl = memchr(line, '\n', (size_t)(text + len - line));
        if (!nl) nl = text + len;
        if (nl == line) continue;
        cJSON *c = cJSON_ParseWithLength(line, (size_t)(nl - line));
        if (!c) {
            CHECK(0, "bad reference line %d", n_cases + 1);
            break;
        }
        const char *name = cJSON_GetObjectItem(c, "name")->valuestring;
        const cJSON *hf = cJSON_GetObjectItem(c, "hf"), *js = cJSON_GetObjectItem(c, "js");
        size_t n, nfc_n, dec_n, skip_n;
        char *in = check_unhex(cJSON_GetObjectItem(c, "hex")->valuestring, &n);
        char *nfc = check_unhex(cJSON_GetObjectItem(c, "nfc_hex")->valuestring, &nfc_n);
        char *want_dec = check_unhex(cJSON_GetObjectItem(c, "hf_decoded")->valuestring, &dec_n);
        char *want_skip =
            check_unhex(cJSON_GetObjectItem(c, "hf_decoded_skip")->valuestring, &skip_n);
        n_cases++;
        if (strcmp(name, "chatml") == 0) {
            // Qwen3's chat template renders exactly this case's text, so its ids are HF's too.
            chat_template *ct = NULL;
            cJSON *msgs = cJSON_Parse("[{\"role\": \"system\", \"content\": \"You are helpful.\"},"
                                      " {\"role\": \"user\", \"content\": \"Hi!\"}]");
            char *chat = NULL;
            size_t chat_n = 0;
            CHECK(chat_template_load(&ct, tok_dir, &err) == 0 &&
                      chat_render(ct, msgs, NULL, true, -1, &chat, &chat_n, &err) == 0,
                  "%s", err.msg);
            CHECK(chat && chat_n == n && memcmp(chat, in, n) == 0, "the chat template differs: %s",
                  chat ? chat : "(none)");
            free(chat);
            cJSON_Delete(msgs);
            chat_template_free(ct);
            saw_chat = true;
        }
        ids.n = 0;
        if (tok_encode(enc, &ids, in, n, &err) != 0) {
            CHECK(0, "%s: encode failed: %s", name, err.msg);
        } else {
            bool ok = ids_equal(&ids, hf);
            same_hf += ok;
            if (!ok) show_diff(name, &ids, hf);
            // The JS port is compared for the record: where it differs from HF it is wrong.
            if (js) {
                bool js_ok = ids_equal(&ids, js);
                same_js += js_ok;
                if (!js_ok && ok) {
                    js_wrong++;
                    if (js_wrong <= 40) fprintf(stderr, "  JS port differs from HF: %s\n", name);
                }
            }
            char *dec, *dec_skip;
            size_t got_n, got_skip_n;
            CHECK(tok_decode(tok, &dec, &got_n, ids.v, ids.n, false, &err) == 0, "%s", err.msg);
            CHECK(tok_decode(tok, &dec_skip, &got_skip_n, ids.v, ids.n, true, &err) == 0, "%s",
                  err.msg);
            bool dec_ok = got_n == dec_n && memcmp(dec, want_dec, dec_n) == 0 &&
                          got_skip_n == skip_n && memcmp(dec_skip, want_skip, skip_n) == 0;
            decoded_ok += dec_ok;
            if (!dec_ok) fprintf(stderr, "  decode differs from HF: %s\n", name);
            // Decoding gives back the text as NFC left it (the text itself when already NFC).
            bool rt = got_n == nfc_n && memcmp(dec, nfc, nfc_n) == 0;
            roundtrip_ok += rt;
            if (!rt) fprintf(stderr, "  decode(encode(x)) != NFC(x): %s\n", name);
            nfc_changed += !(n == nfc_n && memcmp(in, nfc, n) == 0);
            free(dec);
            free(dec_skip);
        }
        free(in);
        free(nfc);
        free(want_dec);
        free(want_skip);
        cJSON_Delete(c);
    }
    printf("parity: %d cases; ids identical to HF tokenizers: %d; to the JS port: %d "
           "(%d where the JS port differs from HF)\n",
           n_cases, same_hf, same_js, js_wrong);
    printf("decode identical to HF: %d; decode(encode(x)) == NFC(x): %d (%d cases change under "
           "NFC, the rest give back x itself)\n",
           decoded_ok, roundtrip_ok, nfc_changed);
    CHECK(saw_chat, "no chatml case in the reference");
    CHECK(n_cases > 5000, "only %d cases in %s", n_cases, ref_path);
    CHECK(same_hf == n_cases, "%d of %d cases differ from HF", n_cases - same_hf, n_cases);
    CHECK(decoded_ok == n_cases, "%d decodes differ from HF", n_cases - decoded_ok);
    CHECK(roundtrip_ok == n_cases, "%d round trips fail", n_cases - roundtrip_ok);
    tok_ids_free(&ids);
    free(text);
    tok_encoder_free(enc);
    tok_free(tok);
    return check_summary();
}
