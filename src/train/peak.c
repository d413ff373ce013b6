// The MFU denominator: a peak that stays the same from run to run. A fresh sgemm measurement at
// every start swung between 93 and 199 GFLOP/s on one machine, so the same run reported 45% or
// 88% MFU. The peak is measured once per machine, CPU model and thread count, carefully, and
// kept in the user's cache folder; metrics.peak_gflops overrides it. A bf16 run's GEMMs are
// oneDNN's bf16 ones, several times the sgemm rate: its peak is a bf16 GEMM's, cached under its
// own key (an fp32 peak under a bf16 run printed MFUs above 100%).
#include "train/peak.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fs.h"
#include "io/atomic.h"
#include "io/json.h"
#include "train/metrics.h"

int peak_cache_path(char *out, size_t cap) {
    const char *dir = getenv("CTITAN_CACHE_DIR"), *xdg = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
    int n;
    if (dir && dir[0])
        n = snprintf(out, cap, "%s/peak_gflops.tsv", dir);
    else if (xdg && xdg[0])
        n = snprintf(out, cap, "%s/ctitan/peak_gflops.tsv", xdg);
    else if (home && home[0])
        n = snprintf(out, cap, "%s/.cache/ctitan/peak_gflops.tsv", home);
    else
        return -1;
    return n > 0 && (size_t)n < cap ? 0 : -1;
}

// "host<TAB>cpu model<TAB>threads<TAB>dtype" identifies a measurement.
void peak_cache_key(char *out, size_t cap, int threads, bool bf16) {
    char host[256] = "?", model[256] = "?", line[512];
    if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "?");
    host[sizeof host - 1] = '\0';
    FILE *f = fopen("/proc/cpuinfo", "r");
    while (f && fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (strncmp(line, "model name", 10) != 0 || !colon) continue;
        snprintf(model, sizeof model, "%s", colon + 1 + (colon[1] == ' '));
        model[strcspn(model, "\n")] = '\0';
        break;
    }
    if (f) fclose(f);
    for (char *p = host; *p; p++) // the key's separators cannot occur inside it
        if (*p == '\t' || *p == '\n') *p = ' ';
    for (char *p = model; *p; p++)
        if (*p == '\t' || *p == '\n') *p = ' ';
    snprintf(out, cap, "%s\t%s\t%d\t%s", host, model, threads, bf16 ? "bf16" : "fp32");
}

double peak_cache_lookup(const char *text, const char *key) {
    size_t klen = strlen(key);
    for (const char *line = text; line && *line;) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        if (len > klen + 1 && strncmp(line, key, klen) == 0 && line[klen] == '\t') {
            char num[64];
            size_t n = len - klen - 1 < sizeof num - 1 ? len - klen - 1 : sizeof num - 1;
            memcpy(num, line + klen + 1, n);
            num[n] = '\0';
            char *stop;
            double v = strtod(num, &stop);
            if (stop != num && *stop == '\0' && v > 0 && v < 1e9) return v;
        }
        line = end ? end + 1 : NULL;
    }
    return 0;
}

// Best of several runs at two sizes: the first runs pay for thread start-up and page faults.
// A bf16 GEMM that cannot run (0: oneDNN made no matmul, out of memory) falls back to sgemm's
// peak rather than dividing by 0.
static double measure(bool bf16) {
    double (*gemm)(int, int) = bf16 ? metrics_bf16_gflops : metrics_sgemm_gflops;
    double a = gemm(1024, 8), b = gemm(2048, 3);
    return a > 0 || b > 0 ? (a > b ? a : b) : bf16 ? measure(false) : 0;
}

// Writes the cache: text's lines but the key's, then "key<TAB>v". False when it could not.
static bool cache_store(const char *path, const char *text, const char *key, double v) {
    ct_error err;
    atomic_file a;
    char *dir = strdup(path);
    if (dir) *strrchr(dir, '/') = '\0';
    bool saved = dir && fs_mkdirs(dir, &err) == 0 && atomic_open(&a, path, &err) == 0;
    free(dir);
    if (!saved) return false;
    const size_t klen = strlen(key);
    for (const char *line = text; line && *line;) { // the other machines' lines (a shared home)
        const char *end = strchr(line, '\n');
        const size_t len = end ? (size_t)(end - line) : strlen(line);
        if (!(len > klen && strncmp(line, key, klen) == 0 && line[klen] == '\t'))
            fprintf(a.fp, "%.*s\n", (int)len, line);
        line = end ? end + 1 : NULL;
    }
    fprintf(a.fp, "%s\t%.1f\n", key, v);
    return atomic_commit(&a, &err) == 0;
}

// Measures the peak now and caches it under its key, replacing any earlier line; `source` says
// so for the log.
static double measure_and_cache(int threads, bool bf16, char *source, size_t cap) {
    char path[4096], key[600];
    peak_cache_key(key, sizeof key, threads, bf16);
    const bool have_path = peak_cache_path(path, sizeof path) == 0;
    char *text = NULL;
    size_t len = 0;
    if (have_path && file_read_all(&text, &len, path, 1 << 20, NULL) != 0) text = NULL;
    const double v = measure(bf16);
    const bool saved = have_path && cache_store(path, text, key, v);
    snprintf(source, cap, "%s measured now%s%s", bf16 ? "bf16 GEMM" : "sgemm",
             saved ? ", cached in " : " (not cached)", saved ? path : "");
    free(text);
    return v;
}

double peak_gflops(double configured, int threads, bool bf16, char *source, size_t cap) {
    if (configured > 0) {
        snprintf(source, cap, "metrics.peak_gflops");
        return configured;
    }
    char path[4096], key[600];
    peak_cache_key(key, sizeof key, threads, bf16);
    char *text = NULL;
    size_t len = 0;
    if (peak_cache_path(path, sizeof path) == 0 &&
        file_read_all(&text, &len, path, 1 << 20, NULL) != 0)
        text = NULL;
    const double v = text ? peak_cache_lookup(text, key) : 0;
    free(text);
    if (v > 0) {
        snprintf(source, cap,
                 "%s GEMMs measured once for this machine and %d thread(s), cached in %s",
                 bf16 ? "bf16" : "fp32", threads, path);
        return v;
    }
    return measure_and_cache(threads, bf16, source, cap);
}

double peak_gflops_recheck(int threads, bool bf16, char *source, size_t cap) {
    return measure_and_cache(threads, bf16, source, cap);
}
