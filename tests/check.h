// Minimal test helpers: CHECK records a failure and goes on; check_summary() prints
// "N passed, N failed" and returns the exit code, which is 1 too when no CHECK ran.
#pragma once
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "io/json.h"

static int check_passed, check_failed;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (cond) {                                                                                \
            check_passed++;                                                                        \
        } else {                                                                                   \
            check_failed++;                                                                        \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                        \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
    } while (0)

// An environment variable set by tests/CMakeLists.txt (CTITAN_REF_DIR, CTITAN_TMP, ...).
static inline const char *check_env(const char *name) {
    const char *v = getenv(name);
    if (!v || !*v) {
        fprintf(stderr, "environment variable %s is not set (run through ctest)\n", name);
        exit(2);
    }
    return v;
}

// Decodes a lower-case hex string into a malloc'd, NUL-terminated buffer of *len bytes (the
// node references write texts as hex: a C JSON reader stops strings at NUL).
static inline char *check_unhex(const char *h, size_t *len) {
    size_t n = strlen(h) / 2;
    char *out = malloc(n + 1);
    for (size_t i = 0; i < n; i++) {
        int hi = h[2 * i] <= '9' ? h[2 * i] - '0' : h[2 * i] - 'a' + 10;
        int lo = h[2 * i + 1] <= '9' ? h[2 * i + 1] - '0' : h[2 * i + 1] - 'a' + 10;
        out[i] = (char)(hi << 4 | lo);
    }
    out[n] = 0;
    *len = n;
    return out;
}

static inline int check_summary(void) {
    printf("%d passed, %d failed\n", check_passed, check_failed);
    if (check_passed + check_failed == 0) {
        fprintf(stderr, "FAIL: no check ran\n"); // the test has shown nothing
        return 1;
    }
    return check_failed ? 1 : 0;
}

// Relative L2 error ||a-b|| / max(||b||, tiny).
static inline double check_rel_l2(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * (double)b[i];
    }
    return sqrt(num) / (den > 1e-30 ? sqrt(den) : 1e-15);
}

// A buffer of n floats followed by a guard band that must come back untouched: a kernel given
// the size it asked for wrote nothing past it.
#define CHECK_GUARD 64
#define CHECK_GUARD_VALUE -12345.5f

static inline float *check_guarded(size_t n) {
    float *p = malloc((n + CHECK_GUARD) * sizeof *p);
    for (size_t i = 0; i < n + CHECK_GUARD; i++) p[i] = CHECK_GUARD_VALUE;
    return p;
}

static inline int check_guard_ok(const float *p, size_t n) {
    for (size_t i = n; i < n + CHECK_GUARD; i++)
        if (p[i] != CHECK_GUARD_VALUE) return 0;
    return 1;
}

static inline double check_max_abs(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d > m || isnan(d)) m = isnan(d) ? INFINITY : d;
    }
    return m;
}

// Whole-file byte equality (files up to 256 MiB).
static inline bool check_files_equal(const char *a, const char *b) {
    char *x = NULL, *y = NULL;
    size_t nx = 0, ny = 0;
    ct_error err = {{0}};
    bool same = file_read_all(&x, &nx, a, 1u << 28, &err) == 0 &&
                file_read_all(&y, &ny, b, 1u << 28, &err) == 0 && nx == ny && memcmp(x, y, nx) == 0;
    free(x);
    free(y);
    return same;
}

// v as it reads back after storing it as dt (F32, BF16 or F16).
static inline float check_round_as(float v, ct_dtype dt) {
    if (dt == CT_BF16) return bf16_to_f32(f32_to_bf16(v));
    if (dt == CT_F16) return f16_to_f32(f32_to_f16(v));
    return v;
}
