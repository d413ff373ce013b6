// The peak GFLOP/s that MFU is measured against, stable across runs (peak.c says why).
#pragma once
#include <stdbool.h>
#include <stddef.h>

// `configured` (metrics.peak_gflops) when positive; else this machine's cached measurement for
// `threads` threads, measured and cached now if there is none. `source` says which, and where
// the cache is, for the log.
double peak_gflops(double configured, int threads, char *source, size_t cap);

// The cache file: $CTITAN_CACHE_DIR/peak_gflops.tsv, else $XDG_CACHE_HOME/ctitan/, else
// ~/.cache/ctitan/. -1 when none can be named.
int peak_cache_path(char *out, size_t cap);
// The peak of the line "KEY<TAB>GFLOPS" in the cache text, or 0 (none, or not a positive
// number). Lines that do not parse are skipped.
double peak_cache_lookup(const char *text, const char *key);
