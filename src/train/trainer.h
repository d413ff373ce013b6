// The training loop: whatever the config describes (an HF folder or a native flavor), the same
// steps: data -> forward/backward (with gradient accumulation) -> clip -> AdamW -> metrics,
// validation and checkpoints; resume from the newest complete checkpoint.
#pragma once
#include <signal.h>
#include <stdio.h>

#include "core/error.h"
#include "parallel/dist.h"
#include "model/qwen3_config.h"
#include "ops/ops.h"
#include "train/config.h"

typedef struct train_options {
    FILE *log; // progress lines (stdout from the CLI); rank 0 writes them
    // The number of a stop signal (SIGINT, SIGTERM, SIGUSR1) once one arrives: checkpoint after
    // the step and return 0, with *stopped_by set to the signal all ranks agree on.
    volatile sig_atomic_t *stop_flag;
    int *stopped_by; // may be NULL
    dist *dist;      // the ranks of a data-parallel job; NULL = one process
} train_options;

// Runs the training job; returns 0 when it finished or was stopped cleanly by a signal (a
// checkpoint was written; *opt->stopped_by says which signal), -1 with err set otherwise. With
// several ranks, an error that every rank returned alike sets dist->failure_agreed; any other error
// leaves the others waiting until their comm timeout, so the caller should end the job
// (dist_abort). Refuses before any work when seq_len exceeds the model's positions or the memory
// estimate does not fit (unless training.allow_overcommit).
int train_run(const ct_config *c, const train_options *opt, ct_error *err);
