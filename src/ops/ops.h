// The op table: every numerical kernel the model calls goes through one ct_ops. The built-in
// CPU table is the reference; faster variants, user plugins and a GPU backend provide other
// tables without touching the model code.
//
// Conventions (llm.c style): outputs first, then inputs, then sizes. All tensors are dense,
// row-major fp32. Gradients of parameters ACCUMULATE (+=), so tied weights and gradient
// accumulation work; gradients of inputs are OVERWRITTEN (=). Buffers do not alias unless a
// comment says they may. Results are deterministic for a fixed thread count.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "ctitan/plugin.h"
#include "ops/ops_list.h"

// The fields are the op list's (ops_list.h), in its order, each with its type there. The
// contracts of the entries plugin.h does not declare:
//
// embedding_forward: out(N,C) = table(V,C)[ids[n]]. ids are in range (the model checks them).
// embedding_bf16_forward: the same from a bf16 table, each value widened (exact): a model that
//   holds its weights in bf16 only (forward-only, qwen3_init_forward_only).
// embedding_backward: dtable[ids[n]] += dout(N,C)[n]; a token seen twice accumulates twice.
// add: out(n) = a + b. out may alias a or b (residual adds and gradient sums).
//
// The plugin ABI's override points (matmul, rmsnorm, rope_forward/backward = the op "rope_hf",
// attention, swiglu, moe = the op "moe_experts", cross_entropy) have the types and the
// contracts (shapes, layouts, aliasing, saved state) of include/ctitan/plugin.h. How many
// floats the attention state and scratch hold is the kernel's business (the CPU reference keeps
// the probabilities (B,NH,T,T); a flash kernel would keep (B,NH,T) log-sum-exps), so the model
// sizes the buffers by asking (attention_state_floats, attention_scratch_floats). The MoE
// experts' state is per sparse layer, the scratch shared by every layer.
//
// Fused elementwise kernels (fused.c; not plugin override points). Each computes what a
// sequence of the ops above computes, bit for bit, in one pass over memory. `ops` is the table
// the model calls through: the built-in fused kernels ignore it, and the composites that
// ct_ops_fit_fusions installs (when a plugin replaces rmsnorm, rope_hf or swiglu) run the
// sequence through it, so a plugin's kernel is always the one that runs.
//
// add_rmsnorm_forward: sum(N,C) = a + b; out, rstd = rmsnorm_forward(sum, weight). sum may
//   alias a or b.
// rmsnorm_backward_add: dresid(N,C) += the rmsnorm_backward input gradient; dweight +=.
//   scratch (N,C) is free memory the composite may use.
// qk_norm_rope_forward: qkv (N, NH*D + 2*NKV*D) is the fused q|k|v projection, row by row. qr
//   (N,NH,D) = rope(rmsnorm(q, q_norm)), kr (N,NKV,D) likewise, v (N,NKV,D) a copy of the v
//   part; q_rstd (N*NH), k_rstd (N*NKV) as rmsnorm saves them. scratch (N, NH*D) is free memory.
// qk_norm_rope_backward: dqkv (N, NH*D + 2*NKV*D) =, dq_norm, dk_norm +=, from the gradients of
//   qr, kr and v. dqr and dkr are clobbered (used as scratch).
// swiglu_rows_forward: gate_up (N, 2F) is the fused gate|up projection, row by row: h (N,F) =
//   silu(gate) * up. scratch holds swiglu_rows_scratch_floats(N, F) floats of free memory (the
//   composite copies gate and up apart into it, so that a plugin's swiglu runs once over all
//   N*F values; the built-in kernel needs none: swiglu_rows_scratch_floats may be NULL).
// swiglu_rows_backward: dgate_up (N, 2F) = (dgate | dup) from dh (N,F). scratch as above.
//   dgate_up may alias gate_up (the model calls it in place: the layer's backward is gate_up's
//   last reader).
//
// bf16 mixed precision (matmul_bf16.c; optional entries, needed only under bf16). Each takes the
// table it is called through first (`ops`): the shapes it prepares live in that table's kernel
// state. Weights are the model's bf16 copies; scratch holds matmul_bf16_scratch_floats(ops, N,
// C, OC, staged) floats (SIZE_MAX: the shape cannot be run), asked once at plan time, which also
// prepares the shape in the kernel state (a table bound to none answers from a state made and
// freed inside the call, preparing nothing: its forward and backward cannot run); `staged`:
// every call passes inp16, and the backward's dout16 too (less scratch).
// matmul_bf16_forward: out(N,OC) = bf16(inp)(N,C) @ weight(OC,C)^T + bf16(bias), fp32 sums. When
//   inp16 is not NULL it is the input already in bf16 and inp is not read. When out16 is not
//   NULL the result goes there, rounded to bf16, and out is not written (bias must be NULL).
// matmul_bf16_backward: dinp(N,C) = bf16(dout) @ weight (skipped when dinp is NULL), dweight +=
//   bf16(dout)^T @ bf16(inp) (skipped when dweight is NULL: a frozen weight), dbias += column sums
//   of dout (fp32); inp16 as in the forward, and likewise dout16 for dout (dbias must then be
//   NULL).
// f32_to_bf16: dst(n) = src rounded to bf16 (to nearest even, as torch's .to(torch.bfloat16)).
// round_to_bf16: x(n) rounded in place to bf16's values (kept in fp32), and written to dst as
//   bf16 unless dst is NULL. bf16_to_f32: dst(n) = src widened (exact).
// cross_entropy_bf16_forward/backward: cross_entropy's contract (plugin.h) over bf16 logits,
//   computed in fp32 (torch's loss over logits.float()); dlogits rounded to bf16 (may alias).
// cross_entropy_forward_backward (and _bf16_): the forward's losses and the backward's dlogits
//   (may alias logits) in one pass over the rows, the same bits as the two calls. scratch (may
//   be NULL): V floats for each OpenMP thread, where the bf16 kernel keeps a row's exps.
// swiglu_rows_bf16_forward/backward: swiglu_rows' contract with gate_up, h and dgate_up in bf16
//   (dh fp32), each step rounded as torch computes SwiGLU on bf16 tensors (swiglu_bf16.h).
// attention_bf16_forward/backward: attention's contract, with q, k, v and dout holding bf16
//   values (the caller rounds them) and the products' other operands and outputs rounded as
//   torch's autocast rounds them (attention_flash.c). The state and scratch are the table's
//   attention's: only a table whose attention is the flash kernel has these (else NULL).
// moe_bf16_forward / moe_bf16_backward: moe_experts' contract (plugin.h) with x16 the input (N,C)
//   already in bf16, w the bf16 copy of the experts' weights (the same layout) and the GEMMs in
//   bf16 with fp32 accumulation, rounded where torch's CPU autocast rounds (moe_experts_bf16.c);
//   dw is the fp32 gradient (+=; NULL: frozen experts, no dW). State and scratch sizes:
//   moe_bf16_state_floats / moe_bf16_scratch_floats; the scratch query also creates the kernels'
//   oneDNN matmuls in the table's kernel state (SIZE_MAX: it could not), as
//   matmul_bf16_scratch_floats does; the scratch query, forward and backward take the table first.
//   Not plugin override points: under a plugin's moe_experts (fp32 by the ABI) the model runs that
//   instead, in fp32.
// lora_forward / lora_backward / lora_dropout (lora.c): PEFT's LoRA branch on a frozen linear
//   layer, y += scale * B (A x) with A (r, in), B (out, r) fp32 (model/qwen3_lora.c). Forward:
//   x (N, in) contiguous, already through dropout; u (N, r) = A x is saved for the backward; y
//   (N, out) is a column block of rows ldy apart (a fused q|k|v or gate|up output), or y16 (bf16,
//   y NULL) the same block of a bf16-only output. Backward: dx (N, in) = the branch's input
//   gradient (=, before dropout's), dA, dB +=; dy the output gradient's block (ldy apart), or
//   dy16. bf16: torch.autocast's arithmetic (lora.c). scratch: ct_lora_scratch_floats floats.
//   lora_dropout: out(n) = x * (1 / (1 - p)) where draw first + i of the splitmix64 sequence of
//   `seed` (core/rng.h) as a uniform in [0, 1) is >= p, else 0; out may alias x. The backward of
//   dropout is the same call on the gradient (the same seed keeps the same elements).
// moe_lora_forward / moe_lora_backward (moe_experts.c): moe_experts' fp32 contract (plugin.h;
//   the grouped kernel's state and scratch) on frozen experts with PEFT's LoRA on each expert's
//   gate_proj, up_proj and down_proj (model/qwen3_lora.c): inside the kernel, on each expert's
//   rows of the routing plan, gate|up += scale * B (A x) before SwiGLU and y += scale * B (A h)
//   before the routing weight, as lora_forward adds them (dropout: ct_moe_lora). The backward
//   gives dx and dweight through base and branch, and adds the adapter's gradients into lora->g;
//   never dW. NULL in a table whose experts are the "loop" kernel or a plugin's.
// moe_bf16_lora_forward / moe_bf16_lora_backward (moe_experts_bf16.c): the same on the bf16
//   experts (moe_bf16_*'s contract, state and scratch), each adapted projection as PEFT's
//   lora.Linear under torch.autocast (lora_forward's bf16 arithmetic on the projection's bf16
//   input and output); the branch's input gradient joins the base's (into dh rounded to bf16 for
//   down_proj). NULL where moe_lora_* are.
// attention_pair_forward/backward, attention_lse_merge (context parallelism's ring attention,
//   model/qwen3.c): one chunk of Tq queries against one chunk of Tk keys, q and out (Tq, NH*D)
//   rows, k and v (Tk, NKV*D) rows, lse and di (NH, Tq). causal: the chunks are the same
//   positions (Tq == Tk), else every query sees every key. q_doc (NULL: none; block-causal):
//   query i sees only keys j >= q_doc[i] - k0 (its document's start, in coordinates where key 0
//   is at k0); a query that sees no key gets out 0 and lse -inf, which the merge passes over.
//   The forward writes out and lse; the
//   backward takes the merged out and lse of all the queries' chunks, computes di = rowsum(dout
//   * out) into its scratch di and adds this pair's share into dq, dk and dv. bf16: q, k, v and
//   dout hold bf16 values, and the tiles round as attention_bf16's. The merge: out, lse (a chunk
//   so far) and out_b, lse_b (the next) become their union's, in fp32.
// attention_decode (generation, model/qwen3_generate.c): one query row against a KV cache.
//   q (NH,D) is the token at position T-1; k, v (T,NKV,D) are the cached keys and values of
//   positions [0, T), that token's own included; out (NH,D) = softmax(scale q k^T) v per head,
//   query head h reading kv head h / (NH/NKV), scale = 1/sqrt(D). scratch holds
//   attention_decode_scratch_floats(T, NH, D) floats. Causality is the caller's: it passes only
//   the positions up to the query's. attention_decode_bf16: the same over a bf16 cache (q holding
//   bf16 values), rounded as attention_bf16's forward rounds: scale = bf16(1/sqrt(D)), the scores
//   bf16(bf16(q k) * scale) and the probabilities to bf16 before the products with v.
// One sparse layer's per-expert adapter (moe_lora_*). Expert e's tensors start at w + e *
// stride (and g + e * stride): for each of gate, up and down in that order that `targets` holds
// (bit 0 gate, 1 up, 2 down), A (r, in) then B (out, r), as model/lora.h lays them out. u holds
// the forward's A x of each routed row, (N*K, r) per module (gate, up, down), kept for the
// backward; scratch holds ct_moe_lora_scratch_floats floats. dropout > 0: PEFT's lora_dropout
// on each branch's input rows, as lora_dropout draws it: element j of the input of module m
// (0 gate, 1 up, 2 down) for token n of the call routed to expert e takes draw
// ((token0 + n) * E + e) * in + j of seed[m]'s sequence; the backward applies the same masks.
typedef struct ct_moe_lora {
    const float *w;
    float *g;
    size_t stride;
    unsigned targets;
    int r;
    float scale;
    float *u, *scratch;
    // fp32 experts: each expert's acc_stride doubles, where its backward sums the branch's
    // products in double (cpu_lora_backward_acc); NULL: in fp32 GEMMs (the bf16 experts).
    double *acc;
    size_t acc_stride;
    float dropout;
    uint64_t seed[3];
    uint64_t token0;
} ct_moe_lora;

typedef struct ct_ops {
    const char *name;
    // The kernel state of the backend this table is bound to (bind_ops sets it; NULL in a table
    // bound to none, as ct_ops_cpu): what the kernels make once and reuse, such as the bf16
    // kernels' oneDNN primitives per shape (cpu_kernels.h for the CPU's). The entries that need
    // it take the table they were called through as their first parameter and read it there, so
    // each backend owns its own and no kernel keeps state in file statics.
    void *kernel_state;
#define CT_OP_FIELD(kind, field, type, ...) type field;
    CT_OPS_LIST(CT_OP_FIELD)
#undef CT_OP_FIELD
} ct_ops;

_Static_assert(sizeof(ct_ops) ==
                   sizeof(const char *) + sizeof(void *) + CT_OP_COUNT * sizeof(void (*)(void)),
               "ct_ops is the name, the kernel state and one function pointer per op list entry");

// The built-in CPU table (BLAS for matmuls, OpenMP for the rest), with the grouped MoE kernel.
extern const ct_ops ct_ops_cpu;

// model.moe_impl: "grouped" (the default: slots sorted by expert, one fused gate/up GEMM per
// expert) or "loop" (the reference: one GEMM per expert and projection). Copies `base` into *out
// with that expert kernel and its bf16 variant (moe_bf16_*); returns -1 for an unknown name.
// Floats of scratch lora_forward and lora_backward take for N rows of (in -> r -> out).
size_t ct_lora_scratch_floats(int N, int in, int r, int out);
// Doubles an fp32 expert's LoRA backward sums its products in (ct_moe_lora.acc), per expert, for
// one branch of (in -> r -> out).
size_t ct_lora_acc_doubles(int in, int r, int out);

// Floats of scratch moe_lora_forward and moe_lora_backward take (ct_moe_lora.scratch).
size_t ct_moe_lora_scratch_floats(int N, int C, int F, int E, int K, int r);

int ct_ops_with_moe_impl(ct_ops *out, const ct_ops *base, const char *moe_impl);

// model.attn_backend: "sdpa" (the reference, and ct_ops_cpu's: materialised (B,NH,T,T)
// probabilities, batched GEMMs) or "flash" (tiled with an online softmax, recomputation in the
// backward: O(T) memory per head). Copies `base` into *out with that attention kernel; returns
// -1 for an unknown name.
int ct_ops_with_attention(ct_ops *out, const ct_ops *base, const char *backend);

// Points each fused entry at the built-in fused kernel if the ops it stands for are the built-in
// ones, else at the composite that calls them through the table. Call after changing any of
// rmsnorm, rope or swiglu (override_apply does).
void ct_ops_fit_fusions(ct_ops *ops);
