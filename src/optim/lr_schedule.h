// The learning-rate schedule of torchtitan's linear_warmup_stable_decay (lr_scheduler.py):
// linear warmup, a stable phase, then a decay (linear, sqrt or cosine) to min_lr_factor.
#pragma once
#include <stdint.h>

#include "core/error.h"

typedef enum lr_decay_type { LR_DECAY_LINEAR, LR_DECAY_SQRT, LR_DECAY_COSINE } lr_decay_type;

typedef struct lr_schedule_cfg {
    double lr;            // peak learning rate (optimizer.lr)
    int64_t warmup_steps; // lr_scheduler.warmup_steps; 0 = none
    double decay_ratio;   // fraction of the training steps spent decaying, in [0, 1]; 0 = none
    lr_decay_type decay_type;
    double min_lr_factor; // the decay ends at lr * min_lr_factor
} lr_schedule_cfg;

// The multiplier for 0-based step `step` of a run of `total_steps` (torch's LambdaLR passes
// last_epoch, which is 0 for the first step). With W = min(warmup_steps, total),
// D = min(round_half_even(total * decay_ratio), total - W) and S = total + 1 - W - D (torchtitan
// adds one virtual step so the last real step is not at the floor):
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
