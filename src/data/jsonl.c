#include "data/jsonl.h"

#include <stdbool.h>
#include <string.h>

#include "io/json.h"

static bool has_escaped_nul(const char *p, size_t n) {
    for (size_t i = 0; i + 5 < n; i++) {
        if (p[i] != '\\') continue;
        if (p[i + 1] == 'u' && memcmp(p + i + 2, "0000", 4) == 0) return true;
        i++; // skip the escaped character, so "\\u0000" (an escaped backslash) is text
    }
    return false;
}

int jsonl_text(cJSON **json, const char **text, size_t *len, const char *line, size_t n,
               ct_error *err) {
    *json = NULL;
    if (has_escaped_nul(line, n)) return ct_fail(err, "\\u0000 (NUL) in the text is not supported");
    cJSON *j = cJSON_ParseWithLength(line, n);
    if (!j) return ct_fail(err, "invalid JSON (expected an object with a \"text\" string)");
    const cJSON *t = cJSON_IsObject(j) ? cJSON_GetObjectItemCaseSensitive(j, "text") : NULL;
    if (!cJSON_IsString(t)) {
        int rc = !cJSON_IsObject(j)
                     ? ct_fail(err, "expected a JSON object, found %s", json_type_name(j))
                 : t ? ct_fail(err, "\"text\" is %s, expected a string", json_type_name(t))
                     : ct_fail(err, "no \"text\" field");
        cJSON_Delete(j);
        return rc;
    }
    *json = j;
    *text = t->valuestring;
    *len = strlen(t->valuestring);
    return 0;
}
