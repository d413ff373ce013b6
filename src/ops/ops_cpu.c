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
    .add_rmsnorm_forward = cpu_add_rmsnorm_forward,
    .rmsnorm_backward_add = cpu_rmsnorm_backward_add,
    .qk_norm_rope_forward = cpu_qk_norm_rope_forward,
    .qk_norm_rope_backward = cpu_qk_norm_rope_backward,
    .swiglu_rows_forward = cpu_swiglu_rows_forward,
    .swiglu_rows_backward = cpu_swiglu_rows_backward,
};

// The kernel families a run may choose between: each entry sets only its family's fields.
typedef struct kernel_choice {
    const char *name;
    ct_ops kernels;
} kernel_choice;

static const kernel_choice moe_impls[] = {
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

static const kernel_choice attention_backends[] = {
    {"sdpa",
     {.attention_state_floats = cpu_attention_state_floats,
      .attention_scratch_floats = cpu_attention_scratch_floats,
      .attention_forward = cpu_attention_forward,
      .attention_backward = cpu_attention_backward}},
    {"flash",
     {.attention_state_floats = cpu_attention_flash_state_floats,
      .attention_scratch_floats = cpu_attention_flash_scratch_floats,
      .attention_forward = cpu_attention_flash_forward,
      .attention_backward = cpu_attention_flash_backward}},
};

static const kernel_choice *find_choice(const kernel_choice *c, size_t n, const char *name) {
    for (size_t i = 0; name && i < n; i++)
        if (strcmp(name, c[i].name) == 0) return &c[i];
    return NULL;
}

int ct_ops_with_moe_impl(ct_ops *out, const ct_ops *base, const char *moe_impl) {
    const kernel_choice *c = find_choice(moe_impls, sizeof moe_impls / sizeof *moe_impls, moe_impl);
    if (!c) return -1;
    *out = *base;
    out->moe_state_floats = c->kernels.moe_state_floats;
    out->moe_scratch_floats = c->kernels.moe_scratch_floats;
    out->moe_forward = c->kernels.moe_forward;
    out->moe_backward = c->kernels.moe_backward;
    return 0;
}

int ct_ops_with_attention(ct_ops *out, const ct_ops *base, const char *backend) {
    const kernel_choice *c = find_choice(
        attention_backends, sizeof attention_backends / sizeof *attention_backends, backend);
    if (!c) return -1;
    *out = *base;
    out->attention_state_floats = c->kernels.attention_state_floats;
    out->attention_scratch_floats = c->kernels.attention_scratch_floats;
    out->attention_forward = c->kernels.attention_forward;
    out->attention_backward = c->kernels.attention_backward;
    return 0;
}
