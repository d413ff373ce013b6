// The CPU kernels' state: what the bf16 kernels make once and reuse (oneDNN's engine and stream,
// each linear layer shape's primitives, each expert shape's GEMMs, and whether this state runs
// its bf16 GEMMs on oneDNN or emulated). It lived in file statics, one per process; now each
// backend object owns one (backend_cpu.c: the plain and the guarded backend each theirs, freed
// at the backend's close), so two backends, a GPU backend beside the CPU one, or two models on
// two backends keep theirs apart.
//
// The kernels reach it through the table they are called with: bind_ops sets the bound table's
// ct_ops.kernel_state, and the entries that need it (matmul_bf16_*, moe_bf16_scratch_floats,
// moe_bf16_forward/backward) take that table as their first parameter, as the fused kernels
// do. A wrapping table (the profiler's, the guard's) copies the pointer with the rest and
// passes the caller's table on, so no wrapper changes. A table bound to nothing (ct_ops_cpu
// itself) has none: its size queries answer from a state of their own, made and freed inside
// the call (the memory estimates made before a model exists), and its bf16 kernels cannot run.
// Tests of the kernels alone give a table a zeroed cpu_kernels of their own.
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "ops/ops.h"

struct dnnl_engine;
struct dnnl_stream;
struct mm_shape;
struct expert_gemms;

typedef struct cpu_kernels {
    // onednn.c: made on first use (NULL until then, or when oneDNN could not make them)
    struct dnnl_engine *engine;
    struct dnnl_stream *stream;
    // matmul_bf16.c: oneDNN or the emulation, decided once; the shapes prepared so far
    int mm_mode;
    struct mm_shape *mm_shapes;
    size_t n_mm_shapes, cap_mm_shapes;
    // moe_experts_bf16.c: the (C, F) shapes whose expert GEMMs are made
    struct expert_gemms *moe_shapes;
    size_t n_moe_shapes, cap_moe_shapes;
} cpu_kernels;

// The state of the table `ops` runs on, or NULL when it is bound to none.
static inline cpu_kernels *cpu_kernels_of(const ct_ops *ops) {
    return ops->kernel_state;
}

// The state a size query (or the question below) runs on: the table's, or, for a table bound to
// none, *own (zeroed here), which the caller frees with cpu_kernels_free when it is the one used.
static inline cpu_kernels *cpu_kernels_or_own(const ct_ops *ops, cpu_kernels *own) {
    *own = (cpu_kernels){0};
    return ops->kernel_state ? ops->kernel_state : own;
}

// Whether k runs its bf16 GEMMs emulated on sgemm (decided on first asking; matmul_bf16.c).
bool matmul_bf16_emulated(cpu_kernels *k);

// Destroys everything k made and leaves it zeroed, ready to be used again. The tables bound to
// it must not run a bf16 kernel meanwhile.
void cpu_kernels_free(cpu_kernels *k);

// Each file's part of cpu_kernels_free.
void matmul_bf16_free(cpu_kernels *k);
void moe_experts_bf16_free(cpu_kernels *k);
void onednn_free(cpu_kernels *k);
