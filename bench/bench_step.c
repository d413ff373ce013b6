// The C side of bench/forward_backward.py and bench/moe.py: times forward+backward of an HF
// folder on a token stream, or of one MoE block alone, or measures the sgemm peak that MFU is
// reported against. Prints one JSON line.
//   bench_step sgemm N REPEATS
//   bench_step bf16 N REPEATS   (the bf16 peak: oneDNN, as a bf16 linear layer runs)
//   bench_step bandwidth GIB REPEATS   (streaming-read bandwidth: the decode bound's divisor)
//   bench_step rows_bf16|rows_f32 C OC COUNT REPEATS   (decode's one-row product against that rate)
//   bench_step attention_decode T NH NKV D LAYERS REPEATS [bf16]   (decode's attention, KV cache)
//   bench_step step HF_DIR TOKENS.npy B T STEPS [MOE_IMPL]
//   bench_step moe N C F E K STEPS MOE_IMPL SEED [bf16]   (bf16: the experts' bf16 kernels)
// step and moe run one untimed warm-up step, then STEPS timed ones, and print every timed
// step ("ms") as well as the best ("ms_per_step").
#include <math.h>
#include <omp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>

#include "core/sysmem.h"
#include "io/npy.h"
#include "model/hf_adapter.h"
#include "ops/cpu_kernels.h"
#include "ops/moe_router.h"
#include "ops/ops.h"
#include "train/metrics.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// CPU seconds of every thread of this process, and the part of them spent in the kernel (page
// faults, mostly): against the wall time they show whether the threads had the cores (a busy
// machine shows as cpu well under threads * wall) and what fresh memory cost.
static void cpu_now(double *cpu, double *sys) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    *cpu = ts.tv_sec + ts.tv_nsec * 1e-9;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    *sys = ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
}

enum { WALL, CPU, SYS };
typedef struct step_clock {
    double t[3]; // seconds, or milliseconds after clock_ms
} step_clock;

static step_clock clock_start(void) {
    step_clock c = {{now(), 0, 0}};
    cpu_now(&c.t[CPU], &c.t[SYS]);
    return c;
}

// Milliseconds since `c`, each clock.
static step_clock clock_ms(step_clock c) {
    step_clock d = clock_start();
    for (int k = 0; k < 3; k++) d.t[k] = (d.t[k] - c.t[k]) * 1e3;
    return d;
}

// "ms_per_step" is the best step (bench/forward_backward.py reads it); "ms", "cpu_ms", "sys_ms"
// list every timed step.
static void print_times(const step_clock *c, int steps) {
    static const char *keys[3] = {"ms", "cpu_ms", "sys_ms"};
    double best = 0;
    for (int s = 0; s < steps; s++)
        if (s == 0 || c[s].t[WALL] < best) best = c[s].t[WALL];
    printf("\"ms_per_step\":%.3f", best);
    for (int k = 0; k < 3; k++) {
        printf(",\"%s\":[", keys[k]);
        for (int s = 0; s < steps; s++) printf("%s%.3f", s ? "," : "", c[s].t[k]);
        printf("]");
    }
}

static int bench_sgemm(int n, int repeats) {
    double gflops = metrics_sgemm_gflops(n, repeats);
    if (gflops <= 0) {
        fprintf(stderr, "bench_step: sgemm %d x %d, %d repeats: bad size or out of memory\n", n, n,
                repeats);
        return 1;
    }
    printf("{\"sgemm_n\":%d,\"sgemm_gflops\":%.2f}\n", n, gflops);
    return 0;
}

// The bf16 peak: oneDNN's bf16 matmul, N^3, the best of REPEATS.
static int bench_bf16(int n, int repeats) {
    double gflops = metrics_bf16_gflops(n, repeats);
    if (gflops <= 0) {
        fprintf(stderr,
                "bench_step: bf16 %d x %d, %d repeats: bad size, out of memory or oneDNN "
                "failed\n",
                n, n, repeats);
        return 1;
    }
    printf("{\"bf16_n\":%d,\"bf16_gflops\":%.2f}\n", n, gflops);
    return 0;
}

// Streaming-read bandwidth, what a decode step's weight reads get at best: a GIB GiB buffer,
// written first by the threads that read it, each OpenMP thread summing its contiguous slice
// with 64-byte vector loads (four independent accumulators, so the adds never wait on each
// other), the best of REPEATS timed passes after one warm-up. numpy's float32 sum (the probe
// bench/generate.py used before) reads at a lower rate than llama.cpp's decode streams its
// weights, so a bound built on it was too low to grade against.
typedef float bw_vec __attribute__((vector_size(64)));

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
static float
bw_sum(const bw_vec *p, size_t n) {
    bw_vec a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
    size_t i = 0;
    for (; i + 4 <= n; i += 4) a0 += p[i], a1 += p[i + 1], a2 += p[i + 2], a3 += p[i + 3];
    for (; i < n; i++) a0 += p[i];
    const bw_vec a = a0 + a1 + a2 + a3;
    float s = 0;
    for (int k = 0; k < 16; k++) s += a[k];
    return s;
}

// bw_sum for CPUs with AVX2 but not AVX-512: GCC builds its 64-byte vectors there through the
// stack, and the probe read 17-18 GB/s where decode's one-row products read 21-25 (2-core EPYC,
// AVX2). This one sums 32-byte vectors into eight accumulators.
typedef float bw_half __attribute__((vector_size(32)));
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target("avx2")))
#endif
static float
bw_sum_avx2(const bw_vec *p, size_t n) {
    const bw_half *h = (const bw_half *)p;
    bw_half a[8] = {{0}};
    size_t i = 0;
    for (; i + 8 <= 2 * n; i += 8)
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) a[j] += h[i + j];
    for (; i < 2 * n; i++) a[0] += h[i];
    float s = 0;
    for (int j = 0; j < 8; j++)
        for (int k = 0; k < 8; k++) s += a[j][k];
    return s;
}

static float bw_sum_any(const bw_vec *p, size_t n) {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
    if (!__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2"))
        return bw_sum_avx2(p, n);
#endif
    return bw_sum(p, n);
}

static int bench_bandwidth(double gib, int repeats) {
    const size_t n = (size_t)(gib * (1 << 30)) / sizeof(bw_vec);
    if (n < 1024 || repeats < 1) {
        fprintf(stderr, "bench_step: bandwidth %g GiB, %d repeats: bad size\n", gib, repeats);
        return 1;
    }
    bw_vec *buf = aligned_alloc(64, n * sizeof *buf);
    if (!buf) {
        fprintf(stderr, "bench_step: bandwidth: out of memory for %g GiB\n", gib);
        return 1;
    }
    // 2 MiB pages, as generation's weights and KV cache have, where the kernel's transparent
    // huge pages are madvise-only.
    madvise(buf, n * sizeof *buf, MADV_HUGEPAGE);
    const int threads = omp_get_max_threads();
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < 16; k++) buf[i][k] = (float)((i + k) & 7);
    double best = 0, *runs = calloc((size_t)repeats, sizeof *runs);
    float sink = 0;
    for (int r = -1; r < repeats; r++) { // r = -1: the warm-up
        const double t0 = now();
#pragma omp parallel reduction(+ : sink)
        {
            const int t = omp_get_thread_num(), nt = omp_get_num_threads();
            const size_t lo = n * t / nt, hi = n * (t + 1) / nt;
            sink += bw_sum_any(buf + lo, hi - lo);
        }
        const double gbs = (double)n * sizeof *buf / (now() - t0) / 1e9;
        if (r >= 0) runs[r] = gbs, best = gbs > best ? gbs : best;
    }
    printf("{\"bandwidth_gib\":%g,\"threads\":%d,\"bandwidth_gbs\":%.2f,\"bandwidth_runs_gbs\":[",
           gib, threads, best);
    for (int r = 0; r < repeats; r++) printf("%s%.2f", r ? "," : "", runs[r]);
    printf("],\"sink\":%g}\n", (double)sink);
    free(runs);
    free(buf);
    return 0;
}

static int bench_model(const char *dir, const char *tokens_path, int B, int T, int steps,
                       const char *moe_impl) {
    ct_error err;
    ct_ops ops;
    if (ct_ops_with_moe_impl(&ops, &ct_ops_cpu, moe_impl) != 0) {
        fprintf(stderr, "bench_step: moe impl \"%s\": expected grouped or loop\n", moe_impl);
        return 2;
    }
    qwen3_model m = {0};
    hf_load_report rep = {0};
    npy_tokens tok;
    if (hf_load_folder(&m, &rep, dir, &ops, &err) != 0 || qwen3_plan(&m, B, T, &err) != 0 ||
        npy_open(&tok, tokens_path, &err) != 0) {
        fprintf(stderr, "bench_step: %s\n", err.msg);
        return 1;
    }
    size_t need = (size_t)B * (T + 1);
    int32_t *stream = malloc(need * 4), *inputs = malloc((size_t)B * T * 4),
            *targets = malloc((size_t)B * T * 4);
    step_clock *ms = malloc((size_t)(steps > 0 ? steps : 1) * sizeof *ms);
    if (npy_read(stream, &tok, 0, need, m.cfg.vocab_size, &err) != 0) {
        fprintf(stderr, "bench_step: %s\n", err.msg);
        return 1;
    }
    for (int b = 0; b < B; b++) {
        memcpy(inputs + (size_t)b * T, stream + (size_t)b * (T + 1), (size_t)T * 4);
        memcpy(targets + (size_t)b * T, stream + (size_t)b * (T + 1) + 1, (size_t)T * 4);
    }
    double loss = 0;
    for (int s = 0; s < steps + 1; s++) { // first step is warm-up
        int64_t n_valid;
        const step_clock t0 = clock_start();
        qwen3_zero_grad(&m);
        loss = qwen3_forward(&m, &(qwen3_batch){.inputs = inputs, .targets = targets}, &n_valid) /
               (double)n_valid;
        qwen3_backward(&m, 1.0f / (float)n_valid);
        if (s > 0) ms[s - 1] = clock_ms(t0);
    }
    printf("{\"moe_impl\":\"%s\",", m.cfg.num_experts > 0 ? moe_impl : "none");
    print_times(ms, steps);
    printf(",\"loss\":%.6f,\"peak_rss_mib\":%.1f}\n", loss, sysmem_peak_rss_bytes() / 1048576.0);
    free(stream), free(inputs), free(targets), free(ms);
    npy_close(&tok);
    qwen3_free(&m);
    hf_report_free(&rep);
    return 0;
}

// ---- the MoE block alone --------------------------------------------------------------------
// Inputs come from a counter-based generator that bench/moe.py reproduces bit for bit in numpy,
// so both sides route the same tokens to the same experts:
//   z = splitmix64(((seed*16 + stream) << 40) + i), value = ((z >> 40) * 2^-24 * 2 - 1) * scale
// in double, rounded to float: uniform in [-scale, scale).

enum { MOE_X, MOE_ROUTER, MOE_EXPERTS, MOE_DOUT };

static void fill_uniform(float *out, size_t n, uint64_t seed, int stream, double scale) {
    const uint64_t base = (seed * 16 + (uint64_t)stream) << 40;
    for (size_t i = 0; i < n; i++) {
        uint64_t z = base + i + 0x9E3779B97F4A7C15ull;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        out[i] = (float)(((double)(z >> 40) * 0x1p-24 * 2.0 - 1.0) * scale);
    }
}

// One step is what a sparse layer does between its post-attention norm and the residual add:
// router matmul, routing (softmax, top-K, renormalised as Qwen3-30B-A3B), the experts, then the
// backward of all three from dout; the parameter gradients are zeroed first, as in training.
static int bench_moe(int N, int C, int F, int E, int K, int steps, const char *moe_impl,
                     uint64_t seed, bool bf16) {
    ct_ops ops;
    if (ct_ops_with_moe_impl(&ops, &ct_ops_cpu, moe_impl) != 0) {
        fprintf(stderr, "bench_step: moe impl \"%s\": expected grouped or loop\n", moe_impl);
        return 2;
    }
    if (N < 1 || C < 1 || F < 1 || E < 1 || K < 1 || K > E || steps < 1) {
        fprintf(stderr, "bench_step: moe: need N, C, F, E, STEPS >= 1 and 1 <= K <= E\n");
        return 2;
    }
    const size_t NC = (size_t)N * C, NE = (size_t)N * E, NK = (size_t)N * K;
    const size_t EC = (size_t)E * C, W = (size_t)E * 3 * F * C;
    // bf16: the experts' bf16 kernels on a bf16 copy of their weights (the router stays fp32).
    const size_t state_n = (bf16 ? ops.moe_bf16_state_floats : ops.moe_state_floats)(N, C, F, E, K);
    cpu_kernels kernels = {0}; // the bf16 experts' GEMMs: the bench's own kernel state
    ops.kernel_state = &kernels;
    const size_t scratch_n = bf16 ? ops.moe_bf16_scratch_floats(&ops, N, C, F, E, K)
                                  : ops.moe_scratch_floats(N, C, F, E, K);
    if (scratch_n == SIZE_MAX) {
        fprintf(stderr, "bench_step: moe: oneDNN could not make the bf16 expert GEMMs\n");
        return 1;
    }
    float *x = malloc(NC * 4), *router = malloc(EC * 4), *w = malloc(W * 4);
    float *dout = malloc(NC * 4), *out = malloc(NC * 4), *dx = malloc(NC * 4);
    float *dtmp = malloc(NC * 4), *probs = malloc(NE * 4), *dlogits = malloc(NE * 4);
    float *weight = malloc(NK * 4), *dweight = malloc(NK * 4);
    int32_t *expert = malloc(NK * 4);
    float *drouter = malloc(EC * 4), *dw = malloc(W * 4);
    float *state = malloc(state_n * 4), *scratch = malloc(scratch_n * 4);
    const int threads = omp_get_max_threads();
    float *route_scratch = malloc(moe_route_scratch_floats(E, threads) * 4 + 4);
    step_clock *ms = malloc((size_t)steps * sizeof *ms);
    if (!x || !router || !w || !dout || !out || !dx || !dtmp || !probs || !dlogits || !weight ||
        !dweight || !expert || !drouter || !dw || !state || !scratch || !route_scratch || !ms) {
        fprintf(stderr, "bench_step: moe: out of memory\n");
        return 1;
    }
    // x is a normed hidden state (unit variance); weights as a normal(0, 0.02) init.
    const double unit = sqrt(3.0), init = 0.02 * sqrt(3.0);
    fill_uniform(x, NC, seed, MOE_X, unit);
    fill_uniform(router, EC, seed, MOE_ROUTER, init);
    fill_uniform(w, W, seed, MOE_EXPERTS, init);
    fill_uniform(dout, NC, seed, MOE_DOUT, unit / N);
    uint16_t *w16 = bf16 ? malloc(W * sizeof *w16) : NULL, *x16 = bf16 ? malloc(NC * 2) : NULL;
    if (w16) ct_ops_cpu.f32_to_bf16(w16, w, W);
    if (x16) ct_ops_cpu.f32_to_bf16(x16, x, NC);
    for (int s = 0; s < steps + 1; s++) { // first step is warm-up
        const step_clock t0 = clock_start();
        memset(drouter, 0, EC * 4);
        memset(dw, 0, W * 4);
        ops.matmul_forward(probs, x, router, NULL, N, C, E); // logits, softmaxed in place
        moe_route_forward(expert, weight, probs, NULL, N, E, K, true, route_scratch, threads);
        if (bf16) {
            ops.moe_bf16_forward(&ops, out, state, scratch, x16, expert, weight, w16, N, C, F, E,
                                 K);
            ops.moe_bf16_backward(&ops, dx, dweight, dw, scratch, dout, state, x16, expert, weight,
                                  w16, N, C, F, E, K);
        } else {
            ops.moe_forward(out, state, scratch, x, expert, weight, w, N, C, F, E, K);
            ops.moe_backward(dx, dweight, dw, scratch, dout, state, x, expert, weight, w, N, C, F,
                             E, K);
        }
        moe_route_backward(dlogits, dweight, NULL, probs, expert, weight, N, E, K, true);
        ops.matmul_backward(dtmp, drouter, NULL, dlogits, x, router, N, C, E);
        ops.add(dx, dx, dtmp, (int64_t)NC);
        if (s > 0) ms[s - 1] = clock_ms(t0);
    }
    // Checks that both sides computed the same thing: <out, dout> (the scalar whose gradient
    // dout is) and the norms of the gradients.
    double dot = 0, ndx = 0, ndw = 0, ndr = 0;
    for (size_t i = 0; i < NC; i++) dot += (double)out[i] * dout[i], ndx += (double)dx[i] * dx[i];
    for (size_t i = 0; i < W; i++) ndw += (double)dw[i] * dw[i];
    for (size_t i = 0; i < EC; i++) ndr += (double)drouter[i] * drouter[i];
    printf("{\"moe_impl\":\"%s\",\"precision\":\"%s\",", moe_impl, bf16 ? "bf16" : "fp32");
    print_times(ms, steps);
    printf(",\"out_dot_dout\":%.9g,\"dx_norm\":%.9g,\"dw_norm\":%.9g,\"drouter_norm\":%.9g,"
           "\"peak_rss_mib\":%.1f}\n",
           dot, sqrt(ndx), sqrt(ndw), sqrt(ndr), sysmem_peak_rss_bytes() / 1048576.0);
    free(x), free(router), free(w), free(dout), free(out), free(dx), free(dtmp), free(probs);
    free(dlogits), free(weight), free(dweight), free(expert), free(drouter), free(dw);
    free(state), free(scratch), free(route_scratch), free(ms), free(w16), free(x16);
    cpu_kernels_free(&kernels);
    return 0;
}

// The one-row product a decode step runs for every linear layer: COUNT matrices of OC x C bf16
// (or fp32) weights (more bytes than the caches hold, as a model's layers are), each multiplied by
// one row through the op table, in turn; then the same buffers summed by bw_sum, the bandwidth
// probe's streaming read. Both in GB/s of weights, the best of REPEATS passes after a warm-up: how
// close the product comes to reading at the memory's rate. The weights sit on 2 MiB pages, as a
// forward-only model's do (the backend's mark_streamed).
static int bench_rows(int C, int OC, int count, int repeats, bool bf16) {
    const char *name = bf16 ? "rows_bf16" : "rows_f32";
    if (C < 1 || OC < 1 || count < 1 || repeats < 1) {
        fprintf(stderr, "bench_step: %s %d %d %d %d: bad size\n", name, C, OC, count, repeats);
        return 1;
    }
    cpu_kernels kernels = {0};
    ct_ops ops = ct_ops_cpu;
    ops.kernel_state = &kernels;
    const size_t ns = bf16 ? ops.matmul_bf16_scratch_floats(&ops, 1, C, OC, false) : 0;
    const size_t each = ((size_t)OC * C * (bf16 ? 2 : 4) + 63) / 64 * 64,
                 bytes = each * (size_t)count;
    char *w = aligned_alloc(1 << 21, (bytes + (1 << 21) - 1) >> 21 << 21);
    float *x = malloc((size_t)C * sizeof *x), *out = malloc((size_t)OC * sizeof *out);
    float *scratch = ns == SIZE_MAX ? NULL : malloc((ns ? ns : 1) * sizeof *scratch);
    if (!w || !x || !out || !scratch) {
        fprintf(stderr, "bench_step: %s: out of memory for %zu bytes\n", name, bytes);
        return 1;
    }
    madvise(w, bytes, MADV_HUGEPAGE);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < bytes / 2; i++) ((uint16_t *)w)[i] = (uint16_t)(0x3f80 + (i & 63));
    for (int c = 0; c < C; c++) x[c] = 1.0f + (float)(c & 7) / 8;
    double best[2] = {0, 0};
    float sink = 0;
    for (int r = -1; r < repeats; r++) { // r = -1: the warm-up
        double t0 = now();
        for (int m = 0; m < count; m++) {
            if (bf16)
                ops.matmul_bf16_forward(&ops, out, NULL, scratch, x, NULL,
                                        (const uint16_t *)(w + each * m), NULL, 1, C, OC);
            else // the same 16-bit pattern: floats near 1
                ops.matmul_forward(out, x, (const float *)(w + each * m), NULL, 1, C, OC);
            sink += out[m % OC];
        }
        const double rows = (double)bytes / (now() - t0) / 1e9;
        t0 = now();
        for (int m = 0; m < count; m++) {
            const bw_vec *p = (const bw_vec *)(w + each * m);
            const size_t n = each / sizeof *p;
#pragma omp parallel reduction(+ : sink)
            {
                const int t = omp_get_thread_num(), nt = omp_get_num_threads();
                sink += bw_sum_any(p + n * t / nt, n * (t + 1) / nt - n * t / nt);
            }
        }
        const double stream = (double)bytes / (now() - t0) / 1e9;
        if (r >= 0 && rows > best[0]) best[0] = rows;
        if (r >= 0 && stream > best[1]) best[1] = stream;
    }
    printf("{\"%s\":[%d,%d,%d],\"threads\":%d,\"weight_mb\":%.1f,\"rows_gbs\":%.2f,"
           "\"stream_gbs\":%.2f,\"sink\":%g}\n",
           name, C, OC, count, omp_get_max_threads(), bytes / 1e6, best[0], best[1], (double)sink);
    free(w), free(x), free(out), free(scratch);
    cpu_kernels_free(&kernels);
    return 0;
}

// Decode's attention at position T - 1: LAYERS caches of T positions (keys and values, fp32 or
// bf16, on 2 MiB pages as generation's are), attention_decode over each in turn, as a decode step
// runs the layers. Prints ms per step (all layers) and the cache's bytes over that time in GB/s,
// beside bw_sum's streaming read of the same buffers; the best of REPEATS after a warm-up.
static int bench_attention_decode(int T, int NH, int NKV, int D, int layers, int repeats,
                                  bool bf16) {
    if (T < 1 || NKV < 1 || NH < NKV || NH % NKV || D < 1 || layers < 1 || repeats < 1) {
        fprintf(stderr, "bench_step: attention_decode: bad size\n");
        return 1;
    }
    const size_t row = (size_t)NKV * D, per = (size_t)T * row * (bf16 ? 2 : 4),
                 each = (per + 63) / 64 * 64, bytes = 2 * each * (size_t)layers;
    char *kv = aligned_alloc(1 << 21, (bytes + (1 << 21) - 1) >> 21 << 21);
    float *q = malloc((size_t)NH * D * sizeof *q), *out = malloc((size_t)NH * D * sizeof *out);
    float *scratch = malloc(ct_ops_cpu.attention_decode_scratch_floats(T, NH, D) * sizeof *scratch);
    if (!kv || !q || !out || !scratch) {
        fprintf(stderr, "bench_step: attention_decode: out of memory for %zu bytes\n", bytes);
        return 1;
    }
    madvise(kv, bytes, MADV_HUGEPAGE);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < bytes / 2; i++) // bf16 values in the range [-0.5, 0.5), either way
        ((uint16_t *)kv)[i] = bf16 || i % 2 ? (uint16_t)(0x3c00 + (i * 2654435761u) % 0x200) : 0;
    for (int i = 0; i < NH * D; i++) q[i] = (float)(i % 13) / 13 - 0.5f;
    double best[2] = {1e30, 0};
    float sink = 0;
    for (int r = -1; r < repeats; r++) {
        double t0 = now();
        for (int l = 0; l < layers; l++) {
            const char *k = kv + 2 * each * l, *v = k + each;
            if (bf16)
                ct_ops_cpu.attention_decode_bf16(out, scratch, q, (const uint16_t *)k,
                                                 (const uint16_t *)v, T, NH, NKV, D);
            else
                ct_ops_cpu.attention_decode(out, scratch, q, (const float *)k, (const float *)v, T,
                                            NH, NKV, D);
            sink += out[l % (NH * D)];
        }
        const double ms = (now() - t0) * 1e3;
        t0 = now();
        const bw_vec *p = (const bw_vec *)kv;
        const size_t n = bytes / sizeof *p;
#pragma omp parallel reduction(+ : sink)
        {
            const int t = omp_get_thread_num(), nt = omp_get_num_threads();
            sink += bw_sum_any(p + n * t / nt, n * (t + 1) / nt - n * t / nt);
        }
        const double stream = (double)bytes / (now() - t0) / 1e9;
        if (r >= 0 && ms < best[0]) best[0] = ms;
        if (r >= 0 && stream > best[1]) best[1] = stream;
    }
    printf("{\"attention_decode\":[%d,%d,%d,%d,%d],\"cache\":\"%s\",\"threads\":%d,"
           "\"cache_mb\":%.1f,\"ms\":%.3f,\"cache_gbs\":%.2f,\"stream_gbs\":%.2f,\"sink\":%g}\n",
           T, NH, NKV, D, layers, bf16 ? "bf16" : "fp32", omp_get_max_threads(), bytes / 1e6,
           best[0], bytes / best[0] / 1e6, best[1], (double)sink);
    free(kv), free(q), free(out), free(scratch);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "sgemm") == 0)
        return bench_sgemm(atoi(argv[2]), atoi(argv[3]));
    if (argc == 4 && strcmp(argv[1], "bf16") == 0) return bench_bf16(atoi(argv[2]), atoi(argv[3]));
    if (argc == 4 && strcmp(argv[1], "bandwidth") == 0)
        return bench_bandwidth(atof(argv[2]), atoi(argv[3]));
    if (argc == 6 && (strcmp(argv[1], "rows_bf16") == 0 || strcmp(argv[1], "rows_f32") == 0))
        return bench_rows(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), atoi(argv[5]),
                          strcmp(argv[1], "rows_bf16") == 0);
    if ((argc == 8 || (argc == 9 && strcmp(argv[8], "bf16") == 0)) &&
        strcmp(argv[1], "attention_decode") == 0)
        return bench_attention_decode(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), atoi(argv[5]),
                                      atoi(argv[6]), atoi(argv[7]), argc == 9);
    if ((argc == 7 || argc == 8) && strcmp(argv[1], "step") == 0)
        return bench_model(argv[2], argv[3], atoi(argv[4]), atoi(argv[5]), atoi(argv[6]),
                           argc == 8 ? argv[7] : "grouped");
    if ((argc == 10 || (argc == 11 && strcmp(argv[10], "bf16") == 0)) &&
        strcmp(argv[1], "moe") == 0)
        return bench_moe(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), atoi(argv[5]), atoi(argv[6]),
                         atoi(argv[7]), argv[8], strtoull(argv[9], NULL, 10), argc == 11);
    fprintf(stderr, "usage: bench_step sgemm N REPEATS\n"
                    "       bench_step bf16 N REPEATS\n"
                    "       bench_step bandwidth GIB REPEATS\n"
                    "       bench_step rows_bf16|rows_f32 C OC COUNT REPEATS\n"
                    "       bench_step attention_decode T NH NKV D LAYERS REPEATS [bf16]\n"
                    "       bench_step step HF_DIR TOKENS.npy B T STEPS [grouped|loop]\n"
                    "       bench_step moe N C F E K STEPS grouped|loop SEED [bf16]\n");
    return 2;
}
