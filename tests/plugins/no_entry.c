// A valid shared library that exports a function but no ctitan_plugin_init: loading it as a
// plugin must fail with a message naming the missing entry point.
__attribute__((visibility("default"))) int not_a_ctitan_plugin(int x) {
    return x + 1;
}
