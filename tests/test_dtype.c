// bf16/f16 <-> fp32 conversion: hand-checked values, every f16 and bf16 value and every midpoint
// between neighbours (round to nearest, ties to even), and random bit patterns against numpy
// (float16) and torch (bfloat16).
#include <float.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/dtype.h"

static float bits_f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint32_t f_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static void test_names(void) {
    const char *names[] = {"F32", "F16", "BF16", "F64", "I64", "I32", "I16",
                           "I8",  "U64", "U32",  "U16", "U8",  "BOOL"};
    const size_t sizes[] = {4, 2, 2, 8, 8, 4, 2, 1, 8, 4, 2, 1, 1};
    for (int t = 0; t < CT_DTYPE_COUNT; t++) {
        ct_dtype got;
        CHECK(strcmp(dtype_name((ct_dtype)t), names[t]) == 0, "name of %d: %s", t, dtype_name(t));
        CHECK(dtype_size((ct_dtype)t) == sizes[t], "size of %s", names[t]);
        CHECK(dtype_from_name(&got, names[t]) == 0 && got == (ct_dtype)t, "parse %s", names[t]);
    }
    ct_dtype got;
    CHECK(dtype_from_name(&got, "f32") == -1, "dtype names are case-sensitive");
    CHECK(dtype_from_name(&got, "F8_E4M3") == -1, "unknown dtype");
}

static void test_bf16_hand(void) {
    struct {
        uint32_t in;
        uint16_t out;
    } cases[] = {
        {0x3f800000, 0x3f80}, // 1.0
        {0xbf800000, 0xbf80}, // -1.0
        {0x3f808000, 0x3f80}, // 1 + 2^-8: tie, down to even
        {0x3f818000, 0x3f82}, // 1 + 3*2^-8: tie, up to even
        {0x3f808001, 0x3f81}, // just above the tie
        {0x3f807fff, 0x3f80}, // just below the tie
        {0x7f800000, 0x7f80}, // inf
        {0xff800000, 0xff80}, // -inf
        {0x7f7fffff, 0x7f80}, // FLT_MAX rounds up to inf
        {0x7f7f7fff, 0x7f7f}, // largest value that stays finite
        {0x00000001, 0x0000}, // smallest subnormal rounds to zero
        {0x00008000, 0x0000}, // subnormal tie, to even (zero)
        {0x00018000, 0x0002}, // subnormal tie, to even
        {0x80000000, 0x8000}, // -0
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint16_t got = f32_to_bf16(bits_f(cases[i].in));
        CHECK(got == cases[i].out, "bf16(0x%08x) = 0x%04x, expected 0x%04x", cases[i].in, got,
              cases[i].out);
    }
    // A NaN whose payload is only in the low 16 bits must not truncate to inf.
    uint32_t nans[] = {0x7fc00000, 0x7f800001, 0xff800001, 0x7fffffff};
    for (size_t i = 0; i < 4; i++) {
        uint16_t h = f32_to_bf16(bits_f(nans[i]));
        CHECK(isnan(bf16_to_f32(h)), "bf16(NaN 0x%08x) = 0x%04x is not NaN", nans[i], h);
        CHECK((h & 0x8000) == ((nans[i] >> 16) & 0x8000), "NaN sign kept");
    }
}

static void test_f16_hand(void) {
    struct {
        float in;
        uint16_t out;
    } cases[] = {
        {1.0f, 0x3c00},
        {-2.0f, 0xc000},
        {65504.0f, 0x7bff},
        {65519.996f, 0x7bff},
        {65520.0f, 0x7c00}, // halfway to 65536: ties to even -> inf
        {1e6f, 0x7c00},
        {-1e6f, 0xfc00},
        {INFINITY, 0x7c00},
        {0x1p-24f, 0x0001},        // smallest subnormal
        {0x1p-25f, 0x0000},        // tie between 0 and 2^-24: to even (0)
        {0x1.000002p-25f, 0x0001}, // just above that tie
        {0x1.8p-24f, 0x0002},      // tie between 1 and 2 ulps: to even
        {0x1p-14f, 0x0400},        // smallest normal
        {0x1.ff8p-15f, 0x03ff},    // largest subnormal
        {0x1.ffcp-15f, 0x0400},    // tie between largest subnormal and smallest normal
        {1.0f + 0x1p-11f, 0x3c00}, // tie, down to even
        {1.0f + 0x3p-11f, 0x3c02}, // tie, up to even
        {0.1f, 0x2e66},
        {-0.0f, 0x8000},
        {1e-10f, 0x0000},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint16_t got = f32_to_f16(cases[i].in);
        CHECK(got == cases[i].out, "f16(%a) = 0x%04x, expected 0x%04x", (double)cases[i].in, got,
              cases[i].out);
    }
    CHECK(f16_to_f32(0x7bff) == 65504.0f && f16_to_f32(0x0001) == 0x1p-24f &&
              f16_to_f32(0xfc00) == -INFINITY && f16_to_f32(0x3555) == 0x1.554p-2f,
          "f16 decode");
    uint16_t h = f32_to_f16(NAN);
    CHECK(isnan(f16_to_f32(h)), "f16(NaN) = 0x%04x is not NaN", h);
    h = f32_to_f16(bits_f(0x7f800001)); // payload below f16's mantissa
    CHECK(isnan(f16_to_f32(h)), "f16(NaN 0x7f800001) = 0x%04x is not NaN", h);
}

// Every 16-bit value decodes and re-encodes to itself; every midpoint between neighbours rounds
// to the even one, and the floats just beside it round to the nearer one.
static void test_exhaustive(const char *what, float (*dec)(uint16_t), uint16_t (*enc)(float),
                            uint16_t max_finite, uint16_t inf) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        uint16_t mag = h & 0x7fff;
        float f = dec((uint16_t)h);
        if (mag > inf) {
            bad += !isnan(f) || !isnan(dec(enc(f)));
        } else {
            bad += enc(f) != h;
        }
    }
    CHECK(bad == 0, "%s: %d values do not round-trip", what, bad);
    bad = 0;
    for (uint32_t h = 0; h <= max_finite; h++) {
        for (int neg = 0; neg < 2; neg++) {
            uint16_t sign = neg ? 0x8000 : 0;
            double lo = dec((uint16_t)h), hi = h < max_finite ? dec((uint16_t)(h + 1)) : 0;
            if (h == max_finite) // the next value if the exponent range went on
                hi = lo + (lo - (double)dec((uint16_t)(h - 1)));
            float mid = (float)((lo + hi) / 2); // exact: one more bit than the 16-bit type
            if (neg) mid = -mid;
            uint16_t lower = (uint16_t)(h | sign), upper = (uint16_t)((h + 1) | sign);
            uint16_t even = (h & 1) ? upper : lower;
            float below = nextafterf(mid, 0.0f),
                  above = nextafterf(mid, neg ? -INFINITY : INFINITY);
            bad += enc(mid) != even;
            bad += enc(below) != lower;
            bad += enc(above) != upper;
            if (bad && bad < 4 && enc(mid) != even)
                fprintf(stderr, "%s: midpoint %a after 0x%04x -> 0x%04x\n", what, (double)mid,
                        lower, enc(mid));
        }
    }
    CHECK(bad == 0, "%s: %d midpoint roundings wrong", what, bad);
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rng_next(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

// Random fp32 bit patterns (biased towards f16's range) converted by numpy and torch.
static void test_against_python(void) {
    const char *tmp = check_env("CTITAN_TMP"), *py = check_env("CTITAN_PYTHON");
    enum { N = 200000 };
    uint32_t *in = malloc(N * 4);
    uint16_t *ref = malloc(N * 2 * 2);
    for (int i = 0; i < N; i++) {
        uint32_t u = rng_next();
        if (i % 2) u = (u & 0x80000000u) | ((0x30000000u + (u & 0x0fffffffu)) & 0x7fffffffu);
        in[i] = u;
    }
    in[0] = 0x477ff000; // 65520
    in[1] = 0x7f7fffff;
    char inp[512], outp[512], cmd[2048];
    snprintf(inp, sizeof inp, "%s/dtype_in.bin", tmp);
    snprintf(outp, sizeof outp, "%s/dtype_out.bin", tmp);
    FILE *fp = fopen(inp, "wb");
    CHECK(fp && fwrite(in, 4, N, fp) == N, "write %s", inp);
    if (fp) fclose(fp);
    snprintf(
        cmd, sizeof cmd,
        "%s -c \"import numpy as np, torch, warnings; warnings.simplefilter('ignore');"
        "a = np.fromfile('%s', dtype='<f4');"
        "h = a.astype(np.float16).view('<u2');"
        "b = torch.from_numpy(a.copy()).to(torch.bfloat16).view(torch.int16).numpy().view('<u2');"
        "np.concatenate([h, b]).astype('<u2').tofile('%s')\"",
        py, inp, outp);
    int rc = system(cmd);
    CHECK(rc == 0, "python conversion failed: %s", cmd);
    fp = fopen(outp, "rb");
    size_t got = fp ? fread(ref, 2, 2 * N, fp) : 0;
    if (fp) fclose(fp);
    CHECK(got == 2 * N, "read %zu of %d reference values", got, 2 * N);
    int bad16 = 0, badbf = 0;
    for (int i = 0; i < N && got == 2 * N; i++) {
        float f = bits_f(in[i]);
        uint16_t h = f32_to_f16(f), b = f32_to_bf16(f);
        if (isnan(f)) { // payloads differ between implementations; NaN-ness must not
            bad16 += !isnan(f16_to_f32(h));
            badbf += !isnan(bf16_to_f32(b));
            continue;
        }
        if (h != ref[i] && bad16++ < 5)
            fprintf(stderr, "f16(0x%08x): ours 0x%04x numpy 0x%04x\n", in[i], h, ref[i]);
        if (b != ref[N + i] && badbf++ < 5)
            fprintf(stderr, "bf16(0x%08x): ours 0x%04x torch 0x%04x\n", in[i], b, ref[N + i]);
    }
    CHECK(bad16 == 0, "%d of %d f16 conversions differ from numpy", bad16, N);
    CHECK(badbf == 0, "%d of %d bf16 conversions differ from torch", badbf, N);
    free(in);
    free(ref);
}

static void test_bulk(void) {
    float src[6] = {1.0f, -0.5f, 3.140625f, 65504.0f, 1e-3f, -7.0f};
    uint16_t h[6];
    float back[6];
    double d[6];
    CHECK(dtype_from_f32(h, src, CT_BF16, 6) == 0, "to bf16");
    CHECK(dtype_to_f32(back, h, CT_BF16, 6) == 0, "from bf16");
    for (int i = 0; i < 6; i++)
        CHECK(back[i] == bf16_to_f32(f32_to_bf16(src[i])), "bf16 bulk %d", i);
    CHECK(dtype_from_f32(h, src, CT_F16, 6) == 0, "to f16");
    CHECK(dtype_to_f32(back, h, CT_F16, 6) == 0, "from f16");
    for (int i = 0; i < 6; i++) CHECK(back[i] == f16_to_f32(f32_to_f16(src[i])), "f16 bulk %d", i);
    for (int i = 0; i < 6; i++) d[i] = src[i];
    CHECK(dtype_to_f32(back, d, CT_F64, 6) == 0 && memcmp(back, src, sizeof src) == 0, "f64");
    CHECK(dtype_from_f32(back, src, CT_F32, 6) == 0 && memcmp(back, src, sizeof src) == 0, "f32");
    CHECK(dtype_to_f32(back, d, CT_I32, 1) == -1, "I32 is not a float type");
    CHECK(dtype_from_f32(d, src, CT_F64, 1) == -1, "no F64 output");
    CHECK(f_bits(bf16_to_f32(0x3f80)) == 0x3f800000, "bf16 decode is a shift");
}

int main(void) {
    test_names();
    test_bf16_hand();
    test_f16_hand();
    test_exhaustive("f16", f16_to_f32, f32_to_f16, 0x7bff, 0x7c00);
    test_exhaustive("bf16", bf16_to_f32, f32_to_bf16, 0x7f7f, 0x7f80);
    test_bulk();
    test_against_python();
    return check_summary();
}
