// The TOML subset reader: every accepted form, every error class (with NAME:LINE and what was
// expected vs found), and the writers' round trips.
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "io/toml.h"

static const toml_entry *find(const toml_doc *d, const char *section, const char *key) {
    for (int i = 0; i < d->n_entries; i++)
        if (strcmp(d->entries[i].section, section) == 0 && strcmp(d->entries[i].key, key) == 0)
            return &d->entries[i];
    return NULL;
}

static void test_accepts(void) {
    const char *text = "\xEF\xBB\xBF# a config\r\n"
                       "top = 1\r\n"
                       "\n"
                       "[job]  # the job\n"
                       "name = \"a \\\"q\\\" \\\\ \\t\\n\\u00e9\\U0001F600\"\n"
                       "lit = 'C:\\path\\x' # no escapes in literal strings\n"
                       "empty = \"\"\n"
                       "\t[ training ]\n"
                       "steps = 1_000\n"
                       "neg = -5\n"
                       "pos = +3\n"
                       "zero = 0\n"
                       "big = 9223372036854775807\n"
                       "small = -9223372036854775808\n"
                       "lr = 1e-4\n"
                       "f1 = -0.5\n"
                       "f2 = 3.141_5\n"
                       "f3 = 1E3\n"
                       "f4 = 6.02e+23\n"
                       "f5 = 0.0\n"
                       "b1 = true\n"
                       "b2=false\n"
                       "arr = [ 1, 2,\n"
                       "   # a comment inside\n"
                       "   3, ]\n"
                       "strs = ['a', \"b\"]\n"
                       "none = []\n"
                       "caf\xC3\xA9 = 1\n";
    toml_doc d;
    ct_error err = {{0}};
    // The non-ASCII bare key is invalid TOML: check it fails, then parse without it.
    CHECK(toml_parse(&d, text, strlen(text), "t.toml", &err) == -1 &&
              strstr(err.msg, "t.toml:28:") && strstr(err.msg, "expected '=' after key 'caf'"),
          "non-ASCII bare key: %s", err.msg);
    size_t len = strlen(text) - strlen("caf\xC3\xA9 = 1\n");
    if (toml_parse(&d, text, len, "t.toml", &err) != 0) {
        CHECK(0, "parse: %s", err.msg);
        return;
    }
    CHECK(d.n_tables == 2 && strcmp(d.tables[0].name, "job") == 0 && d.tables[0].line == 4 &&
              strcmp(d.tables[1].name, "training") == 0 && d.tables[1].line == 8,
          "tables and their lines");
    const toml_entry *e = find(&d, "", "top");
    CHECK(e && e->value.type == TOML_INT && e->value.i == 1 && e->line == 2, "root key after BOM");
    e = find(&d, "job", "name");
    CHECK(e && e->value.type == TOML_STRING &&
              strcmp(e->value.str, "a \"q\" \\ \t\n\xC3\xA9\xF0\x9F\x98\x80") == 0 && e->line == 5,
          "basic string escapes");
    e = find(&d, "job", "lit");
    CHECK(e && strcmp(e->value.str, "C:\\path\\x") == 0, "literal string");
    e = find(&d, "job", "empty");
    CHECK(e && e->value.type == TOML_STRING && e->value.str[0] == '\0', "empty string");
    struct {
        const char *key;
        int64_t v;
    } ints[] = {{"steps", 1000}, {"neg", -5},        {"pos", 3},
                {"zero", 0},     {"big", INT64_MAX}, {"small", INT64_MIN}};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        e = find(&d, "training", ints[i].key);
        CHECK(e && e->value.type == TOML_INT && e->value.i == ints[i].v, "int %s", ints[i].key);
    }
    struct {
        const char *key;
        double v;
    } floats[] = {{"lr", 1e-4}, {"f1", -0.5},    {"f2", 3.1415},
                  {"f3", 1e3},  {"f4", 6.02e23}, {"f5", 0.0}};
    for (size_t i = 0; i < sizeof floats / sizeof floats[0]; i++) {
        e = find(&d, "training", floats[i].key);
        CHECK(e && e->value.type == TOML_FLOAT && e->value.f == floats[i].v, "float %s",
              floats[i].key);
    }
    e = find(&d, "training", "b1");
    CHECK(e && e->value.type == TOML_BOOL && e->value.b, "true");
    e = find(&d, "training", "b2");
    CHECK(e && e->value.type == TOML_BOOL && !e->value.b, "false without spaces");
    e = find(&d, "training", "arr");
    CHECK(e && e->value.type == TOML_ARRAY && e->value.n_items == 3 && e->value.items[2].i == 3 &&
              e->line == 23,
          "multi-line array with a comment and a trailing comma");
    e = find(&d, "training", "strs");
    CHECK(e && e->value.n_items == 2 && strcmp(e->value.items[1].str, "b") == 0, "string array");
    e = find(&d, "training", "none");
    CHECK(e && e->value.type == TOML_ARRAY && e->value.n_items == 0 && e->line == 27,
          "empty array; lines counted through the multi-line array");
    toml_free(&d);
    CHECK(toml_parse(&d, "", 0, "empty.toml", &err) == 0 && d.n_entries == 0, "an empty document");
    toml_free(&d);
}

// Parses `text` and expects an error containing every NULL-terminated fragment.
static void expect_error(const char *text, size_t len, const char *what, ...) {
    toml_doc d;
    ct_error err = {{0}};
    if (toml_parse(&d, text, len, "bad.toml", &err) == 0) {
        toml_free(&d);
        CHECK(0, "%s: parsed, expected an error", what);
        return;
    }
    CHECK(d.n_entries == 0 && d.entries == NULL, "%s: doc left empty", what);
    va_list ap;
    va_start(ap, what);
    for (const char *frag; (frag = va_arg(ap, const char *));)
        CHECK(strstr(err.msg, frag) != NULL, "%s: message lacks '%s': %s", what, frag, err.msg);
    va_end(ap);
}

#define BAD(text, what, ...) expect_error(text, strlen(text), what, __VA_ARGS__, NULL)

static void test_errors(void) {
    BAD("[a.b]\nx = 1\n[a . b]\n", "dotted table twice",
        "bad.toml:3:", "table [a.b] is defined twice (first at line 1)");
    BAD("[a.]\n", "dotted table, empty part", "bad.toml:1:", "expected a table name part");
    BAD("[a.\"b\"]\n", "dotted table, quoted part", "bad.toml:1:", "quoted table name parts");
    BAD("[[a]]\n", "array of tables", "bad.toml:1:", "arrays of tables");
    BAD("[a]\nb.c = 1\n", "dotted key", "bad.toml:2:", "dotted keys");
    BAD("\"a\" = 1\n", "quoted key", "bad.toml:1:", "quoted keys are not supported");
    BAD("[a]\nx = 1\n\nx = 2\n", "duplicate key",
        "bad.toml:4:", "key 'x' is defined twice in [a] (first at line 2)");
    BAD("x = 1\nx = 2\n", "duplicate root key", "bad.toml:2:", "first at line 1");
    BAD("[a]\n[b]\n[a]\n", "duplicate table",
        "bad.toml:3:", "table [a] is defined twice (first at line 1)");
    BAD("[a\n", "unclosed table", "bad.toml:1:", "expected ']'", "found end of line");
    BAD("[]\n", "empty table name", "bad.toml:1:", "expected a table name", "found ']'");
    BAD("[a] x = 1\n", "text after a table", "bad.toml:1:", "expected end of line", "'x'");
    BAD("[a]\nx 1\n", "missing =", "bad.toml:2:", "expected '=' after key 'x'", "found '1'");
    BAD("[a]\nx =\n", "missing value", "bad.toml:2:", "expected a value", "end of line");
    BAD("[a]\nx = # c\n", "comment for value", "bad.toml:2:", "expected a value", "'#'");
    BAD("[a]\nx = hello\n", "bare word", "bad.toml:2:", "found 'hello'", "strings need quotes");
    BAD("[a]\nx = \"abc\n", "unterminated string", "bad.toml:2:", "unterminated string");
    BAD("[a]\nx = 'abc\n", "unterminated literal", "bad.toml:2:", "closing '");
    BAD("[a]\nx = \"a\\qb\"\n", "bad escape", "bad.toml:2:", "invalid escape '\\q'");
    BAD("[a]\nx = \"\\u12\"\n", "short \\u", "bad.toml:2:", "expected 4 hex digits");
    BAD("[a]\nx = \"\\uD800\"\n", "surrogate escape", "bad.toml:2:", "Unicode scalar value");
    BAD("[a]\nx = \"\\u0000\"\n", "NUL escape", "bad.toml:2:", "NUL is not supported");
    BAD("[a]\nx = \"\"\"abc\"\"\"\n", "multi-line string",
        "bad.toml:2:", "multi-line strings (\"\"\")");
    BAD("[a]\nx = '''abc'''\n", "multi-line literal", "multi-line strings (''')");
    BAD("[a]\nx = {y = 1}\n", "inline table", "bad.toml:2:", "inline tables");
    BAD("[a]\nx = 012\n", "leading zero", "bad.toml:2:", "leading zeros");
    BAD("[a]\nx = 1__0\n", "double underscore", "bad.toml:2:", "found '1__0'");
    BAD("[a]\nx = 1_\n", "trailing underscore", "found '1_'");
    BAD("[a]\nx = _1\n", "leading underscore", "found '_1'");
    BAD("[a]\nx = 1.\n", "bare dot", "found '1.'");
    BAD("[a]\nx = .5\n", "no int part", "found '.5'");
    BAD("[a]\nx = 1e\n", "empty exponent", "found '1e'");
    BAD("[a]\nx = inf\n", "inf", "bad.toml:2:", "inf and nan are not allowed", "'inf'");
    BAD("[a]\nx = -nan\n", "nan", "inf and nan are not allowed", "'-nan'");
    BAD("[a]\nx = 0x1F\n", "hex", "bad.toml:2:", "hexadecimal");
    BAD("[a]\nx = 1979-05-27\n", "date", "bad.toml:2:", "dates and times");
    BAD("[a]\nx = 07:32:00\n", "time", "dates and times");
    BAD("[a]\nx = 9223372036854775808\n", "int overflow", "bad.toml:2:", "out of the 64-bit range");
    BAD("[a]\nx = 1e400\n", "float overflow", "bad.toml:2:", "out of range");
    BAD("[a]\nx = 1 2\n", "two values",
        "bad.toml:2:", "expected end of line after the value of 'x', found '2'");
    BAD("[a]\nx = \"s\" y\n", "text after a string", "found 'y'");
    BAD("[a]\nx = [1, \"a\"]\n", "mixed array",
        "bad.toml:2:", "expected an integer, found a string");
    BAD("[a]\nx = [1, 2.5]\n", "int and float array", "expected an integer, found a float");
    BAD("[a]\nx = [[1]]\n", "nested array", "nested arrays");
    BAD("[a]\nx = [1, 2\ny = 3\n", "unterminated array",
        "bad.toml:3:", "expected ',' or ']' in array, found 'y'");
    BAD("[a]\nx = [1,\n", "array at end of file", "unterminated array (opened at line 2)");
    BAD("[a]\nx = [1 2]\n", "array without comma", "expected ',' or ']'", "'2]'");
    // Bytes: invalid UTF-8 anywhere (with its byte offset), control characters, bare CR.
    BAD("[a]\n# \xff\n", "invalid UTF-8 in a comment", "bad.toml:2:", "invalid UTF-8 at byte 6");
    BAD("[a]\nx = \"\xC3\"\n", "truncated sequence", "bad.toml:2:", "invalid UTF-8 at byte 9");
    BAD("x = 'ok'\ny = '\xC0\xAF'\n", "overlong", "bad.toml:2:", "at byte 14");
    BAD("x = '\xED\xA0\x80'\n", "encoded surrogate", "invalid UTF-8 at byte 5");
    BAD("x = '\xF4\x90\x80\x80'\n", "past U+10FFFF", "invalid UTF-8 at byte 5");
    BAD("[a]\nx = 'a\x01'\n", "control character", "bad.toml:2:", "control character 0x01");
    BAD("[a]\rx = 1\n", "bare CR", "bad.toml:1:", "control character 0x0d");
    expect_error("x = 'a\0b'\n", 10, "NUL byte", "bad.toml:1:", "control character 0x00", NULL);
}

// Dotted table headers, as torchtitan's [quantize.linear.float8] and [training.data].
static void test_dotted_tables(void) {
    toml_doc d;
    ct_error err;
    const char *t = "[training]\nsteps = 1\n[quantize.linear.float8]\nenable = false\n"
                    "[ training . data ]\nname = \"c4\"\n";
    CHECK(toml_parse(&d, t, strlen(t), "t.toml", &err) == 0, "%s", err.msg);
    const toml_entry *e = find(&d, "quantize.linear.float8", "enable");
    CHECK(e && e->value.type == TOML_BOOL && !e->value.b && e->line == 4, "three parts");
    e = find(&d, "training.data", "name");
    CHECK(e && strcmp(e->value.str, "c4") == 0, "white space around the dots");
    CHECK(d.n_tables == 3 && strcmp(d.tables[2].name, "training.data") == 0, "table names");
    toml_free(&d);
}

static void test_value(void) {
    toml_value v;
    ct_error err = {{0}};
    CHECK(toml_parse_value(&v, "-1_000", "--x", &err) == 0 && v.type == TOML_INT && v.i == -1000,
          "int value");
    CHECK(toml_parse_value(&v, " 1e-4 ", "--x", &err) == 0 && v.type == TOML_FLOAT && v.f == 1e-4,
          "float value with spaces");
    CHECK(toml_parse_value(&v, "true", "--x", &err) == 0 && v.type == TOML_BOOL && v.b, "bool");
    CHECK(toml_parse_value(&v, "'s'", "--x", &err) == 0 && strcmp(v.str, "s") == 0, "string");
    toml_value_free(&v);
    CHECK(toml_parse_value(&v, "[1,\n2]", "--x", &err) == 0 && v.n_items == 2, "array");
    toml_value_free(&v);
    CHECK(toml_parse_value(&v, "3 4", "--steps", &err) == -1 &&
              strcmp(err.msg, "--steps: expected one value, found '4' after it") == 0,
          "trailing text: %s", err.msg);
    CHECK(toml_parse_value(&v, "abc", "--steps", &err) == -1 &&
              strstr(err.msg, "--steps: expected a value") && strstr(err.msg, "found 'abc'"),
          "word: %s", err.msg);
    CHECK(toml_parse_value(&v, "", "--steps", &err) == -1 && strstr(err.msg, "found end of value"),
          "empty: %s", err.msg);
    CHECK(toml_parse_value(&v, "nan", "--lr", &err) == -1 && strstr(err.msg, "--lr: ") &&
              strstr(err.msg, "inf and nan"),
          "nan: %s", err.msg);
    CHECK(toml_check_text("ok \xC3\xA9", 5, "--s", &err) == 0, "valid text");
    CHECK(toml_check_text("a\xff", 2, "--s", &err) == -1 &&
              strcmp(err.msg, "--s: invalid UTF-8 at byte 1") == 0,
          "invalid text: %s", err.msg);
}

// Writes with the writers, reads back with the reader: the same value.
static void test_writers(void) {
    char buf[64];
    struct {
        double x;
        const char *text;
    } forms[] = {{8e-4, "0.0008"}, {1.0, "1.0"},      {1e-8, "1e-08"}, {0.1, "0.1"},
                 {-2.5, "-2.5"},   {1e300, "1e+300"}, {0.0, "0.0"},    {100.0, "100.0"}};
    for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
        CHECK(toml_format_float(buf, sizeof buf, forms[i].x) == 0 &&
                  strcmp(buf, forms[i].text) == 0,
              "format %g: %s", forms[i].x, buf);
    }
    CHECK(toml_format_float(buf, sizeof buf, INFINITY) == -1, "inf is refused");
    // Random finite doubles over the whole exponent range read back bit for bit.
    uint64_t s = 0x9E3779B97F4A7C15ull;
    int bad = 0;
    for (int i = 0; i < 20000; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        double x;
        memcpy(&x, &s, sizeof x);
        if (!isfinite(x)) continue;
        toml_value v;
        ct_error err;
        if (toml_format_float(buf, sizeof buf, x) != 0 || toml_parse_value(&v, buf, "f", &err) ||
            v.type != TOML_FLOAT || memcmp(&v.f, &x, sizeof x) != 0) {
            if (bad++ < 3) fprintf(stderr, "float round trip: %.17g -> %s\n", x, buf);
        }
    }
    CHECK(bad == 0, "%d floats did not round-trip", bad);

    const char *strs[] = {"",
                          "plain",
                          "q\"uote",
                          "back\\slash",
                          "tab\tnew\nline\rcr\bbs\ff",
                          "ctl\x01\x1f\x7f",
                          "caf\xC3\xA9 \xF0\x9F\x98\x80",
                          "'single'"};
    for (size_t i = 0; i < sizeof strs / sizeof strs[0]; i++) {
        char *text = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);
        toml_write_string(f, strs[i]);
        fclose(f);
        toml_value v;
        ct_error err = {{0}};
        int rc = toml_parse_value(&v, text, "s", &err);
        CHECK(rc == 0 && v.type == TOML_STRING && strcmp(v.str, strs[i]) == 0,
              "string round trip %zu: %s -> %s", i, text, err.msg);
        if (rc == 0) toml_value_free(&v);
        free(text);
    }
}

static void test_file(const char *tmp) {
    char path[1024];
    snprintf(path, sizeof path, "%s/x.toml", tmp);
    FILE *f = fopen(path, "wb");
    fputs("[s]\nk = 'v'\nj = [\n", f);
    fclose(f);
    toml_doc d;
    ct_error err = {{0}};
    char want[1100];
    snprintf(want, sizeof want, "%s:4: unterminated array (opened at line 3)", path);
    CHECK(toml_parse_file(&d, path, &err) == -1 && strstr(err.msg, want), "file error: %s",
          err.msg);
    CHECK(toml_parse_file(&d, "/nonexistent/c.toml", &err) == -1 &&
              strstr(err.msg, "/nonexistent/c.toml"),
          "missing file: %s", err.msg);
}

int main(void) {
    test_dotted_tables();
    test_accepts();
    test_errors();
    test_value();
    test_writers();
    test_file(check_env("CTITAN_TMP"));
    return check_summary();
}
