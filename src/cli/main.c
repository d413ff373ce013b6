// ctitan: one launcher, one subcommand per file (src/cli/cmd_*.c).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "core/suggest.h"

typedef struct subcommand {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} subcommand;

static const subcommand subcommands[] = {
    {"train", cmd_train, "train the model a config describes (HF folder or native flavor)"},
    {"verify", cmd_verify, "one forward+backward of an HF model on tokens: loss, grad norm"},
    {"eval", cmd_eval,
     "loss and perplexity of a model over a dataset, forward only (train's config and data)"},
    {"plot", cmd_plot, "draw a run's loss curve (metrics.jsonl) as a PNG with gnuplot"},
    {"inspect", cmd_inspect, "list and validate the tensors of a safetensors file or HF folder"},
    {"tokenize", cmd_tokenize,
     "text (.txt, .jsonl) to token ids (.npy, .jsonl) with a tokenizer.json"},
    {"generate", cmd_generate,
     "sample text from an HF folder or checkpoint: a prompt, a JSONL of prompts, or a chat"},
    {"export", cmd_export, "a training checkpoint as a Hugging Face folder (for transformers)"},
    {"check-kernels", cmd_check_kernels,
     "check plugin kernels (--override.imports) against the built-in ops"},
};
static const int n_subcommands = sizeof subcommands / sizeof subcommands[0];

static void print_usage(void) {
    printf("ctitan %s: train Qwen3 models in C\n\n"
           "usage: ctitan SUBCOMMAND [--key=value | --key value ...]\n\nsubcommands:\n",
           CTITAN_VERSION);
    for (int i = 0; i < n_subcommands; i++)
        printf("  %-13s %s\n", subcommands[i].name, subcommands[i].summary);
    printf("\n  ctitan SUBCOMMAND --help   lists that subcommand's options and defaults\n"
           "  ctitan --version          prints the version\n");
}

// OpenMP threads that spin between parallel regions (libgomp's default, for a while) take the
// cores from OpenBLAS's own threads (its pthread build) during every GEMM that follows: on 2
// cores a training step measured 13-15% slower than with OMP_WAIT_POLICY=passive, and 40% slower
// with "active". OpenBLAS's OpenMP build, which ctitan links when installed, runs on these same
// threads, and there training measured the same with either policy (docs/performance.md).
// libgomp reads the variable when it is loaded, before main, so ctitan sets it and executes
// itself again, once; a policy the user set is kept.
// CTITAN_OMP_PASSIVE marks the policy as ctitan's, which a command may change (cli_exec_self).
static char **self_argv;

static void prefer_passive_omp_threads(void) {
    if (getenv("OMP_WAIT_POLICY")) return;
    setenv("OMP_WAIT_POLICY", "passive", 1);
    setenv("CTITAN_OMP_PASSIVE", "1", 1);
    execv("/proc/self/exe", self_argv);
    // No /proc: go on with libgomp's default.
}

void cli_exec_self(void) {
    execv("/proc/self/exe", self_argv);
}

int main(int argc, char **argv) {
    self_argv = argv;
    prefer_passive_omp_threads();
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
        strcmp(argv[1], "help") == 0) {
        print_usage();
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("ctitan %s\n", CTITAN_VERSION);
        return 0;
    }
    for (int i = 0; i < n_subcommands; i++)
        if (strcmp(argv[1], subcommands[i].name) == 0)
            return subcommands[i].run(argc - 2, argv + 2);

    const char *names[16];
    for (int i = 0; i < n_subcommands; i++) names[i] = subcommands[i].name;
    const char *close = suggest_closest(argv[1], names, n_subcommands);
    ct_error err;
    if (close)
        ct_fail(&err, "unknown subcommand '%s' (did you mean '%s'?)", argv[1], close);
    else
        ct_fail(&err, "unknown %s '%s' (see ctitan --help)",
                argv[1][0] == '-' ? "option" : "subcommand", argv[1]);
    return cli_report(&err);
}
