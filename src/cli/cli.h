// The CLI: one binary, one entry point per subcommand (src/cli/cmd_*.c), and one option
// parser shared by all of them. Options take `--key=value` and `--key value` alike; an unknown
// option is an error that suggests the closest valid one.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "train/config.h"

typedef struct cli_option {
    const char *key;           // "model.hf_path" (given as --model.hf_path)
    const char *default_value; // NULL = no default; for flags "false"
    const char *help;
    bool is_flag; // takes no value: --json (or --json=true/false)
} cli_option;

typedef struct cli_args {
    const cli_option *opts;
    int n_opts;
    const char *values[64]; // per option; default_value when not given
    bool given[64];
    const char *positional[16];
    int n_positional;
} cli_args;

// Parses argv[0..argc) (the words after the subcommand). `max_positional` bounds the
// non-option words. `--help` is handled by the caller (see cli_wants_help).
int cli_parse(cli_args *a, const cli_option *opts, int n_opts, int argc, char **argv,
              int max_positional, ct_error *err);
bool cli_wants_help(int argc, char **argv);
// The command line of a subcommand that takes config keys: its own options (opts: --prompt,
// --json) into `a`, and the keys `u` names into `c` through config_load_use, with the key
// table's defaults, checks and messages. A word is the command's when its key is one of opts;
// every other word is the config's. u->ctx, when u->fix is set, may be `a`: it is parsed first.
int cli_parse_config(cli_args *a, ct_config *c, const config_use *u, const cli_option *opts,
                     int n_opts, int argc, char **argv, ct_error *err);
const char *cli_str(const cli_args *a, const char *key);
int cli_int(int64_t *out, const cli_args *a, const char *key, ct_error *err);
bool cli_flag(const cli_args *a, const char *key);
void cli_print_help(const char *usage, const char *summary, const cli_option *opts, int n_opts);
// cli_print_help that also lists the config keys `u` takes, with the table's help and default.
void cli_print_help_keys(const char *usage, const char *summary, const cli_option *opts, int n_opts,
                         const config_use *u);
// Prints "ctitan: error: <msg>" to stderr and returns the exit code 1.
int cli_report(const ct_error *err);

// --checkpoint DIR: DIR itself when it is a checkpoint (has state.json), else the newest
// complete step-N checkpoint under it (skipped incomplete ones are warned about on stderr).
int cli_resolve_checkpoint(char *dir, size_t cap, const char *given, ct_error *err);
// A command's --checkpoint DIR (generate, eval): dir gets the resolved folder, and c takes its
// model (backend "hf" on the folder: its config.json and model.safetensors) and, as its default
// tokenizer, the run's (its config.toml's model.tokenizer_path).
int cli_use_checkpoint(ct_config *c, char *dir, size_t cap, const char *given, ct_error *err);

// Subcommands. Each returns the process exit code.
// Runs this process again with its own arguments, as main received them (libgomp reads its
// settings from the environment once, when it is loaded); returns only when it could not.
void cli_exec_self(void);

int cmd_train(int argc, char **argv);
int cmd_verify(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_plot(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_export(int argc, char **argv);
int cmd_check_kernels(int argc, char **argv);
int cmd_generate(int argc, char **argv);
