// ctitan train: the launcher. The same command trains whatever the config describes.
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "train/config.h"
#include "train/trainer.h"

static volatile sig_atomic_t stop_requested;

static void on_stop_signal(int sig) {
    (void)sig;
    stop_requested = 1;
}

int cmd_train(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        printf("usage: ctitan train [--config FILE.toml] [--section.key=value | --section.key "
               "value ...]\n\n"
               "Trains the model the config describes (an HF folder or a native flavor).\n"
               "Precedence: defaults < the TOML file < command-line options. A run whose\n"
               "job.dump_folder holds checkpoints resumes from the newest complete one.\n"
               "SIGINT/SIGTERM write a checkpoint at the current step and exit 0.\n\n"
               "keys:\n");
        config_print_help(stdout);
        return 0;
    }
    ct_config cfg;
    ct_error err;
    if (config_load(&cfg, NULL, argc, argv, &err) != 0) return cli_report(&err);

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    train_options opt = {.log = stdout, .stop_flag = &stop_requested};
    if (train_run(&cfg, &opt, &err) != 0) return cli_report(&err);
    return 0;
}
