// The reductions the trainer and the checkpoints ask of the backend: sums of squares (clipping,
// verify's norms), the loss sum over valid targets, the first non-finite element, and a
// buffer's XXH64. Each gives the same bits for any thread count.
#include <math.h>
#include <stdint.h>

#include "core/xxh64.h"
#include "ops/ops_cpu.h"

#define SUMSQ_MAX_CHUNKS 4096
#define SUMSQ_MIN_CHUNK ((size_t)1 << 16)

// Chunks fixed by n alone, each summed in double in order, then the chunks in order.
void cpu_sum_squares(double *host_out, const float *x, size_t n) {
    size_t chunk = (n + SUMSQ_MAX_CHUNKS - 1) / SUMSQ_MAX_CHUNKS;
    if (chunk < SUMSQ_MIN_CHUNK) chunk = SUMSQ_MIN_CHUNK;
    size_t n_chunks = (n + chunk - 1) / chunk;
    double part[SUMSQ_MAX_CHUNKS];
#pragma omp parallel for schedule(static) if (n_chunks > 1)
    for (size_t c = 0; c < n_chunks; c++) {
        size_t lo = c * chunk, hi = lo + chunk < n ? lo + chunk : n;
        double s = 0;
        for (size_t i = lo; i < hi; i++) s += (double)x[i] * (double)x[i];
        part[c] = s;
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
