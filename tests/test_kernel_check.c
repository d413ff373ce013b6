// The plugin parity check (src/plugin/kernel_check.h) on override sets filled by hand with
// in-test kernels: exact copies pass, subtly wrong kernels fail on the right rows, and a kernel
// that crashes or hangs is contained by kernel_check_isolated.
//
// Every kernel_check_isolated call runs before the first in-process check: libgomp's thread
// pool does not survive fork, and the built-in MoE kernel opens an OpenMP region even at the
// small test shape.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "check.h"
#include "ops/ops.h"
#include "ops/ops_cpu.h"
#include "plugin/kernel_check.h"
#include "plugin/override.h"

// Under ASan a SIGSEGV is caught by the sanitizer, which reports it and exits with code 1 (or
// aborts, with abort_on_error=1).
#if defined(__SANITIZE_ADDRESS__)
#define TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TEST_ASAN 1
#endif
#endif
#ifndef TEST_ASAN
#define TEST_ASAN 0
#endif

static const kernel_check_shape shape = {.T = 64,
                                         .C = 64,
                                         .NH = 4,
                                         .NKV = 2,
                                         .D = 16,
                                         .F = 96,
                                         .V = 500,
                                         .E = 4,
                                         .K = 2,
                                         .FM = 32,
                                         .eps = 1e-6f,
                                         .rope_theta = 1e6};

#define FN(f) ((ctitan_fn)(f))

static void set_init(override_set *s) {
    memset(s, 0, sizeof *s);
    s->n_libs = 1;
    snprintf(s->libs[0], sizeof s->libs[0], "test");
}

// backward NULL: forward only.
static void set_op(override_set *s, override_op op, ctitan_fn forward, ctitan_fn backward) {
    s->ops[op] = (override_entry){
        .set = true, .lib = 0, .forward = forward, .backward = backward, .forward_only = !backward};
}

// The built-in kernels themselves, registered as a plugin would.
static void set_exact(override_set *s) {
    set_init(s);
    set_op(s, OVERRIDE_RMSNORM, FN(cpu_rmsnorm_forward), FN(cpu_rmsnorm_backward));
    set_op(s, OVERRIDE_ROPE_HF, FN(cpu_rope_forward), FN(cpu_rope_backward));
    set_op(s, OVERRIDE_ATTENTION, FN(cpu_attention_forward), FN(cpu_attention_backward));
    set_op(s, OVERRIDE_SWIGLU, FN(cpu_swiglu_forward), FN(cpu_swiglu_backward));
    set_op(s, OVERRIDE_MOE_EXPERTS, FN(cpu_moe_grouped_forward), FN(cpu_moe_grouped_backward));
    set_op(s, OVERRIDE_CROSS_ENTROPY, FN(cpu_cross_entropy_forward),
           FN(cpu_cross_entropy_backward));
    set_op(s, OVERRIDE_MATMUL, FN(cpu_matmul_forward), FN(cpu_matmul_backward));
}

// ---- broken kernels --------------------------------------------------------------------------

static volatile uintptr_t bad_address = 8; // volatile: the compiler cannot see the store is bad

static void segv_swiglu(float *out, const float *gate, const float *up, int64_t n) {
    (void)out, (void)gate, (void)up, (void)n;
    *(volatile float *)bad_address = 1.0f;
}

static void hang_swiglu(float *out, const float *gate, const float *up, int64_t n) {
    (void)out, (void)gate, (void)up, (void)n;
    for (;;) usleep(10000);
}

static void exit_swiglu(float *out, const float *gate, const float *up, int64_t n) {
    (void)out, (void)gate, (void)up, (void)n;
    _exit(3);
}

// silu(x) = x * sigmoid(1.01 x): off by about 1e-3.
static void wrong_swiglu(float *out, const float *gate, const float *up, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = gate[i] / (1.0f + expf(-1.01f * gate[i])) * up[i];
}

// dweight = instead of +=.
static void assign_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                   const float *inp, const float *weight, int N, int C, int OC) {
    memset(dweight, 0, (size_t)OC * C * sizeof *dweight);
    cpu_matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC);
}

// Right output, but the probabilities the built-in backward reads stay unwritten.
static void stateless_attention(float *out, float *state, const float *q, const float *k,
                                const float *v, int B, int T, int NH, int NKV, int D) {
    (void)state;
    float *p = malloc(cpu_attention_state_floats(B, T, NH, NKV, D) * sizeof *p);
    cpu_attention_forward(out, p, q, k, v, B, T, NH, NKV, D);
    free(p);
}

// ---- helpers ---------------------------------------------------------------------------------

static int count_rows(const kernel_check_report *r, const char *op, const char *dir,
                      const char *tensor, bool pass) {
    int n = 0;
    for (int i = 0; i < r->n_rows; i++) {
        const kernel_check_row *x = &r->rows[i];
        n += (!op || strcmp(x->op, op) == 0) && (!dir || strcmp(x->direction, dir) == 0) &&
             (!tensor || strcmp(x->tensor, tensor) == 0) && x->pass == pass;
    }
    return n;
}

static bool rows_equal_but_speed(const kernel_check_row *a, const kernel_check_row *b) {
    return strcmp(a->op, b->op) == 0 && strcmp(a->direction, b->direction) == 0 &&
           strcmp(a->tensor, b->tensor) == 0 && strcmp(a->case_name, b->case_name) == 0 &&
           a->max_abs == b->max_abs && a->max_rel == b->max_rel && a->tolerance == b->tolerance &&
           a->pass == b->pass;
}

static int run(kernel_check_report *r, const override_set *s, FILE *progress) {
    ct_error err = {{0}};
    const int rc = kernel_check_run(r, s, &ct_ops_cpu, &shape, progress, &err);
    CHECK(rc == 0, "kernel_check_run: %s", err.msg);
    return rc;
}

// ---- isolated: first, before any OpenMP region in this process -------------------------------

static void test_isolated_crash(void) {
    override_set s;
    set_init(&s);
    set_op(&s, OVERRIDE_RMSNORM, FN(cpu_rmsnorm_forward), FN(cpu_rmsnorm_backward));
    set_op(&s, OVERRIDE_SWIGLU, FN(segv_swiglu), FN(cpu_swiglu_backward));
    kernel_check_report r;
    ct_error err = {{0}};
    CHECK(kernel_check_isolated(&r, &s, &ct_ops_cpu, &shape, 60, &err) == 0, "%s", err.msg);
    CHECK(r.crashed && !r.passed && r.n_rows == 0, "crashed %d passed %d rows %d", r.crashed,
          r.passed, r.n_rows);
    CHECK(strncmp(r.crash, "swiglu forward (model case): ", 29) == 0, "crash: %s", r.crash);
    if (TEST_ASAN) // exits 1, or aborts with ASAN_OPTIONS=abort_on_error=1 (make asan)
        CHECK(strstr(r.crash, ": exited with code 1 without finishing") ||
                  strstr(r.crash, ": killed by SIG"),
              "crash: %s", r.crash);
    else
        CHECK(strstr(r.crash, "killed by SIGSEGV") != NULL, "crash: %s", r.crash);
    char why[256];
    kernel_check_first_failure(&r, why, sizeof why);
    CHECK(strcmp(why, r.crash) == 0, "first failure of a crash: %s", why);
    kernel_check_free(&r);
}

static void test_isolated_hang(void) {
    override_set s;
    set_init(&s);
    set_op(&s, OVERRIDE_SWIGLU, FN(hang_swiglu), FN(cpu_swiglu_backward));
    kernel_check_report r;
    ct_error err = {{0}};
    CHECK(kernel_check_isolated(&r, &s, &ct_ops_cpu, &shape, 2, &err) == 0, "%s", err.msg);
    CHECK(r.crashed && !r.passed, "crashed %d passed %d", r.crashed, r.passed);
    CHECK(strcmp(r.crash, "swiglu forward (model case): no answer after 2 s") == 0, "crash: %s",
          r.crash);
    kernel_check_free(&r);
}

static void test_isolated_exit(void) {
    override_set s;
    set_init(&s);
    set_op(&s, OVERRIDE_SWIGLU, FN(exit_swiglu), FN(cpu_swiglu_backward));
    kernel_check_report r;
    ct_error err = {{0}};
    CHECK(kernel_check_isolated(&r, &s, &ct_ops_cpu, &shape, 60, &err) == 0, "%s", err.msg);
    CHECK(r.crashed && strcmp(r.crash, "swiglu forward (model case): exited with code 3 without "
                                       "finishing") == 0,
          "crash: %s", r.crash);
    kernel_check_free(&r);
}

static kernel_check_report isolated_exact; // compared with the in-process run below

static void test_isolated_exact(void) {
    override_set s;
    set_exact(&s);
    ct_error err = {{0}};
    CHECK(kernel_check_isolated(&isolated_exact, &s, &ct_ops_cpu, &shape, 60, &err) == 0, "%s",
          err.msg);
    CHECK(!isolated_exact.crashed && isolated_exact.passed, "crash: %s", isolated_exact.crash);
}

// ---- in process ------------------------------------------------------------------------------

static void test_exact(void) {
    override_set s;
    set_exact(&s);
    FILE *progress = tmpfile();
    kernel_check_report r;
    if (run(&r, &s, progress) != 0) return;
    // rmsnorm 2+2 per case, rope 1+1, attention 1+3, swiglu 1+2, moe 1+3, cross_entropy 1+1,
    // matmul 1+2 (model) and 1+3 (awkward, with dbias).
    CHECK(r.n_rows == 45, "%d rows", r.n_rows);
    CHECK(r.passed && !r.crashed, "exact copies fail");
    CHECK(count_rows(&r, NULL, NULL, NULL, false) == 0, "failed rows");
    for (int i = 0; i < r.n_rows; i++) {
        const kernel_check_row *x = &r.rows[i];
        if (strcmp(x->op, "rope_hf") == 0 || strcmp(x->op, "swiglu") == 0)
            CHECK(x->max_abs == 0, "%s %s %s: max abs %g", x->op, x->direction, x->tensor,
                  x->max_abs);
        const bool model = strcmp(x->case_name, "model") == 0;
        CHECK(model ? x->speedup > 0 : x->speedup == 0, "%s %s %s %s: speedup %g", x->op,
              x->direction, x->tensor, x->case_name, x->speedup);
    }
    CHECK(count_rows(&r, "matmul", "backward", "dbias", true) == 1, "one dbias row (awkward)");
    CHECK(count_rows(&r, "moe_experts", "backward", "dw", true) == 2, "moe dw rows");

    // One progress line per op, direction and case, in order.
    rewind(progress);
    char line[128];
    int lines = 0;
    while (fgets(line, sizeof line, progress)) {
        if (lines == 0)
            CHECK(strcmp(line, "checking rmsnorm forward (model)\n") == 0, "first: %s", line);
        if (lines == 3)
            CHECK(strcmp(line, "checking rmsnorm backward (awkward)\n") == 0, "fourth: %s", line);
        lines++;
    }
    CHECK(lines == 28, "%d progress lines", lines);
    fclose(progress);

    // The child's rows are the in-process rows (the timings aside).
    CHECK(isolated_exact.n_rows == r.n_rows, "isolated %d rows, in process %d",
          isolated_exact.n_rows, r.n_rows);
    for (int i = 0; i < r.n_rows && i < isolated_exact.n_rows; i++)
        CHECK(rows_equal_but_speed(&isolated_exact.rows[i], &r.rows[i]), "row %d differs", i);

    char why[256] = "x";
    kernel_check_first_failure(&r, why, sizeof why);
    CHECK(why[0] == '\0', "first failure of a pass: %s", why);

    // JSON: parses, says passed, one object per row.
    FILE *f = tmpfile();
    kernel_check_json(&r, f);
    const long n = ftell(f);
    rewind(f);
    char *text = calloc((size_t)n + 1, 1);
    CHECK(fread(text, 1, (size_t)n, f) == (size_t)n, "read back the JSON");
    fclose(f);
    cJSON *j = cJSON_Parse(text);
    CHECK(j != NULL, "JSON does not parse: %s", text);
    if (j) {
        CHECK(cJSON_IsTrue(cJSON_GetObjectItem(j, "passed")), "passed");
        CHECK(cJSON_IsNull(cJSON_GetObjectItem(j, "crashed")), "crashed");
        const cJSON *rows = cJSON_GetObjectItem(j, "rows");
        CHECK(cJSON_GetArraySize(rows) == r.n_rows, "json rows");
        const cJSON *last = cJSON_GetArrayItem(rows, r.n_rows - 1); // awkward: not timed
        CHECK(cJSON_IsNull(cJSON_GetObjectItem(last, "speedup")), "awkward speedup is null");
        cJSON_Delete(j);
    }
    free(text);

    kernel_check_print(&r, &s, stdout);
    kernel_check_free(&r);
}

static void test_wrong_swiglu(void) {
    override_set s;
    set_init(&s);
    set_op(&s, OVERRIDE_SWIGLU, FN(wrong_swiglu), FN(cpu_swiglu_backward));
    kernel_check_report r;
    if (run(&r, &s, NULL) != 0) return;
    CHECK(!r.passed, "a wrong swiglu passes");
    CHECK(count_rows(&r, "swiglu", "forward", "out", false) == 2, "forward out rows should fail");
    CHECK(count_rows(&r, "swiglu", "backward", NULL, true) == 4, "backward rows should pass");
    char why[256];
    kernel_check_first_failure(&r, why, sizeof why);
    CHECK(strncmp(why, "swiglu forward out (model case): max abs ", 41) == 0, "%s", why);
    CHECK(strstr(why, "> tolerance 1e-06") != NULL, "%s", why);
    kernel_check_print(&r, &s, stdout);
    kernel_check_free(&r);
}

static void test_assign_matmul(void) {
    override_set s;
    set_init(&s);
    set_op(&s, OVERRIDE_MATMUL, FN(cpu_matmul_forward), FN(assign_matmul_backward));
    kernel_check_report r;
    if (run(&r, &s, NULL) != 0) return;
    CHECK(!r.passed, "= instead of += passes");
    CHECK(count_rows(&r, "matmul", "backward", "dweight", false) == 2, "dweight should fail");
    CHECK(count_rows(&r, "matmul", NULL, NULL, false) == 2, "only dweight should fail");
    kernel_check_free(&r);
}

static void test_forward_only(void) {
    // rmsnorm: correct, its backward rows (built-in backward on the plugin's rstd) pass.
    override_set s;
    set_init(&s);
    set_op(&s, OVERRIDE_RMSNORM, FN(cpu_rmsnorm_forward), NULL);
    kernel_check_report r;
    if (run(&r, &s, NULL) == 0) {
        CHECK(r.passed && r.n_rows == 8, "passed %d, %d rows", r.passed, r.n_rows);
        CHECK(count_rows(&r, "rmsnorm", "backward", NULL, true) == 4, "backward rows");
        for (int i = 0; i < r.n_rows; i++) // the backward is the built-in's: not timed
            if (strcmp(r.rows[i].direction, "backward") == 0)
                CHECK(r.rows[i].speedup == 0, "backward speedup %g", r.rows[i].speedup);
        kernel_check_free(&r);
    }

    // attention that leaves its state unwritten: forward right, backward wrong.
    set_init(&s);
    set_op(&s, OVERRIDE_ATTENTION, FN(stateless_attention), NULL);
    if (run(&r, &s, NULL) == 0) {
        CHECK(!r.passed, "an attention without state passes");
        CHECK(count_rows(&r, "attention", "forward", "out", true) == 2, "forward should pass");
        CHECK(count_rows(&r, "attention", "backward", NULL, false) == 6, "backward should fail");
        kernel_check_free(&r);
    }

    // A stateless forward-only op: the backward would be the built-in on the same inputs.
    set_init(&s);
    set_op(&s, OVERRIDE_ROPE_HF, FN(cpu_rope_forward), NULL);
    if (run(&r, &s, NULL) == 0) {
        CHECK(r.passed && r.n_rows == 2, "passed %d, %d rows", r.passed, r.n_rows);
        CHECK(count_rows(&r, NULL, "backward", NULL, true) == 0, "no backward rows");
        kernel_check_free(&r);
    }
}

static void test_bad_input(void) {
    override_set s;
    set_exact(&s);
    kernel_check_shape bad = shape;
    bad.NKV = 3; // 4 heads do not group into 3
    kernel_check_report r;
    ct_error err = {{0}};
    CHECK(kernel_check_run(&r, &s, &ct_ops_cpu, &bad, NULL, &err) == -1, "bad shape accepted");
    CHECK(strstr(err.msg, "NKV=3") != NULL, "%s", err.msg);
    set_init(&s);
    set_op(&s, OVERRIDE_MOE_EXPERTS, FN(cpu_moe_grouped_forward), NULL);
    CHECK(kernel_check_run(&r, &s, &ct_ops_cpu, &shape, NULL, &err) == -1, "moe forward only");
}

// override_apply puts each override point's kernels where the op list says (ops/ops_list.h):
// the forward and backward into one field each, and the workspace sizes for attention and
// moe_experts.
static void marker_fwd(void) {}
static void marker_bwd(void) {}
static void marker_state(void) {}
static void marker_scratch(void) {}

static int count_field(const ct_ops *o, ctitan_fn fn) {
    int n = 0;
    for (int f = 0; f < CT_OP_COUNT; f++) {
        ctitan_fn got;
        memcpy(&got, (const char *)o + sizeof(const char *) + (size_t)f * sizeof got, sizeof got);
        n += got == fn;
    }
    return n;
}

static void test_apply_slots(void) {
    for (int op = 0; op < OVERRIDE_N_OPS; op++) {
        override_set s;
        set_init(&s);
        set_op(&s, (override_op)op, marker_fwd, marker_bwd);
        const bool ws = op == OVERRIDE_ATTENTION || op == OVERRIDE_MOE_EXPERTS;
        if (ws) s.ops[op].state_floats = marker_state, s.ops[op].scratch_floats = marker_scratch;
        ct_ops o;
        override_apply(&o, &ct_ops_cpu, &s);
        const char *name = override_op_name((override_op)op);
        CHECK(count_field(&o, marker_fwd) == 1, "%s: the forward in one field", name);
        CHECK(count_field(&o, marker_bwd) == 1, "%s: the backward in one field", name);
        CHECK(count_field(&o, marker_state) == ws && count_field(&o, marker_scratch) == ws,
              "%s: the workspace sizes %s", name, ws ? "in one field each" : "nowhere");
        // The ABI is fp32: a replaced cross-entropy drops the table's bf16 one (the model's bf16
        // head then keeps fp32 logits for the plugin).
        const bool ce = op == OVERRIDE_CROSS_ENTROPY;
        CHECK(!o.cross_entropy_bf16_forward == ce && !o.cross_entropy_bf16_backward == ce &&
                  !o.cross_entropy_bf16_forward_backward == ce &&
                  !o.cross_entropy_forward_backward == ce,
              "%s: the bf16 cross-entropy %s", name, ce ? "dropped" : "kept");
        ct_ops flash, of;
        ct_ops_with_attention(&flash, &ct_ops_cpu, "flash");
        override_apply(&of, &flash, &s);
        const bool att = op == OVERRIDE_ATTENTION;
        CHECK(!of.attention_bf16_forward == att && !of.attention_bf16_backward == att,
              "%s: the bf16 attention %s", name, att ? "dropped" : "kept");
        const bool sw = op == OVERRIDE_SWIGLU;
        CHECK(!o.swiglu_rows_bf16_forward == sw && !o.swiglu_rows_bf16_backward == sw,
              "%s: the bf16 SwiGLU %s", name, sw ? "dropped" : "kept");
        // LoRA's per-expert adapters run inside the built-in expert kernels, fp32 and bf16: a
        // plugin's moe_experts drops both (a LoRA run with expert targets is then refused).
        const bool mx = op == OVERRIDE_MOE_EXPERTS;
        CHECK(!o.moe_lora_forward == mx && !o.moe_lora_backward == mx &&
                  !o.moe_bf16_lora_forward == mx && !o.moe_bf16_lora_backward == mx,
              "%s: the experts' LoRA kernels %s", name, mx ? "dropped" : "kept");
    }
}

int main(void) {
    test_apply_slots();
    test_isolated_crash();
    test_isolated_hang();
    test_isolated_exit();
    test_isolated_exact();

    test_exact();
    test_wrong_swiglu();
    test_assign_matmul();
    test_forward_only();
    test_bad_input();
    kernel_check_free(&isolated_exact);
    return check_summary();
}
