// The peak GFLOP/s that MFU is measured against, stable across runs (peak.c says why).
#pragma once
#include <stdbool.h>
#include <stddef.h>

// `configured` (metrics.peak_gflops) when positive; else this machine's cached measurement for
// `threads` threads and the run's GEMM dtype (bf16: oneDNN's bf16 GEMM, else sgemm), measured
// and cached now if there is none. `source` says which, and where the cache is, for the log.
double peak_gflops(double configured, int threads, bool bf16, char *source, size_t cap);
// Measures the peak again and replaces its cache line: for a run whose steps went faster than
// the cached peak, which was then measured while the machine was busy (a cache of 99 GFLOP/s on
// a machine whose sgemm reaches 190 printed MFUs of 170%).
double peak_gflops_recheck(int threads, bool bf16, char *source, size_t cap);
// The cache line's key: "host<TAB>cpu model<TAB>threads<TAB>fp32|bf16". Lines of the older
// three-field key (fp32 peaks without a dtype) match no key and are measured again.
void peak_cache_key(char *out, size_t cap, int threads, bool bf16);

// The cache file: $CTITAN_CACHE_DIR/peak_gflops.tsv, else $XDG_CACHE_HOME/ctitan/, else
// ~/.cache/ctitan/. -1 when none can be named.
int peak_cache_path(char *out, size_t cap);
// The peak of the line "KEY<TAB>GFLOPS" in the cache text, or 0 (none, or not a positive
// number). Lines that do not parse are skipped.
double peak_cache_lookup(const char *text, const char *key);
