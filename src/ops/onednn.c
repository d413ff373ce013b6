#include "ops/onednn.h"

#include <stdio.h>
#include <stdlib.h>

// The engine and stream are the kernel state's (cpu_kernels.h), made on its first use.
static bool onednn_start(cpu_kernels *k) {
    if (k->engine && k->stream) return true;
    if (!k->engine && dnnl_engine_create(&k->engine, dnnl_cpu, 0) != dnnl_success) {
        k->engine = NULL;
        return false;
    }
    if (dnnl_stream_create(&k->stream, k->engine, dnnl_stream_default_flags) != dnnl_success) {
        k->stream = NULL;
        return false;
    }
    return true;
}

dnnl_engine_t onednn_engine(cpu_kernels *k) {
    return onednn_start(k) ? k->engine : NULL;
}

dnnl_stream_t onednn_stream(cpu_kernels *k) {
    return onednn_start(k) ? k->stream : NULL;
}

void onednn_free(cpu_kernels *k) {
    if (k->stream) dnnl_stream_destroy(k->stream);
    if (k->engine) dnnl_engine_destroy(k->engine);
    k->stream = NULL, k->engine = NULL;
}

dnnl_memory_desc_t onednn_md2(int64_t rows, int64_t cols, int64_t rs, int64_t cs,
                              dnnl_data_type_t t) {
    dnnl_memory_desc_t md;
    dnnl_dims_t dims = {rows, cols}, strides = {rs, cs};
    dnnl_memory_desc_init_by_strides(&md, 2, dims, t, strides);
    return md;
}

int onednn_matmul_create(cpu_kernels *k, dnnl_primitive_t *prim, dnnl_memory_desc_t *pad,
                         const dnnl_memory_desc_t *src, const dnnl_memory_desc_t *weights,
                         const dnnl_memory_desc_t *dst, bool accumulate) {
    dnnl_matmul_desc_t desc;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t post = NULL;
    dnnl_primitive_desc_t pd = NULL;
    *prim = NULL;
    *pad = (dnnl_memory_desc_t){0};
    int ok =
        onednn_start(k) && dnnl_matmul_desc_init(&desc, src, weights, NULL, dst) == dnnl_success &&
        dnnl_primitive_attr_create(&attr) == dnnl_success &&
        dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) == dnnl_success;
    if (ok && accumulate)
        ok = dnnl_post_ops_create(&post) == dnnl_success &&
             dnnl_post_ops_append_sum(post, 1.0f) == dnnl_success &&
             dnnl_primitive_attr_set_post_ops(attr, post) == dnnl_success;
    ok = ok && dnnl_primitive_desc_create(&pd, &desc, attr, k->engine, NULL) == dnnl_success &&
         dnnl_primitive_create(prim, pd) == dnnl_success;
    const dnnl_memory_desc_t *md =
        ok ? dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0) : NULL;
    if (md) *pad = *md;
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (post) dnnl_post_ops_destroy(post);
    if (attr) dnnl_primitive_attr_destroy(attr);
    return ok ? 0 : -1;
}

static dnnl_memory_desc_t rt_md(const onednn_rt_operand *o, int64_t n) {
    return onednn_md2(o->rows == DNNL_RUNTIME_DIM_VAL ? n : o->rows,
                      o->cols == DNNL_RUNTIME_DIM_VAL ? n : o->cols, o->rs, o->cs, o->t);
}

int onednn_rt_create(cpu_kernels *k, onednn_rt_matmul *mm, onednn_rt_operand src,
                     onednn_rt_operand weights, onednn_rt_operand dst, bool accumulate) {
    mm->op[0] = src, mm->op[1] = weights, mm->op[2] = dst;
    dnnl_memory_desc_t md[3], pad;
    for (int i = 0; i < 3; i++) md[i] = rt_md(&mm->op[i], DNNL_RUNTIME_DIM_VAL);
    if (onednn_matmul_create(k, &mm->prim, &pad, &md[0], &md[1], &md[2], accumulate)) return -1;
    mm->engine = k->engine, mm->stream = k->stream;
    if (dnnl_memory_desc_get_size(&pad) == 0) return 0;
    // A scratchpad would have to be planned per concurrent caller; 2.6's gemm-based matmul (the
    // one that takes runtime dimensions) asks for none.
    dnnl_primitive_destroy(mm->prim);
    mm->prim = NULL;
    return -1;
}

void onednn_rt_run(const onednn_rt_matmul *mm, int64_t n, const void *src, const void *weights,
                   void *dst) {
    static const int arg[3] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST};
    void *const handle[3] = {(void *)src, (void *)weights, dst};
    dnnl_memory_t mem[3] = {NULL, NULL, NULL};
    dnnl_exec_arg_t args[3];
    bool ok = true;
    for (int i = 0; i < 3; i++) {
        const dnnl_memory_desc_t md = rt_md(&mm->op[i], n);
        ok = ok && dnnl_memory_create(&mem[i], &md, mm->engine, handle[i]) == dnnl_success;
        args[i] = (dnnl_exec_arg_t){arg[i], mem[i]};
    }
    // A CPU stream holds no state between calls (each execute runs the primitive in the
    // caller's thread), so concurrent callers share it.
    ok = ok && dnnl_primitive_execute(mm->prim, mm->stream, 3, args) == dnnl_success &&
         dnnl_stream_wait(mm->stream) == dnnl_success;
    for (int i = 0; i < 3; i++)
        if (mem[i]) dnnl_memory_destroy(mem[i]);
    if (!ok) {
        fprintf(stderr, "ctitan: internal error: a oneDNN bf16 matmul with %lld rows failed\n",
                (long long)n);
        abort();
    }
}
