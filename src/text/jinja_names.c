// The name tables of jinja_names.h's lists.
#include "text/jinja_names.h"

#include <assert.h>
#include <string.h>

#define NAME(id, name, ...) name,
#define METHOD_NAME(id, type, name, fn) name,

const char *const jinja_filter_names[] = {JINJA_FILTERS(NAME)};
const char *const jinja_test_names[] = {JINJA_TESTS(NAME)};
const char *const jinja_method_names[] = {JINJA_METHODS(METHOD_NAME)};
const char *const jinja_loop_field_names[] = {JINJA_LOOP_FIELDS(NAME)};
const char *const jinja_global_names[] = {JINJA_GLOBALS(NAME)};

static_assert(sizeof jinja_filter_names / sizeof *jinja_filter_names == JINJA_N_FILTERS, "filters");
static_assert(sizeof jinja_test_names / sizeof *jinja_test_names == JINJA_N_TESTS, "tests");
static_assert(sizeof jinja_method_names / sizeof *jinja_method_names == JINJA_N_METHODS, "methods");
static_assert(sizeof jinja_loop_field_names / sizeof *jinja_loop_field_names == JINJA_N_LOOP_FIELDS,
              "loop fields");
static_assert(sizeof jinja_global_names / sizeof *jinja_global_names == JINJA_N_GLOBALS, "globals");

int jinja_name_find(const char *const *names, int count, const char *s, size_t n) {
    for (int i = 0; i < count; i++)
        if (strlen(names[i]) == n && memcmp(names[i], s, n) == 0) return i;
    return -1;
}
