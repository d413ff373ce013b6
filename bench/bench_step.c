// The C side of bench/forward_backward.py: times forward+backward of an HF folder on a token
// stream, or measures the sgemm peak that MFU is reported against. Prints one JSON line.
//   bench_step sgemm N REPEATS
//   bench_step step HF_DIR TOKENS.npy B T STEPS
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/sysmem.h"
#include "io/npy.h"
#include "model/hf_adapter.h"
#include "train/metrics.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
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

static int bench_model(const char *dir, const char *tokens_path, int B, int T, int steps) {
    ct_error err;
    qwen3_model m = {0};
    hf_load_report rep = {0};
    npy_tokens tok;
    if (hf_load_folder(&m, &rep, dir, NULL, &err) != 0 || qwen3_plan(&m, B, T, &err) != 0 ||
        npy_open(&tok, tokens_path, &err) != 0) {
        fprintf(stderr, "bench_step: %s\n", err.msg);
        return 1;
    }
    size_t need = (size_t)B * (T + 1);
    int32_t *stream = malloc(need * 4), *inputs = malloc((size_t)B * T * 4),
            *targets = malloc((size_t)B * T * 4);
    if (npy_read(stream, &tok, 0, need, m.cfg.vocab_size, &err) != 0) {
        fprintf(stderr, "bench_step: %s\n", err.msg);
        return 1;
    }
    for (int b = 0; b < B; b++) {
        memcpy(inputs + (size_t)b * T, stream + (size_t)b * (T + 1), (size_t)T * 4);
        memcpy(targets + (size_t)b * T, stream + (size_t)b * (T + 1) + 1, (size_t)T * 4);
    }
    double best = 1e30, loss = 0;
    for (int s = 0; s < steps + 1; s++) { // first step is warm-up
        int64_t n_valid;
        double t0 = now();
        qwen3_zero_grad(&m);
        loss = qwen3_forward(&m, inputs, targets, &n_valid) / (double)n_valid;
        qwen3_backward(&m, 1.0f / (float)n_valid);
        double dt = now() - t0;
        if (s > 0 && dt < best) best = dt;
    }
    printf("{\"ms_per_step\":%.3f,\"loss\":%.6f,\"peak_rss_mib\":%.1f}\n", best * 1e3, loss,
           sysmem_peak_rss_bytes() / 1048576.0);
    free(stream), free(inputs), free(targets);
    npy_close(&tok);
    qwen3_free(&m);
    hf_report_free(&rep);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "sgemm") == 0)
        return bench_sgemm(atoi(argv[2]), atoi(argv[3]));
    if (argc == 7 && strcmp(argv[1], "step") == 0)
        return bench_model(argv[2], argv[3], atoi(argv[4]), atoi(argv[5]), atoi(argv[6]));
    fprintf(stderr, "usage: bench_step sgemm N REPEATS | step HF_DIR TOKENS.npy B T STEPS\n");
    return 2;
}
