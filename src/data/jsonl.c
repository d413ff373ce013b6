#include "data/jsonl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "io/json.h"

const char *const jsonl_kind_names[] = {"text", "messages", "ids"};

// The "text" string of the parsed line j: cJSON checks the line and types the field; the bytes
// come from the line itself, because cJSON's valuestring is a C string and would end at a
// \u0000. Deletes j.
static int text_of(cJSON *j, const char **text, size_t *len, jsonl_buf *buf, const char *line,
                   size_t n, ct_error *err) {
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

int jsonl_doc_parse(jsonl_doc *d, jsonl_buf *buf, const char *line, size_t n, ct_error *err) {
    memset(d, 0, sizeof *d);
    cJSON *j = cJSON_ParseWithLength(line, n);
    if (!j)
        return ct_fail(err, "invalid JSON (expected an object with \"text\", \"messages\" or "
                            "\"ids\")");
    bool is_object = cJSON_IsObject(j);
    bool chat = is_object && cJSON_GetObjectItemCaseSensitive(j, "messages");
    bool text = is_object && cJSON_GetObjectItemCaseSensitive(j, "text");
    bool ids = is_object && cJSON_GetObjectItemCaseSensitive(j, "ids");
    if (chat && text) {
        cJSON_Delete(j);
        return ct_fail(err, "both \"messages\" and \"text\": expected one of them");
    }
    if (chat || ids) { // a pre-tokenized line's "text" is its rendering (tokenize --render)
        d->kind = chat ? JSONL_CHAT : JSONL_IDS;
        d->root = j;
        return 0;
    }
    if (is_object && !text) {
        cJSON_Delete(j);
        return ct_fail(err, "no \"text\", \"messages\" or \"ids\" field");
    }
    d->kind = JSONL_TEXT;
    return text_of(j, &d->text, &d->len, buf, line, n, err);
}

// NULL when v is an integer in [0, limit) written without a sign (-0 is refused: the files we
// write never hold one, and a tool that wrote it meant something else); else what was found.
static const char *number_why(const cJSON *v, double limit) {
    if (!cJSON_IsNumber(v)) return json_type_name(v);
    const double x = v->valuedouble;
    if (x != x) return "NaN";
    if (x == 0 && signbit(x)) return "-0";
    if (!(x >= 0 && x < limit)) return isinf(x) ? "infinity" : "a number outside it";
    if (x != floor(x)) return "a fraction";
    return NULL;
}

int jsonl_ids_check(const cJSON *root, int32_t vocab_size, size_t *n, bool *has_mask,
                    ct_error *err) {
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(root, "ids");
    const cJSON *mask = cJSON_GetObjectItemCaseSensitive(root, "mask");
    if (!cJSON_IsArray(ids))
        return ct_fail(err, "\"ids\" is not an array: found %s", json_type_name(ids));
    if (mask && !cJSON_IsArray(mask))
        return ct_fail(err, "\"mask\" is not an array: found %s", json_type_name(mask));
    size_t count = (size_t)cJSON_GetArraySize(ids), i = 0;
    if (count == 0) return ct_fail(err, "\"ids\" is empty");
    if (mask && (size_t)cJSON_GetArraySize(mask) != count)
        return ct_fail(err, "\"mask\" has %d values, \"ids\" %zu: expected one per id",
                       cJSON_GetArraySize(mask), count);
    const double limit = vocab_size > 0 ? vocab_size : (double)INT32_MAX + 1;
    // The range is checked before anything converts: a double outside int64 (3e102, inf, NaN)
    // has no integer value, and converting it is undefined behaviour.
    for (const cJSON *v = ids->child; v; v = v->next, i++) {
        const char *why = number_why(v, limit);
        if (why)
            return ct_fail(err, "\"ids\"[%zu]: expected an integer in [0, %.0f), found %s", i,
                           limit, why);
    }
    i = 0;
    for (const cJSON *v = mask ? mask->child : NULL; v; v = v->next, i++) {
        const char *why = number_why(v, 2);
        if (why) return ct_fail(err, "\"mask\"[%zu]: expected 0 or 1, found %s", i, why);
    }
    *n = count;
    *has_mask = mask != NULL;
    return 0;
}

void jsonl_ids_copy(const cJSON *root, int32_t *ids, uint8_t *mask) {
    size_t i = 0;
    for (const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "ids")->child; v; v = v->next)
        ids[i++] = (int32_t)v->valuedouble;
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(root, "mask");
    i = 0;
    for (const cJSON *v = m && mask ? m->child : NULL; v; v = v->next)
        mask[i++] = v->valuedouble != 0;
}

void jsonl_buf_free(jsonl_buf *buf) {
    free(buf->p);
    memset(buf, 0, sizeof *buf);
}
