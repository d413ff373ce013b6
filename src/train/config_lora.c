// lora.adapter_path's adapter_config.json against the [lora] keys (README "LoRA"): a key the user
// left at its default takes the file's value (so `--lora.adapter_path DIR` alone starts a LoRA
// run of the adapter's own rank, alpha, targets and scaling); one the user set must agree with
// the file, else the load fails naming both values. lora.dropout is a training choice, not part
// of what the adapter computes: the file's when unset, the user's otherwise.
#include <stdio.h>
#include <string.h>

#include "model/peft_adapter.h"
#include "train/config_internal.h"

static const char *set_at(const config_origins *o, const char *full) {
    int i = config_key_index(full, strlen(full));
    return i >= 0 && o->where[i][0] ? o->where[i] : NULL;
}

static void targets_text(char *out, size_t cap, unsigned targets) {
    if (targets == LORA_ALL_LINEAR) {
        snprintf(out, cap, "all-linear");
        return;
    }
    size_t n = 0;
    out[0] = 0;
    for (int m = 0; m < LORA_N_MODULES; m++)
        if (targets >> m & 1u)
            n += (size_t)snprintf(out + n, n < cap ? cap - n : 0, "%s%s", n ? "," : "",
                                  lora_module_name((lora_module)m));
}

static void disagree(config_errors *errs, const char *where, const char *key, const char *mine,
                     const char *dir, const char *theirs) {
    ct_error e;
    ct_fail(&e, "%s: %s = %s, but %s/%s has %s: leave %s unset to take the adapter's", where, key,
            mine, dir, PEFT_CONFIG_NAME, theirs, key);
    config_errors_add(errs, &e);
}

void config_lora_adapter(ct_config *c, const config_origins *o, config_errors *errs) {
    ct_config_lora *l = &c->lora;
    if (!l->adapter_path[0]) return;
    peft_config pc;
    ct_error e;
    if (peft_config_load(&pc, l->adapter_path, &e) != 0) {
        const char *where = set_at(o, "lora.adapter_path");
        if (where) ct_wrap(&e, "%s: lora.adapter_path", where);
        config_errors_add(errs, &e);
        return;
    }
    const lora_config *f = &pc.lc;
    const char *dir = l->adapter_path, *at;
    char mine[600], theirs[600];
    if (!(at = set_at(o, "lora.rank")))
        l->rank = f->rank;
    else if (l->rank != f->rank) {
        snprintf(mine, sizeof mine, "%d", l->rank), snprintf(theirs, sizeof theirs, "r %d", f->rank);
        disagree(errs, at, "lora.rank", mine, dir, theirs);
    }
    if (!(at = set_at(o, "lora.alpha")))
        l->alpha = f->alpha;
    else if ((float)l->alpha != f->alpha) {
        snprintf(mine, sizeof mine, "%g", l->alpha);
        snprintf(theirs, sizeof theirs, "lora_alpha %g", (double)f->alpha);
        disagree(errs, at, "lora.alpha", mine, dir, theirs);
    }
    if (!(at = set_at(o, "lora.use_rslora")))
        l->use_rslora = f->use_rslora;
    else if (l->use_rslora != f->use_rslora) {
        snprintf(theirs, sizeof theirs, "use_rslora %s", f->use_rslora ? "true" : "false");
        disagree(errs, at, "lora.use_rslora", l->use_rslora ? "true" : "false", dir, theirs);
    }
    if (!set_at(o, "lora.dropout")) l->dropout = f->dropout;
    targets_text(theirs, sizeof theirs, f->targets);
    if (!(at = set_at(o, "lora.target_modules"))) {
        targets_text(l->target_modules, sizeof l->target_modules, f->targets);
        return;
    }
    // The user's list, parsed as config_lora does (an unknown name is config_check's to report).
    char list[sizeof l->target_modules];
    const char *names[64];
    int n = 0;
    unsigned targets = 0;
    snprintf(list, sizeof list, "%s", l->target_modules);
    for (char *save = NULL, *tok = strtok_r(list, ", ", &save); tok && n < 64;
         tok = strtok_r(NULL, ", ", &save))
        names[n++] = tok;
    if (lora_parse_targets(names, n, &targets, "lora", &e) == 0 && targets != f->targets) {
        snprintf(mine, sizeof mine, "\"%s\"", l->target_modules);
        char t[620];
        snprintf(t, sizeof t, "target_modules \"%s\"", theirs);
        disagree(errs, at, "lora.target_modules", mine, dir, t);
    }
}

void config_lora_base_name(char *out, size_t cap, const ct_config *c) {
    const char *base = c->checkpoint.initial_load_path[0]      ? c->checkpoint.initial_load_path
                       : strcmp(c->model.backend, "hf") == 0 ? c->model.hf_path
                                                             : c->model.flavor;
    snprintf(out, cap, "%s", base);
}
