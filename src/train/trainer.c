// The training loop (steps, metrics, validation, checkpoints, stop signals) and train_run. The
// setup is in trainer_setup.c, the step in trainer_step.c, validation and metrics in
// trainer_metrics.c, checkpoints in trainer_checkpoint.c.
#include "train/trainer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "ops/ops_profile.h"
#include "train/trainer_internal.h"

// The signal every rank exits with: the highest any rank received, so that all agree.
static int agreed_signal(trainer *t, int mine, ct_error *err) {
    int *all = calloc((size_t)t->world->size, sizeof *all);
    if (!all) return ct_fail(err, "out of memory"), -1;
    int sig = -1;
    if (dist_allgather(t->world, &mine, all, sizeof mine, "the stop signal", err) == 0) {
        sig = 0;
        for (int r = 0; r < t->world->size; r++) sig = all[r] > sig ? all[r] : sig;
    }
    free(all);
    return sig;
}

static int train_loop(trainer *t, const train_options *opt, ct_error *err) {
    const ct_config *c = t->cfg;
    double t_resume = ct_now_s(), t_start = t_resume - t->state.time_s, t_log = t_resume;
    double comm_since_log[2] = {0, 0}, t_profile = t_resume; // exposed, hidden
    int64_t steps_since_log = 0, skipped_total = 0, start_step = t->state.step;
    while (t->state.step < c->training.steps) {
        t->d->timeout_s = c->comm.train_timeout_seconds;
        step_result r;
        if (trainer_step(t, &r, err) != 0) return -1;
        steps_since_log++;
        comm_since_log[0] += r.comm_s;
        comm_since_log[1] += r.comm_hidden_s;
        if (r.no_tokens) {
            skipped_total++;
            fprintf(t->log,
                    "step %lld: no token of the step's samples is trained (every target is "
                    "masked); step skipped\n",
                    (long long)t->state.step);
        } else if (r.skipped) {
            skipped_total++;
            t->state.skipped_in_row++;
            fprintf(t->log, "step %lld: non-finite %s; step skipped (%d in a row)\n",
                    (long long)t->state.step, isfinite(r.loss) ? "gradient norm" : "loss",
                    t->state.skipped_in_row);
            if (t->state.skipped_in_row > c->training.max_skipped_steps) {
                t->d->failure_agreed = true; // every rank saw the same sums and stops here
                return ct_fail(err,
                               "%d non-finite steps in a row (training.max_skipped_steps = %d): "
                               "stopping; the last checkpoint holds the last finite weights",
                               t->state.skipped_in_row, c->training.max_skipped_steps);
            }
        } else {
            t->state.skipped_in_row = 0;
        }
        int64_t step = t->state.step;
        t->state.time_s = ct_now_s() - t_start;
        if (c->debug.profile_ops && step == start_step + 1 && step < c->training.steps) {
            ops_profile_reset(); // the first step warms up caches and thread pools
            t_profile = ct_now_s();
        }
        if (step % c->metrics.log_freq == 0 || step == 1 || step == c->training.steps)
            trainer_log_metrics(t, &r, t_resume, &t_log, &steps_since_log, comm_since_log,
                                start_step, skipped_total);
        if (t->has_val && step % c->validation.freq == 0 && trainer_validate(t, err) != 0)
            return -1;
        // A signal may reach the ranks at different steps: any rank's stop stops them all here
        // (every rank of the world: under TP a save is a collective of the TP groups too).
        double stop = opt->stop_flag && *opt->stop_flag;
        if (dist_sum(t->world, stop, &stop, "the stop check", err) != 0) return -1;
        t->d->timeout_s = c->comm.checkpoint_timeout_seconds;
        if (c->checkpoint.enable &&
            (step % c->checkpoint.interval == 0 || stop > 0 || step == c->training.steps)) {
            if (trainer_save_checkpoint(t, err) != 0) return -1;
        }
        if (stop > 0) {
            int sig = agreed_signal(t, opt->stop_flag ? *opt->stop_flag : 0, err);
            if (sig < 0) return -1;
            if (opt->stopped_by) *opt->stopped_by = sig;
            fprintf(t->log, "stopped by signal %d at step %lld; the checkpoint of step %lld %s\n",
                    sig, (long long)step, (long long)step,
                    c->checkpoint.enable ? "resumes the run"
                                         : "was not saved (checkpoint.enable "
                                           "is false)");
            return 0;
        }
    }
    if (c->debug.profile_ops) {
        // Steps after the warm-up; the checkpoint saves in between count as "other".
        const int64_t n = t->state.step - start_step - (t->state.step - start_step > 1);
        if (n > 0) ops_profile_print(t->log, (ct_now_s() - t_profile) / (double)n, (int)n);
    }
    trainer_log_comm_volume(t, t->state.step - start_step);
    t->d->timeout_s = c->comm.checkpoint_timeout_seconds;
    if (c->checkpoint.last_save_in_hf && trainer_export_final(t, err) != 0) return -1;
    return 0;
}

int train_run(const ct_config *c, const train_options *opt, ct_error *err) {
    dist single;
    trainer t = {.d = opt->dist};
    if (!t.d) { // a world of one: no launcher, no MPI
        memset(&single, 0, sizeof single);
        single.size = single.local_size = 1;
        t.d = &single;
    }
    int rc = trainer_setup(&t, c, opt->log, err);
    if (rc == 0) rc = train_loop(&t, opt, err);
    if (rc == 0) override_report_calls(&t.setup.overrides, t.log);
    if (rc == 0)
        fprintf(t.log, "done: step %lld; outputs in %s (metrics.jsonl, config.toml%s)\n",
                (long long)t.state.step, c->job.dump_folder,
                c->checkpoint.enable ? ", checkpoint/" : "");
    trainer_free(&t);
    return rc;
}
