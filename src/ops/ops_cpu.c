// The built-in CPU op table: BLAS (OpenBLAS) for matmuls, OpenMP for everything else.
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
    .cross_entropy_forward = cpu_cross_entropy_forward,
    .cross_entropy_backward = cpu_cross_entropy_backward,
};
