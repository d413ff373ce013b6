// oneDNN for the bf16 kernels (matmul_bf16.c, moe_experts_bf16.c): a kernel state's engine and
// stream (cpu_kernels.h), 2-D memory descriptors by strides, and matmul primitives (fp32
// accumulation, optionally added into dst by the sum post-op, user scratchpad).
#pragma once
#include <oneapi/dnnl/dnnl.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ops/cpu_kernels.h"

// k's, created on its first use (NULL: oneDNN could not make them); onednn_free (cpu_kernels.h)
// destroys them. Plan time only: the kernels use the ones their primitives were made with.
dnnl_engine_t onednn_engine(cpu_kernels *k);
dnnl_stream_t onednn_stream(cpu_kernels *k);

// A (rows, cols) matrix with row stride rs and column stride cs, in elements. rows or cols may
// be DNNL_RUNTIME_DIM_VAL (given per call).
dnnl_memory_desc_t onednn_md2(int64_t rows, int64_t cols, int64_t rs, int64_t cs,
                              dnnl_data_type_t t);

// src (M,K) @ weights (K,N) -> dst (M,N) on k's engine; dst += with `accumulate`. *pad receives
// the scratchpad's descriptor (size 0: none). 0 on success.
int onednn_matmul_create(cpu_kernels *k, dnnl_primitive_t *prim, dnnl_memory_desc_t *pad,
                         const dnnl_memory_desc_t *src, const dnnl_memory_desc_t *weights,
                         const dnnl_memory_desc_t *dst, bool accumulate);

// A matmul whose one runtime dimension (M or K) changes from call to call: each operand's
// (rows, cols, rs, cs, type), DNNL_RUNTIME_DIM_VAL where the call's n goes. Made with no
// scratchpad (onednn_rt_create fails when oneDNN would want one).
typedef struct onednn_rt_operand {
    int64_t rows, cols, rs, cs;
    dnnl_data_type_t t;
} onednn_rt_operand;
typedef struct onednn_rt_matmul {
    dnnl_primitive_t prim;
    onednn_rt_operand op[3]; // src, weights, dst
    dnnl_engine_t engine;    // the kernel state's it was made on, which runs it
    dnnl_stream_t stream;
} onednn_rt_matmul;

int onednn_rt_create(cpu_kernels *k, onednn_rt_matmul *mm, onednn_rt_operand src,
                     onednn_rt_operand weights, onednn_rt_operand dst, bool accumulate);
// Runs it with the runtime dimension n >= 1. oneDNN 2.6 runs such a matmul through its gemm
// driver, which allocates its packing buffers per call; and each call makes the three memory
// objects of its shape. Safe to call from several threads at once (on disjoint dst).
void onednn_rt_run(const onednn_rt_matmul *mm, int64_t n, const void *src, const void *weights,
                   void *dst);
