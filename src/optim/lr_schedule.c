// torchtitan's linear_warmup_stable_decay, with its phase lengths computed as
// build_lr_schedulers does. Every expression keeps torchtitan's order in double, so the factors
// equal the Python ones bit for bit (tests/test_optim.c compares them).
#include "optim/lr_schedule.h"

#include <math.h>
#include <string.h>

static const char *const DECAY_NAMES[] = {"linear", "sqrt", "cosine"};

lr_phases lr_phases_of(const lr_schedule_cfg *c, int64_t total) {
    lr_phases p = {0};
    if (total < 0) total = 0;
    p.warmup = c->warmup_steps < 0 ? 0 : c->warmup_steps;
    if (p.warmup > total) p.warmup = total, p.warmup_clamped = true;
    if (isnan(c->decay_ratio)) {
        p.decay = total - p.warmup;
    } else {
        // Python's round() is half-to-even, as is nearbyint in the default rounding mode.
        double ratio = c->decay_ratio > 0 ? c->decay_ratio : 0;
        p.decay = (int64_t)nearbyint((double)total * ratio);
        if (p.warmup + p.decay > total) p.decay = total - p.warmup, p.decay_clamped = true;
    }
    p.stable = total + 1 - p.warmup - p.decay;
    return p;
}

double lr_factor(const lr_schedule_cfg *c, int64_t step, int64_t total_steps) {
    int64_t total = total_steps > 0 ? total_steps : 0;
    lr_phases ph = lr_phases_of(c, total);
    int64_t warmup = ph.warmup, stable = ph.stable, decay = ph.decay;
    if (step < 0) step = 0;
    if (step > total) step = total;

    if (step < warmup) return (double)(step + 1) / (double)warmup;
    if (step < warmup + stable) return 1.0; // also every step when decay == 0
    double progress = (double)(step + 1 - (warmup + stable)) / (double)decay;
    double f;
    switch (c->decay_type) {
    case LR_DECAY_SQRT:
        f = 1 - sqrt(progress);
        break;
    case LR_DECAY_COSINE:
        f = 0.5 * (1.0 + cos(M_PI * progress));
        break;
    default:
        f = 1 - progress;
        break;
    }
    return c->min_lr_factor + (1 - c->min_lr_factor) * f;
}

double lr_at(const lr_schedule_cfg *c, int64_t step, int64_t total_steps) {
    return c->lr * lr_factor(c, step, total_steps);
}

int lr_decay_parse(lr_decay_type *out, const char *name, ct_error *err) {
    for (int i = 0; i < 3; i++)
        if (strcmp(name, DECAY_NAMES[i]) == 0) {
            *out = (lr_decay_type)i;
            return 0;
        }
    return ct_fail(err,
                   "lr_scheduler.decay_type: expected \"linear\", \"sqrt\" or \"cosine\", "
                   "found \"%s\"",
                   name);
}

const char *lr_decay_name(lr_decay_type t) {
    return (unsigned)t < 3 ? DECAY_NAMES[t] : "?";
}
