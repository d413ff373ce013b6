// PEFT's LoRA on a Qwen3 model whose base weights are frozen (model/lora.h has the configuration
// and the adapter's layout). Every adapted projection computes y = W x + s * B (A dropout(x)),
// as PEFT's lora.Linear.forward does (ops/lora.c has the arithmetic, fp32 and torch.autocast's
// bf16); the backward computes the input gradient through W (never dW) and the adapter's
// gradients. The base weights are held once, in the compute dtype (qwen3_init_forward_only's
// layout: under bf16 the matrices live only in param_bf16), with no gradient buffer; the
// adapter's weights and gradients are two fp32 buffers in lora_layout order on the model's
// backend.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "model/lora.h"
#include "model/qwen3.h"
#include "ops/ops.h"

// One projection of one layer as the forward and backward use it.
typedef struct qwen3_lora_module {
    const lora_tensor *a, *b; // the adapter's A (r, in) and B (out, r); NULL: not adapted
    float *u;                 // (N, r): A x of the last forward, saved for the backward
} qwen3_lora_module;

typedef struct qwen3_lora {
    lora_layout L;
    float scale;   // lora_scale
    uint64_t seed; // the dropout masks' (qwen3_lora_init_random, or set by the caller)
    // Training forwards run so far (the masks' key when a batch names no samples). A checkpoint
    // keeps it.
    uint64_t forwards;
    // The dropout masks' key of the last forward: token n of it is token token0 + n of the
    // run's stream of samples (qwen3_batch.sample0 x T, or the forward count x N).
    uint64_t token0;
    // The last forward was a training one (qwen3_forward_train): dropout applies, as in PEFT's
    // train mode; a plain qwen3_forward (validation, eval) runs without it, as model.eval().
    bool training;
    float *w, *g;                            // (L.num) the adapter and its gradients
    qwen3_lora_module (*mod)[LORA_N_MODULES]; // [layer][module]
    // qwen3_plan's: one buffer holding each module's u, then the branch input staged (bf16
    // widened, dropout applied), its gradient, and the kernels' scratch.
    float *act;
    float *xd, *dx, *scratch;
    // The adapter as the trained parameters (qwen3_trained): a model-shaped table whose
    // params are the adapter's tensors under PEFT's names, param_mem = w, grad_mem = g, cfg
    // the base's, and nothing else set (no weights of its own, no ops to free). unit_lo: unit
    // u's first element in the adapter (the embedding's and the head's units hold none).
    qwen3_model view;
    size_t *unit_lo;
    // Per layer: the sparse layer's per-expert adapter as the expert kernel takes it (w NULL: the
    // layer is dense, or its experts are not adapted); u and scratch from qwen3_lora_plan.
    ct_moe_lora *experts;
    float *experts_act; // every adapted sparse layer's u, then the kernels' shared scratch
    // Pipeline parallelism's activation sets (qwen3_plan_sets): what a forward keeps for its
    // backward, per set: the modules' u (u_floats from act, set 0's in act), the experts' u
    // (eu_floats from set 0's eu0), the dropout key and mode. `set` is the one in use; n_sets
    // 0: one set.
    size_t u_floats, eu_floats;
    float *eu0;
    int n_sets, set;
    float **set_u, **set_eu;
    uint64_t *set_token0;
    bool *set_training;
} qwen3_lora;

// A model for LoRA training: the base as qwen3_init_forward_only holds it (no gradients, each
// weight once in the dtype its kernel reads) but planned with `opts` as given (activation
// checkpointing as asked, a backward allowed), and the adapter of `lc` (A and B zero: fill them
// with qwen3_lora_init_random or qwen3_lora_write). MLP targets on a model with sparse (MoE)
// layers adapt every expert's projections (PEFT's per-expert modules), inside the grouped
// expert kernel (moe_lora_*, or moe_bf16_lora_* on bf16 experts), and the dense layers' MLP.
// Refused (one line): tensor parallelism (set later by a strategy; the trainer refuses it), a
// plugin op table without the lora_* entries; with MLP targets on sparse layers: an expert kernel
// without a LoRA variant (the "loop" reference, a plugin's).
int qwen3_init_lora(qwen3_model *m, const qwen3_config *cfg, ct_backend *be, const ct_ops *ops,
                    const qwen3_memory_opts *opts, const lora_config *lc, ct_error *err);
// PEFT's default init from the run's seed: every A kaiming-uniform with a = sqrt(5), i.e.
// U(-1/sqrt(in), 1/sqrt(in)) (element i of tensor t is draw i of the splitmix64 sequence of
// (seed, t's index in the layout), core/rng.h), every B zero; the dropout seed from `seed` too.
// whole: the whole model's config when m is a pipeline stage's (its tensors draw the streams of
// their places in the whole model's layout, the dropout seed from its tensor count), else NULL.
int qwen3_lora_init_random(qwen3_model *m, uint64_t seed, const qwen3_config *whole, ct_error *err);
// m's adapter into dst, a host buffer in W's layout (the whole model's, whose tensors m's are by
// global layer): each of m's tensors at its place there, the rest untouched.
int qwen3_lora_read_whole(const qwen3_model *m, const lora_layout *W, float *dst, ct_error *err);
// The same for any host buffer in m's adapter layout (its moments), local into whole; back: each
// of m's tensors from whole into local.
int qwen3_lora_to_whole(const qwen3_model *m, const lora_layout *W, float *local, float *whole,
                        bool back, ct_error *err);
// The whole model's adapter (layout W, config whole) as a parameter table alone with its weights,
// param_mem (W->num floats on m's backend, zero; m's ops): a checkpoint's model under PP, m a
// stage's. qwen3_lora_table_free releases it (after a failure too).
int qwen3_lora_table(qwen3_model *g, const lora_layout *W, const qwen3_config *whole,
                     const qwen3_model *m, ct_error *err);
void qwen3_lora_table_free(qwen3_model *g);
// Host I/O of the adapter (floats [offset, offset + n) of the layout), weights or gradients.
void qwen3_lora_write(qwen3_model *m, size_t offset, size_t n, const float *src);
// DIR's PEFT adapter folder (model/peft_adapter.h) into m's adapter (lora_layout order, over what
// it held). Its r, lora_alpha, target_modules and use_rslora must be the model's (else one line
// naming both); lora_dropout is the model's own choice. Here, not beside PEFT's parser, so that
// the parser links without the model (its fuzz target). whole: as qwen3_lora_init_random's (the
// folder holds the whole model's adapter; a stage takes its layers' tensors), else NULL.
int peft_adapter_apply(qwen3_model *m, const char *dir, const qwen3_config *whole, ct_error *err);
void qwen3_lora_read(const qwen3_model *m, float *dst, size_t offset, size_t n, bool grads);

// The frozen base's identity: XXH64 over each tensor's bytes as the model holds them (bf16
// where it holds a tensor in bf16 only), combined in table order.
uint64_t qwen3_lora_base_hash(const qwen3_model *m);
// The same a part at a time: h (QWEN3_LORA_HASH0 first) extended by the tensors that start in
// [lo, hi), as the model holds them now (FSDP hashes each unit while it is whole); parts in
// order give qwen3_lora_base_hash.
#define QWEN3_LORA_HASH0 0x4c6f524142617365ull // "LoRABase"
uint64_t qwen3_lora_base_hash_range(const qwen3_model *m, uint64_t h, size_t lo, size_t hi);
// Its parts: tensor p's XXH64 as the model holds it, and the chain's step for the tensor at index
// i of the whole table (a pipeline stage's tensors hashed alone, chained in the whole's order).
uint64_t qwen3_lora_tensor_hash(const qwen3_model *m, const qwen3_param *p);
uint64_t qwen3_lora_hash_step(uint64_t h, uint64_t tensor, int i);

// Private to src/model (qwen3.c, qwen3_layout.c).
int qwen3_lora_plan(qwen3_model *m, int B, int T, ct_error *err);
// qwen3_plan_sets' and qwen3_use_set's part for the adapter (after qwen3_lora_plan).
int qwen3_lora_plan_sets(qwen3_model *m, int n, ct_error *err);
void qwen3_lora_use_set(qwen3_model *m, int j);
void qwen3_lora_free(qwen3_model *m);
void qwen3_lora_zero_grad(qwen3_model *m);
// Layer l's projection md: y (N rows, ldy apart; or y16, a bf16-only output) += the branch of
// input x (N, in) (bf16: its bf16 copy x16). Nothing when md is not adapted in layer l.
void qwen3_lora_forward(const qwen3_model *m, int l, lora_module md, float *y, uint16_t *y16,
                        int ldy, const float *x, const uint16_t *x16, int N);
// Its backward from the output gradient dy (ldy apart; or dy16): the adapter's gradients
// accumulate, and the branch's input gradient is added into dx (N, in).
void qwen3_lora_backward(const qwen3_model *m, int l, lora_module md, float *dx, const float *dy,
                         const uint16_t *dy16, int ldy, const float *x, const uint16_t *x16, int N);
// Layer l's per-expert adapter for the expert kernel, its dropout set for the current forward
// (the masks of qwen3_lora_forward's scheme, keyed by token and expert), or NULL (none, or l is
// dense).
const ct_moe_lora *qwen3_lora_experts(const qwen3_model *m, int l);
// Whether projection md of layer l is adapted.
static inline bool qwen3_lora_has(const qwen3_model *m, int l, lora_module md) {
    return m->lora && m->lora->mod[l][md].a;
}
