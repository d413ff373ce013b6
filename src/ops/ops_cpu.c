// The built-in CPU op table: BLAS (OpenBLAS) for matmuls, OpenMP for everything else.
#include <string.h>

#include "ops/ops.h"
#include "ops/cpu_kernels.h"
#include "ops/moe_router.h"
#include "ops/ops_cpu.h"

const char *const ct_op_field_names[CT_OP_COUNT] = {
#define FIELD_NAME(kind, field, ...) [CT_OP_##field] = #field,
    CT_OPS_LIST(FIELD_NAME)
#undef FIELD_NAME
};

// Every entry's cpu kernel (the grouped MoE kernel, the reference attention).
const ct_ops ct_ops_cpu = {.name = "cpu",
#define CPU_KERNEL(kind, field, type, cpu, ...) .field = cpu,
                           CT_OPS_LIST(CPU_KERNEL)
#undef CPU_KERNEL
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
      .moe_backward = cpu_moe_grouped_backward,
      .moe_bf16_state_floats = cpu_moe_grouped_bf16_state_floats,
      .moe_bf16_scratch_floats = cpu_moe_grouped_bf16_scratch_floats,
      .moe_bf16_forward = cpu_moe_grouped_bf16_forward,
      .moe_bf16_backward = cpu_moe_grouped_bf16_backward,
      .moe_lora_forward = cpu_moe_grouped_lora_forward,
      .moe_lora_backward = cpu_moe_grouped_lora_backward,
      .moe_bf16_lora_forward = cpu_moe_grouped_bf16_lora_forward,
      .moe_bf16_lora_backward = cpu_moe_grouped_bf16_lora_backward}},
    {"loop",
     {.moe_state_floats = cpu_moe_loop_state_floats,
      .moe_scratch_floats = cpu_moe_loop_scratch_floats,
      .moe_forward = cpu_moe_loop_forward,
      .moe_backward = cpu_moe_loop_backward,
      .moe_bf16_state_floats = cpu_moe_loop_bf16_state_floats,
      .moe_bf16_scratch_floats = cpu_moe_loop_bf16_scratch_floats,
      .moe_bf16_forward = cpu_moe_loop_bf16_forward,
      .moe_bf16_backward = cpu_moe_loop_bf16_backward}},
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
      .attention_backward = cpu_attention_flash_backward,
      .attention_bf16_forward = cpu_attention_flash_bf16_forward,
      .attention_bf16_backward = cpu_attention_flash_bf16_backward}},
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
    out->moe_bf16_state_floats = c->kernels.moe_bf16_state_floats;
    out->moe_bf16_scratch_floats = c->kernels.moe_bf16_scratch_floats;
    out->moe_bf16_forward = c->kernels.moe_bf16_forward;
    out->moe_bf16_backward = c->kernels.moe_bf16_backward;
    out->moe_lora_forward = c->kernels.moe_lora_forward; // the loop kernel has none
    out->moe_lora_backward = c->kernels.moe_lora_backward;
    out->moe_bf16_lora_forward = c->kernels.moe_bf16_lora_forward;
    out->moe_bf16_lora_backward = c->kernels.moe_bf16_lora_backward;
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
    out->attention_bf16_forward = c->kernels.attention_bf16_forward;
    out->attention_bf16_backward = c->kernels.attention_bf16_backward;
    return 0;
}

void cpu_kernels_free(cpu_kernels *k) {
    if (!k) return;
    matmul_bf16_free(k);
    moe_experts_bf16_free(k);
    onednn_free(k); // last: the primitives above were made on its engine
    *k = (cpu_kernels){0};
}
