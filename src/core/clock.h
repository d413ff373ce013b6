// One monotonic clock for every timing in ctitan (step times, comm waits, deadlines, profiles).
#pragma once
#include <time.h>

// Seconds on CLOCK_MONOTONIC: only differences mean anything.
static inline double ct_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
