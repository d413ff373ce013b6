// json helpers: whole-file reads, parse errors with byte offsets, typed getters.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "io/json.h"

static void test_files(const char *tmp) {
    char p[1024], *buf = NULL;
    size_t len = 0;
    ct_error err = {{0}};
    snprintf(p, sizeof p, "%s/a.json", tmp);
    FILE *fp = fopen(p, "wb");
    fputs("{\"a\": 1,\n \"b\": [1, 2,]}", fp);
    fclose(fp);
    CHECK(file_read_all(&buf, &len, p, 100, &err) == 0 && len == 23 && buf[23] == '\0', "read: %s",
          err.msg);
    free(buf);
    CHECK(file_read_all(&buf, &len, p, 10, &err) == -1 && strstr(err.msg, p) &&
              strstr(err.msg, "23 bytes"),
          "size cap: %s", err.msg);
    CHECK(file_read_all(&buf, &len, "/nonexistent/x.json", 10, &err) == -1 &&
              strstr(err.msg, "/nonexistent/x.json") && strstr(err.msg, "No such file"),
          "missing: %s", err.msg);
    CHECK(file_read_all(&buf, &len, tmp, 10, &err) == -1 && strstr(err.msg, "not a regular file"),
          "folder: %s", err.msg);
    cJSON *j = NULL;
    CHECK(json_parse_file(&j, p, &err) == -1 && strstr(err.msg, p) &&
              strstr(err.msg, "byte 21 (line 2, column 13)"),
          "syntax error position: %s", err.msg);
    CHECK(json_parse(&j, "[1] x", 3, "mem", &err) == 0 && cJSON_IsArray(j),
          "length-bounded parse ignores what follows");
    cJSON_Delete(j);
    CHECK(json_parse(&j, "", 0, "empty", &err) == -1 && strstr(err.msg, "empty: invalid JSON"),
          "empty text: %s", err.msg);
}

static void test_getters(void) {
    const char *text = "{\"i\": 42, \"neg\": -7, \"f\": 1.5, \"big\": 1e300, \"b\": true, "
                       "\"s\": \"hello\", \"n\": null, \"arr\": [1]}";
    cJSON *j = NULL;
    ct_error err = {{0}};
    CHECK(json_parse(&j, text, strlen(text), "cfg.json", &err) == 0, "parse");
    int64_t i = -1;
    CHECK(json_get_int(&i, j, "i", true, 0, 100, "cfg.json", &err) == 0 && i == 42, "int");
    CHECK(json_get_int(&i, j, "neg", true, -10, 10, "cfg.json", &err) == 0 && i == -7, "neg int");
    CHECK(json_get_int(&i, j, "i", true, 0, 10, "cfg.json", &err) == -1 &&
              strstr(err.msg, "cfg.json") && strstr(err.msg, "\"i\"") &&
              strstr(err.msg, "[0, 10]") && strstr(err.msg, "42"),
          "range: %s", err.msg);
    CHECK(json_get_int(&i, j, "f", true, 0, 10, "cfg.json", &err) == -1 && strstr(err.msg, "1.5"),
          "fraction: %s", err.msg);
    CHECK(json_get_int(&i, j, "big", true, 0, 10, "cfg.json", &err) == -1, "huge: %s", err.msg);
    CHECK(json_get_int(&i, j, "s", true, 0, 10, "cfg.json", &err) == -1 &&
              strstr(err.msg, "found a string"),
          "type: %s", err.msg);
    i = 5;
    CHECK(json_get_int(&i, j, "missing", false, 0, 10, "cfg.json", &err) == 0 && i == 5,
          "optional missing leaves the value");
    CHECK(json_get_int(&i, j, "n", false, 0, 10, "cfg.json", &err) == 0 && i == 5,
          "optional null leaves the value");
    CHECK(json_get_int(&i, j, "missing", true, 0, 10, "cfg.json", &err) == -1 &&
              strstr(err.msg, "cfg.json: missing required key \"missing\""),
          "required: %s", err.msg);
    double d = 0;
    CHECK(json_get_double(&d, j, "f", true, "cfg.json", &err) == 0 && d == 1.5, "double");
    CHECK(json_get_double(&d, j, "b", true, "cfg.json", &err) == -1 &&
              strstr(err.msg, "found a boolean"),
          "double type: %s", err.msg);
    bool b = false;
    CHECK(json_get_bool(&b, j, "b", true, "cfg.json", &err) == 0 && b, "bool");
    CHECK(json_get_bool(&b, j, "i", true, "cfg.json", &err) == -1 && strstr(err.msg, "\"i\""),
          "bool type: %s", err.msg);
    char s[8];
    CHECK(json_get_string(s, sizeof s, j, "s", true, "cfg.json", &err) == 0 &&
              strcmp(s, "hello") == 0,
          "string");
    CHECK(json_get_string(s, 4, j, "s", true, "cfg.json", &err) == -1 && strstr(err.msg, "limit"),
          "string too long: %s", err.msg);
    CHECK(json_get_string(s, sizeof s, j, "arr", true, "cfg.json", &err) == -1 &&
              strstr(err.msg, "found an array"),
          "string type: %s", err.msg);
    cJSON_Delete(j);

    const char *nums = "[0, 3, 9007199254740991, 9007199254740992, -1, 2.5, \"4\", 1e400]";
    CHECK(json_parse(&j, nums, strlen(nums), "nums", &err) == 0, "parse nums");
    const bool ok[8] = {true, true, true, false, false, false, false, false};
    for (int k = 0; k < 8; k++) {
        uint64_t u = 0;
        CHECK(json_is_uint(cJSON_GetArrayItem(j, k), &u) == ok[k], "json_is_uint item %d", k);
        if (k == 2) CHECK(u == 9007199254740991ull, "2^53-1");
    }
    cJSON_Delete(j);
}

// What json_write_string writes to a file, for comparing with json_quote's buffer.
static char *quote_via_file(const char *s, size_t n, unsigned flags, size_t *len) {
    FILE *f = tmpfile();
    json_write_string(f, s, n, flags);
    *len = (size_t)ftell(f);
    char *out = calloc(*len + 1, 1);
    rewind(f);
    if (fread(out, 1, *len, f) != *len) *len = 0;
    fclose(f);
    return out;
}

// One writer, four option sets: each reproduces the bytes of one former caller.
static void test_quote(void) {
    static const char in[] = "a\"\\\n\x01\0\x7f\xc3\xa9\xf0\x9f\x98\x80\xff";
    const size_t n = sizeof in - 1; // the NUL inside counts
    static const struct {
        unsigned flags;
        const char *want;
    } cases[] = {
        // the safetensors header, override/kernel reports, generate --json: control bytes as
        // \u00XX, everything else (invalid UTF-8 too) copied
        {0, "\"a\\\"\\\\\\u000a\\u0001\\u0000\x7f\xc3\xa9\xf0\x9f\x98\x80\xff\""},
        // tojson, tokenize --render: json.dumps(ensure_ascii=False)
        {JSON_SHORT, "\"a\\\"\\\\\\n\\u0001\\u0000\x7f\xc3\xa9\xf0\x9f\x98\x80\xff\""},
        {JSON_ASCII, "\"a\\\"\\\\\\u000a\\u0001\\u0000\\u007f\\u00e9\\ud83d\\ude00\\ufffd\""},
        // the safetensors index: json.dumps
        {JSON_SHORT | JSON_ASCII,
         "\"a\\\"\\\\\\n\\u0001\\u0000\\u007f\\u00e9\\ud83d\\ude00\\ufffd\""},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        json_buf b = {0};
        CHECK(json_quote(&b, "x", 1, 0) == 0 && json_quote(&b, in, n, cases[k].flags) == 0 &&
                  b.len == 3 + strlen(cases[k].want) && memcmp(b.p, "\"x\"", 3) == 0 &&
                  strcmp(b.p + 3, cases[k].want) == 0,
              "json_quote flags %u: %s", cases[k].flags, b.p ? b.p : "(null)");
        size_t len;
        char *f = quote_via_file(in, n, cases[k].flags, &len);
        CHECK(len == strlen(cases[k].want) && strcmp(f, cases[k].want) == 0,
              "json_write_string flags %u: %s", cases[k].flags, f);
        free(f);
        free(b.p);
    }
    // The file writer flushes in chunks; a long string must come out whole.
    char big[1000];
    for (size_t i = 0; i < sizeof big; i++) big[i] = i % 3 ? '\x02' : '\xe2';
    json_buf b = {0};
    size_t len;
    CHECK(json_quote(&b, big, sizeof big, JSON_ASCII) == 0, "long string");
    char *f = quote_via_file(big, sizeof big, JSON_ASCII, &len);
    CHECK(len == b.len && memcmp(f, b.p, len) == 0, "file and buffer agree on a long string");
    free(f);
    free(b.p);
}

// json_exact_number reads back as the same double where cJSON's own printing does not: eval's
// losses compared with train's bit for bit (cJSON 1.7 prints 15 digits when they read back within
// an epsilon; 4.3493711451689405 came out as 4.34937114516894).
static void test_exact_number(void) {
    const double xs[] = {4.3493711451689405, 0.1, 1.0 / 3.0, -2.5e-300, 12.430000000000001};
    for (size_t i = 0; i < sizeof xs / sizeof xs[0]; i++) {
        cJSON *a = cJSON_CreateArray();
        cJSON_AddItemToArray(a, json_exact_number(xs[i]));
        char *text = cJSON_PrintUnformatted(a);
        cJSON *back = cJSON_Parse(text);
        CHECK(back && cJSON_GetArrayItem(back, 0)->valuedouble == xs[i], "%.17g printed as %s",
              xs[i], text);
        cJSON_Delete(back);
        cJSON_free(text);
        cJSON_Delete(a);
    }
    cJSON *nan = json_exact_number(0.0 / 0.0);
    CHECK(cJSON_IsNull(nan), "NaN is not null");
    cJSON_Delete(nan);
}

int main(void) {
    test_exact_number();
    test_quote();
    test_files(check_env("CTITAN_TMP"));
    test_getters();
    return check_summary();
}
