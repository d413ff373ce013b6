// The names a template calls, each listed once, in the style of the op list (ops/ops_list.h):
// the filters, the tests, the methods (of str, dict and loop), the loop's fields and the
// globals. Each list makes an enum and a name table (jinja_names.c, with a static assertion on
// its count); the file that implements a list makes its table of functions from the same list,
// with its own assertion. The parser knows the filters and tests from here, so adding one is a
// line here plus its function; a name in no list is an error naming it.
#pragma once
#include <stddef.h>

// X(id, name, fn): `x | name(...)` calls fn (jinja_filters.c) with the id, so one function may
// serve several names.
#define JINJA_FILTERS(X)                                                                           \
    X(JF_LENGTH, "length", filter_length)                                                          \
    X(JF_COUNT, "count", filter_length)                                                            \
    X(JF_TOJSON, "tojson", filter_tojson)                                                          \
    X(JF_TRIM, "trim", filter_text)                                                                \
    X(JF_UPPER, "upper", filter_text)                                                              \
    X(JF_LOWER, "lower", filter_text)                                                              \
    X(JF_TITLE, "title", filter_text)                                                              \
    X(JF_CAPITALIZE, "capitalize", filter_text)                                                    \
    X(JF_STRING, "string", filter_string)                                                          \
    X(JF_INT, "int", filter_number)                                                                \
    X(JF_FLOAT, "float", filter_number)                                                            \
    X(JF_LIST, "list", filter_sequence)                                                            \
    X(JF_JOIN, "join", filter_join)                                                                \
    X(JF_FIRST, "first", filter_sequence)                                                          \
    X(JF_LAST, "last", filter_sequence)                                                            \
    X(JF_DEFAULT, "default", filter_default)                                                       \
    X(JF_D, "d", filter_default)                                                                   \
    X(JF_ITEMS, "items", filter_items)                                                             \
    X(JF_REVERSE, "reverse", filter_sequence)                                                      \
    X(JF_REPLACE, "replace", filter_replace)                                                       \
    X(JF_MAP, "map", filter_map)                                                                   \
    X(JF_SELECT, "select", filter_select)                                                          \
    X(JF_REJECT, "reject", filter_select)                                                          \
    X(JF_SELECTATTR, "selectattr", filter_select)                                                  \
    X(JF_REJECTATTR, "rejectattr", filter_select)                                                  \
    X(JF_SAFE, "safe", filter_safe)                                                                \
    X(JF_ABS, "abs", filter_abs)

// X(id, name, fn, nargs): `x is name(...)` calls fn (jinja_tests.c); it takes at most nargs
// positional arguments and no keywords.
#define JINJA_TESTS(X)                                                                             \
    X(JT_DEFINED, "defined", test_type, 0)                                                         \
    X(JT_UNDEFINED, "undefined", test_type, 0)                                                     \
    X(JT_NONE, "none", test_type, 0)                                                               \
    X(JT_STRING, "string", test_type, 0)                                                           \
    X(JT_NUMBER, "number", test_type, 0)                                                           \
    X(JT_MAPPING, "mapping", test_type, 0)                                                         \
    X(JT_SEQUENCE, "sequence", test_type, 0)                                                       \
    X(JT_ITERABLE, "iterable", test_type, 0)                                                       \
    X(JT_TRUE, "true", test_type, 0)                                                               \
    X(JT_FALSE, "false", test_type, 0)                                                             \
    X(JT_BOOLEAN, "boolean", test_type, 0)                                                         \
    X(JT_INTEGER, "integer", test_type, 0)                                                         \
    X(JT_FLOAT, "float", test_type, 0)                                                             \
    X(JT_EQUALTO, "equalto", test_eq, 1)                                                           \
    X(JT_EQ, "eq", test_eq, 1)                                                                     \
    X(JT_EQ_OP, "==", test_eq, 1)                                                                  \
    X(JT_NE, "ne", test_eq, 1)                                                                     \
    X(JT_NE_OP, "!=", test_eq, 1)                                                                  \
    X(JT_SAMEAS, "sameas", test_sameas, 1)                                                         \
    X(JT_ODD, "odd", test_divisible, 0)                                                            \
    X(JT_EVEN, "even", test_divisible, 0)                                                          \
    X(JT_DIVISIBLEBY, "divisibleby", test_divisible, 1)                                            \
    X(JT_IN, "in", test_in, 1)                                                                     \
    X(JT_CALLABLE, "callable", test_type, 0)                                                       \
    X(JT_LOWER, "lower", test_case, 0)                                                             \
    X(JT_UPPER, "upper", test_case, 0)

// X(id, type, name, fn): the method `name` of a value of type `type` (a jtype, jinja_value.h)
// calls fn (jinja_methods.c). Python's other str, dict and list methods are known by name
// (jinja_access.c) only to say they are not supported.
#define JINJA_METHODS(X)                                                                           \
    X(JM_STARTSWITH, JV_STR, "startswith", method_affix)                                           \
    X(JM_ENDSWITH, JV_STR, "endswith", method_affix)                                               \
    X(JM_SPLIT, JV_STR, "split", method_split)                                                     \
    X(JM_STRIP, JV_STR, "strip", method_strip)                                                     \
    X(JM_LSTRIP, JV_STR, "lstrip", method_strip)                                                   \
    X(JM_RSTRIP, JV_STR, "rstrip", method_strip)                                                   \
    X(JM_UPPER, JV_STR, "upper", method_case)                                                      \
    X(JM_LOWER, JV_STR, "lower", method_case)                                                      \
    X(JM_REPLACE, JV_STR, "replace", method_replace)                                               \
    X(JM_TITLE, JV_STR, "title", method_case)                                                      \
    X(JM_CAPITALIZE, JV_STR, "capitalize", method_case)                                            \
    X(JM_GET, JV_DICT, "get", method_get)                                                          \
    X(JM_ITEMS, JV_DICT, "items", method_dict_list)                                                \
    X(JM_KEYS, JV_DICT, "keys", method_dict_list)                                                  \
    X(JM_VALUES, JV_DICT, "values", method_dict_list)                                              \
    X(JM_CYCLE, JV_LOOP, "cycle", method_cycle)

// X(id, name): the fields of `loop` inside a for (jinja_access.c); loop.cycle is a method.
#define JINJA_LOOP_FIELDS(X)                                                                       \
    X(JL_INDEX, "index")                                                                           \
    X(JL_INDEX0, "index0")                                                                         \
    X(JL_REVINDEX, "revindex")                                                                     \
    X(JL_REVINDEX0, "revindex0")                                                                   \
    X(JL_FIRST, "first")                                                                           \
    X(JL_LAST, "last")                                                                             \
    X(JL_LENGTH, "length")                                                                         \
    X(JL_DEPTH, "depth")                                                                           \
    X(JL_DEPTH0, "depth0")                                                                         \
    X(JL_PREVITEM, "previtem")                                                                     \
    X(JL_NEXTITEM, "nextitem")

// X(id, name, fn): the global `name(...)` calls fn (jinja_methods.c).
#define JINJA_GLOBALS(X)                                                                           \
    X(JG_RANGE, "range", global_range)                                                             \
    X(JG_NAMESPACE, "namespace", global_mapping)                                                   \
    X(JG_DICT, "dict", global_mapping)                                                             \
    X(JG_RAISE_EXCEPTION, "raise_exception", global_raise_exception)                               \
    X(JG_STRFTIME_NOW, "strftime_now", global_strftime_now)

#define JINJA_ID(id, ...) id,
typedef enum { JINJA_FILTERS(JINJA_ID) JINJA_N_FILTERS } jinja_filter;
typedef enum { JINJA_TESTS(JINJA_ID) JINJA_N_TESTS } jinja_test;
typedef enum { JINJA_METHODS(JINJA_ID) JINJA_N_METHODS } jinja_method;
typedef enum { JINJA_LOOP_FIELDS(JINJA_ID) JINJA_N_LOOP_FIELDS } jinja_loop_field;
typedef enum { JINJA_GLOBALS(JINJA_ID) JINJA_N_GLOBALS } jinja_global;

extern const char *const jinja_filter_names[];
extern const char *const jinja_test_names[];
extern const char *const jinja_method_names[];
extern const char *const jinja_loop_field_names[];
extern const char *const jinja_global_names[];

// The index of s[0..n) in names[0..count), or -1.
int jinja_name_find(const char *const *names, int count, const char *s, size_t n);
