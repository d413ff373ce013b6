#include "text/chat.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io/json.h"
#include "text/jinja.h"

static const char *const special_names[] = {"bos_token", "eos_token", "pad_token", "unk_token"};
#define N_SPECIAL 4

struct chat_template {
    jinja_template *t;
    char *special[N_SPECIAL]; // NULL when the tokenizer has none
};

int chat_template_from_string(chat_template **out, const char *src, size_t len, ct_error *err) {
    *out = NULL;
    chat_template *c = calloc(1, sizeof *c);
    if (!c) return ct_fail(err, "chat template: out of memory");
    if (jinja_parse(&c->t, src, len, "chat_template", err)) {
        free(c);
        return -1;
    }
    *out = c;
    return 0;
}

void chat_template_free(chat_template *t) {
    if (!t) return;
    jinja_free(t->t);
    for (int i = 0; i < N_SPECIAL; i++) free(t->special[i]);
    free(t);
}

// tokenizer_config.json's template: a string, or the {"name": "default"} entry of a list.
static const cJSON *config_template(const cJSON *cfg) {
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
    if (cJSON_IsString(ct)) return ct;
    const cJSON *e;
    if (cJSON_IsArray(ct)) {
        cJSON_ArrayForEach(e, ct) {
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
            const cJSON *tpl = cJSON_GetObjectItemCaseSensitive(e, "template");
            if (cJSON_IsString(name) && !strcmp(name->valuestring, "default") &&
                cJSON_IsString(tpl))
                return tpl;
        }
    }
    return NULL;
}

int chat_template_load(chat_template **out, const char *dir, ct_error *err) {
    *out = NULL;
    char jinja_path[4096], cfg_path[4096];
    snprintf(jinja_path, sizeof jinja_path, "%s/chat_template.jinja", dir);
    snprintf(cfg_path, sizeof cfg_path, "%s/tokenizer_config.json", dir);
    struct stat st;
    bool have_jinja = stat(jinja_path, &st) == 0, have_cfg = stat(cfg_path, &st) == 0;
    cJSON *cfg = NULL;
    if (have_cfg && json_parse_file(&cfg, cfg_path, err)) return -1;
    int rc;
    if (have_jinja) {
        char *src;
        size_t len;
        if (file_read_all(&src, &len, jinja_path, (size_t)16 << 20, err)) {
            cJSON_Delete(cfg);
            return -1;
        }
        rc = chat_template_from_string(out, src, len, err);
        free(src);
        if (rc) ct_wrap(err, "%s", jinja_path);
    } else {
        const cJSON *tpl = cfg ? config_template(cfg) : NULL;
        if (!tpl) {
            cJSON_Delete(cfg);
            return ct_fail(err, "%s: no chat template: %s is missing and %s %s", dir, jinja_path,
                           cfg_path,
                           have_cfg ? "has no \"chat_template\" string (nor a list entry named "
                                      "\"default\")"
                                    : "is missing too");
        }
        rc = chat_template_from_string(out, tpl->valuestring, strlen(tpl->valuestring), err);
        if (rc) ct_wrap(err, "%s", cfg_path);
    }
    for (int i = 0; rc == 0 && cfg && i < N_SPECIAL; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, special_names[i]);
        if (cJSON_IsObject(v)) v = cJSON_GetObjectItemCaseSensitive(v, "content");
        if (cJSON_IsString(v) && !((*out)->special[i] = strdup(v->valuestring))) {
            rc = ct_fail(err, "chat template: out of memory");
        }
    }
    cJSON_Delete(cfg);
    if (rc) {
        chat_template_free(*out);
        *out = NULL;
    }
    return rc;
}

static int check_messages(const cJSON *messages, ct_error *err) {
    if (!cJSON_IsArray(messages))
        return ct_fail(err, "chat: messages must be an array, got %s", json_type_name(messages));
    if (cJSON_GetArraySize(messages) == 0) return ct_fail(err, "chat: messages is empty");
    static const char *const roles[] = {"system", "user", "assistant", "tool"};
    int i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, messages) {
        if (!cJSON_IsObject(m))
            return ct_fail(err, "chat: message %d must be an object, got %s", i, json_type_name(m));
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsString(role))
            return ct_fail(err, "chat: message %d: \"role\" must be a string, got %s", i,
                           json_type_name(role));
        bool known = false;
        for (int k = 0; k < 4; k++) known |= !strcmp(role->valuestring, roles[k]);
        if (!known)
            return ct_fail(
                err, "chat: message %d: role \"%.100s\" is not system, user, assistant or tool", i,
                role->valuestring);
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        bool tool_calls = cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(m, "tool_calls")) > 0;
        bool null_ok = !strcmp(role->valuestring, "assistant") && tool_calls;
        if (!cJSON_IsString(content) && !(null_ok && (!content || cJSON_IsNull(content))))
            return ct_fail(err, "chat: message %d (%s): \"content\" must be a string%s, got %s", i,
                           role->valuestring, null_ok ? " or null" : "", json_type_name(content));
        i++;
    }
    return 0;
}

int chat_render(const chat_template *t, const cJSON *messages, const cJSON *tools,
                bool add_generation_prompt, int enable_thinking, char **out, size_t *out_len,
                ct_error *err) {
    *out = NULL;
    if (out_len) *out_len = 0;
    if (check_messages(messages, err)) return -1;
    // The keyword arguments apply_chat_template passes to the template.
    cJSON *vars = cJSON_CreateObject();
    bool ok = vars != NULL;
    ok = ok && cJSON_AddItemReferenceToObject(vars, "messages", (cJSON *)messages);
    ok = ok && (tools ? cJSON_AddItemReferenceToObject(vars, "tools", (cJSON *)tools)
                      : cJSON_AddNullToObject(vars, "tools") != NULL);
    ok = ok && cJSON_AddNullToObject(vars, "documents");
    ok = ok && cJSON_AddBoolToObject(vars, "add_generation_prompt", add_generation_prompt);
    if (enable_thinking >= 0)
        ok = ok && cJSON_AddBoolToObject(vars, "enable_thinking", enable_thinking);
    for (int i = 0; i < N_SPECIAL; i++)
        if (t->special[i])
            ok = ok && cJSON_AddStringToObject(vars, special_names[i], t->special[i]);
    int rc = ok ? jinja_render(t->t, vars, out, out_len, err) : ct_fail(err, "chat: out of memory");
    cJSON_Delete(vars);
    return rc;
}
