// The reductions the trainer and the checkpoints ask of the backend: sums of squares (clipping,
// verify's norms), the loss sum over valid targets, the first non-finite element, and a
// buffer's XXH64. Each gives the same bits for any thread count.
#include <math.h>
#include <stdint.h>

#include "core/xxh64.h"
#include "ops/ops_cpu.h"

#define SUMSQ_MAX_CHUNKS 4096
#define SUMSQ_MIN_CHUNK ((size_t)1 << 16)

// Chunks fixed by n alone, each summed in double over SUMSQ_LANES interleaved lanes (element i
// into lane i % SUMSQ_LANES: independent sums that vectorise, where one running sum waits on
// each add's latency) combined pairwise, then the chunks in order. The lanes are in the code,
// not left to the vectoriser, so the bits do not depend on the SIMD width either.
#define SUMSQ_LANES 8

static double sum_squares_chunk(const float *x, size_t n) {
    double lane[SUMSQ_LANES] = {0};
    size_t i = 0;
    for (; i + SUMSQ_LANES <= n; i += SUMSQ_LANES)
        for (int l = 0; l < SUMSQ_LANES; l++) lane[l] += (double)x[i + l] * (double)x[i + l];
    for (; i < n; i++) lane[i % SUMSQ_LANES] += (double)x[i] * (double)x[i];
    for (int w = SUMSQ_LANES / 2; w > 0; w /= 2)
        for (int l = 0; l < w; l++) lane[l] += lane[l + w];
    return lane[0];
}

void cpu_sum_squares(double *host_out, const float *x, size_t n) {
    size_t chunk = (n + SUMSQ_MAX_CHUNKS - 1) / SUMSQ_MAX_CHUNKS;
    if (chunk < SUMSQ_MIN_CHUNK) chunk = SUMSQ_MIN_CHUNK;
    size_t n_chunks = (n + chunk - 1) / chunk;
    double part[SUMSQ_MAX_CHUNKS];
#pragma omp parallel for schedule(static) if (n_chunks > 1)
    for (size_t c = 0; c < n_chunks; c++) {
        size_t lo = c * chunk, hi = lo + chunk < n ? lo + chunk : n;
        part[c] = sum_squares_chunk(x + lo, hi - lo);
    }
    double total = 0;
    for (size_t c = 0; c < n_chunks; c++) total += part[c];
    *host_out = total;
}

void cpu_loss_sum(double *host_out, const float *losses, const int32_t *targets, int ignore,
                  int N) {
    double sum = 0.0;
    for (int i = 0; i < N; i++)
        if (targets[i] != ignore) sum += losses[i];
    *host_out = sum;
}

void cpu_first_nonfinite(size_t *host_out, const float *x, size_t n) {
    size_t first = SIZE_MAX;
#pragma omp parallel for reduction(min : first) schedule(static)
    for (size_t k = 0; k < n; k++)
        if (!isfinite(x[k]) && k < first) first = k;
    *host_out = first;
}

void cpu_hash_xxh64(uint64_t *host_out, const void *p, size_t bytes) {
    *host_out = ct_xxh64(p, bytes, 0);
}
