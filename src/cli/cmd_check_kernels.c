// ctitan check-kernels: only the parity check that train and verify run before they trust a
// plugin's kernels, with its table (or JSON). The model whose shapes the check mirrors comes
// from the same config as `ctitan train` (the debugmodel flavor by default).
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "io/json.h"
#include "train/config.h"
#include "train/run_setup.h"

// Which ops the plugins override, for the JSON.
static void overrides_json(const override_set *s, FILE *f) {
    fputc('[', f);
    bool first = true;
    for (int i = 0; i < OVERRIDE_N_OPS; i++) {
        const override_entry *e = &s->ops[i];
        if (!e->set) continue;
        fprintf(f, "%s{\"op\": \"%s\", \"library\": ", first ? "" : ", ",
                override_op_name((override_op)i));
        json_write_string(f, s->libs[e->lib], strlen(s->libs[e->lib]), 0);
        fprintf(f, ", \"forward_only\": %s}", e->forward_only ? "true" : "false");
        first = false;
    }
    fputc(']', f);
}

static int check(const ct_config *cfg, bool json, ct_error *err) {
    if (!cfg->override.imports[0])
        return ct_fail(err, "check-kernels needs --override.imports LIB.so[,LIB2.so]");
    // The run setup of train and verify, stopping at the check: the same model, kernels and
    // reference table; nothing is refused or applied here.
    run_setup setup;
    run_setup_opts so = {.log = json ? NULL : stdout, .check_only = true};
    if (run_setup_open(&setup, cfg, &so, err) != 0) return -1;
    const kernel_check_report *r = &setup.check;
    if (json) {
        fputs("{\"overrides\": ", stdout);
        overrides_json(&setup.overrides, stdout);
        fputs(", \"check\": ", stdout);
        kernel_check_json(r, stdout);
        fputs("}\n", stdout);
    }
    char why[512];
    kernel_check_first_failure(r, why, sizeof why);
    int rc = 0;
    if (r->crashed)
        rc = ct_fail(err, "a plugin crashed in the parity check: %s", r->crash);
    else if (!r->passed)
        rc = ct_fail(err, "the parity check failed: %s", why);
    run_setup_close(&setup);
    return rc;
}

int cmd_check_kernels(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        printf("usage: ctitan check-kernels --override.imports LIB.so[,LIB2.so] [--json]\n"
               "                            [--config FILE.toml] [--section.key=value ...]\n\n"
               "Loads the plugins and runs each op they override against the built-in op on\n"
               "random inputs, forward and backward, in a child process: one shaped like the\n"
               "model the config describes (the debugmodel flavor by default; one sequence of\n"
               "min(training.seq_len, 256) tokens, at most 16 experts) and one of awkward\n"
               "small sizes. Prints max abs and max relative (normwise) difference per output\n"
               "and gradient, pass/FAIL against the op's tolerance, and the speed against the\n"
               "built-in. Exits 1 when any check fails or the plugin crashes. --json prints\n"
               "one JSON object instead of the table. Every `ctitan train` key is accepted.\n");
        return 0;
    }
    // --json is ours; every other word is the training config, whose data check-kernels does
    // not read (no training.dataset_path needed).
    static const cli_option own[] = {
        {"json", "false", "print one JSON object instead of the table", true}};
    static const config_use use = {.command = "check-kernels"};
    cli_args args;
    ct_config cfg;
    ct_error err;
    if (cli_parse_config(&args, &cfg, &use, own, 1, argc, argv, &err) != 0 ||
        check(&cfg, cli_flag(&args, "json"), &err) != 0)
        return cli_report(&err);
    return 0;
}
