// The built-in CPU op table: BLAS (OpenBLAS) for matmuls, OpenMP for everything else.
#include <string.h>

#include "ops/ops.h"
#include "ops/ops_cpu.h"

const ct_ops ct_ops_cpu = {
    .name = "cpu",
    .embedding_forward = cpu_embedding_forward,
    .embedding_backward = cpu_embedding_backward,
    .add = cpu_add,
    .matmul_forward = cpu_matmul_forward,
    .matmul_backward = cpu_matmul_backward,
    .rmsnorm_forward = cpu_rmsnorm_forward,
    .rmsnorm_backward = cpu_rmsnorm_backward,
    .rope_forward = cpu_rope_forward,
    .rope_backward = cpu_rope_backward,
    .attention_state_floats = cpu_attention_state_floats,
    .attention_scratch_floats = cpu_attention_scratch_floats,
    .attention_forward = cpu_attention_forward,
    .attention_backward = cpu_attention_backward,
    .swiglu_forward = cpu_swiglu_forward,
    .swiglu_backward = cpu_swiglu_backward,
    .moe_state_floats = cpu_moe_grouped_state_floats,
    .moe_scratch_floats = cpu_moe_grouped_scratch_floats,
    .moe_forward = cpu_moe_grouped_forward,
    .moe_backward = cpu_moe_grouped_backward,
    .cross_entropy_forward = cpu_cross_entropy_forward,
    .cross_entropy_backward = cpu_cross_entropy_backward,
};

int ct_ops_with_moe_impl(ct_ops *out, const ct_ops *base, const char *moe_impl) {
    static const struct {
        const char *name;
        ct_ops experts; // only the moe_* entries are set
    } impls[] = {
        {"grouped",
         {.moe_state_floats = cpu_moe_grouped_state_floats,
          .moe_scratch_floats = cpu_moe_grouped_scratch_floats,
          .moe_forward = cpu_moe_grouped_forward,
          .moe_backward = cpu_moe_grouped_backward}},
        {"loop",
         {.moe_state_floats = cpu_moe_loop_state_floats,
          .moe_scratch_floats = cpu_moe_loop_scratch_floats,
          .moe_forward = cpu_moe_loop_forward,
          .moe_backward = cpu_moe_loop_backward}},
    };
    for (size_t i = 0; moe_impl && i < sizeof impls / sizeof impls[0]; i++) {
        if (strcmp(moe_impl, impls[i].name) != 0) continue;
        const ct_ops *x = &impls[i].experts;
        *out = *base;
        out->moe_state_floats = x->moe_state_floats;
        out->moe_scratch_floats = x->moe_scratch_floats;
        out->moe_forward = x->moe_forward;
        out->moe_backward = x->moe_backward;
        return 0;
    }
    return -1;
}
