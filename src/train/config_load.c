// Loading a training config: defaults, then the TOML file, then the command line, with every
// problem collected and reported at once, torchtitan's keys and aliases (config_compat.c), and
// "did you mean" suggestions. The key table and the value parsing are in config.c.
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/suggest.h"
#include "io/toml.h"
#include "train/config_internal.h"

// "did you mean ...?" for an unknown key: a known hint first ("training.dtype" means
// mixed_precision_param), then the closest key of the same section (torchtitan's inert keys
// included), then the same key under another section, then the closest key anywhere.
static void suggest_key(char *out, size_t cap, const char *section, const char *key, bool cli) {
    char full[256];
    snprintf(full, sizeof full, "%s.%s", section, key);
    const char *pre = cli ? " (did you mean --" : " (did you mean ";
    const char *hint = config_compat_hint(full);
    out[0] = '\0';
    if (hint) {
        const char *dot = strrchr(hint, '.');
        if (cli)
            snprintf(out, cap, "%s%s?)", pre, hint);
        else if (strncmp(hint, section, strlen(section)) == 0 && hint[strlen(section)] == '.')
            snprintf(out, cap, "%s%s?)", pre, dot + 1);
        else
            snprintf(out, cap, " (did you mean %s in [%.*s]?)", dot + 1, (int)(dot - hint), hint);
        return;
    }
    const char *names[CONFIG_MAX_KEYS + 64];
    int n = 0;
    for (int i = 0; i < config_n_keys; i++)
        if (strcmp(config_table[i].section, section) == 0) names[n++] = config_table[i].key;
    n += config_compat_inert_names(names + n, 64, section);
    const char *close = n ? suggest_closest(key, names, n) : NULL;
    if (close) {
        if (cli)
            snprintf(out, cap, "%s%s.%s?)", pre, section, close);
        else
            snprintf(out, cap, "%s%s?)", pre, close);
        return;
    }
    // The key may exist under another section ([training] seed is [debug] seed), or begin a
    // key there (warmup: lr_scheduler.warmup_steps).
    size_t key_len = strlen(key);
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < config_n_keys; i++) {
            const char *other = config_table[i].key;
            bool match = pass == 0 ? strcmp(other, key) == 0
                                   : strncmp(other, key, key_len) == 0 && other[key_len] == '_';
            if (!match) continue;
            if (cli)
                snprintf(out, cap, "%s%s.%s?)", pre, config_table[i].section, other);
            else if (pass == 0)
                snprintf(out, cap, " (it belongs in [%s])", config_table[i].section);
            else
                snprintf(out, cap, " (did you mean %s in [%s]?)", other, config_table[i].section);
            return;
        }
    }
    if (!cli) return;
    char buf[CONFIG_MAX_KEYS][96];
    for (int i = 0; i < config_n_keys; i++) {
        config_full_name(buf[i], sizeof buf[i], &config_table[i]);
        names[i] = buf[i];
    }
    close = suggest_closest(full, names, config_n_keys);
    if (close) snprintf(out, cap, "%s%s?)", pre, close);
}

// "did you mean" for a command that takes some keys: its keys and its own options only, so a
// suggestion is always something it takes.
static void suggest_use(char *out, size_t cap, const config_use *u, const char *full) {
    const char *names[CONFIG_MAX_KEYS + 64];
    int n = 0;
    for (int i = 0; i < u->n_keys && n < CONFIG_MAX_KEYS; i++) names[n++] = u->keys[i];
    for (int i = 0; i < u->n_own && n < CONFIG_MAX_KEYS + 64; i++) names[n++] = u->own[i];
    const char *hint = config_compat_hint(full), *close = NULL;
    if (hint && config_use_takes(u, hint)) close = hint;
    if (!close) close = suggest_closest(full, names, n);
    if (close)
        snprintf(out, cap, " (did you mean --%s?)", close);
    else
        snprintf(out, cap, " (see ctitan %s --help)", u->command);
}

bool config_use_takes(const config_use *u, const char *full_name) {
    if (!u->keys) return config_key_index(full_name, strlen(full_name)) >= 0;
    for (int i = 0; i < u->n_keys; i++)
        if (strcmp(u->keys[i], full_name) == 0) return true;
    return false;
}

static bool any_section_known(const char *s) {
    return config_section_known(s) || config_compat_section_known(s);
}

static void unknown_section(config_errors *errs, const char *path, const toml_table *t) {
    const char *names[CONFIG_MAX_KEYS];
    int n = 0;
    for (int j = 0; j < config_n_keys; j++)
        if (j == 0 || strcmp(config_table[j].section, config_table[j - 1].section) != 0)
            names[n++] = config_table[j].section;
    const char *close = suggest_closest(t->name, names, n);
    char hint[96] = "";
    if (close) snprintf(hint, sizeof hint, " (did you mean [%s]?)", close);
    ct_error e;
    ct_fail(&e, "%s:%d: unknown section [%s]%s", path, t->line, t->name, hint);
    config_errors_add(errs, &e);
}

// One `section.key = value` from the file or the command line, by its table index, a renamed
// torchtitan key, or an inert torchtitan key. Returns the table index set, or -1.
static int apply_one(ct_config *c, const char *section, const char *key, const toml_value *v,
                     const char *text, const char *where, const config_use *u, bool cli,
                     config_notes *notes, config_errors *errs) {
    char full[256];
    snprintf(full, sizeof full, "%s.%s", section, key);
    const char *renamed = config_compat_renamed(full);
    int k = config_key_index(renamed ? renamed : full, strlen(renamed ? renamed : full));
    ct_error e;
    if (k >= 0 && (!u->keys || config_use_takes(u, renamed ? renamed : full))) {
        int rc = text ? config_key_set_text(c, &config_table[k], text, where, &e)
                      : config_key_set(c, &config_table[k], v, where, &e);
        if (rc == 0) return k;
        config_errors_add(errs, &e);
        return -1;
    }
    if (u->keys) { // a command that takes some keys: the others are unknown to it
        char hint[256];
        suggest_use(hint, sizeof hint, u, full);
        ct_fail(&e, "command line: unknown option --%s%s", full, hint);
        config_errors_add(errs, &e);
        return -1;
    }
    toml_value parsed = {0};
    if (text && toml_parse_value(&parsed, text, where, NULL) != 0) { // a bare word: a string
        parsed = (toml_value){.type = TOML_STRING, .str = strdup(text)};
        if (!parsed.str) return -1;
    }
    int inert = config_compat_inert(section, key, text ? &parsed : v, where, notes, &e);
    if (text) toml_value_free(&parsed);
    if (inert != 0) {
        if (inert < 0) config_errors_add(errs, &e);
        return -1;
    }
    char hint[256];
    suggest_key(hint, sizeof hint, section, key, cli);
    if (cli)
        ct_fail(&e, "command line: unknown option --%s%s", full,
                hint[0] ? hint : " (see ctitan train --help)");
    else if (section[0] == '\0')
        ct_fail(&e, "%s: key '%s' is outside any [section]%s", where, key, hint);
    else
        ct_fail(&e, "%s: unknown key '%s' in [%s]%s", where, key, section, hint);
    config_errors_add(errs, &e);
    return -1;
}

static int apply_toml(ct_config *c, const char *path, config_origins *o, config_notes *notes,
                      config_errors *errs) {
    toml_doc doc;
    ct_error e;
    if (toml_parse_file(&doc, path, &e) != 0) {
        config_errors_add(errs, &e);
        return -1;
    }
    // Tables and entries in line order, so the problems are listed as the file reads.
    int t = 0;
    for (int i = 0; i <= doc.n_entries; i++) {
        for (; t < doc.n_tables && (i == doc.n_entries || doc.tables[t].line < doc.entries[i].line);
             t++)
            if (!any_section_known(doc.tables[t].name)) unknown_section(errs, path, &doc.tables[t]);
        if (i == doc.n_entries) break;
        const toml_entry *en = &doc.entries[i];
        if (en->section[0] && !any_section_known(en->section)) continue; // reported above
        char where[CONFIG_ORIGIN_MAX];
        snprintf(where, sizeof where, "%s:%d", path, en->line);
        int k = apply_one(c, en->section, en->key, &en->value, NULL, where, &config_use_train,
                          false, notes, errs);
        if (k >= 0) snprintf(o->where[k], sizeof o->where[k], "%s", where);
    }
    toml_free(&doc);
    return 0;
}

static bool is_bool_word(const char *s) {
    return strcmp(s, "true") == 0 || strcmp(s, "false") == 0;
}

static bool is_config_option(const char *a, size_t *name_len) {
    static const char *const names[] = {"--config", "--job.config_file"};
    for (int i = 0; i < 2; i++) {
        size_t n = strlen(names[i]);
        if (strncmp(a, names[i], n) == 0 && (a[n] == '\0' || a[n] == '=')) {
            *name_len = n;
            return true;
        }
    }
    return false;
}

// Finds `--config FILE` / `--config=FILE` (or torchtitan's --job.config_file). *index_out is
// its position (or -1).
static int find_config_arg(const char **path, int *index_out, int argc, char **argv,
                           ct_error *err) {
    *path = NULL;
    *index_out = -1;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *value = NULL;
        size_t n;
        if (!is_config_option(a, &n)) continue;
        if (a[n] == '=') {
            value = a + n + 1;
        } else {
            if (i + 1 >= argc || strncmp(argv[i + 1], "--", 2) == 0)
                return ct_fail(err, "command line: %s needs a file", a);
            value = argv[i + 1];
        }
        if (*path) return ct_fail(err, "command line: --config given twice");
        *path = value;
        *index_out = i;
    }
    return 0;
}

// `--config NAME`: a file if one exists, else the recipe configs/NAME.toml in the working
// folder, then beside the binary (the source tree's configs/ for build/ctitan).
static int resolve_config_path(char *out, size_t cap, const char *name, ct_error *err) {
    struct stat st;
    if (stat(name, &st) == 0 || strchr(name, '/')) {
        snprintf(out, cap, "%s", name);
        return 0;
    }
    const char *ext =
        strlen(name) > 5 && strcmp(name + strlen(name) - 5, ".toml") == 0 ? "" : ".toml";
    char exe[CT_CONFIG_PATH_MAX] = "";
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[n > 0 ? n : 0] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash) *slash = '\0';
    const char *dirs[] = {"configs", exe[0] ? exe : NULL};
    const char *rel[] = {"", "/../configs"};
    for (int i = 0; i < 2; i++) {
        if (!dirs[i]) continue;
        snprintf(out, cap, "%s%s/%s%s", dirs[i], rel[i], name, ext);
        if (stat(out, &st) == 0) return 0;
    }
    return ct_fail(err,
                   "command line: --config %s: no such file, and no recipe configs/%s%s (in the "
                   "working folder or beside the ctitan binary)",
                   name, name, ext);
}

static int apply_argv(ct_config *c, const config_use *u, int argc, char **argv, int config_at,
                      config_origins *o, config_notes *notes, config_errors *errs) {
    bool given[CONFIG_MAX_KEYS] = {false};
    ct_error e;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (i == config_at) {
            if (!strchr(a, '=')) i++;
            continue;
        }
        if (strncmp(a, "--", 2) != 0 || a[2] == '\0') {
            ct_fail(&e,
                    "command line: unexpected argument '%s' (options are --section.key=value or "
                    "--section.key value)",
                    a);
            config_errors_add(errs, &e);
            continue;
        }
        const char *name = a + 2, *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        char full[256];
        snprintf(full, sizeof full, "%.*s", (int)(len < 255 ? len : 255), name);
        int k = config_key_index(full, strlen(full));
        const config_key *key = k >= 0 ? &config_table[k] : NULL;
        bool boolish = !key || key->type == CONFIG_BOOL || key->type == CONFIG_TRISTATE;
        const char *value;
        if (eq) {
            value = eq + 1;
        } else if (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0 &&
                   (!boolish || is_bool_word(argv[i + 1]) || !key ||
                    key->type == CONFIG_TRISTATE)) {
            value = argv[++i];
        } else if (boolish) {
            value = "true"; // a bare boolean flag: --training.allow_overcommit
        } else {
            ct_fail(&e, "command line: --%s needs a value", full);
            config_errors_add(errs, &e);
            continue;
        }
        char where[CONFIG_ORIGIN_MAX];
        snprintf(where, sizeof where, "command line --%s", full);
        if (k >= 0 && given[k]) {
            ct_fail(&e, "%s: given twice", where);
            config_errors_add(errs, &e);
            continue;
        }
        char *dot = strrchr(full, '.');
        if (!dot) {
            char hint[256];
            if (u->keys)
                suggest_use(hint, sizeof hint, u, full);
            else
                suggest_key(hint, sizeof hint, "", full, true);
            ct_fail(&e, "command line: unknown option --%s%s", full,
                    hint[0] ? hint : " (see ctitan train --help)");
            config_errors_add(errs, &e);
            continue;
        }
        *dot = '\0';
        k = apply_one(c, full, dot + 1, NULL, value, where, u, true, notes, errs);
        if (k >= 0) {
            given[k] = true;
            snprintf(o->where[k], sizeof o->where[k], "%s", where);
        }
    }
    return 0;
}

const config_use config_use_train = {.command = "train", .needs_data = true};

// The first key `u` requires that neither the file, the command line nor the command gave.
static void check_required(const ct_config *c, const config_use *u, const config_origins *o,
                           config_errors *errs) {
    for (int i = 0; i < u->n_required; i++) {
        const int k = config_key_index(u->required[i], strlen(u->required[i]));
        // Given, or set by the command itself (generate's --checkpoint sets model.hf_path).
        const bool fixed = k >= 0 && config_table[k].type == CONFIG_STR &&
                           ((const char *)c + config_table[k].offset)[0];
        if (k >= 0 && (o->where[k][0] || fixed)) continue;
        ct_error e;
        if (u->required_msg)
            ct_fail(&e, "%s", u->required_msg);
        else
            ct_fail(&e, "%s needs --%s", u->command, u->required[i]);
        config_errors_add(errs, &e);
        return; // one line: the first key missing
    }
}

int config_load_use(ct_config *c, config_notes *notes, const config_use *u,
                    const char *toml_path_or_NULL, int argc, char **argv, ct_error *err) {
    config_defaults_raw(c);
    if (notes) memset(notes, 0, sizeof *notes);
    if (u->fix && u->fix(c, u->ctx, err) != 0) return -1;
    const char *name = NULL;
    int config_at = -1;
    // --config is a whole run's file: only a command that takes every key reads one.
    if (!u->keys && find_config_arg(&name, &config_at, argc, argv, err) != 0) return -1;
    if (!name) name = toml_path_or_NULL;
    char path[CT_CONFIG_PATH_MAX];
    if (name && resolve_config_path(path, sizeof path, name, err) != 0) return -1;
    config_origins *o = calloc(1, sizeof *o);
    config_errors *errs = calloc(1, sizeof *errs);
    int rc = -1;
    if (!o || !errs) {
        ct_fail(err, "out of memory");
        goto done;
    }
    if (name) apply_toml(c, path, o, notes, errs);
    apply_argv(c, u, argc, argv, config_at, o, notes, errs);
    if (errs->n == 0) check_required(c, u, o, errs);
    if (errs->n == 0) config_compat_resolve(c, o, errs);
    if (errs->n == 0) config_lora_adapter(c, o, errs);
    if (config_errors_report(errs, err) != 0) goto done;
    config_resolve(c);
    rc = config_check(c, o, u->needs_data, err);
done:
    free(o);
    free(errs);
    return rc;
}

int config_load_noted(ct_config *c, config_notes *notes, const char *toml_path_or_NULL, int argc,
                      char **argv, ct_error *err) {
    return config_load_use(c, notes, &config_use_train, toml_path_or_NULL, argc, argv, err);
}

int config_load(ct_config *c, const char *toml_path_or_NULL, int argc, char **argv, ct_error *err) {
    return config_load_noted(c, NULL, toml_path_or_NULL, argc, argv, err);
}
