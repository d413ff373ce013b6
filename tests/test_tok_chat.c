// Chat-template parity: every case of tests/chat_cases.jsonl rendered by ctitan (chat_render on
// the real Qwen3 template, or the engine on a template of tests/chat_templates/) must equal, byte
// for byte, what two references render, and fail where they fail: Python's jinja2 set up as
// transformers' apply_chat_template sets it up (tests/ref/chat_ref_hf.py: what HF does, so it
// decides), and @huggingface/jinja (tests/ref/chat_ref.mjs). A case where the JS engine is known
// to differ from Python names the reason in "js_differs"; there the JS output must differ.
// Also chat_template_load's sources and chat_render's checks of the messages.
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "check.h"
#include "io/json.h"
#include "text/chat.h"
#include "text/jinja.h"

static char *read_text(const char *path, size_t *len) {
    ct_error err;
    char *s;
    if (file_read_all(&s, len, path, (size_t)1 << 28, &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    return s;
}

// Renders one case the way the reference does; 0 with *out, or -1 with err.
static int render_case(const cJSON *c, const chat_template *qwen3, const char *tpl_dir, char **out,
                       size_t *n, ct_error *err) {
    const cJSON *tpl = cJSON_GetObjectItem(c, "template"), *vars = cJSON_GetObjectItem(c, "vars");
    if (cJSON_IsString(tpl)) {
        char path[8300];
        snprintf(path, sizeof path, "%s/%s", tpl_dir, tpl->valuestring);
        size_t len;
        char *src = read_text(path, &len);
        jinja_template *t;
        int rc = jinja_parse(&t, src, len, tpl->valuestring, err);
        free(src);
        if (rc) return rc;
        rc = jinja_render(t, vars, out, n, err);
        jinja_free(t);
        return rc;
    }
    const cJSON *think = cJSON_GetObjectItem(c, "enable_thinking");
    return chat_render(qwen3, cJSON_GetObjectItem(c, "messages"), cJSON_GetObjectItem(c, "tools"),
                       cJSON_IsTrue(cJSON_GetObjectItem(c, "add_generation_prompt")),
                       think ? cJSON_IsTrue(think) : -1, out, n, err);
}

static void show_diff(const char *name, const char *got, size_t got_n, const char *want,
                      size_t want_n) {
    size_t i = 0;
    while (i < got_n && i < want_n && got[i] == want[i]) i++;
    size_t from = i > 40 ? i - 40 : 0;
    fprintf(stderr,
            "  %s: %zu bytes vs the reference's %zu; first difference at byte %zu\n"
            "    ctitan: ...%.*s\n    ref:    ...%.*s\n",
            name, got_n, want_n, i, (int)((got_n < i + 40 ? got_n : i + 40) - from), got + from,
            (int)((want_n < i + 40 ? want_n : i + 40) - from), want + from);
}

static void test_parity(const char *assets, const char *src, const char *tmp, const char *python) {
    char cases[4096], ref[4096], js_ref[4096], cmd[16384], tok_dir[4096], tpl_dir[4096];
    snprintf(cases, sizeof cases, "%s/tests/chat_cases.jsonl", src);
    snprintf(tpl_dir, sizeof tpl_dir, "%s/tests/chat_templates", src);
    snprintf(ref, sizeof ref, "%s/chat_ref_hf.jsonl", tmp);
    snprintf(js_ref, sizeof js_ref, "%s/chat_ref_js.jsonl", tmp);
    snprintf(tok_dir, sizeof tok_dir, "%s/qwen3-tokenizer", assets);
    // Python's reference needs jinja2 in CTITAN_PYTHON; without it the JS engine is the reference
    // and, where that is known to differ, the Python output recorded in the case ("expect").
    snprintf(cmd, sizeof cmd, "'%s' -c 'import jinja2' 2>/dev/null", python);
    bool have_py = system(cmd) == 0;
    if (!have_py)
        printf("NOTE: %s has no jinja2: comparing with @huggingface/jinja and the cases' recorded "
               "Python outputs only\n",
               python);
    // CI installs it (scripts/install-deps): there the Python reference must run.
    const char *ci = getenv("CI");
    CHECK(have_py || !ci || !*ci || strcmp(ci, "false") == 0 || strcmp(ci, "0") == 0,
          "CI is set but %s has no jinja2 (apt-get install python3-jinja2)", python);
    for (int k = !have_py; k < 2; k++) {
        if (k == 0)
            snprintf(cmd, sizeof cmd,
                     "'%s' '%s/tests/ref/chat_ref_hf.py' --assets '%s' --cases '%s' --out '%s'",
                     python, src, assets, cases, ref);
        else
            snprintf(cmd, sizeof cmd,
                     "node '%s/tests/ref/chat_ref.mjs' --assets '%s' --cases '%s' --out '%s'", src,
                     assets, cases, js_ref);
        fprintf(stderr, "running: %s\n", cmd);
        if (system(cmd) != 0) {
            CHECK(0, "the reference failed: %s", cmd);
            return;
        }
    }
    ct_error err;
    chat_template *qwen3;
    if (chat_template_load(&qwen3, tok_dir, &err) != 0) {
        CHECK(0, "%s", err.msg);
        return;
    }
    size_t cn, rn;
    size_t jn;
    char *ctext = read_text(cases, &cn), *jtext = read_text(js_ref, &jn);
    char *rtext = have_py ? read_text(ref, &rn) : jtext;
    char *cs = ctext, *rs = rtext, *js = jtext;
    int n = 0, same = 0, errors = 0, js_same = 0, js_known = 0;
    for (;;) {
        char *ce = strchr(cs, '\n'), *re = strchr(rs, '\n'), *je = strchr(js, '\n');
        if (!ce || !re || !je) break;
        *ce = *je = 0;
        if (re != je) *re = 0;
        cJSON *c = cJSON_Parse(cs), *r = cJSON_Parse(rs), *j = cJSON_Parse(js);
        cs = ce + 1, rs = re + 1, js = je + 1;
        const cJSON *expect = cJSON_GetObjectItem(c, "expect");
        if (r && !have_py && cJSON_IsString(expect)) { // the recorded Python output instead
            size_t en = strlen(expect->valuestring);
            char *h = malloc(2 * en + 1);
            for (size_t i = 0; i < en; i++)
                sprintf(h + 2 * i, "%02x", (unsigned char)expect->valuestring[i]);
            cJSON_Delete(r);
            r = cJSON_CreateObject();
            cJSON_AddStringToObject(r, "hex", h);
            free(h);
        }
        if (!c || !r || !j) {
            CHECK(0, "bad case or reference line %d", n + 1);
            cJSON_Delete(c);
            cJSON_Delete(r);
            cJSON_Delete(j);
            break;
        }
        n++;
        const char *name = cJSON_GetObjectItem(c, "name")->valuestring;
        const cJSON *hex = cJSON_GetObjectItem(r, "hex"), *rerr = cJSON_GetObjectItem(r, "error");
        char *out = NULL;
        size_t out_n = 0;
        int rc = render_case(c, qwen3, tpl_dir, &out, &out_n, &err);
        if (rerr) {
            CHECK(rc != 0, "%s: the reference fails (%s) but ctitan renders", name,
                  rerr->valuestring);
            if (rc != 0) {
                errors++;
                printf("  %s: both fail; ctitan: %s | ref: %s\n", name, err.msg, rerr->valuestring);
            }
        } else if (rc != 0) {
            CHECK(0, "%s: ctitan fails: %s", name, err.msg);
        } else {
            size_t want_n;
            char *want = check_unhex(hex->valuestring, &want_n);
            bool ok = out_n == want_n && memcmp(out, want, want_n) == 0;
            same += ok;
            if (!ok) show_diff(name, out, out_n, want, want_n);
            CHECK(ok, "%s: the rendering differs from @huggingface/jinja's", name);
            free(want);
        }
        // @huggingface/jinja: the same outcome, except where the case says it differs.
        const cJSON *jhex = cJSON_GetObjectItem(j, "hex"),
                    *known = cJSON_GetObjectItem(c, "js_differs");
        bool js_ok = rc != 0 ? cJSON_GetObjectItem(j, "error") != NULL
                             : cJSON_IsString(jhex) && strlen(jhex->valuestring) == 2 * out_n;
        if (js_ok && rc == 0) {
            size_t jl;
            char *jw = check_unhex(jhex->valuestring, &jl);
            js_ok = memcmp(jw, out, out_n) == 0;
            if (!js_ok && !known) show_diff(name, out, out_n, jw, jl);
            free(jw);
        }
        js_same += js_ok;
        if (known) {
            js_known++;
            printf("  %s: @huggingface/jinja differs from Python, as expected: %s\n", name,
                   known->valuestring);
        }
        CHECK(js_ok != (known != NULL), "%s: @huggingface/jinja %s", name,
              known ? "now agrees: drop \"js_differs\"" : "renders it differently");
        free(out);
        cJSON_Delete(c);
        cJSON_Delete(r);
        cJSON_Delete(j);
    }
    CHECK(n >= 30, "only %d cases", n);
    printf(
        "chat parity: %d cases; %d byte-identical to Python jinja2 (as transformers runs it) and "
        "%d failing in both%s; %d identical to @huggingface/jinja, %d known to differ there\n",
        n, same, errors, have_py ? "" : " (no jinja2: JS and recorded outputs)", js_same, js_known);
    free(ctext);
    if (have_py) free(rtext);
    free(jtext);
    chat_template_free(qwen3);
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
}

static void test_load(const char *tmp) {
    char dir[4096], path[4200];
    ct_error err;
    chat_template *t = NULL;
    snprintf(dir, sizeof dir, "%s/load", tmp);
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    remove(path);
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    remove(path);
    CHECK(chat_template_load(&t, dir, &err) != 0 && strstr(err.msg, "chat_template.jinja") &&
              strstr(err.msg, "tokenizer_config.json"),
          "no template: %s", err.msg);
    // A list of named templates: the one named "default"; special tokens as {"content": ...}.
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    write_file(path, "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"},"
                     " {\"name\": \"default\", \"template\": \"{{ bos_token }}D{{ eos_token }}\"}],"
                     " \"bos_token\": {\"content\": \"<s>\"}, \"eos_token\": \"</s>\","
                     " \"unk_token\": null}");
    cJSON *msgs = cJSON_Parse("[{\"role\": \"user\", \"content\": \"x\"}]");
    char *out = NULL;
    size_t n;
    CHECK(chat_template_load(&t, dir, &err) == 0, "%s", err.msg);
    CHECK(t && chat_render(t, msgs, NULL, false, -1, &out, &n, &err) == 0 &&
              !strcmp(out, "<s>D</s>"),
          "list form: %s", out ? out : err.msg);
    free(out);
    chat_template_free(t);
    // chat_template.jinja wins over the config's.
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    write_file(path, "J{{ messages | length }}{{ unk_token is defined }}");
    out = NULL;
    CHECK(chat_template_load(&t, dir, &err) == 0, "%s", err.msg);
    CHECK(t && chat_render(t, msgs, NULL, false, -1, &out, &n, &err) == 0 &&
              !strcmp(out, "J1False"),
          ".jinja: %s", out ? out : err.msg);
    free(out);
    chat_template_free(t);
    // A syntax error names the file and the position.
    write_file(path, "ok\n{% if %}");
    CHECK(chat_template_load(&t, dir, &err) != 0 && strstr(err.msg, "chat_template.jinja") &&
              strstr(err.msg, "chat_template:2:7:"),
          "syntax error: %s", err.msg);
    cJSON_Delete(msgs);
}

static void expect_invalid(const chat_template *t, const char *json, const char *want) {
    cJSON *m = cJSON_Parse(json);
    char *out = NULL;
    size_t n;
    ct_error err = {{0}};
    int rc = chat_render(t, m, NULL, false, -1, &out, &n, &err);
    CHECK(rc != 0 && strstr(err.msg, want), "%s: want \"%s\", got \"%s\"", json, want,
          rc ? err.msg : "success");
    free(out);
    cJSON_Delete(m);
}

static void test_validation(void) {
    chat_template *t;
    ct_error err;
    const char *src = "{% for m in messages %}{{ m.role }}{% endfor %}";
    CHECK(chat_template_from_string(&t, src, strlen(src), &err) == 0, "%s", err.msg);
    expect_invalid(t, "{}", "messages must be an array, got an object");
    expect_invalid(t, "[]", "messages is empty");
    expect_invalid(t, "[{\"role\": \"user\", \"content\": \"a\"}, 3]",
                   "message 1 must be an object");
    expect_invalid(t, "[{\"content\": \"a\"}]", "message 0: \"role\" must be a string");
    expect_invalid(t, "[{\"role\": \"robot\", \"content\": \"a\"}]",
                   "message 0: role \"robot\" is not system, user, assistant or tool");
    expect_invalid(t, "[{\"role\": \"user\", \"content\": [1]}]",
                   "message 0 (user): \"content\" must be a string, got an array");
    expect_invalid(t, "[{\"role\": \"assistant\", \"content\": null}]",
                   "message 0 (assistant): \"content\" must be a string, got null");
    cJSON *ok = cJSON_Parse("[{\"role\": \"assistant\", \"content\": null, \"tool_calls\": "
                            "[{\"function\": {\"name\": \"f\", \"arguments\": {}}}]}]");
    char *out = NULL;
    size_t n;
    CHECK(chat_render(t, ok, NULL, false, -1, &out, &n, &err) == 0 && !strcmp(out, "assistant"),
          "null content with tool_calls: %s", out ? out : err.msg);
    free(out);
    cJSON_Delete(ok);
    chat_template_free(t);
}

int main(void) {
    const char *assets = check_env("CTITAN_ASSETS_DIR"), *tmp = check_env("CTITAN_TMP");
    const char *src = check_env("CTITAN_SOURCE_DIR");
    test_load(tmp);
    test_validation();
    test_parity(assets, src, tmp, check_env("CTITAN_PYTHON"));
    return check_summary();
}
