// TOML subset reader (see toml.h for what is accepted). One pass over the text with a cursor that
// counts lines; a pre-pass checks the bytes (UTF-8, control characters) so the parser can trust
// them.
#include "io/toml.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "core/utf8.h"
#include "io/json.h"
#include "core/grow.h"

#define TOML_MAX_FILE_BYTES (16u << 20)
#define TOML_MAX_NUMBER_LEN 64

typedef struct toml_lex {
    const char *p, *end;
    const char *name; // file name, or the command-line option being parsed
    int line;         // 0: not a file, messages carry no line number
    ct_error *err;
} toml_lex;

static int lex_fail(toml_lex *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int lex_fail(toml_lex *l, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (l->line > 0) return ct_fail(l->err, "%s:%d: %s", l->name, l->line, msg);
    return ct_fail(l->err, "%s: %s", l->name, msg);
}

static bool lex_at_eol(const toml_lex *l) {
    return l->p >= l->end || *l->p == '\n' || *l->p == '\r';
}

// What the cursor is looking at, for "found ..." in messages.
static const char *lex_found(const toml_lex *l, char *buf, size_t cap) {
    if (l->p >= l->end) return l->line > 0 ? "end of file" : "end of value";
    if (lex_at_eol(l)) return l->line > 0 ? "end of line" : "end of value";
    size_t n = 0;
    while (l->p + n < l->end && n < 24 && l->p[n] != ' ' && l->p[n] != '\t' && l->p[n] != '\n' &&
           l->p[n] != '\r')
        n++;
    // Never cut a UTF-8 character in half.
    if (l->p + n < l->end)
        while (n > 1 && ((unsigned char)l->p[n] & 0xC0) == 0x80) n--;
    snprintf(buf, cap, "'%.*s'", (int)n, l->p);
    return buf;
}

static void lex_ws(toml_lex *l) {
    while (l->p < l->end && (*l->p == ' ' || *l->p == '\t')) l->p++;
}

static void lex_comment(toml_lex *l) {
    if (l->p < l->end && *l->p == '#')
        while (l->p < l->end && *l->p != '\n' && *l->p != '\r') l->p++;
}

// Steps over one line end (the pre-pass guarantees \r is followed by \n).
static void lex_newline(toml_lex *l) {
    if (l->p < l->end && *l->p == '\r') l->p++;
    if (l->p < l->end && *l->p == '\n') {
        l->p++;
        if (l->line > 0) l->line++;
    }
}

// Whitespace, comments and line ends, as allowed between array elements.
static void lex_ws_multiline(toml_lex *l) {
    for (;;) {
        lex_ws(l);
        lex_comment(l);
        if (l->p < l->end && (*l->p == '\n' || *l->p == '\r')) {
            lex_newline(l);
            continue;
        }
        return;
    }
}

static int lex_eol(toml_lex *l, const char *after) {
    lex_ws(l);
    lex_comment(l);
    if (!lex_at_eol(l)) {
        char f[64];
        return lex_fail(l, "expected end of line after %s, found %s", after,
                        lex_found(l, f, sizeof f));
    }
    return 0;
}

static int utf8_fail(const char *name, size_t off, int line, ct_error *err) {
    if (line > 0) return ct_fail(err, "%s:%d: invalid UTF-8 at byte %zu", name, line, off);
    return ct_fail(err, "%s: invalid UTF-8 at byte %zu", name, off);
}

// Valid UTF-8 (no overlongs, surrogates or code points past U+10FFFF), no control characters
// but tab and line ends, and no bare \r: the rules TOML sets for a whole document.
static int toml_check_bytes(const char *text, size_t len, const char *name, bool lines,
                            ct_error *err) {
    int line = lines ? 1 : 0;
    size_t i = 0;
    while (i < len) {
        unsigned char c = (unsigned char)text[i];
        if (c < 0x80) {
            bool bare_cr = c == '\r' && (i + 1 >= len || text[i + 1] != '\n');
            if (c == '\n') {
                if (lines) line++;
            } else if (bare_cr || (c < 0x20 && c != '\t' && c != '\r') || c == 0x7f) {
                if (lines)
                    return ct_fail(err, "%s:%d: control character 0x%02x at byte %zu", name, line,
                                   c, i);
                return ct_fail(err, "%s: control character 0x%02x at byte %zu", name, c, i);
            }
            i++;
            continue;
        }
        uint32_t cp;
        int n = utf8_decode(&cp, (const unsigned char *)text + i, len - i);
        if (n < 0) return utf8_fail(name, i, line, err);
        i += (size_t)n;
    }
    return 0;
}

// A growable byte buffer for string values.
typedef struct toml_buf {
    char *s;
    size_t n, cap;
} toml_buf;

static int buf_push(toml_buf *b, const char *bytes, size_t n) {
    if (grow_to((void **)&b->s, &b->cap, b->n + n + 1, 1) != 0) return -1;
    memcpy(b->s + b->n, bytes, n);
    b->n += n;
    b->s[b->n] = '\0';
    return 0;
}

static int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

// \uXXXX or \UXXXXXXXX, cursor just past the 'u'/'U'.
static int lex_unicode_escape(toml_lex *l, toml_buf *b, int digits) {
    uint32_t cp = 0;
    for (int k = 0; k < digits; k++) {
        int h = l->p + k < l->end ? hex_value(l->p[k]) : -1;
        if (h < 0)
            return lex_fail(l, "expected %d hex digits after '\\%c' in string", digits,
                            digits == 4 ? 'u' : 'U');
        cp = cp << 4 | (uint32_t)h;
    }
    if (cp == 0 || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return lex_fail(l, "escape '\\%c%.*s' is not a usable Unicode scalar value%s",
                        digits == 4 ? 'u' : 'U', digits, l->p,
                        cp == 0 ? " (NUL is not supported in strings)" : "");
    l->p += digits;
    char enc[4];
    if (buf_push(b, enc, (size_t)utf8_encode(enc, cp)) != 0) return lex_fail(l, "out of memory");
    return 0;
}

// A "basic" or 'literal' string on one line; cursor on the opening quote.
static int lex_string(toml_lex *l, toml_value *v) {
    char q = *l->p;
    if (l->end - l->p >= 3 && l->p[1] == q && l->p[2] == q)
        return lex_fail(l, "multi-line strings (%c%c%c) are not supported", q, q, q);
    l->p++;
    toml_buf b = {0};
    if (buf_push(&b, "", 0) != 0) return lex_fail(l, "out of memory");
    for (;;) {
        if (lex_at_eol(l)) {
            free(b.s);
            return lex_fail(l,
                            "unterminated string: expected a closing %c before the end of the "
                            "line",
                            q);
        }
        char c = *l->p++;
        if (c == q) break;
        int rc = 0;
        if (c == '\\' && q == '"') {
            char e = l->p < l->end ? *l->p++ : '\0';
            const char *rep = NULL;
            switch (e) {
            case 'b':
                rep = "\b";
                break;
            case 't':
                rep = "\t";
                break;
            case 'n':
                rep = "\n";
                break;
            case 'f':
                rep = "\f";
                break;
            case 'r':
                rep = "\r";
                break;
            case '"':
                rep = "\"";
                break;
            case '\\':
                rep = "\\";
                break;
            case 'u':
                rc = lex_unicode_escape(l, &b, 4);
                break;
            case 'U':
                rc = lex_unicode_escape(l, &b, 8);
                break;
            default:
                free(b.s);
                return lex_fail(l,
                                "invalid escape '\\%c' in string (valid: \\b \\t \\n \\f \\r "
                                "\\\" \\\\ \\uXXXX \\UXXXXXXXX)",
                                e ? e : ' ');
            }
            if (rep && buf_push(&b, rep, 1) != 0) rc = lex_fail(l, "out of memory");
        } else if (buf_push(&b, &c, 1) != 0) {
            rc = lex_fail(l, "out of memory");
        }
        if (rc != 0) {
            free(b.s);
            return -1;
        }
    }
    v->type = TOML_STRING;
    v->str = b.s;
    return 0;
}

static bool is_digit(char c) {
    return c >= '0' && c <= '9';
}

// digit ( '_'? digit )*  — underscores only between digits.
static bool scan_digits(const char *s, size_t n, size_t *i) {
    if (*i >= n || !is_digit(s[*i])) return false;
    (*i)++;
    while (*i < n) {
        if (is_digit(s[*i])) {
            (*i)++;
        } else if (s[*i] == '_' && *i + 1 < n && is_digit(s[*i + 1])) {
            *i += 2;
        } else {
            break;
        }
    }
    return true;
}

static bool token_is(const char *s, size_t n, const char *word) {
    return strlen(word) == n && memcmp(s, word, n) == 0;
}

// A bare token: true, false, an integer or a float.
static int lex_scalar(toml_lex *l, toml_value *v) {
    const char *s = l->p;
    size_t n = 0;
    while (s + n < l->end && !strchr(" \t\r\n,]#", s[n])) n++;
    char f[64];
    if (n == 0) return lex_fail(l, "expected a value, found %s", lex_found(l, f, sizeof f));
    if (token_is(s, n, "true") || token_is(s, n, "false")) {
        v->type = TOML_BOOL;
        v->b = s[0] == 't';
        l->p += n;
        return 0;
    }
    size_t i = (s[0] == '+' || s[0] == '-') ? 1 : 0;
    if (token_is(s + i, n - i, "inf") || token_is(s + i, n - i, "nan"))
        return lex_fail(l, "expected a finite number, found %s (inf and nan are not allowed)",
                        lex_found(l, f, sizeof f));
    if (n - i >= 2 && s[i] == '0' && strchr("xob", s[i + 1]))
        return lex_fail(l,
                        "expected a decimal number, found %s (hexadecimal, octal and binary "
                        "integers are not supported)",
                        lex_found(l, f, sizeof f));
    if (memchr(s, ':', n) || (n >= 5 && is_digit(s[0]) && is_digit(s[3]) && s[4] == '-'))
        return lex_fail(l, "expected a value, found %s (dates and times are not supported)",
                        lex_found(l, f, sizeof f));
    bool is_float = false, ok = true;
    if (i < n && s[i] == '0' && i + 1 < n && (is_digit(s[i + 1]) || s[i + 1] == '_'))
        return lex_fail(l, "expected a number, found %s (leading zeros are not allowed)",
                        lex_found(l, f, sizeof f));
    ok = scan_digits(s, n, &i);
    if (ok && i < n && s[i] == '.') {
        i++;
        is_float = true;
        ok = scan_digits(s, n, &i);
    }
    if (ok && i < n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        is_float = true;
        if (i < n && (s[i] == '+' || s[i] == '-')) i++;
        ok = scan_digits(s, n, &i);
    }
    if (!ok || i != n) {
        bool word = (s[0] >= 'a' && s[0] <= 'z') || (s[0] >= 'A' && s[0] <= 'Z');
        return lex_fail(l,
                        "expected a value (\"string\", number, true, false or [array]), found "
                        "%s%s",
                        lex_found(l, f, sizeof f), word ? " (strings need quotes)" : "");
    }
    char num[TOML_MAX_NUMBER_LEN + 1];
    size_t k = 0;
    for (size_t j = 0; j < n; j++) {
        if (s[j] == '_') continue;
        if (k == TOML_MAX_NUMBER_LEN)
            return lex_fail(l, "number %s is too long", lex_found(l, f, sizeof f));
        num[k++] = s[j];
    }
    num[k] = '\0';
    errno = 0;
    if (is_float) {
        double x = strtod(num, NULL);
        if (!isfinite(x)) return lex_fail(l, "float %s is out of range", lex_found(l, f, sizeof f));
        v->type = TOML_FLOAT;
        v->f = x;
    } else {
        long long x = strtoll(num, NULL, 10);
        if (errno == ERANGE)
            return lex_fail(l, "integer %s is out of the 64-bit range", lex_found(l, f, sizeof f));
        v->type = TOML_INT;
        v->i = x;
    }
    l->p += n;
    return 0;
}

static int lex_value(toml_lex *l, toml_value *v, bool in_array);

static int lex_array(toml_lex *l, toml_value *v) {
    int open_line = l->line;
    l->p++;
    v->type = TOML_ARRAY;
    v->items = NULL;
    v->n_items = 0;
    size_t cap = 0;
    char f[64];
    for (;;) {
        lex_ws_multiline(l);
        if (l->p < l->end && *l->p == ']') {
            l->p++;
            return 0;
        }
        if (l->p >= l->end) {
            toml_value_free(v);
            if (open_line > 0)
                return lex_fail(l, "unterminated array (opened at line %d): expected ']'",
                                open_line);
            return lex_fail(l, "unterminated array: expected ']'");
        }
        toml_value item = {0};
        if (lex_value(l, &item, true) != 0) {
            toml_value_free(v);
            return -1;
        }
        if (v->n_items > 0 && item.type != v->items[0].type) {
            toml_type first = v->items[0].type, found = item.type;
            toml_value_free(&item);
            toml_value_free(v);
            return lex_fail(l, "array elements must all have one type: expected %s, found %s",
                            toml_type_name(first), toml_type_name(found));
        }
        if (grow_to((void **)&v->items, &cap, (size_t)v->n_items + 1, sizeof *v->items) != 0) {
            toml_value_free(&item);
            toml_value_free(v);
            return lex_fail(l, "out of memory");
        }
        v->items[v->n_items++] = item;
        lex_ws_multiline(l);
        if (l->p < l->end && *l->p == ',') {
            l->p++;
            continue;
        }
        if (l->p < l->end && *l->p == ']') {
            l->p++;
            return 0;
        }
        toml_value_free(v);
        return lex_fail(l, "expected ',' or ']' in array, found %s", lex_found(l, f, sizeof f));
    }
}

static int lex_value(toml_lex *l, toml_value *v, bool in_array) {
    char f[64];
    if (lex_at_eol(l) || *l->p == '#')
        return lex_fail(l, "expected a value, found %s", lex_found(l, f, sizeof f));
    switch (*l->p) {
    case '"':
    case '\'':
        return lex_string(l, v);
    case '[':
        if (in_array) return lex_fail(l, "nested arrays are not supported");
        return lex_array(l, v);
    case '{':
        return lex_fail(l, "inline tables ({...}) are not supported; use a [section]");
    default:
        return lex_scalar(l, v);
    }
}

static bool is_bare_key_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || is_digit(c) || c == '_' || c == '-';
}

static int lex_key(toml_lex *l, char **out, const char *what) {
    char f[64];
    if (l->p < l->end && (*l->p == '"' || *l->p == '\''))
        return lex_fail(l, "quoted %ss are not supported, found %s", what,
                        lex_found(l, f, sizeof f));
    const char *s = l->p;
    while (l->p < l->end && is_bare_key_char(*l->p)) l->p++;
    if (l->p == s) return lex_fail(l, "expected a %s, found %s", what, lex_found(l, f, sizeof f));
    *out = strndup(s, (size_t)(l->p - s));
    if (!*out) return lex_fail(l, "out of memory");
    return 0;
}

void toml_value_free(toml_value *v) {
    if (!v) return;
    free(v->str);
    for (int i = 0; i < v->n_items; i++) toml_value_free(&v->items[i]);
    free(v->items);
    memset(v, 0, sizeof *v);
}

void toml_free(toml_doc *doc) {
    if (!doc) return;
    for (int i = 0; i < doc->n_entries; i++) {
        free(doc->entries[i].section);
        free(doc->entries[i].key);
        toml_value_free(&doc->entries[i].value);
    }
    for (int i = 0; i < doc->n_tables; i++) free(doc->tables[i].name);
    free(doc->entries);
    free(doc->tables);
    memset(doc, 0, sizeof *doc);
}

static int lex_table(toml_lex *l, toml_doc *doc, const char **section) {
    char f[64];
    l->p++;
    if (l->p < l->end && *l->p == '[')
        return lex_fail(l, "arrays of tables ([[...]]) are not supported");
    lex_ws(l);
    // A dotted name ([quantize.linear.float8]) names the nested table; its parts are joined
    // with '.', white space around the dots dropped, as TOML reads it.
    char *name = NULL;
    if (lex_key(l, &name, "table name") != 0) return -1;
    lex_ws(l);
    while (l->p < l->end && *l->p == '.') {
        l->p++;
        lex_ws(l);
        char *part = NULL;
        if (lex_key(l, &part, "table name part") != 0) {
            free(name);
            return -1;
        }
        size_t a = strlen(name), b = strlen(part);
        char *joined = realloc(name, a + 1 + b + 1);
        if (!joined) {
            free(part);
            free(name);
            return lex_fail(l, "out of memory");
        }
        joined[a] = '.';
        memcpy(joined + a + 1, part, b + 1);
        free(part);
        name = joined;
        lex_ws(l);
    }
    if (l->p >= l->end || *l->p != ']') {
        free(name);
        return lex_fail(l, "expected ']' after the table name, found %s",
                        lex_found(l, f, sizeof f));
    }
    l->p++;
    if (lex_eol(l, "the table header") != 0) {
        free(name);
        return -1;
    }
    for (int i = 0; i < doc->n_tables; i++) {
        if (strcmp(doc->tables[i].name, name) == 0) {
            int first = doc->tables[i].line;
            free(name);
            return lex_fail(l, "table [%s] is defined twice (first at line %d)",
                            doc->tables[i].name, first);
        }
    }
    toml_table *t = realloc(doc->tables, (size_t)(doc->n_tables + 1) * sizeof *t);
    if (!t) {
        free(name);
        return lex_fail(l, "out of memory");
    }
    doc->tables = t;
    doc->tables[doc->n_tables++] = (toml_table){name, l->line};
    *section = name;
    return 0;
}

static int lex_keyval(toml_lex *l, toml_doc *doc, const char *section, size_t *cap) {
    char f[64];
    toml_entry e = {0};
    e.line = l->line;
    if (lex_key(l, &e.key, "key") != 0) return -1;
    lex_ws(l);
    int rc = 0;
    if (l->p < l->end && *l->p == '.') {
        rc = lex_fail(l,
                      "dotted keys (%s.x = ...) are not supported; put the key under its "
                      "[section]",
                      e.key);
    } else if (l->p >= l->end || *l->p != '=') {
        rc = lex_fail(l, "expected '=' after key '%s', found %s", e.key, lex_found(l, f, sizeof f));
    }
    if (rc == 0) {
        l->p++;
        lex_ws(l);
        rc = lex_value(l, &e.value, false);
    }
    char after[160];
    snprintf(after, sizeof after, "the value of '%s'", e.key);
    if (rc == 0) rc = lex_eol(l, after);
    for (int i = 0; rc == 0 && i < doc->n_entries; i++) {
        const toml_entry *o = &doc->entries[i];
        if (strcmp(o->section, section) == 0 && strcmp(o->key, e.key) == 0) {
            if (*section)
                rc = lex_fail(l, "key '%s' is defined twice in [%s] (first at line %d)", e.key,
                              section, o->line);
            else
                rc = lex_fail(l, "key '%s' is defined twice (first at line %d)", e.key, o->line);
        }
    }
    if (rc == 0) {
        e.section = strdup(section);
        if (!e.section) rc = lex_fail(l, "out of memory");
    }
    if (rc == 0 &&
        grow_to((void **)&doc->entries, cap, (size_t)doc->n_entries + 1, sizeof *doc->entries) != 0)
        rc = lex_fail(l, "out of memory");
    if (rc != 0) {
        free(e.key);
        free(e.section);
        toml_value_free(&e.value);
        return -1;
    }
    doc->entries[doc->n_entries++] = e;
    return 0;
}

int toml_parse(toml_doc *doc, const char *text, size_t len, const char *name, ct_error *err) {
    memset(doc, 0, sizeof *doc);
    if (toml_check_bytes(text, len, name, true, err) != 0) return -1;
    toml_lex l = {text, text + len, name, 1, err};
    if (len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0) l.p += 3;
    const char *section = "";
    size_t cap = 0;
    while (l.p < l.end) {
        lex_ws(&l);
        lex_comment(&l);
        int rc = 0;
        if (lex_at_eol(&l)) {
            lex_newline(&l);
            continue;
        }
        if (*l.p == '[') {
            rc = lex_table(&l, doc, &section);
        } else {
            rc = lex_keyval(&l, doc, section, &cap);
        }
        if (rc != 0) {
            toml_free(doc);
            return -1;
        }
        lex_newline(&l);
    }
    return 0;
}

int toml_parse_file(toml_doc *doc, const char *path, ct_error *err) {
    memset(doc, 0, sizeof *doc);
    char *text = NULL;
    size_t len = 0;
    if (file_read_all(&text, &len, path, TOML_MAX_FILE_BYTES, err) != 0) return -1;
    int rc = toml_parse(doc, text, len, path, err);
    free(text);
    return rc;
}

int toml_parse_value(toml_value *out, const char *text, const char *what, ct_error *err) {
    memset(out, 0, sizeof *out);
    size_t len = strlen(text);
    if (toml_check_bytes(text, len, what, false, err) != 0) return -1;
    toml_lex l = {text, text + len, what, 0, err};
    lex_ws(&l);
    if (lex_value(&l, out, false) != 0) return -1;
    lex_ws(&l);
    if (l.p != l.end) {
        char f[64];
        toml_value_free(out);
        return lex_fail(&l, "expected one value, found %s after it", lex_found(&l, f, sizeof f));
    }
    return 0;
}

int toml_check_text(const char *text, size_t len, const char *what, ct_error *err) {
    return toml_check_bytes(text, len, what, false, err);
}

const char *toml_type_name(toml_type t) {
    switch (t) {
    case TOML_STRING:
        return "a string";
    case TOML_INT:
        return "an integer";
    case TOML_FLOAT:
        return "a float";
    case TOML_BOOL:
        return "a boolean";
    case TOML_ARRAY:
        return "an array";
    }
    return "an unknown type";
}

void toml_write_string(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '"':
            fputs("\\\"", f);
            break;
        case '\\':
            fputs("\\\\", f);
            break;
        case '\b':
            fputs("\\b", f);
            break;
        case '\t':
            fputs("\\t", f);
            break;
        case '\n':
            fputs("\\n", f);
            break;
        case '\f':
            fputs("\\f", f);
            break;
        case '\r':
            fputs("\\r", f);
            break;
        default:
            if (*p < 0x20 || *p == 0x7f) {
                fprintf(f, "\\u%04X", *p);
            } else {
                fputc(*p, f);
            }
        }
    }
    fputc('"', f);
}

int toml_format_float(char *buf, size_t cap, double x) {
    if (!isfinite(x) || cap < 32) return -1;
    // %.17g always round-trips; shorter forms are tried first so 8e-4 stays "0.0008".
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, cap, "%.*g", prec, x);
        if (strtod(buf, NULL) == x) break;
    }
    // %g turns 100 into 1e+02; people read plain decimals better in that range.
    const char *e = strpbrk(buf, "eE");
    int ex = e ? atoi(e + 1) : 0;
    if (e && ex >= -5 && ex < 16) {
        char plain[64];
        for (int digits = 0; digits <= 20; digits++) {
            snprintf(plain, sizeof plain, "%.*f", digits, x);
            if (strtod(plain, NULL) == x) {
                snprintf(buf, cap, "%s", plain);
                break;
            }
        }
    }
    if (!strpbrk(buf, ".eE")) strncat(buf, ".0", cap - strlen(buf) - 1);
    return 0;
}
