#!/usr/bin/env bash
# The plugin ABI header include/ctitan/plugin.h is usable from C99, C11, C++11 and C++17 with
# -pedantic -Wall -Wextra -Werror, and a plugin written in C++ exports ctitan_plugin_init
# unmangled (extern "C") even when built with -fvisibility=hidden.
set -u
: "${CTITAN_SOURCE_DIR:?run through ctest}" "${CTITAN_TMP:?}"
tmp=$CTITAN_TMP; rm -rf "$tmp"; mkdir -p "$tmp"
inc=$CTITAN_SOURCE_DIR/include
source "$(dirname "$0")/checks.bash" # ok, bad, finish
# Compiler output is cut to its first 2000 characters: the first error is the one that matters.
bad() { failed=$((failed + 1)); local m="$*"; echo "FAIL: ${m:0:2000}" >&2; }

if ! command -v c++ >/dev/null 2>&1; then
  echo "FAIL: no c++ compiler on PATH: cannot prove plugin.h compiles as C++ (install g++," \
       "e.g. apt-get install build-essential)" >&2
  exit 1
fi
cc=cc; command -v cc >/dev/null 2>&1 || cc=gcc

# One source, valid as C and as C++: a plugin registering a rope_hf override and its counters.
src=$tmp/plugin_check.c
cat >"$src" <<'SRC'
#include <ctitan/plugin.h>

static uint64_t calls[2];

static void fwd(float *out, const float *inp, const float *cos, const float *sin, int B, int T,
                int H, int D) {
    ctitan_rope_hf_forward_fn self = fwd; /* the kernel has exactly the op's type */
    (void)self, (void)out, (void)inp, (void)cos, (void)sin, (void)B, (void)T, (void)H, (void)D;
    calls[0]++;
}

static void bwd(float *dinp, const float *dout, const float *cos, const float *sin, int B,
                int T, int H, int D) {
    ctitan_rope_hf_backward_fn self = bwd;
    (void)self, (void)dinp, (void)dout, (void)cos, (void)sin, (void)B, (void)T, (void)H, (void)D;
    calls[1]++;
}

CTITAN_PLUGIN_EXPORT int ctitan_plugin_init(uint32_t api_version, ctitan_registry *reg) {
    if (api_version != CTITAN_PLUGIN_API_VERSION) {
        ctitan_plugin_error(reg, "built against another plugin ABI");
        return 1;
    }
    if (ctitan_register_op(reg, "rope_hf", (ctitan_fn)fwd, (ctitan_fn)bwd, 0)) return 1;
    return ctitan_register_counters(reg, "rope_hf", &calls[0], &calls[1]) ? 1 : 0;
}
SRC
cp "$src" "$tmp/plugin_check.cpp"

for std in c99 c11; do
  out=$($cc -std=$std -pedantic -Wall -Wextra -Werror -fsyntax-only -I"$inc" "$src" 2>&1) && ok ||
    bad "plugin.h does not compile as $std: $out"
done
for std in c++11 c++17; do
  out=$(c++ -std=$std -pedantic -Wall -Wextra -Werror -fsyntax-only -I"$inc" \
          "$tmp/plugin_check.cpp" 2>&1) && ok || bad "plugin.h does not compile as $std: $out"
done

# Built for real as C++: the entry point must be exported under its C name.
so=$tmp/libplugin_check.so
if out=$(c++ -std=c++11 -pedantic -Wall -Wextra -Werror -fvisibility=hidden -shared -fPIC \
           -I"$inc" -o "$so" "$tmp/plugin_check.cpp" 2>&1); then
  syms=$(nm -D --defined-only "$so" 2>&1)
  grep -qE '^[0-9a-f]+ T ctitan_plugin_init$' <<<"$syms" && ok ||
    bad "the C++ plugin does not export ctitan_plugin_init unmangled; nm -D says: $syms"
  # -fvisibility=hidden: nothing but the entry point is exported by the plugin's own code.
  grep -qE ' T .*(fwd|bwd)' <<<"$syms" && bad "the C++ plugin exports its kernels: $syms" || ok
else
  bad "c++ -shared could not build the plugin: $out"
fi

finish || exit 1
echo "plugin_header: plugin.h compiles as c99, c11, c++11, c++17; entry point exported unmangled"
