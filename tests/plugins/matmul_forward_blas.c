// A correct forward-only "matmul": the built-in's OpenBLAS call (bit-identical), registered with
// CTITAN_OP_FORWARD_ONLY so the built-in backward runs. The bf16 test uses it: the plugin ABI is
// fp32, so under training.mixed_precision_param = "bfloat16" a run with it keeps its linear
// layers in fp32 and says so.
#include <cblas.h>
#include <ctitan/plugin.h>

static uint64_t forward_calls;

static void matmul_forward(float *out, const float *inp, const float *weight, const float *bias,
                           int N, int C, int OC) {
    forward_calls++;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, weight, C, 0.0f,
                out, OC);
    if (!bias) return;
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) out[(size_t)n * OC + o] += bias[o];
}

CTITAN_PLUGIN_EXPORT int ctitan_plugin_init(uint32_t api_version, ctitan_registry *reg) {
    (void)api_version;
    if (ctitan_register_op(reg, "matmul", (ctitan_fn)matmul_forward, NULL, CTITAN_OP_FORWARD_ONLY))
        return 1;
    return ctitan_register_counters(reg, "matmul", &forward_calls, NULL) ? 1 : 0;
}
