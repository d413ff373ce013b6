// PEFT's LoRA on the MoE experts: the pieces both expert kernels share (moe_lora.h).
#include "ops/moe_lora.h"

#include "ops/ops_cpu.h"

// Floats a sorted row takes of the scratch, and an expert on its own (its weights' copies): the
// branch's input gradient (n, W), its input dropped out or (backward) h scaled by the routing
// weight (n, W), u scaled (n, r), and lora_forward/backward's scratch (ct_lora_scratch_floats);
// W = max(C, F).
static size_t lora_row_floats(int C, int F, int r) {
    return (size_t)3 * C + 3 * (size_t)F + 2 * (size_t)r;
}

size_t moe_lora_widest(const moe_lora_ctx *g) {
    return (size_t)(g->C > g->F ? g->C : g->F);
}

size_t ct_moe_lora_scratch_floats(int N, int C, int F, int E, int K, int r) {
    return (size_t)N * K * lora_row_floats(C, F, r) + (size_t)E * 2 * r * ((size_t)C + F);
}

bool moe_expert_lora_at(expert_lora *o, const moe_lora_ctx *g, int e, int m, int r0) {
    const ct_moe_lora *lo = g->lora;
    if (!lo || !(lo->targets & (1u << m))) return false;
    const size_t r = (size_t)lo->r, C = (size_t)g->C, F = (size_t)g->F;
    size_t off = (size_t)e * lo->stride; // each module's A and B: r * (C + F) floats
    for (int k = 0; k < m; k++)
        if (lo->targets & (1u << k)) off += r * (C + F);
    o->in = m == 2 ? g->F : g->C;
    o->out = m == 2 ? g->C : g->F;
    o->e = e, o->m = m, o->r0 = r0;
    o->A = lo->w + off, o->B = o->A + r * (size_t)o->in;
    o->dA = lo->g + off, o->dB = o->dA + r * (size_t)o->in;
    o->u = lo->u + (size_t)m * g->S * r + (size_t)r0 * r;
    o->scratch =
        lo->scratch + (size_t)r0 * lora_row_floats(g->C, g->F, lo->r) + (size_t)e * 2 * r * (C + F);
    o->acc = lo->acc ? lo->acc + (size_t)e * lo->acc_stride : NULL;
    return true;
}

float *moe_expert_lora_kernel_scratch(const moe_lora_ctx *g, const expert_lora *a, int n) {
    return a->scratch + (size_t)n * (2 * moe_lora_widest(g) + (size_t)g->lora->r);
}

const float *moe_expert_lora_dropout(const moe_lora_ctx *g, const expert_lora *a, int n, float *dst,
                                     const float *x) {
    const ct_moe_lora *lo = g->lora;
    if (!(lo->dropout > 0.0f)) return x;
    for (int i = 0; i < n; i++) {
        const uint64_t t = lo->token0 + (uint64_t)(g->perm[a->r0 + i] / g->K);
        cpu_lora_dropout(dst + (size_t)i * a->in, x + (size_t)i * a->in, a->in, lo->dropout,
                         lo->seed[a->m], (t * (uint64_t)g->E + (uint64_t)a->e) * (uint64_t)a->in);
    }
    return dst;
}
