#include "cli/cli.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/suggest.h"
#include "checkpoint/checkpoint.h"
#include "io/json.h"

static int option_index(const cli_option *opts, int n, const char *key, size_t key_len) {
    for (int i = 0; i < n; i++)
        if (strlen(opts[i].key) == key_len && strncmp(opts[i].key, key, key_len) == 0) return i;
    return -1;
}

static int unknown_option(const cli_option *opts, int n, const char *arg, size_t key_len,
                          ct_error *err) {
    char key[128];
    snprintf(key, sizeof key, "%.*s", (int)(key_len < 127 ? key_len : 127), arg);
    const char *names[64];
    for (int i = 0; i < n && i < 64; i++) names[i] = opts[i].key;
    const int m = n < 64 ? n : 64;
    const char *close = suggest_closest(key, names, m);
    // train's dotted name of an option a subcommand spells short (tokenize's
    // --model.tokenizer_path for --tokenizer): the last part, or an option it starts with.
    const char *tail = strrchr(key, '.');
    if (!close && tail) close = suggest_closest(++tail, names, m);
    for (int i = 0; !close && tail && i < m; i++)
        if (strlen(names[i]) >= 4 && strncmp(tail, names[i], strlen(names[i])) == 0)
            close = names[i];
    if (close) return ct_fail(err, "unknown option --%s (did you mean --%s?)", key, close);
    return ct_fail(err, "unknown option --%s (see --help)", key);
}

int cli_parse(cli_args *a, const cli_option *opts, int n_opts, int argc, char **argv,
              int max_positional, ct_error *err) {
    memset(a, 0, sizeof *a);
    if (n_opts > 64) return ct_fail(err, "internal: too many options (%d > 64)", n_opts);
    a->opts = opts;
    a->n_opts = n_opts;
    for (int i = 0; i < n_opts; i++) a->values[i] = opts[i].default_value;
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        if (strncmp(arg, "--", 2) != 0 || arg[2] == '\0') {
            if (a->n_positional >= max_positional || a->n_positional >= 16)
                return ct_fail(err, "unexpected argument '%s'", arg);
            a->positional[a->n_positional++] = arg;
            continue;
        }
        const char *key = arg + 2, *eq = strchr(key, '=');
        size_t key_len = eq ? (size_t)(eq - key) : strlen(key);
        int k = option_index(opts, n_opts, key, key_len);
        if (k < 0) return unknown_option(opts, n_opts, key, key_len, err);
        const char *value;
        if (eq) {
            value = eq + 1;
        } else if (opts[k].is_flag) {
            value = "true";
        } else {
            if (i + 1 >= argc) return ct_fail(err, "option --%s needs a value", opts[k].key);
            value = argv[++i];
        }
        if (opts[k].is_flag && strcmp(value, "true") != 0 && strcmp(value, "false") != 0)
            return ct_fail(err, "option --%s: expected true or false, found '%s'", opts[k].key,
                           value);
        if (a->given[k]) return ct_fail(err, "option --%s given twice", opts[k].key);
        a->values[k] = value;
        a->given[k] = true;
    }
    return 0;
}

bool cli_wants_help(int argc, char **argv) {
    for (int i = 0; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) return true;
    return false;
}

const char *cli_str(const cli_args *a, const char *key) {
    int k = option_index(a->opts, a->n_opts, key, strlen(key));
    return k < 0 ? NULL : a->values[k];
}

int cli_int(int64_t *out, const cli_args *a, const char *key, ct_error *err) {
    const char *s = cli_str(a, key);
    if (!s) return ct_fail(err, "option --%s is required", key);
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end != '\0')
        return ct_fail(err, "option --%s: expected an integer, found '%s'", key, s);
    *out = v;
    return 0;
}

bool cli_flag(const cli_args *a, const char *key) {
    const char *s = cli_str(a, key);
    return s && strcmp(s, "true") == 0;
}

static void print_option(const char *key, bool is_flag, const char *help, const char *def) {
    char left[96];
    snprintf(left, sizeof left, "--%s%s", key, is_flag ? "" : " VALUE");
    printf("  %-34s %s", left, help);
    if (def && def[0] && !is_flag) printf(" (default: %s)", def);
    printf("\n");
}

void cli_print_help_keys(const char *usage, const char *summary, const cli_option *opts, int n_opts,
                         const config_use *u) {
    printf("usage: %s\n\n%s\n\noptions:\n", usage, summary);
    for (int i = 0; i < n_opts; i++)
        print_option(opts[i].key, opts[i].is_flag, opts[i].help, opts[i].default_value);
    for (int i = 0; u && i < u->n_keys; i++) {
        const config_key *k = config_find_key(u->keys[i]);
        if (k) print_option(u->keys[i], k->type == CONFIG_BOOL, k->help, k->def);
    }
    printf("  %-34s %s\n", "--help", "show this help");
}

void cli_print_help(const char *usage, const char *summary, const cli_option *opts, int n_opts) {
    cli_print_help_keys(usage, summary, opts, n_opts, NULL);
}

int cli_parse_config(cli_args *a, ct_config *c, const config_use *u, const cli_option *opts,
                     int n_opts, int argc, char **argv, ct_error *err) {
    // Two lists of words, the command's and the config's; any count of arguments.
    char **own = malloc((size_t)(argc + 1) * sizeof *own);
    char **keys = malloc((size_t)(argc + 1) * sizeof *keys);
    const char *names[64];
    int n_own = 0, n_keys = 0, rc = -1;
    if (!own || !keys) {
        ct_fail(err, "out of memory for %d arguments", argc);
        goto done;
    }
    for (int i = 0; i < argc; i++) {
        const bool dashed = strncmp(argv[i], "--", 2) == 0;
        const char *key = argv[i] + (dashed ? 2 : 0), *eq = strchr(key, '=');
        const size_t len = eq ? (size_t)(eq - key) : strlen(key);
        const int k = dashed ? option_index(opts, n_opts, key, len) : -1;
        if (k < 0) {
            keys[n_keys++] = argv[i];
            continue;
        }
        own[n_own++] = argv[i];
        if (!eq && !opts[k].is_flag && i + 1 < argc) own[n_own++] = argv[++i];
    }
    for (int i = 0; i < n_opts && i < 64; i++) names[i] = opts[i].key;
    config_use use = *u;
    use.own = names;
    use.n_own = n_opts < 64 ? n_opts : 64;
    if (cli_parse(a, opts, n_opts, n_own, own, 0, err) == 0 &&
        config_load_use(c, NULL, &use, NULL, n_keys, keys, err) == 0)
        rc = 0;
done:
    free(own);
    free(keys);
    return rc;
}

int cli_report(const ct_error *err) {
    const char *line = err->msg;
    do {
        size_t n = strcspn(line, "\n");
        fprintf(stderr, "ctitan: error: %.*s\n", (int)n, line);
        line += n + (line[n] == '\n');
    } while (*line);
    return 1;
}

static void print_notes(ckpt_notes *notes) {
    for (int i = 0; i < notes->n; i++) fprintf(stderr, "ctitan: warning: %s\n", notes->msgs[i]);
    ckpt_notes_free(notes);
}

// DIR is a checkpoint (it has state.json) or holds step-N folders.
int cli_resolve_checkpoint(char *dir, size_t cap, const char *given, ct_error *err) {
    char state[4096];
    struct stat sb;
    snprintf(state, sizeof state, "%s/state.json", given);
    if (stat(state, &sb) == 0) {
        if (snprintf(dir, cap, "%s", given) >= (int)cap) return ct_fail(err, "path too long");
        return 0;
    }
    if (stat(given, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return ct_fail(err, "--checkpoint %s: no such folder", given);
    ckpt_notes notes = {0};
    int found = ckpt_find_latest(dir, cap, NULL, given, NULL, &notes, err);
    print_notes(&notes);
    if (found < 0) return -1;
    if (found == 0)
        return ct_fail(err,
                       "--checkpoint %s: not a checkpoint (no state.json) and holds no "
                       "complete step-N checkpoint",
                       given);
    return 0;
}

int cli_use_checkpoint(ct_config *c, char *dir, size_t cap, const char *given, ct_error *err) {
    if (cli_resolve_checkpoint(dir, cap, given, err) != 0) return -1;
    if (strlen(dir) >= sizeof c->model.hf_path)
        return ct_fail(err, "--checkpoint %s: the path is longer than %zu characters", given,
                       sizeof c->model.hf_path - 1);
    snprintf(c->model.backend, sizeof c->model.backend, "hf");
    snprintf(c->model.hf_path, sizeof c->model.hf_path, "%s", dir);
    char path[4200], *toml = NULL;
    size_t len;
    snprintf(path, sizeof path, "%s/config.toml", dir);
    if (file_read_all(&toml, &len, path, 1 << 20, err) != 0)
        return ct_wrap(err, "--checkpoint %s", given);
    ckpt_tokenizer_dir(c->model.tokenizer_path, sizeof c->model.tokenizer_path, toml);
    free(toml);
    return 0;
}
