// ctitan train: the launcher. The same command trains whatever the config describes.
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "parallel/dist.h"
#include "train/config.h"
#include "train/trainer.h"

static volatile sig_atomic_t stop_requested; // the first stop signal's number
static volatile sig_atomic_t say_notices;    // rank 0 prints what a signal does

static void say(const char *msg) {
    if (say_notices) {
        ssize_t ignored = write(STDERR_FILENO, msg, strlen(msg)); // async-signal-safe
        (void)ignored;
    }
}

// The first SIGINT/SIGTERM/SIGUSR1 asks for a checkpoint after the current step, said at once;
// a second SIGINT (Ctrl-C twice) exits at once without one: the last complete checkpoint stays,
// since saves are atomic.
static void on_stop_signal(int sig) {
    if (stop_requested && sig == SIGINT) {
        say("\nctitan: second interrupt: exiting now without a checkpoint (the last complete "
            "one is kept)\n");
        _exit(128 + SIGINT);
    }
    if (stop_requested) return;
    stop_requested = sig;
    if (sig == SIGINT)
        say("\nctitan: interrupt: stopping after this step with a checkpoint; press Ctrl-C again "
            "to exit now without one\n");
    else
        say("\nctitan: stop signal: stopping after this step with a checkpoint\n");
}

// The exit of every rank. An error all ranks agreed on is printed once, by rank 0; an error of
// this rank alone is printed here and ends the whole job at once, so that no rank waits out its
// comm timeout for a partner that is gone.
static int finish(dist *d, const ct_error *err) {
    if (!err) {
        dist_finalize(d);
        return 0;
    }
    if (d->size > 1 && !d->failure_agreed) {
        if (strncmp(err->msg, "rank ", 5) == 0)
            fprintf(stderr, "ctitan: error: %s\n", err->msg);
        else
            fprintf(stderr, "ctitan: error: rank %d: %s\n", d->rank, err->msg);
        dist_abort(d, 1);
    }
    if (d->rank == 0) cli_report(err);
    dist_finalize(d);
    return 1;
}

int cmd_train(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        printf("usage: ctitan train [--config FILE.toml] [--section.key=value | --section.key "
               "value ...]\n\n"
               "Trains the model the config describes (an HF folder or a native flavor).\n"
               "Precedence: defaults < the TOML file < command-line options. A run whose\n"
               "job.dump_folder holds checkpoints resumes from the newest complete one.\n"
               "SIGINT/SIGTERM/SIGUSR1 write a checkpoint after the current step and exit\n"
               "128 + the signal (130, 143, 138); a second Ctrl-C exits at once without one.\n"
               "Under mpirun send SIGUSR1: mpirun forwards it, but kills the ranks 1 s\n"
               "after forwarding SIGTERM. Exit 0 means the run reached training.steps.\n\n"
               "keys:\n");
        config_print_help(stdout);
        return 0;
    }
    ct_config cfg;
    ct_error err;
    dist d;
    if (dist_init(&d, &err) != 0) return cli_report(&err);
    // Every rank reads the same config, so every rank fails alike: rank 0 says why.
    config_notes notes;
    if (config_load_noted(&cfg, &notes, NULL, argc, argv, &err) != 0) {
        d.failure_agreed = true;
        return finish(&d, &err);
    }
    if (notes.n_no_effect && d.rank == 0)
        printf("config: %d torchtitan key%s with no effect in ctitan, accepted at %s neutral "
               "value%s: %s\n",
               notes.n_no_effect, notes.n_no_effect == 1 ? "" : "s",
               notes.n_no_effect == 1 ? "its" : "their", notes.n_no_effect == 1 ? "" : "s",
               notes.no_effect);

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    // mpirun forwards SIGUSR1 to every rank and lets them finish (Slurm: --signal=USR1@120).
    sigaction(SIGUSR1, &sa, NULL);

    say_notices = d.rank == 0;
    int stopped_by = 0;
    train_options opt = {
        .log = stdout, .stop_flag = &stop_requested, .stopped_by = &stopped_by, .dist = &d};
    int rc = finish(&d, train_run(&cfg, &opt, &err) == 0 ? NULL : &err);
    // 0 only for a run that reached training.steps; a stop by signal N exits 128 + N, as a
    // shell reports a process the signal ended, after its checkpoint (on every rank alike).
    return rc == 0 && stopped_by > 0 ? 128 + stopped_by : rc;
}
