#include "plugin/trusted_ops.h"

#include <string.h>

kernel_check_shape kernel_check_shape_of(const qwen3_config *c, int seq_len) {
    const qwen3_dims d = qwen3_dims_of(c, 1, seq_len);
    return (kernel_check_shape){.T = d.T,
                                .C = d.C,
                                .NH = d.NH,
                                .NKV = d.NKV,
                                .D = d.D,
                                .F = d.F,
                                .V = d.V,
                                .E = d.E,
                                .K = d.K,
                                .FM = d.Fm,
                                .eps = c->rms_norm_eps,
                                .rope_theta = c->rope_theta};
}

// The library behind a report line that starts with an op's name.
static const char *library_of(const override_set *s, const char *line) {
    char op[32];
    size_t n = strcspn(line, " ");
    snprintf(op, sizeof op, "%.*s", (int)(n < sizeof op ? n : sizeof op - 1), line);
    int i = override_op_index(op);
    return i >= 0 && s->ops[i].set ? s->libs[s->ops[i].lib] : "?";
}

int trusted_ops_check(kernel_check_report *r, override_set *s, const char *imports,
                      const ct_ops *builtin, const kernel_check_shape *shape, FILE *log,
                      ct_error *err) {
    memset(r, 0, sizeof *r);
    if (override_load(s, imports, err) != 0) return -1;
    if (log) override_log(s, log);
    if (kernel_check_isolated(r, s, builtin, shape, KERNEL_CHECK_TIMEOUT_S, err) != 0) {
        override_close(s);
        return -1;
    }
    if (log) kernel_check_print(r, s, log);
    return 0;
}

int trusted_ops_setup(ct_ops *ops, override_set *s, const char *imports, bool allow_mismatch,
                      const kernel_check_shape *shape, FILE *log, FILE *warn, ct_error *err) {
    memset(s, 0, sizeof *s);
    if (!imports || !*imports) return 0;
    kernel_check_report r;
    if (trusted_ops_check(&r, s, imports, ops, shape, log, err) != 0) return -1;
    int rc = 0;
    if (r.crashed) {
        rc = ct_fail(err, "plugin %s crashed in the parity check: %s; it is not used",
                     library_of(s, r.crash), r.crash);
    } else if (!r.passed) {
        char why[512];
        kernel_check_first_failure(&r, why, sizeof why);
        if (!allow_mismatch) {
            rc = ct_fail(err,
                         "plugin %s refused: %s (see the table above; "
                         "--override.allow_mismatch uses it anyway)",
                         library_of(s, why), why);
        } else {
            const char *loud = "WARNING: override.allow_mismatch: running with a kernel that "
                               "FAILED its parity check against the built-in op: ";
            if (log) fprintf(log, "%s%s (%s)\n", loud, why, library_of(s, why));
            if (warn && warn != log) fprintf(warn, "%s%s (%s)\n", loud, why, library_of(s, why));
        }
    }
    kernel_check_free(&r);
    if (rc != 0) {
        override_close(s);
        return -1;
    }
    ct_ops builtin = *ops;
    override_apply(ops, &builtin, s);
    return 0;
}
