// The learning-rate schedule of torchtitan's linear_warmup_stable_decay (lr_scheduler.py):
// linear warmup, a stable phase, then a decay (linear, sqrt or cosine) to min_lr_factor.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "core/error.h"

typedef enum lr_decay_type { LR_DECAY_LINEAR, LR_DECAY_SQRT, LR_DECAY_COSINE } lr_decay_type;

typedef struct lr_schedule_cfg {
    double lr;            // peak learning rate (optimizer.lr)
    int64_t warmup_steps; // lr_scheduler.warmup_steps; 0 = none
    // Fraction of the steps spent decaying, in [0, 1]; NAN = unset, as torchtitan's None:
    // decay over every step after the warmup.
    double decay_ratio;
    lr_decay_type decay_type;
    double min_lr_factor; // the decay ends at lr * min_lr_factor
} lr_schedule_cfg;

// build_lr_schedulers' phase lengths for a run of `total` steps: W = min(warmup_steps, total);
// D = min(round_half_even(total * decay_ratio), total - W), or total - W when decay_ratio is
// unset; S = total + 1 - W - D (torchtitan adds one virtual step so the last real step is not at
// the floor). The clamped flags say where torchtitan warns.
typedef struct lr_phases {
    int64_t warmup, stable, decay;
    bool warmup_clamped, decay_clamped;
} lr_phases;
lr_phases lr_phases_of(const lr_schedule_cfg *c, int64_t total);

// The multiplier for 0-based step `step` of a run of `total_steps` (torch's LambdaLR passes
// last_epoch, which is 0 for the first step), with W, S, D of lr_phases_of:
//   step < W:       (step + 1) / W
//   step < W + S:   1
//   otherwise:      p = (step + 1 - (W + S)) / D, f = 1 - p | 1 - sqrt(p) | (1 + cos(pi p)) / 2,
//                   min_lr_factor + (1 - min_lr_factor) * f
// W = 0 and D = 0 give a constant 1. Steps past total_steps are taken as total_steps.
double lr_factor(const lr_schedule_cfg *c, int64_t step, int64_t total_steps);
// c->lr * lr_factor(...), the product LambdaLR forms.
double lr_at(const lr_schedule_cfg *c, int64_t step, int64_t total_steps);

// "linear", "sqrt", "cosine"; anything else is an error listing them.
int lr_decay_parse(lr_decay_type *out, const char *name, ct_error *err);
const char *lr_decay_name(lr_decay_type t);
