// bf16 linear layers through oneDNN (training.mixed_precision_param = "bfloat16"): the input
// in bf16, the weight's bf16 copy, fp32 accumulation and an fp32 (or bf16) result, as torch's CPU
// autocast runs nn.Linear through oneDNN. The three products of matmul.c:
//   forward  out  = inp @ W^T
//   backward dinp = dout @ W,  dW += dout^T @ inp (oneDNN's sum post-op: accumulated in fp32)
// Each shape's primitives are created once, by matmul_bf16_scratch_floats when the model plans
// its buffers, and kept in the kernel state of the table's backend (cpu_kernels.h); the kernels
// then run them with user-provided scratch (bf16 copies of inputs the caller did not give in bf16,
// and oneDNN's scratchpad), so nothing is allocated inside a step. oneDNN runs on the same OpenMP
// threads as the rest. Where oneDNN has no bf16 matmul, the same products run emulated on sgemm
// (matmul_bf16_emulated.c).
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/grow.h"
#include "ops/bf16_round.h"
#include "ops/vec_math.h"
#include "ops/matmul_bf16_internal.h"
#include "ops/onednn.h"
#include "ops/ops_cpu.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#define ROW_DPBF16 1
#endif

typedef enum { MM_FORWARD, MM_FORWARD_BF16_OUT, MM_DINP, MM_DWEIGHT, MM_KINDS } mm_kind;

typedef struct mm_prim {
    dnnl_primitive_t prim;
    dnnl_memory_t src, weights, dst, pad; // data handles set per call
    size_t pad_bytes;
} mm_prim;

typedef struct mm_shape {
    int N, C, OC;
    mm_prim kind[MM_KINDS];
} mm_shape;

// The shapes prepared so far are a kernel state's list that grows (cpu_kernels.mm_shapes): each
// shape's primitives are made once per state.

#define md2 onednn_md2

// One primitive: src (M,K) @ weights (K,Nn) -> dst (M,Nn), dst += when `accumulate`.
static int make_prim(cpu_kernels *k, mm_prim *p, dnnl_memory_desc_t src, dnnl_memory_desc_t weights,
                     dnnl_memory_desc_t dst, bool accumulate) {
    dnnl_memory_desc_t pad;
    const dnnl_engine_t engine = onednn_engine(k);
    int ok = onednn_matmul_create(k, &p->prim, &pad, &src, &weights, &dst, accumulate) == 0;
    p->pad_bytes = ok ? dnnl_memory_desc_get_size(&pad) : 0;
    ok = ok && dnnl_memory_create(&p->src, &src, engine, DNNL_MEMORY_NONE) == dnnl_success &&
         dnnl_memory_create(&p->weights, &weights, engine, DNNL_MEMORY_NONE) == dnnl_success &&
         dnnl_memory_create(&p->dst, &dst, engine, DNNL_MEMORY_NONE) == dnnl_success &&
         (!p->pad_bytes ||
          dnnl_memory_create(&p->pad, &pad, engine, DNNL_MEMORY_NONE) == dnnl_success);
    return ok ? 0 : -1;
}

static mm_shape *find_shape(cpu_kernels *k, int N, int C, int OC) {
    for (size_t i = 0; k && i < k->n_mm_shapes; i++) {
        mm_shape *s = &k->mm_shapes[i];
        if (s->N == N && s->C == C && s->OC == OC) return s;
    }
    return NULL;
}

// How a kernel state runs its bf16 GEMMs (cpu_kernels.mm_mode), decided once, before any shape,
// by the same question whatever the model's shapes are: oneDNN, unless CTITAN_BF16_GEMM=emulated
// asks for the emulation or oneDNN cannot make a 16 x 16 x 16 product's primitives (no bf16
// matmul on this CPU). A model shape oneDNN then refuses cannot be run (SIZE_MAX scratch), rather
// than switching the mode behind the shapes prepared before it.
enum { MODE_UNSET, MODE_ONEDNN, MODE_EMULATED };

static bool make_shape(cpu_kernels *k, mm_shape *s, int N, int C, int OC);
static mm_shape *prepare(cpu_kernels *k, int N, int C, int OC);

static void decide_mode(cpu_kernels *k) {
    if (k->mm_mode != MODE_UNSET) return;
    const char *env = getenv("CTITAN_BF16_GEMM");
    k->mm_mode = env && strcmp(env, "emulated") == 0 ? MODE_EMULATED : MODE_ONEDNN;
    if (k->mm_mode == MODE_ONEDNN && !prepare(k, 16, 16, 16)) k->mm_mode = MODE_EMULATED;
}

bool matmul_bf16_emulated(cpu_kernels *k) {
    decide_mode(k);
    return k->mm_mode == MODE_EMULATED;
}

bool cpu_matmul_bf16_emulated(const ct_ops *ops) {
    cpu_kernels own, *k = cpu_kernels_or_own(ops, &own);
    const bool emulated = matmul_bf16_emulated(k);
    if (k == &own) cpu_kernels_free(&own);
    return emulated;
}

static void free_shape(mm_shape *s) {
    for (int i = 0; i < MM_KINDS; i++) {
        mm_prim *p = &s->kind[i];
        if (p->prim) dnnl_primitive_destroy(p->prim);
        dnnl_memory_t mem[4] = {p->src, p->weights, p->dst, p->pad};
        for (int m = 0; m < 4; m++)
            if (mem[m]) dnnl_memory_destroy(mem[m]);
    }
    *s = (mm_shape){0};
}

void matmul_bf16_free(cpu_kernels *k) {
    for (size_t i = 0; i < k->n_mm_shapes; i++) free_shape(&k->mm_shapes[i]);
    free(k->mm_shapes);
    k->mm_shapes = NULL, k->n_mm_shapes = k->cap_mm_shapes = 0;
    k->mm_mode = MODE_UNSET;
}

// The shape's entry, made (its primitives under oneDNN) when new; NULL when it cannot be run.
static mm_shape *prepare(cpu_kernels *k, int N, int C, int OC) {
    if (k->mm_mode == MODE_UNSET) decide_mode(k);
    mm_shape *s = find_shape(k, N, C, OC);
    if (s) return s;
    if (grow_to((void **)&k->mm_shapes, &k->cap_mm_shapes, k->n_mm_shapes + 1,
                sizeof *k->mm_shapes) != 0)
        return NULL;
    s = &k->mm_shapes[k->n_mm_shapes];
    *s = (mm_shape){.N = N, .C = C, .OC = OC};
    if (k->mm_mode == MODE_ONEDNN && !make_shape(k, s, N, C, OC)) {
        free_shape(s);
        return NULL;
    }
    k->n_mm_shapes++;
    return s;
}

// The shape's oneDNN primitives; false when oneDNN cannot make them.
static bool make_shape(cpu_kernels *k, mm_shape *s, int N, int C, int OC) {
    if (!onednn_engine(k)) return false;
    const dnnl_data_type_t b16 = dnnl_bf16, f32 = dnnl_f32;
    // forward: inp (N,C) @ W^T, W (OC,C) read as (C,OC) with strides (1,C)
    if (make_prim(k, &s->kind[MM_FORWARD], md2(N, C, C, 1, b16), md2(C, OC, 1, C, b16),
                  md2(N, OC, OC, 1, f32), false) ||
        make_prim(k, &s->kind[MM_FORWARD_BF16_OUT], md2(N, C, C, 1, b16), md2(C, OC, 1, C, b16),
                  md2(N, OC, OC, 1, b16), false) ||
        // dinp: dout (N,OC) @ W (OC,C)
        make_prim(k, &s->kind[MM_DINP], md2(N, OC, OC, 1, b16), md2(OC, C, C, 1, b16),
                  md2(N, C, C, 1, f32), false) ||
        // dW += dout^T (OC,N) @ inp (N,C)
        make_prim(k, &s->kind[MM_DWEIGHT], md2(OC, N, 1, OC, b16), md2(N, C, C, 1, b16),
                  md2(OC, C, C, 1, f32), true))
        return false;
    return true;
}

// Scratch layout, in order: the input rounded to bf16 (N*C) unless the caller gives it (inp16),
// dout rounded (N*OC) unless given (dout16; the backward only), then oneDNN's scratchpad; each
// 64-byte aligned. Sized for the worst case, or for oneDNN's scratchpad alone when `staged`.
static size_t align64(size_t bytes) {
    return (bytes + 63) / 64 * 64;
}

typedef struct mm_scratch {
    uint16_t *inp, *dout;
    void *pad;
} mm_scratch;

static mm_scratch scratch_parts(float *scratch, int N, int C, int OC, bool need_inp,
                                bool need_dout) {
    char *p = (char *)(((uintptr_t)scratch + 63) / 64 * 64);
    mm_scratch s = {NULL, NULL, NULL};
    if (need_inp) s.inp = (uint16_t *)p, p += align64((size_t)N * C * 2);
    if (need_dout) s.dout = (uint16_t *)p, p += align64((size_t)N * OC * 2);
    s.pad = p;
    return s;
}

static size_t scratch_floats(cpu_kernels *k, int N, int C, int OC, bool staged) {
    const mm_shape *s = prepare(k, N, C, OC);
    if (!s) return SIZE_MAX;
    if (k->mm_mode == MODE_EMULATED) return mm_emulated_scratch_floats(N, C, OC);
    size_t pad = 0;
    for (int k = 0; k < MM_KINDS; k++)
        if (s->kind[k].pad_bytes > pad) pad = s->kind[k].pad_bytes;
    const size_t copies = staged ? 0 : align64((size_t)N * C * 2) + align64((size_t)N * OC * 2);
    return (copies + align64(pad) + 64) / sizeof(float);
}

size_t cpu_matmul_bf16_scratch_floats(const ct_ops *ops, int N, int C, int OC, bool staged) {
    cpu_kernels own, *k = cpu_kernels_or_own(ops, &own);
    const size_t n = scratch_floats(k, N, C, OC, staged);
    if (k == &own) cpu_kernels_free(&own);
    return n;
}

static void run(cpu_kernels *k, mm_prim *p, const void *src, const void *weights, void *dst,
                void *scratch) {
    dnnl_memory_set_data_handle(p->src, (void *)src);
    dnnl_memory_set_data_handle(p->weights, (void *)weights);
    dnnl_memory_set_data_handle(p->dst, dst);
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, p->src},
                               {DNNL_ARG_WEIGHTS, p->weights},
                               {DNNL_ARG_DST, p->dst},
                               {DNNL_ARG_SCRATCHPAD, p->pad}};
    if (p->pad) dnnl_memory_set_data_handle(p->pad, scratch);
    dnnl_primitive_execute(p->prim, k->stream, p->pad ? 4 : 3, args);
    dnnl_stream_wait(k->stream);
}

// The shape's primitives: prepared in the table's kernel state when the model planned its
// buffers.
static mm_shape *planned(cpu_kernels *k, int N, int C, int OC) {
    mm_shape *s = find_shape(k, N, C, OC);
    if (!s) {
        fprintf(stderr, "ctitan: internal error: bf16 matmul %d x %d x %d was not planned%s\n", N,
                C, OC, k ? "" : " (the op table is bound to no backend)");
        abort();
    }
    return s;
}

// out (N,OC) += bias, the bias rounded to bf16 first: autocast casts a linear's bias to bf16 and
// adds it to the fp32 sum before the output's one rounding.
static void add_bias_bf16(float *out, const float *bias, int N, int OC) {
#pragma omp parallel for schedule(static) if ((int64_t)N * OC >= CPU_PAR_MIN)
    for (int n = 0; n < N; n++) {
        float *row = out + (size_t)n * OC;
        for (int o = 0; o < OC; o++) row[o] += bf16_value(bf16_round(bias[o]));
    }
}

// One output of a one-row product: the bf16 weight row against the bf16 input, widened (exact),
// summed in fp32 in 16 lanes.
CPU_SIMD_CLONES
static float dot_bf16(const uint16_t *w, const uint16_t *x, int C) {
    float lane[16] = {0};
    int k = 0;
    for (; k + 16 <= C; k += 16)
        for (int j = 0; j < 16; j++) lane[j] += bf16_value(w[k + j]) * bf16_value(x[k + j]);
    float sum = 0;
    for (int j = 0; j < 16; j++) sum += lane[j];
    for (; k < C; k++) sum += bf16_value(w[k]) * bf16_value(x[k]);
    return sum;
}

// One output of the one-row product, its bias added and stored as the caller asked.
static inline void row_store(float *out, uint16_t *out16, const float *bias, int o, float v) {
    if (bias) v += bf16_value(bf16_round(bias[o]));
    if (out16)
        out16[o] = bf16_round(v);
    else
        out[o] = v;
}

#ifdef ROW_DPBF16
// One VDPBF16PS step: 32 bf16 pairs of w and x, each pair's two products added into one of acc's
// 16 fp32 lanes (products of bf16 values are exact in fp32; it rounds to nearest and flushes
// subnormals, as oneDNN's bf16 kernels on this CPU do). mask selects the elements read.
#define DPBF16_STEP(acc, w, x, mask)                                                               \
    acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_maskz_loadu_epi16(mask, w),                       \
                           (__m512bh)_mm512_maskz_loadu_epi16(mask, x))

// Rows [o0, o1) of the one-row product with AVX512-BF16, one row at a time: each row is one
// sequential read, with four independent accumulators over its 128-element strides (k, k + 32,
// k + 64, k + 96), so the adds never wait on each other. Reading four rows at once (four streams
// sharing each load of x, the earlier kernel) ran at 49 GB/s where a plain streaming sum of the
// same buffers ran at 61 (2 threads, 0.6B geometry's matrices; docs/performance.md); one stream
// a row reaches the streaming sum's rate. Lane j of accumulator i sums elements 128m + 32i + 2j
// and 128m + 32i + 2j + 1; the four are added (0 + 1) + (2 + 3), then across the lanes.
__attribute__((target("avx512f,avx512bw,avx512bf16"))) static void
rows_dpbf16(float *out, uint16_t *out16, const uint16_t *x, const uint16_t *w, const float *bias,
            int C, int o0, int o1) {
    const int quad = C / 128 * 128, full = C / 32 * 32;
    const __mmask32 all = ~(__mmask32)0, tail = (__mmask32)((1ull << (C - full)) - 1);
    for (int o = o0; o < o1; o++) {
        const uint16_t *wo = w + (size_t)o * C;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int k = 0; k < quad; k += 128) {
            DPBF16_STEP(a0, wo + k, x + k, all);
            DPBF16_STEP(a1, wo + k + 32, x + k + 32, all);
            DPBF16_STEP(a2, wo + k + 64, x + k + 64, all);
            DPBF16_STEP(a3, wo + k + 96, x + k + 96, all);
        }
        for (int k = quad; k < full; k += 32) DPBF16_STEP(a0, wo + k, x + k, all);
        if (tail) DPBF16_STEP(a1, wo + full, x + full, tail);
        row_store(
            out, out16, bias, o,
            _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3))));
    }
}
#undef DPBF16_STEP

// 16 bf16 pairs of w and x into lo and hi (AVX2, FMA): a bf16 value is the top half of its fp32,
// so unpacking with zeros widens 16 of them into two vectors, elements 0-3 and 8-11 in the first,
// 4-7 and 12-15 in the second; x unpacked the same way pairs each weight with its element.
__attribute__((target("avx2,fma"), always_inline)) static inline void
widened_fma(__m256 *lo, __m256 *hi, const uint16_t *w, const uint16_t *x) {
    const __m256i z = _mm256_setzero_si256(), wv = _mm256_loadu_si256((const __m256i *)w),
                  xv = _mm256_loadu_si256((const __m256i *)x);
    *lo = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_unpacklo_epi16(z, wv)),
                          _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, xv)), *lo);
    *hi = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_unpackhi_epi16(z, wv)),
                          _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, xv)), *hi);
}

// rows_dpbf16 for CPUs with AVX2 and FMA but not AVX512-BF16 (AMD before Zen 4, Intel before
// Cooper Lake): four accumulators a row over its 32-element strides, a 16-element step, then the
// last C % 16 elements one by one, added after the lanes. Two rows at a time, one from each half
// of the block, so each thread reads two streams: one stream a thread read 70-78% of a streaming
// sum's rate on a 2-core Zen 3, two 93-99% (docs/performance.md). A row's sums do not depend on
// its partner (an odd block's last row is its own partner). Each stream is prefetched ROW_AHEAD
// elements (1 KiB) on, into the next rows where a row ends: on a Zen 3 whose streaming sum ran
// 19-21% ahead of the products of a decode step's shapes, 6-8% less time (256 to 2048 elements
// ahead all helped; 512 the most).
enum { ROW_AHEAD = 512 };
__attribute__((target("avx2,fma"))) static void rows_fma_bf16(float *out, uint16_t *out16,
                                                              const uint16_t *x, const uint16_t *w,
                                                              const float *bias, int C, int o0,
                                                              int o1) {
    const int dual = C / 32 * 32, full = C / 16 * 16, half = (o1 - o0 + 1) / 2;
    for (int i = 0; i < half; i++) {
        const int o[2] = {o0 + i, o0 + half + i < o1 ? o0 + half + i : o0 + i};
        const uint16_t *wr[2] = {w + (size_t)o[0] * C, w + (size_t)o[1] * C};
        __m256 a[2][4];
        for (int r = 0; r < 2; r++)
            for (int q = 0; q < 4; q++) a[r][q] = _mm256_setzero_ps();
        for (int k = 0; k < dual; k += 32)
            for (int r = 0; r < 2; r++) {
                _mm_prefetch((const char *)((uintptr_t)(wr[r] + k) + 2 * ROW_AHEAD), _MM_HINT_T0);
                widened_fma(&a[r][0], &a[r][1], wr[r] + k, x + k);
                widened_fma(&a[r][2], &a[r][3], wr[r] + k + 16, x + k + 16);
            }
        for (int r = 0; r < 2; r++) {
            if (full > dual) widened_fma(&a[r][0], &a[r][1], wr[r] + dual, x + dual);
            float tail = 0;
            for (int k = full; k < C; k++) tail += bf16_value(wr[r][k]) * bf16_value(x[k]);
            const __m256 sum =
                _mm256_add_ps(_mm256_add_ps(a[r][0], a[r][1]), _mm256_add_ps(a[r][2], a[r][3]));
            row_store(out, out16, bias, o[r], hsum8(sum) + tail);
        }
    }
}

// rows_dpbf16 or rows_fma_bf16 over rows [o0, o1) for cpu_rows_shared.
typedef struct {
    float *out;
    uint16_t *out16;
    const uint16_t *x, *w;
    const float *bias;
    int C;
    bool dp;
} bf16_rows;

static void bf16_rows_run(void *ctx, int o0, int o1) {
    const bf16_rows *a = ctx;
    if (a->dp)
        rows_dpbf16(a->out, a->out16, a->x, a->w, a->bias, a->C, o0, o1);
    else
        rows_fma_bf16(a->out, a->out16, a->x, a->w, a->bias, a->C, o0, o1);
}
#endif

// N == 1 (generation's decode): oneDNN's matmul took 83% of a bf16 decode step there, more than
// reading the weights costs. Each output is a dot product over its weight row, read once in
// place, the rows shared out over the threads by cpu_rows_shared; the same products and fp32
// sums as the GEMM, in another order. With AVX512-BF16 (rows_dpbf16) the weight streams at the
// memory's rate; dot_bf16 (widen, multiply, add: 15 instructions per 16 elements) could not
// keep up with it, and on AVX2 read 18 GB/s where rows_fma_bf16 reads 22-31
// (docs/performance.md).
static void row_forward(float *out, uint16_t *out16, const uint16_t *x, const uint16_t *weight,
                        const float *bias, int C, int OC) {
#ifdef ROW_DPBF16
    const bool dp = __builtin_cpu_supports("avx512bf16"),
               fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (dp || fma) {
        bf16_rows a = {out, out16, x, weight, bias, C, dp};
        cpu_rows_shared(OC, (int64_t)C * OC >= CPU_PAR_MIN, bf16_rows_run, &a);
        return;
    }
#endif
#pragma omp parallel for schedule(static) if ((int64_t)C * OC >= CPU_PAR_MIN)
    for (int o = 0; o < OC; o++)
        row_store(out, out16, bias, o, dot_bf16(weight + (size_t)o * C, x, C));
}

void cpu_matmul_bf16_forward(const ct_ops *ops, float *out, uint16_t *out16, float *scratch,
                             const float *inp, const uint16_t *inp16, const uint16_t *weight,
                             const float *bias, int N, int C, int OC) {
    cpu_kernels *k = cpu_kernels_of(ops);
    mm_shape *s = planned(k, N, C, OC);
    if (N == 1) {
        const mm_scratch sc = scratch_parts(scratch, N, C, OC, !inp16, false);
        if (!inp16) cpu_f32_to_bf16(sc.inp, inp, (size_t)C), inp16 = sc.inp;
        row_forward(out, out16, inp16, weight, bias, C, OC);
        return;
    }
    if (k->mm_mode == MODE_EMULATED) {
        mm_emulated_forward(out, out16, scratch, inp, inp16, weight, N, C, OC);
        if (bias) add_bias_bf16(out, bias, N, OC);
        return;
    }
    const mm_scratch sc = scratch_parts(scratch, N, C, OC, !inp16, false);
    if (!inp16) cpu_f32_to_bf16(sc.inp, inp, (size_t)N * C), inp16 = sc.inp;
    run(k, &s->kind[out16 ? MM_FORWARD_BF16_OUT : MM_FORWARD], inp16, weight,
        out16 ? (void *)out16 : out, sc.pad);
    if (bias) add_bias_bf16(out, bias, N, OC);
}

void cpu_matmul_bf16_backward(const ct_ops *ops, float *dinp, float *dweight, float *dbias,
                              float *scratch, const float *dout, const uint16_t *dout16,
                              const float *inp, const uint16_t *inp16, const uint16_t *weight,
                              int N, int C, int OC) {
    cpu_kernels *k = cpu_kernels_of(ops);
    mm_shape *s = planned(k, N, C, OC);
    if (k->mm_mode == MODE_EMULATED) {
        mm_emulated_backward(dinp, dweight, scratch, dout, dout16, inp, inp16, weight, N, C, OC);
        if (dbias) cpu_matmul_bias_grad(dbias, dout, N, OC);
        return;
    }
    const mm_scratch sc = scratch_parts(scratch, N, C, OC, !inp16, !dout16);
    if (!dout16) cpu_f32_to_bf16(sc.dout, dout, (size_t)N * OC), dout16 = sc.dout;
    if (dinp) run(k, &s->kind[MM_DINP], dout16, weight, dinp, sc.pad);
    if (dweight) { // none for a frozen weight
        if (!inp16) cpu_f32_to_bf16(sc.inp, inp, (size_t)N * C), inp16 = sc.inp;
        run(k, &s->kind[MM_DWEIGHT], dout16, inp16, dweight, sc.pad);
    }
    if (dbias) cpu_matmul_bias_grad(dbias, dout, N, OC);
}

void cpu_f32_to_bf16(uint16_t *dst, const float *src, size_t n) {
#pragma omp parallel for simd schedule(static) if (n >= CPU_PAR_MIN)
    for (size_t i = 0; i < n; i++) dst[i] = bf16_round(src[i]);
}

// x[i0, i1) rounded in place to bf16's values, and written to dst unless it is NULL.
CPU_SIMD_CLONES
static void round_range(uint16_t *dst, float *x, size_t i0, size_t i1) {
    if (dst) {
#pragma omp simd
        for (size_t i = i0; i < i1; i++) x[i] = bf16_value(dst[i] = bf16_round(x[i]));
    } else {
#pragma omp simd
        for (size_t i = i0; i < i1; i++) x[i] = bf16_value(bf16_round(x[i]));
    }
}

// Below CPU_PAR_MIN no parallel region at all: one whose `if` is false still pays libgomp's team
// set-up, 1.5 us against 0.1 us of work for 1024 elements, and a bf16 decode token runs 254 of
// these roundings (docs/performance.md).
void cpu_round_to_bf16(uint16_t *dst, float *x, size_t n) {
    if (n < CPU_PAR_MIN) {
        round_range(dst, x, 0, n);
        return;
    }
#pragma omp parallel
    {
        const size_t t = (size_t)omp_get_thread_num(), nt = (size_t)omp_get_num_threads();
        round_range(dst, x, n * t / nt, n * (t + 1) / nt);
    }
}

void cpu_bf16_to_f32(float *dst, const uint16_t *src, size_t n) {
#pragma omp parallel for simd schedule(static) if (n >= CPU_PAR_MIN)
    for (size_t i = 0; i < n; i++) dst[i] = bf16_value(src[i]);
}
