// The Jinja2-subset engine alone (src/text/jinja.h): each construct, the whitespace rules,
// Python's printing of values, tojson, slicing, undefined values, the limits, and the errors
// with their positions. Expected outputs are what Python's jinja2 renders with transformers'
// settings (trim_blocks, lstrip_blocks, loopcontrols, tojson as json.dumps).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "check.h"
#include "text/jinja.h"

static const char *V = "{\"s\": \"Hello World\", \"n\": 7, \"f\": 2.5, \"t\": true, \"z\": null,"
                       " \"l\": [3, 1, 2], \"e\": [], \"u8\": \"h\\u00e9\\u4e16\\ud83d\\ude00\","
                       " \"d\": {\"b\": 2, \"a\": [1, {\"x\": \"y\"}], \"c\": null},"
                       " \"ms\": [{\"role\": \"system\", \"content\": \"S\"},"
                       " {\"role\": \"user\", \"content\": \"U\"}, {\"role\": \"user\"}]}";

static void R_(int line, const char *tpl, const char *want) {
    ct_error err;
    jinja_template *t;
    cJSON *vars = cJSON_Parse(V);
    char *out = NULL;
    size_t n = 0;
    if (jinja_parse(&t, tpl, strlen(tpl), "t", &err) != 0) {
        CHECK(0, "line %d: %s: parse: %s", line, tpl, err.msg);
    } else {
        if (jinja_render(t, vars, &out, &n, &err) != 0)
            CHECK(0, "line %d: %s: render: %s", line, tpl, err.msg);
        else
            CHECK(n == strlen(want) && memcmp(out, want, n) == 0,
                  "line %d: %s\n  got  \"%s\"\n  want \"%s\"", line, tpl, out, want);
        jinja_free(t);
    }
    free(out);
    cJSON_Delete(vars);
}
#define R(tpl, want) R_(__LINE__, tpl, want)

// Parse or render must fail with exactly this message.
static void E_(int line, const char *tpl, const char *want) {
    ct_error err = {{0}};
    jinja_template *t;
    cJSON *vars = cJSON_Parse(V);
    char *out = NULL;
    size_t n;
    int rc = jinja_parse(&t, tpl, strlen(tpl), "t", &err);
    if (rc == 0) {
        rc = jinja_render(t, vars, &out, &n, &err);
        jinja_free(t);
    }
    CHECK(rc != 0 && strcmp(err.msg, want) == 0, "line %d: %s\n  got  \"%s\"\n  want \"%s\"", line,
          tpl, rc ? err.msg : out, want);
    free(out);
    cJSON_Delete(vars);
}
#define E(tpl, want) E_(__LINE__, tpl, want)

static void test_output_and_values(void) {
    R("a{{ s }}b", "aHello Worldb");
    R("{{ n }} {{ f }} {{ t }} {{ z }} {{ missing }}|", "7 2.5 True None |");
    R("{{ 1.0 }} {{ 0.1 }} {{ 1e16 }} {{ 1.5e-7 }} {{ 10 / 4 }} {{ 3 / 3 }} {{ 1e15 }} {{ 0.0001 "
      "}}",
      "1.0 0.1 1e+16 1.5e-07 2.5 1.0 1000000000000000.0 0.0001");
    R("{{ -0.0 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7.5 // 2 "
      "}}",
      "-0.0 1024 0.5 3 -4 2 3.0");
    R("{{ l }} {{ d }} {{ (1, 'a') }} {{ (1,) }} {{ [none, true, 'it\\'s'] }}",
      "[3, 1, 2] {'b': 2, 'a': [1, {'x': 'y'}], 'c': None} (1, 'a') (1,) [None, True, \"it's\"]");
    R("{{ 'a' ~ 1 ~ none ~ true }} {{ 'x' * 3 }} {{ [1] + [2] }} {{ 'a' + 'b' }}",
      "a1NoneTrue xxx [1, 2] ab");
    R("{{ \"tab\\there\" }}|{{ 'q\\'s' }}|{{ '\\u00e9\\x41' }}", "tab\there|q's|\xc3\xa9"
                                                                 "A");
    R("{# comment #}x{#- c -#} y", "xy");
    R("{{ -n }} {{ not t }} {{ t and 'y' }} {{ z or 'd' }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }}",
      "-7 False y d True False");
    R("{{ 'a' in 'cat' }} {{ 2 in l }} {{ 'b' in d }} {{ 5 not in l }} {{ 'x' in missing }}",
      "True True True True False");
    R("{{ 'y' if t else 'n' }} {{ 'y' if z else 'n' }} [{{ 'y' if z }}]", "y n []");
}

static void test_whitespace(void) {
    R("{% if t %}\nyes\n{% endif %}\nend", "yes\nend");       // trim_blocks
    R("<\n  {% if t %}\n  x\n  {% endif %}\n>", "<\n  x\n>"); // lstrip_blocks
    R("a  {%- if t -%}  b  {%- endif -%}  c", "abc");
    R("a {{- s -}} b", "aHello Worldb");
    R("a\n  {{ n }}\n", "a\n  7");                      // one trailing newline goes
    R("a\r\n{% if t %}\r\nb\r\n{% endif %}", "a\nb\n"); // newlines normalised
    R("  {%+ if t %}x{% endif %}", "  x");
    R("x {% if t %}y{% endif %}", "x y"); // not at a line start: kept
    R("{% raw %}{{ not evaluated }}{% endraw %}", "{{ not evaluated }}");
    R("{% for i in l %}\n  {{ i }}\n{% endfor %}", "  3\n  1\n  2\n");
    R("{# c #}\nx", "x");
}

static void test_statements(void) {
    R("{% if n > 10 %}a{% elif n > 5 %}b{% else %}c{% endif %}", "b");
    R("{% for x in l %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}"
      "{{ loop.first }}{{ loop.last }}{{ loop.length }} {% endfor %}",
      "1032TrueFalse3 2121FalseFalse3 3210FalseTrue3 ");
    R("{% for x in l %}{{ loop.previtem }}-{{ loop.nextitem }} {% endfor %}", "-1 3-2 1- ");
    R("{% for x in e %}x{% else %}empty{% endfor %}", "empty");
    R("{% for x in l if x > 1 %}{{ x }}{{ loop.length }}{% endfor %}", "3222");
    R("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", "b=2;a=[1, {'x': 'y'}];c=None;");
    R("{% for k in d %}{{ k }}{% endfor %} {% for c in u8 %}[{{ c }}]{% endfor %}",
      "bac [h][\xc3\xa9][\xe4\xb8\x96][\xf0\x9f\x98\x80]");
    R("{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}"
      "{% endif %}{{ i }}{% endfor %}",
      "0134");
    R("{% for x in l %}{% for y in [0, 1] %}{{ loop.index }}{% endfor %}{{ loop.index }} {% endfor "
      "%}",
      "121 122 123 ");
    R("{% set x = 5 %}{% set a, b = 1, 2 %}{{ x }}{{ a }}{{ b }}", "512");
    R("{% set x = 1 %}{% for i in l %}{% set x = i %}{% endfor %}{{ x }}", "1"); // loop scope
    R("{% set ns = namespace(v=0, s='') %}{% for i in l %}{% set ns.v = ns.v + i %}{% endfor %}"
      "{{ ns.v }}",
      "6");
    R("{% set b %}in {{ n }}{% endset %}[{{ b }}]", "[in 7]");
    R("{% macro m(a, b='B', c=none) %}{{ a }}{{ b }}{{ c }}{% endmacro %}"
      "{{ m(1) }} {{ m(1, 2) }} {{ m(c=3, a=0) }}",
      "1BNone 12None 0B3");
    R("{% macro r(k) %}{% if k > 0 %}{{ k }}{{ r(k - 1) }}{% endif %}{% endmacro %}{{ r(3) }}",
      "321");
    R("{% generation %}g{% endgeneration %}", "g");
}

static void test_access_and_slices(void) {
    R("{{ d.b }} {{ d['b'] }} {{ d.a[1].x }} {{ l[-1] }} {{ l[5] }}|{{ d.zz }}|", "2 2 y 2 ||");
    R("{{ ms[0].role }} {{ ms[2].content is defined }} {{ ms[2].content is undefined }}",
      "system False True");
    R("{{ l[::-1] }} {{ l[1:] }} {{ l[:-1] }} {{ l[::2] }} {{ l[5:] }} {{ l[-10:1] }}",
      "[2, 1, 3] [1, 2] [3, 1] [3, 2] [] [3]");
    R("{{ s[::-1] }} {{ s[-5:] }} {{ u8[1:3] }} {{ u8[::-1] }} {{ u8[-1] }}",
      "dlroW olleH World \xc3\xa9\xe4\xb8\x96 \xf0\x9f\x98\x80\xe4\xb8\x96\xc3\xa9h "
      "\xf0\x9f\x98\x80");
    R("{{ s[10:2:-3] }} {{ l[1::-1] }}", "doo [1, 3]");
}

static void test_filters(void) {
    R("{{ s | length }} {{ u8 | length }} {{ l | count }} {{ d | length }} {{ missing | length }}",
      "11 4 3 3 0");
    R("{{ d | tojson }}", "{\"b\": 2, \"a\": [1, {\"x\": \"y\"}], \"c\": null}");
    R("{{ d | tojson(indent=2) }}", "{\n  \"b\": 2,\n  \"a\": [\n    1,\n    {\n      \"x\": "
                                    "\"y\"\n    }\n  ],\n  \"c\": null\n}");
    R("{{ e | tojson(indent=2) }} {{ u8 | tojson }} {{ 'a\"\\\\\\n\\x01' | tojson }} {{ [0.1, "
      "1e16, "
      "true] | tojson }}",
      "[] \"h\xc3\xa9\xe4\xb8\x96\xf0\x9f\x98\x80\" \"a\\\"\\\\\\n\\u0001\" [0.1, 1e+16, true]");
    R("[{{ '  x  ' | trim }}] {{ s | upper }} {{ s | lower }} {{ 'hello wORLD-x' | title }} "
      "{{ 'hELLO' | capitalize }}",
      "[x] HELLO WORLD hello world Hello World-X Hello");
    R("{{ n | string }}{{ '12' | int + 1 }} {{ 'x' | int }} {{ '2.5' | float }} {{ f | int }} "
      "{{ 3 | float }}",
      "713 0 2.5 2 3.0");
    R("{{ 'ab' | list }} {{ l | join('-') }} {{ l | first }} {{ l | last }} {{ l | reverse | list "
      "}}",
      "['a', 'b'] 3-1-2 3 2 [2, 1, 3]");
    R("{{ missing | default('x') }} {{ z | default('x') }} {{ '' | d('e', true) }}", "x None e");
    R("{{ d | items | list }}", "[('b', 2), ('a', [1, {'x': 'y'}]), ('c', None)]");
    R("{{ s | replace('o', '0') }} {{ s | replace('o', '', 1) }}", "Hell0 W0rld Hell World");
    R("{{ ms | map(attribute='role') | join(',') }} {{ ms | map(attribute='content', default='-') "
      "| "
      "join }}",
      "system,user,user SU-");
    R("{{ ms | selectattr('role', 'equalto', 'user') | list | length }} "
      "{{ ms | rejectattr('content', 'defined') | list | length }} {{ l | select('odd') | list }}",
      "2 1 [3, 1]");
    R("{{ ['a', 'B'] | map('upper') | join }} {{ -3 | abs }}", "AB 3");
}

static void test_tests_and_methods(void) {
    R("{{ n is number }}{{ t is number }}{{ t is boolean }}{{ n is integer }}{{ f is float }}"
      "{{ s is string }}{{ d is mapping }}{{ l is sequence }}{{ s is iterable }}{{ z is none }}"
      "{{ t is true }}{{ z is not none }}",
      "TrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueFalse");
    R("{{ n is odd }}{{ n is even }}{{ n is divisibleby 7 }}{{ n is equalto 7 }}{{ 2 is in l }}",
      "TrueFalseTrueTrueTrue");
    R("{{ s.startswith('Hell') }} {{ s.endswith(('x', 'ld')) }} {{ s.split() }} {{ "
      "'a,b,,c'.split(',') }} "
      "{{ 'a b c'.split(' ', 1) }} {{ '  a  b '.split(none, 1) }}",
      "True True ['Hello', 'World'] ['a', 'b', '', 'c'] ['a', 'b c'] ['a', 'b ']");
    R("[{{ '\\n x \\n'.strip() }}] [{{ '\\n x \\n'.strip('\\n') }}] [{{ 'xxaxx'.lstrip('x') }}] "
      "[{{ 'xxaxx'.rstrip('x') }}] [{{ '\xe3\x80\x80"
      "a'.strip() }}]",
      "[x] [ x ] [axx] [xxa] [a]");
    R("{{ s.upper() }} {{ s.lower() }} {{ \"they're bill's\".title() }} {{ 'aBC'.capitalize() }} "
      "{{ s.replace('l', 'L', 2) }} {{ '\xc3\xa9'.upper() }}",
      "HELLO WORLD hello world They'Re Bill'S Abc HeLLo World \xc3\x89");
    R("{{ d.get('b') }} {{ d.get('q') }} {{ d.get('q', 1) }} {{ d.keys() | list }} {{ d.values() | "
      "length }}",
      "2 None 1 ['b', 'a', 'c'] 3");
    R("{% for i in l %}{{ loop.cycle('a', 'b') }}{% endfor %}", "aba");
    R("{{ dict(a=1) }} {{ range(3) | list }} {{ range(5, 0, -2) | list }}",
      "{'a': 1} [0, 1, 2] [5, 3, 1]");
}

static void test_errors(void) {
    E("{{ s | wordwrap }}", "t:1:8: unsupported filter 'wordwrap'");
    E("a\n{% if n %}x{% else %}",
      "t:2:22: unexpected end of template: expected 'endif' to close the 'if' at 2:1");
    E("{% for x in l %}\n {% endif %}", "t:2:5: unexpected 'endif' inside 'for'");
    E("{{ n + }}", "t:1:8: expected an expression but found '}}'");
    E("{% set x = 1 x %}", "t:1:14: expected '%}' but found 'x'");
    E("{% include 'a' %}", "t:1:4: unsupported tag 'include'");
    E("{% frobnicate %}", "t:1:4: unknown tag 'frobnicate'");
    E("{% break %}", "t:1:4: 'break' outside a for loop");
    E("{{ 'abc }}", "t:1:4: unterminated string");
    E("{# open", "t:1:1: unterminated comment: expected '#}'");
    E("{{ x is frob }}", "t:1:9: unsupported test 'frob'");
    E("\n  {{ raise_exception('bad ' ~ n) }}", "t:2:21: raise_exception: bad 7");
    E("{{ s.format(1) }}", "t:1:12: unsupported method str.format()");
    E("{{ s.nosuch() }}", "t:1:12: unsupported or unknown method 'nosuch' (undefined)");
    E("{{ nosuch() }}", "t:1:10: 'nosuch' is undefined");
    E("{{ missing.attr }}", "t:1:12: 'missing' is undefined");
    E("{{ 'a' + 1 }}", "t:1:8: unsupported operand type(s) for +: 'str' and 'int'");
    E("{{ n < 'a' }}", "t:1:8: '<' not supported between instances of 'int' and 'str'");
    E("{{ 1 // 0 }}", "t:1:6: integer division or modulo by zero");
    E("{% set d.x = 1 %}", "t:1:1: cannot assign attribute on non-namespace object 'd'");
    E("{% for a, b in l %}{% endfor %}", "t:1:1: 'int' object is not iterable");
    E("{% for x in z %}{% endfor %}", "t:1:13: 'NoneType' object is not iterable");
    E("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}",
      "t:1:35: macro 'm' takes not more than 1 argument(s)");
    E("{{ l[::0] }}", "t:1:5: slice step cannot be zero");
    E("{{ 9223372036854775807 + 1 }}", "t:1:24: integer overflow in '+' (beyond 64 bits)");
    E("{{ s | tojson(sort_keys=true) }}",
      "t:1:8: tojson: sort_keys and ensure_ascii are not supported");
}

static void test_limits(void) {
    ct_error err;
    jinja_template *t;
    char *out = NULL;
    size_t n;
    const char *deep = "{% macro r(k) %}{{ r(k + 1) }}{% endmacro %}{{ r(0) }}";
    CHECK(jinja_parse(&t, deep, strlen(deep), "t", &err) == 0, "%s", err.msg);
    CHECK(jinja_render(t, NULL, &out, &n, &err) != 0 && strstr(err.msg, "nested deeper than 200"),
          "recursion: %s", err.msg);
    jinja_free(t);
    const char *big = "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}";
    CHECK(jinja_parse(&t, big, strlen(big), "t", &err) == 0, "%s", err.msg);
    jinja_set_limits(t, &(jinja_limits){.max_output = 1 << 20});
    CHECK(jinja_render(t, NULL, &out, &n, &err) != 0 && strstr(err.msg, "output passed 1 MiB"),
          "output: %s", err.msg);
    jinja_set_limits(t, &(jinja_limits){.max_steps = 1000, .max_output = (size_t)1 << 30});
    CHECK(jinja_render(t, NULL, &out, &n, &err) != 0 && strstr(err.msg, "more than 1000 loop"),
          "steps: %s", err.msg);
    jinja_free(t);
    // An expression nested beyond the parser's depth is an error, not a stack overflow.
    char nest[2100];
    memset(nest, '(', 1000);
    strcpy(nest + 1000, "1");
    memset(nest + 1001, ')', 1000);
    nest[2001] = 0;
    char tpl[2200];
    snprintf(tpl, sizeof tpl, "{{ %s }}", nest);
    CHECK(jinja_parse(&t, tpl, strlen(tpl), "t", &err) != 0 && strstr(err.msg, "nested deeper"),
          "nesting: %s", err.msg);
    // Text only, and an empty template.
    CHECK(jinja_parse(&t, "", 0, "t", &err) == 0 && jinja_render(t, NULL, &out, &n, &err) == 0 &&
              n == 0 && out && !out[0],
          "empty: %s", err.msg);
    free(out);
    jinja_free(t);
}

int main(void) {
    test_output_and_values();
    test_whitespace();
    test_statements();
    test_access_and_slices();
    test_filters();
    test_tests_and_methods();
    test_errors();
    test_limits();
    return check_summary();
}
