// The types of the backend's collectives (ct_backend's comm_* entries): which group of ranks a
// collective runs on, what its elements are, and a collective in flight. They live here, below
// parallel/, so that the backend owns the calls that read and write its buffers while the
// process groups (parallel/dist.h) stay above it: dist makes a ct_comm for its group
// (dist_comm) and passes it down as an opaque handle. The CPU backends run the collectives on
// MPI (backend_cpu.c); a GPU backend would run them on NCCL over the same handle's group.
#pragma once
#include <stdbool.h>
#include <stddef.h>

// A group of ranks, as the backend sees it. impl is the implementation's communicator (the CPU
// backends: a pointer to the group's MPI_Comm), read when a collective starts; NULL for a world
// of one without MPI, where a collective over the group's one rank completes at once.
typedef struct ct_comm {
    const void *impl;
    int rank, size;
} ct_comm;

// Element types. Every reduction is a sum; a BF16 sum rounds each addition to bf16, as a bf16
// all-reduce does (training.mixed_precision_reduce = "bfloat16").
typedef enum ct_comm_type { CT_COMM_F32, CT_COMM_BF16, CT_COMM_BYTE } ct_comm_type;

static inline size_t ct_comm_type_size(ct_comm_type t) {
    return t == CT_COMM_F32 ? 4 : t == CT_COMM_BF16 ? 2 : 1;
}

// A collective in flight, from its start to the comm_test or comm_wait that completes it (and
// sets the caller's pointer to NULL). NULL is a completed one. Opaque: the backend's.
typedef struct ct_request ct_request;
