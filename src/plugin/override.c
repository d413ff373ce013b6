// Plugin loading and the registry a plugin's ctitan_plugin_init talks to.
#include "plugin/override.h"

#include <dlfcn.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/suggest.h"
#include "io/json.h"
#include "ops/ops_cpu.h"

// The override points' names, in the order of override_op (the order reports list them, and
// plugin.h's). Written out here rather than generated from the op list (ops/ops_list.h), whose
// order is the table's (matmul first): generating them would reorder every report. Where each
// one's kernels go in ct_ops is the list's (plugin_fields below), and the count is checked
// against it.
static const char *const op_names[OVERRIDE_N_OPS] = {
    "rmsnorm", "rope_hf", "attention", "swiglu", "moe_experts", "cross_entropy", "matmul",
};

// The op list's entries of the override points: each op's forward and backward kernels and,
// for attention and moe_experts, its workspace size queries.
static const struct {
    const char *op;
    ct_op_dir dir;
    size_t offset;
} plugin_fields[] = {
#define PLUGIN_FIELD(kind, field, type, cpu, need, op, dir, ...) PLUGIN_FIELD_##kind(op, dir, field)
#define PLUGIN_FIELD_PLUGIN(op, dir, field) {op, CT_OP_DIR_##dir, offsetof(ct_ops, field)},
#define PLUGIN_FIELD_PLUGIN_SIZE PLUGIN_FIELD_PLUGIN
#define PLUGIN_FIELD_OWN(op, dir, field)
#define PLUGIN_FIELD_OWN_SIZE(op, dir, field)
#define PLUGIN_FIELD_FUSED(op, dir, field)
    CT_OPS_LIST(PLUGIN_FIELD)
#undef PLUGIN_FIELD
};

#define PLUGIN_COUNT(kind, ...) PLUGIN_COUNT_##kind
#define PLUGIN_COUNT_PLUGIN +1
#define PLUGIN_COUNT_PLUGIN_SIZE
#define PLUGIN_COUNT_OWN
#define PLUGIN_COUNT_OWN_SIZE
#define PLUGIN_COUNT_FUSED
enum { N_PLUGIN_KERNELS = 0 CT_OPS_LIST(PLUGIN_COUNT) };
_Static_assert(N_PLUGIN_KERNELS == 2 * OVERRIDE_N_OPS,
               "the op list has a forward and a backward entry for each override point");

// Where op i's kernel for `dir` lives in ct_ops; 0 (the `name` field) when it has none.
static size_t slot(int i, ct_op_dir dir) {
    for (size_t k = 0; k < sizeof plugin_fields / sizeof *plugin_fields; k++)
        if (plugin_fields[k].dir == dir && strcmp(plugin_fields[k].op, op_names[i]) == 0)
            return plugin_fields[k].offset;
    return 0;
}

const char *override_op_name(override_op op) {
    return op >= 0 && op < OVERRIDE_N_OPS ? op_names[op] : "?";
}

int override_op_index(const char *name) {
    for (int i = 0; i < OVERRIDE_N_OPS; i++)
        if (name && strcmp(name, op_names[i]) == 0) return i;
    return -1;
}

// What the registry callbacks need: the set being filled, which library is registering, and
// the first error (later calls are ignored once one failed, so the first cause is reported).
typedef struct load_ctx {
    override_set *set;
    int lib;
    int n_registered;
    ct_error *err;
    bool failed;
    char plugin_message[512]; // from ctitan_plugin_error
} load_ctx;

__attribute__((format(printf, 2, 3))) static int reg_fail(load_ctx *c, const char *fmt, ...) {
    if (!c->failed) {
        char what[900];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(what, sizeof what, fmt, ap);
        va_end(ap);
        ct_fail(c->err, "plugin %s: %s", c->set->libs[c->lib], what);
        c->failed = true;
    }
    return -1;
}

// The op's entry for a registration call, or NULL after reporting why not.
static override_entry *reg_entry(load_ctx *c, const char *op, bool for_extra) {
    int i = override_op_index(op);
    if (i < 0) {
        const char *close = op ? suggest_closest(op, op_names, OVERRIDE_N_OPS) : NULL;
        char known[256] = "";
        for (int k = 0; k < OVERRIDE_N_OPS; k++)
            snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", k ? ", " : "",
                     op_names[k]);
        char detail[400];
        if (close)
            snprintf(detail, sizeof detail, " (did you mean \"%s\"?)", close);
        else
            snprintf(detail, sizeof detail, "; the ops are %s", known);
        reg_fail(c, "unknown op \"%s\"%s", op ? op : "(null)", detail);
        return NULL;
    }
    override_entry *e = &c->set->ops[i];
    if (for_extra && (!e->set || e->lib != c->lib)) {
        reg_fail(c, "\"%s\": register the op itself before its counters or workspace", op);
        return NULL;
    }
    return e;
}

static int reg_op(ctitan_registry *reg, uint32_t plugin_api_version, const char *op,
                  ctitan_fn forward, ctitan_fn backward, uint32_t flags) {
    load_ctx *c = reg->host;
    if (c->failed) return -1;
    if (plugin_api_version != CTITAN_PLUGIN_API_VERSION) {
        char detail[160];
        snprintf(detail, sizeof detail,
                 "built for plugin ABI version %u, but this ctitan provides version %u (rebuild "
                 "it against this ctitan's include/ctitan/plugin.h)",
                 plugin_api_version, CTITAN_PLUGIN_API_VERSION);
        return reg_fail(c, "registering \"%s\": %s", op, detail);
    }
    override_entry *e = reg_entry(c, op, false);
    if (!e) return -1;
    if (e->set) {
        char detail[1100];
        snprintf(detail, sizeof detail, "%s already overrides it; load only one of them",
                 e->lib == c->lib ? "this plugin" : c->set->libs[e->lib]);
        return reg_fail(c, "\"%s\" is registered twice: %s", op, detail);
    }
    if (flags & ~CTITAN_OP_FORWARD_ONLY) return reg_fail(c, "\"%s\": unknown flag bits", op);
    bool fwd_only = flags & CTITAN_OP_FORWARD_ONLY;
    if (!forward) return reg_fail(c, "\"%s\": the forward kernel is NULL", op);
    if (fwd_only && backward)
        return reg_fail(c, "\"%s\": CTITAN_OP_FORWARD_ONLY with a backward kernel", op);
    if (!fwd_only && !backward)
        return reg_fail(c,
                        "\"%s\": the backward kernel is NULL; pass CTITAN_OP_FORWARD_ONLY to "
                        "use the built-in backward",
                        op);
    if (fwd_only && override_op_index(op) == OVERRIDE_MOE_EXPERTS)
        return reg_fail(c,
                        "\"%s\" cannot be overridden forward only: the built-in backward reads "
                        "the built-in forward's private state",
                        op);
    *e = (override_entry){.set = true,
                          .lib = c->lib,
                          .forward = forward,
                          .backward = backward,
                          .forward_only = fwd_only};
    c->n_registered++;
    return 0;
}

static int reg_counters(ctitan_registry *reg, const char *op, const uint64_t *forward_calls,
                        const uint64_t *backward_calls) {
    load_ctx *c = reg->host;
    if (c->failed) return -1;
    override_entry *e = reg_entry(c, op, true);
    if (!e) return -1;
    e->forward_calls = forward_calls;
    e->backward_calls = backward_calls;
    return 0;
}

static int reg_workspace(ctitan_registry *reg, const char *op, ctitan_fn state_floats,
                         ctitan_fn scratch_floats) {
    load_ctx *c = reg->host;
    if (c->failed) return -1;
    override_entry *e = reg_entry(c, op, true);
    if (!e) return -1;
    if (!slot(override_op_index(op), CT_OP_DIR_state))
        return reg_fail(c, "\"%s\" has no workspace to size (only attention and moe_experts)", op);
    if (e->forward_only)
        return reg_fail(c,
                        "\"%s\": a forward-only override keeps the built-in state, so it cannot "
                        "size its own workspace",
                        op);
    if (!state_floats || !scratch_floats)
        return reg_fail(c, "\"%s\": both workspace size functions are needed", op);
    e->state_floats = state_floats;
    e->scratch_floats = scratch_floats;
    return 0;
}

static void reg_error(ctitan_registry *reg, const char *message) {
    load_ctx *c = reg->host;
    snprintf(c->plugin_message, sizeof c->plugin_message, "%s", message ? message : "");
}

// dlopen, find the entry point, call it. On failure the library stays in s->handles for
// override_close.
static int load_one(override_set *s, const char *path, ct_error *err) {
    const int lib = s->n_libs;
    if (lib == OVERRIDE_MAX_LIBS)
        return ct_fail(err, "override.imports: at most %d plugins", OVERRIDE_MAX_LIBS);
    if (strlen(path) >= OVERRIDE_PATH_MAX)
        return ct_fail(err, "override.imports: the path \"%.60s...\" is too long", path);
    for (int i = 0; i < lib; i++)
        if (strcmp(s->libs[i], path) == 0)
            return ct_fail(err, "override.imports: %s is listed twice", path);
    snprintf(s->libs[lib], OVERRIDE_PATH_MAX, "%s", path);
    // A name with a slash is a file; a bare name is searched like any library (LD_LIBRARY_PATH).
    struct stat st;
    if (strchr(path, '/') && stat(path, &st) != 0)
        return ct_fail(err, "plugin %s: file not found", path);
    // RTLD_LOCAL: two plugins may use the same symbol names without clashing.
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *why = dlerror();
        return ct_fail(err, "plugin %s: cannot load it: %s", path, why ? why : "unknown error");
    }
    s->handles[lib] = h;
    s->n_libs++;
    typedef int (*init_fn)(uint32_t, ctitan_registry *);
    init_fn init;
    void *sym = dlsym(h, CTITAN_PLUGIN_ENTRY);
    memcpy(&init, &sym, sizeof init); // POSIX: a data pointer holds a function address
    if (!init)
        return ct_fail(err,
                       "plugin %s: no entry point %s() (is it a ctitan plugin? see "
                       "include/ctitan/plugin.h)",
                       path, CTITAN_PLUGIN_ENTRY);
    load_ctx c = {.set = s, .lib = lib, .err = err};
    ctitan_registry reg = {.api_version = CTITAN_PLUGIN_API_VERSION,
                           .host = &c,
                           .register_op = reg_op,
                           .register_counters = reg_counters,
                           .register_workspace = reg_workspace,
                           .error = reg_error};
    int rc = init(CTITAN_PLUGIN_API_VERSION, &reg);
    if (c.failed) return -1;
    if (rc != 0) {
        if (c.plugin_message[0])
            return ct_fail(err, "plugin %s refused to load: %s", path, c.plugin_message);
        return ct_fail(err, "plugin %s: %s() returned %d", path, CTITAN_PLUGIN_ENTRY, rc);
    }
    if (c.n_registered == 0) return ct_fail(err, "plugin %s registered no op", path);
    return 0;
}

int override_load(override_set *s, const char *imports, ct_error *err) {
    memset(s, 0, sizeof *s);
    char *list = strdup(imports ? imports : "");
    if (!list) return ct_fail(err, "out of memory");
    int rc = 0;
    for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok && rc == 0;
         tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ') tok++;
        for (char *end = tok + strlen(tok); end > tok && end[-1] == ' ';) *--end = '\0';
        if (*tok) rc = load_one(s, tok, err);
    }
    free(list);
    if (rc != 0) override_close(s);
    return rc;
}

void override_close(override_set *s) {
    for (int i = 0; i < s->n_libs; i++)
        if (s->handles[i]) dlclose(s->handles[i]);
    memset(s, 0, sizeof *s);
}

bool override_any(const override_set *s) {
    for (int i = 0; i < OVERRIDE_N_OPS; i++)
        if (s->ops[i].set) return true;
    return false;
}

// Stores a registered kernel into its slot: the slot's type is the one plugin.h documents for
// the op, which is what the plugin was told to pass (cast to ctitan_fn).
static void put(ct_ops *out, size_t offset, ctitan_fn fn) {
    _Static_assert(sizeof(ctitan_fn) == sizeof(ctitan_rope_hf_forward_fn), "one pointer size");
    memcpy((char *)out + offset, &fn, sizeof fn);
}

void override_apply(ct_ops *out, const ct_ops *base, const override_set *s) {
    *out = *base;
    for (int i = 0; i < OVERRIDE_N_OPS; i++) {
        const override_entry *e = &s->ops[i];
        if (!e->set) continue;
        put(out, slot(i, CT_OP_DIR_forward), e->forward);
        if (e->backward) put(out, slot(i, CT_OP_DIR_backward), e->backward); // else built-in's
        if (e->state_floats && slot(i, CT_OP_DIR_state)) {
            put(out, slot(i, CT_OP_DIR_state), e->state_floats);
            put(out, slot(i, CT_OP_DIR_scratch), e->scratch_floats);
        } else if (i == OVERRIDE_ATTENTION) {
            // The ABI's attention state is the reference kernel's (the probabilities), whatever
            // kernel the run chose (flash keeps log-sum-exps): its sizes, and its backward for a
            // forward-only override.
            out->attention_state_floats = cpu_attention_state_floats;
            out->attention_scratch_floats = cpu_attention_scratch_floats;
            if (!e->backward) out->attention_backward = cpu_attention_backward;
        }
    }
    // The plugin ABI is fp32: a replaced cross-entropy or attention drops the table's bf16
    // variant of it (under bf16 the plugin's kernel runs in fp32 around it).
    if (s->ops[OVERRIDE_CROSS_ENTROPY].set) {
        out->cross_entropy_bf16_forward = NULL, out->cross_entropy_bf16_backward = NULL;
        out->cross_entropy_forward_backward = NULL;
        out->cross_entropy_bf16_forward_backward = NULL;
    }
    if (s->ops[OVERRIDE_ATTENTION].set)
        out->attention_bf16_forward = NULL, out->attention_bf16_backward = NULL;
    if (s->ops[OVERRIDE_MOE_EXPERTS].set) { // LoRA's experts run inside the built-in kernels
        out->moe_lora_forward = NULL, out->moe_lora_backward = NULL;
        out->moe_bf16_lora_forward = NULL, out->moe_bf16_lora_backward = NULL;
    }
    if (s->ops[OVERRIDE_SWIGLU].set)
        out->swiglu_rows_bf16_forward = NULL, out->swiglu_rows_bf16_backward = NULL;
    ct_ops_fit_fusions(out); // a replaced rmsnorm, rope or swiglu must run inside them too
}

void override_log(const override_set *s, FILE *log) {
    for (int i = 0; i < OVERRIDE_N_OPS; i++) {
        const override_entry *e = &s->ops[i];
        if (!e->set) continue;
        fprintf(log, "override: %s %s from %s%s\n", op_names[i],
                e->forward_only ? "forward (built-in backward)" : "forward+backward",
                s->libs[e->lib], e->state_floats ? ", with its own workspace sizes" : "");
    }
}

static void print_count(FILE *f, const uint64_t *counter, bool json) {
    if (counter)
        fprintf(f, "%llu", (unsigned long long)*counter);
    else
        fputs(json ? "null" : "-", f);
}

void override_report_calls(const override_set *s, FILE *log) {
    for (int i = 0; i < OVERRIDE_N_OPS; i++) {
        const override_entry *e = &s->ops[i];
        if (!e->set || (!e->forward_calls && !e->backward_calls)) continue;
        fprintf(log, "override calls: %s forward ", op_names[i]);
        print_count(log, e->forward_calls, false);
        fputs(" backward ", log);
        print_count(log, e->backward_calls, false);
        fprintf(log, " (counted by %s)\n", s->libs[e->lib]);
    }
}

void override_calls_json(const override_set *s, FILE *json) {
    fputc('{', json);
    bool first = true;
    for (int i = 0; i < OVERRIDE_N_OPS; i++) {
        const override_entry *e = &s->ops[i];
        if (!e->set) continue;
        fprintf(json, "%s\"%s\": {\"library\": ", first ? "" : ", ", op_names[i]);
        json_write_string(json, s->libs[e->lib], strlen(s->libs[e->lib]), 0);
        fprintf(json,
                ", \"forward_only\": %s, \"forward_calls\": ", e->forward_only ? "true" : "false");
        print_count(json, e->forward_calls, true);
        fputs(", \"backward_calls\": ", json);
        print_count(json, e->backward_calls, true);
        fputc('}', json);
        first = false;
    }
    fputc('}', json);
}
