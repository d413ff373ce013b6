#include "data/jsonl.h"

#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "io/json.h"

// cJSON checks the line and types the field; the bytes come from the line itself, because
// cJSON's valuestring is a C string and would end at a \u0000.
int jsonl_text(const char **text, size_t *len, jsonl_buf *buf, const char *line, size_t n,
               ct_error *err) {
    cJSON *j = cJSON_ParseWithLength(line, n);
    if (!j) return ct_fail(err, "invalid JSON (expected an object with a \"text\" string)");
    const cJSON *t = cJSON_IsObject(j) ? cJSON_GetObjectItemCaseSensitive(j, "text") : NULL;
    int rc = 0;
    if (!cJSON_IsObject(j))
        rc = ct_fail(err, "expected a JSON object, found %s", json_type_name(j));
    else if (!t)
        rc = ct_fail(err, "no \"text\" field");
    else if (!cJSON_IsString(t))
        rc = ct_fail(err, "\"text\" is not a string: found %s", json_type_name(t));
    cJSON_Delete(j);
    if (rc != 0) return rc;
    const char *body;
    size_t body_n;
    // A name that cJSON (a C string compare) takes for "text" but is not, "text\u0000x", is none.
    if (!json_member_string(&body, &body_n, line, n, "text"))
        return ct_fail(err, "no \"text\" field");
    if (!memchr(body, '\\', body_n)) {
        *text = body;
        *len = body_n;
        return 0;
    }
    if (body_n > buf->cap) {
        char *grown = realloc(buf->p, body_n);
        if (!grown) return ct_fail(err, "out of memory for a text of %zu bytes", body_n);
        buf->p = grown;
        buf->cap = body_n;
    }
    if (json_unescape(buf->p, len, body, body_n) != 0)
        return ct_fail(err, "invalid JSON: a \\u escape in \"text\" without 4 hex digits");
    *text = buf->p;
    return 0;
}

void jsonl_buf_free(jsonl_buf *buf) {
    free(buf->p);
    memset(buf, 0, sizeof *buf);
}
