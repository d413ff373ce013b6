// A TOML reader for the subset that training configs use, and the two writers config dumps need.
//
// Supported: comments, [section] tables (dotted names such as [a.b] name the table "a.b"), `key =
// value` with bare keys, "basic strings" (all TOML escapes), 'literal strings', integers (sign, _
// separators), floats (fraction and/or exponent), booleans, and arrays of one scalar type (may span
// lines). CRLF line ends and a leading BOM are accepted. Rejected with a message that says so:
// dotted keys (a.b = 1), quoted keys, arrays of tables, inline tables, multi-line strings,
// hex/octal/binary integers, dates, inf and nan, nested arrays. Duplicate tables and keys are
// errors, as TOML says. Every error reads "NAME:LINE: ..." with what was expected and what was
// found; invalid UTF-8 is reported with its byte offset.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/error.h"

typedef enum toml_type { TOML_STRING, TOML_INT, TOML_FLOAT, TOML_BOOL, TOML_ARRAY } toml_type;

typedef struct toml_value {
    toml_type type;
    char *str;                // TOML_STRING: malloc'd, NUL-terminated (a \u0000 escape is rejected)
    int64_t i;                // TOML_INT
    double f;                 // TOML_FLOAT, always finite
    bool b;                   // TOML_BOOL
    struct toml_value *items; // TOML_ARRAY: n_items scalars, all of one type
    int n_items;
} toml_value;

typedef struct toml_entry {
    char *section; // "" for keys before the first [section]
    char *key;
    toml_value value;
    int line; // 1-based line of the key
} toml_entry;

typedef struct toml_table {
    char *name;
    int line;
} toml_table;

// Entries and tables in file order.
typedef struct toml_doc {
    toml_entry *entries;
    int n_entries;
    toml_table *tables;
    int n_tables;
} toml_doc;

// `name` is the file name used in messages. On failure *doc is left empty (nothing to free).
int toml_parse(toml_doc *doc, const char *text, size_t len, const char *name, ct_error *err);
int toml_parse_file(toml_doc *doc, const char *path, ct_error *err);
void toml_free(toml_doc *doc);

// Parses the whole of `text` as one TOML value ("3", "-1_000", "1e-4", "true", "'s'", "[1, 2]"),
// as given on a command line; `what` names it in messages.
int toml_parse_value(toml_value *out, const char *text, const char *what, ct_error *err);
void toml_value_free(toml_value *v);
// The byte rules TOML sets for a document (valid UTF-8, no control characters but tab and line
// ends), for text taken verbatim, such as a command-line string value.
int toml_check_text(const char *text, size_t len, const char *what, ct_error *err);

// "a string", "an integer", "a float", "a boolean", "an array" for messages.
const char *toml_type_name(toml_type t);

// Writes s as a TOML basic string, quotes included, escaping what TOML requires.
void toml_write_string(FILE *f, const char *s);
// The shortest decimal form of a finite x that reads back to the same double, in TOML float
// syntax (always with '.' or an exponent: 1.0, 0.0008, 1e-08). Returns -1 for inf/nan.
int toml_format_float(char *buf, size_t cap, double x);
