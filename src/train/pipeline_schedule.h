// Pipeline parallelism's plan as data (pipeline_schedule.c): the schedule's name, the stages'
// layers (torchtitan's default split or module_fqns_per_model_part), and each rank's ordered
// list of actions (a stage's forward or backward of one micro-batch), as torchtitan's schedules
// (PyTorch's ScheduleGPipe, Schedule1F1B, ScheduleInterleaved1F1B) order them. No process
// knowledge: strategy_pp.c runs the lists.
#pragma once
#include <stdbool.h>

#include "core/error.h"

typedef enum { PP_1F1B, PP_GPIPE, PP_INTERLEAVED_1F1B } pp_schedule_kind;

// The most stages one rank holds.
#define PP_MAX_LOCAL 8
// The implemented names, for messages.
#define PP_SCHEDULES "1F1B, GPipe, Interleaved1F1B"

// name (case-insensitive) -> kind; an unknown or unimplemented one is an error naming
// parallelism.pipeline_parallel_schedule and the implemented names.
int pp_schedule_parse(const char *name, pp_schedule_kind *kind, ct_error *err);
// Stages per rank a schedule places by default: 1 (1F1B, GPipe) or 2 (looped).
int pp_schedule_stages_per_rank(pp_schedule_kind kind);

// One stage: the embedding (first stage), decoder layers [lo, hi), the norm and head (last).
typedef struct pp_stage {
    bool embed, head;
    int lo, hi;
} pp_stage;

// The stages of a model of n_layers layers for pp ranks: from `fqns` (module_fqns_per_model_part
// as stored: ';' between stages, ',' between names) when not empty, else torchtitan's default
// split into layers_per_stage-sized stages (0: pp * stages_per_rank stages) with the embedding
// counting first_less layers and the head last_less. Errors (one line, naming the keys): too few
// layers for the stages, a stage without a decoder layer, a stage count that pp does not divide
// (or, single-stage schedules, other than pp), bad or out-of-order names. *n_stages <= max.
int pp_split(pp_stage *stages, int max, int *n_stages, int n_layers, int pp, pp_schedule_kind kind,
             int layers_per_stage, int first_less, int last_less, const char *fqns,
             ct_error *err);

// One action of a rank's list.
typedef struct pp_action {
    int stage; // global stage index
    bool backward;
    int mb; // micro-batch
} pp_action;

// Rank `rank` of pp's actions for n_stages stages (loop placement: stage s on rank s % pp) and m
// micro-batches: 2 * m * n_stages / pp of them into out. Errors: Interleaved1F1B with m not a
// multiple of its rounds (max(1, m / pp)).
int pp_schedule_actions(pp_schedule_kind kind, int pp, int rank, int n_stages, int m,
                        pp_action *out, ct_error *err);

// The most forwards of a rank's list of n actions whose backward has not run yet, at any point:
// the activation sets the rank keeps (1F1B: min(m, S - stage) on a single-stage rank; GPipe: m).
int pp_schedule_in_flight(const pp_action *actions, int n);
