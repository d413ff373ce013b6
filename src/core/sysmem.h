// What the machine has and what this process used: for pre-run memory checks and reports.
#pragma once
#include <stddef.h>
#include <stdint.h>

uint64_t sysmem_peak_rss_bytes(void);  // high-water mark of this process's resident memory
uint64_t sysmem_available_bytes(void); // MemAvailable from /proc/meminfo (0 if unknown)
