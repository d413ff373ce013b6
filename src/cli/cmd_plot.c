// ctitan plot: metrics.jsonl -> a PNG loss curve (training loss, and validation loss when
// logged), drawn by gnuplot.
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli/cli.h"

static const cli_option plot_options[] = {
    {"input", NULL, "metrics.jsonl, or a job.dump_folder that holds one", false},
    {"output", NULL, "PNG to write (default: loss.png beside the metrics)", false},
};

// Splits metrics.jsonl into two whitespace-separated data files gnuplot reads: "step loss" and
// "step val_loss". Returns the number of training rows, or -1.
static int write_series(FILE *train, FILE *val, const char *path, int *n_val, ct_error *err) {
    FILE *f = fopen(path, "r");
    if (!f) return ct_fail(err, "%s: cannot open: %s", path, strerror(errno));
    char line[4096];
    int n = 0, lineno = 0;
    *n_val = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        cJSON *row = cJSON_Parse(line);
        const cJSON *step = cJSON_GetObjectItemCaseSensitive(row, "step");
        const cJSON *loss = cJSON_GetObjectItemCaseSensitive(row, "loss");
        const cJSON *vloss = cJSON_GetObjectItemCaseSensitive(row, "val_loss");
        if (!row || !cJSON_IsNumber(step)) {
            cJSON_Delete(row);
            fclose(f);
            return ct_fail(err, "%s:%d: not a metrics row (a JSON object with \"step\")", path,
                           lineno);
        }
        if (cJSON_IsNumber(loss))
            fprintf(train, "%g %.9g\n", step->valuedouble, loss->valuedouble), n++;
        if (cJSON_IsNumber(vloss))
            fprintf(val, "%g %.9g\n", step->valuedouble, vloss->valuedouble), (*n_val)++;
        cJSON_Delete(row);
    }
    fclose(f);
    if (n == 0) return ct_fail(err, "%s: no training rows with a loss to plot", path);
    return n;
}

int cmd_plot(int argc, char **argv) {
    const int n_opts = sizeof plot_options / sizeof plot_options[0];
    if (cli_wants_help(argc, argv)) {
        cli_print_help("ctitan plot --input RUN_DIR|metrics.jsonl [--output loss.png]",
                       "Draws the loss curve of a run (and its validation loss) as a PNG, with "
                       "gnuplot.",
                       plot_options, n_opts);
        return 0;
    }
    ct_error err;
    cli_args args;
    if (cli_parse(&args, plot_options, n_opts, argc, argv, 0, &err) != 0) return cli_report(&err);
    const char *input = cli_str(&args, "input");
    if (!input) {
        ct_fail(&err, "plot needs --input (a run folder or its metrics.jsonl)");
        return cli_report(&err);
    }
    char metrics[4096], output[4096];
    struct stat sb;
    bool is_dir = stat(input, &sb) == 0 && S_ISDIR(sb.st_mode);
    snprintf(metrics, sizeof metrics, is_dir ? "%s/metrics.jsonl" : "%s", input);
    if (cli_str(&args, "output"))
        snprintf(output, sizeof output, "%s", cli_str(&args, "output"));
    else if (is_dir)
        snprintf(output, sizeof output, "%s/loss.png", input);
    else
        snprintf(output, sizeof output, "loss.png");

    char train_path[] = "/tmp/ctitan-plot-train-XXXXXX", val_path[] = "/tmp/ctitan-plot-val-XXXXXX";
    int fd_t = mkstemp(train_path), fd_v = mkstemp(val_path);
    FILE *train = fd_t >= 0 ? fdopen(fd_t, "w") : NULL, *val = fd_v >= 0 ? fdopen(fd_v, "w") : NULL;
    int n_val = 0, n = -1;
    if (!train || !val)
        ct_fail(&err, "cannot create temporary files in /tmp: %s", strerror(errno));
    else
        n = write_series(train, val, metrics, &n_val, &err);
    if (train) fclose(train);
    if (val) fclose(val);
    int rc = 1;
    if (n > 0) {
        FILE *gp = popen("gnuplot 2>&1", "w");
        if (!gp) {
            ct_fail(&err, "cannot run gnuplot (install gnuplot-nox): %s", strerror(errno));
        } else {
            fprintf(gp,
                    "set terminal pngcairo size 1000,600\nset output '%s'\n"
                    "set title 'ctitan: %s'\nset xlabel 'step'\nset ylabel 'loss'\nset grid\n"
                    "plot '%s' using 1:2 with lines lw 2 title 'train loss'",
                    output, metrics, train_path);
            if (n_val)
                fprintf(gp, ", '%s' using 1:2 with linespoints lw 2 title 'validation loss'",
                        val_path);
            fprintf(gp, "\n");
            int status = pclose(gp);
            if (status != 0 || stat(output, &sb) != 0 || sb.st_size == 0)
                ct_fail(&err, "gnuplot failed to write %s (is gnuplot-nox installed?)", output);
            else {
                printf("plot: %s (%d training points, %d validation points)\n", output, n, n_val);
                rc = 0;
            }
        }
    }
    unlink(train_path);
    unlink(val_path);
    return rc ? cli_report(&err) : 0;
}
