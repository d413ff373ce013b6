// One Qwen3 decoder (dense, or MoE with sparse blocks per layer), forward and backward on fp32
// planned buffers. The model knows tensors by their Hugging Face names through `params`;
// it knows nothing about files or processes.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "core/error.h"
#include "model/qwen3_config.h"
#include "ops/ops.h"

#define QWEN3_IGNORE_INDEX (-100)

// A named parameter tensor: a view into the contiguous parameter buffer.
typedef struct qwen3_param {
    char name[96]; // HF name, e.g. "model.layers.3.self_attn.q_proj.weight"
    int ndim;      // 1 or 2
    int64_t shape[2];
    size_t offset; // in floats, into param_mem (and grad_mem)
    size_t numel;
    // Not trained (no gradient, no weight decay) and not part of HF's format: the MoE
    // aux-loss-free expert bias. Saved in checkpoints, left out of HF exports, optional at
    // HF load (zero when absent).
    bool buffer;
} qwen3_param;

typedef struct qwen3_layer_weights {
    float *input_norm; // (C)
    // The native layout fuses projections that read the same input: q_proj, k_proj, v_proj
    // are consecutive in the parameter buffer, so wqkv is one (NH*D + 2*NKV*D, C) matrix and
    // one GEMM computes all three; the HF tensors are views of its row blocks (the same for
    // the biases, and for gate_proj|up_proj as w_gate_up).
    float *wqkv;            // q_proj (NH*D, C), then k_proj, v_proj (NKV*D, C)
    float *bqkv, *bo;       // (NH*D + 2*NKV*D), (C); NULL without attention_bias
    float *q_norm, *k_norm; // (D), shared by all heads
    float *wo;              // (C, NH*D)
    float *post_norm;       // (C)
    float *w_gate_up;       // gate_proj (F, C) then up_proj (F, C); NULL in a sparse layer
    float *w_down;          // (C, F); NULL in a sparse layer
    // Sparse (MoE) layers only, else NULL. E experts of width Fm (moe_intermediate_size).
    float *router;      // (E, C) mlp.gate.weight
    float *experts;     // E blocks of 3*Fm*C: mlp.experts.{e}.gate_proj (Fm,C), up_proj (Fm,C),
                        // down_proj (C,Fm); the layout ct_ops.moe_forward reads
    float *expert_bias; // (E) the aux-loss-free bias (a buffer: its "gradient" stays 0)
} qwen3_layer_weights;

typedef struct qwen3_weights {
    float *embed; // (V, C)
    qwen3_layer_weights *layers;
    float *final_norm; // (C)
    float *lm_head;    // (V, C); the same pointer as embed when tied
} qwen3_weights;

// How a model trades compute for memory. Set before qwen3_plan; all zero stores everything.
typedef struct qwen3_memory_opts {
    // Activation checkpointing: 0 = off; k > 0 = layer l keeps only its input and recomputes
    // its forward during the backward when (l + 1) % k == 0 (1: every layer, torchtitan's
    // "full"; k: its "selective" every k-th layer). The recomputation runs the same ops on the
    // same inputs, so gradients are bit-identical to no checkpointing.
    int ac_every;
    // Op-level selective checkpointing (torchtitan's selective_ac_option "op"): every layer
    // that ac_every does not recompute whole keeps the outputs of its GEMMs and of attention
    // (q|k|v; attention's output and saved state; resid2, which o_proj's output is added into;
    // gate|up, or the router logits, the routing and the expert kernel's state) and recomputes
    // its elementwise ops (the two RMSNorms, q/k norm + RoPE, SwiGLU) from them in the
    // backward, into one set shared by all layers. Bit-identical, as ac_every.
    bool ac_op;
    // The loss head in chunks of this many tokens (0 = whole): the (N, V) logits are never held
    // at once, only (loss_chunk, V). qwen3_forward_train then also runs the head's backward, and
    // qwen3_backward after a plain qwen3_forward recomputes the logits chunk by chunk.
    int loss_chunk;
    // Sequence parallelism (tensor parallelism's, qwen3_tp): the degree (0 or 1: none). The
    // buffers that hold only this rank's rows of the sequence (the residual stream and its
    // gradient, the norms' rstd) are planned for N / sp rows; the GEMMs' gathered inputs and
    // everything after them stay N.
    int sp;
    // Context parallelism (qwen3_cp): the degree (0 or 1: none). The model is planned for its
    // rank's T = seq_len / cp rows of each sequence (two chunks of T/2, headtail), its RoPE table
    // for the whole sequence's T * cp positions and each token's own rows of it (by its global
    // position), a layer's attention state as the ring's lse (B, 2, NH, T/2), and the ring's
    // buffers (the peers' keys and values, their gradients, a chunk's partial output).
    int cp;
    // Under CP, the ring passes keys along (context_parallel_rotate_method "alltoall"): the
    // ring's buffers are that method's (10 K|V-sized blocks), else all-gather's (6 cp).
    bool cp_ring;
    // bf16 mixed precision (training.mixed_precision_param = "bfloat16"): every linear layer
    // (q|k|v, o, gate|up, down, the router, lm_head) runs the table's matmul_bf16 kernels on a
    // bf16 copy of the weights (param_bf16, refreshed by qwen3_refresh_bf16) with fp32
    // accumulation; the rest stays fp32. The weights, gradients and optimizer stay fp32.
    bool bf16;
    // With bf16, a MoE model's experts run the table's moe_bf16 kernels too (bf16 GEMMs on the
    // same copy; gate/up saved in bf16). false keeps them on the fp32 moe kernels: a plugin's
    // expert kernel (the plugin ABI is fp32).
    bool bf16_experts;
    // Block-causal attention over packed documents (torchtitan's attn_mask_type =
    // "block_causal", HF's padding-free packing): a token attends only to the earlier tokens of
    // its own document, and its RoPE position is its offset in that document. The documents come
    // from each forward's positions (qwen3_batch); qwen3_plan reserves what it needs (the
    // per-token RoPE rows, the document lists), which qwen3_memory_plan_ops counts.
    bool block_causal;
} qwen3_memory_opts;

// Tensor parallelism with sequence parallelism (torchtitan's Qwen3 plan), as the model sees it:
// this rank's part of a TP group of `size` ranks. The model is then a local one (its config has
// the rank's heads, MLP width and vocabulary rows [vocab_lo, vocab_lo + cfg.vocab_size) of
// vocab_total), and its N = B*T token rows are cut into `size` sequence shards of N/size rows:
// the residual stream and the three RMSNorms run on this rank's shard, an all-gather fills
// the full rows before the q|k|v and gate|up GEMMs and the head, a reduce-scatter sums the
// o_proj and down_proj partial outputs (and the vocab-parallel embedding's) onto the shards,
// and the cross-entropy takes each row's max, sum of exponentials and target logit over the
// group (loss parallel: no rank holds a row's whole logits). The backward swaps gathers and
// reduce-scatters. The strategy that owns the group (train/strategy_tp.c) provides the
// collectives and the buffers below; the model never sees MPI.
typedef struct qwen3_tp {
    int rank, size;
    int vocab_lo, vocab_total;
    // In place, over the group, blocks of n floats: gather: every rank's block r lands at
    // buf + r*n (this rank's is there already); reduce_scatter: buf holds `size` blocks, and
    // the sum of every rank's block r lands at buf's start on rank r; allreduce: buf(n) summed.
    // A failure is kept by the strategy (ctx) and reported after the step's backward.
    void (*gather)(void *ctx, float *buf, size_t n);
    void (*reduce_scatter)(void *ctx, float *buf, size_t n);
    void (*allreduce)(void *ctx, float *buf, size_t n);
    void *ctx;
    // Planned by the strategy for the model's N rows. Host: the last forward's local input ids
    // (id - vocab_lo, or -1 for an id of another rank's rows), and scratch for the targets.
    int32_t *host_ids, *host_targets;
    // Backend: the local ids (0 where host_ids is -1) and targets (local index, -1 elsewhere,
    // -100 ignored), each row's max on every rank (size x N), its sum of exponentials and target
    // logit minus the max (N x 2).
    int32_t *ids, *targets;
    float *ce_max, *ce_sums;
} qwen3_tp;

// Context parallelism (torchtitan's context_parallel_degree, ring attention), as the model sees
// it: this rank's place in a CP group of `size` ranks. Each sequence of T * size tokens is cut in
// 2 * size chunks of T/2 (T: the planned rows), and this rank holds chunks `rank` and
// 2 * size - 1 - rank ("headtail": every rank gets the same share of the causal work), as rows
// [0, T/2) and [T/2, T) of each of its B rows; its RoPE rows are those of their global positions.
// Everything but attention is per token, so only attention meets the other ranks: its queries
// run against every rank's keys and values (the chunks in their past; the diagonal chunks
// causal), each pair's output merged by its log-sum-exp in fp32 (attention_lse_merge), in the
// same order for either rotate method: step i takes the keys of rank (rank - i) mod size, its
// first chunk, then its second. The backward returns each rank's share of the keys' and values'
// gradients to their owner, who adds them in the order rank, rank + 1, ... (mod size) for either
// method. ring: the keys and values travel along the ring (send to rank + 1, receive from
// rank - 1), one peer's at a time, and their gradients travel with them; else: one all-gather
// of every rank's keys and values, and one all-to-all of the gradients. The strategy that owns
// the group (train/context_parallel.c) provides the collectives; the model never sees MPI.
typedef struct qwen3_cp {
    int rank, size;
    bool ring; // context_parallel_rotate_method "alltoall": pass along the ring; else "allgather"
    // Over the group, blocks of n floats; a failure is kept by the strategy (ctx) and reported
    // after the step's backward (the later calls of the step then do nothing). gather: in place,
    // every rank's block r lands at buf + r*n (this rank's is there already); alltoall: block q of
    // send goes to rank q, block q of recv comes from rank q; both blocking. sendrecv starts
    // send(n) to rank + 1 and recv(n) from rank - 1 (tag: which of a step's messages, 0..3) and
    // returns at once, so the ring's transfers run behind the pairs' compute; wait completes
    // every one started (the buffers are in use until then).
    void (*gather)(void *ctx, float *buf, size_t n);
    void (*sendrecv)(void *ctx, const float *send, float *recv, size_t n, int tag);
    void (*wait)(void *ctx);
    void (*alltoall)(void *ctx, const float *send, float *recv, size_t n);
    void *ctx;
} qwen3_cp;
// Expert parallelism, as the model sees it: this rank is `rank` of an EP group of `size` ranks,
// each holding cfg.local_experts (El) whole experts of every sparse layer (rank r: experts
// [r*El, (r+1)*El)). A sparse layer routes its own N tokens, sends each chosen (token, expert)
// row to the expert's owner sorted by expert (an all-to-all of the counts, then of the rows and
// their routing weights), runs the expert kernel on what arrived (one row per received pair,
// K = 1, its weight applied there), returns each row's weighted output (an all-to-all back) and
// sums every token's K rows in ascending expert order from 0.0f, as the one-process kernels do.
// The rows of an expert are ordered by source rank, then token: the order one process gives the
// same global batch, so the expert GEMMs see the same rows. The backward sends the output
// gradient's rows the same way and returns the input gradient's rows and the weights' gradient.
// The strategy (train/strategy_ep.c) provides the all-to-all and the buffers; the model never
// sees MPI. qwen3_ep.c holds the model's side.
typedef struct qwen3_ep {
    int rank, size;
    // EP with TP and expert_tensor_parallel_degree 1 (m->tp set too): the group spans the TP
    // ranks, and a sparse layer routes and sends only this rank's sequence shard (N/tp rows of
    // ln2); its output lands on the shard as is, with no reduce-scatter.
    bool shard;
    // In place over the group, as the backend's comm_alltoall with element size `bytes`: send +
    // sdispls[q] (scounts[q] elements) to rank q, recv + rdispls[q] from q. A failure is kept by
    // the strategy (ctx) and reported after the step's backward; the rest of the step's
    // exchanges then do nothing.
    void (*alltoall)(void *ctx, const void *send, const int *scounts, const int *sdispls,
                     void *recv, const int *rcounts, const int *rdispls, int bytes);
    void *ctx;
    int rows_max; // rows this rank's experts can receive in one layer: size * N * min(K, El)
    // Host: the plan of the layer being run (the strategy allocates them).
    int32_t *h_expert; // N*K: the routing, read back
    int32_t *h_perm;   // N*K: sorted position -> slot (by expert, then token)
    int32_t *h_tpos;   // N*K: token t's K sorted positions, ascending
    int32_t *h_idx;    // max(N*K, rows_max): gather indices
    int32_t *h_rperm;  // rows_max: expert-major row -> arrival row
    int *h_rcounts;    // n_sparse x size x El: rows from rank s for local expert j
    int *scounts, *sdispls, *rcounts, *rdispls; // size each: rows to / from each rank
    int *ccounts, *cdispls;                     // size each: the counts' all-to-all (El each)
    // Backend: the counts exchanged, the indices, the rows sent and received.
    int32_t *counts_send, *counts_recv; // size*El each
    int32_t *idx;                       // max(N*K, rows_max)
    float *send;                        // N*K rows of C floats (or bf16 rows)
    float *sendw;                       // N*K routing weights (and their gradients back)
    float *recv;                        // rows_max rows of C floats
    float *recvw;                       // rows_max
    float *y;                           // rows_max rows of C floats: the experts' output
    float *dw_rows;                     // rows_max: the routing weights' gradient
    float *scratch;                     // the expert kernel's scratch for rows_max rows
    // Per sparse layer, kept for the backward: the received rows (expert-major; bf16 under bf16
    // experts), their routing weights, local expert ids and the expert kernel's state. Under
    // pipeline parallelism, per activation set too (n_sets x n_sparse entries, set-major, and
    // h_rcounts n_sets times): the strategy picks `set` with the model's activation set, so each
    // micro-batch in flight keeps its forward's rows until its backward.
    float **x_rows, **w_rows, **state;
    int32_t **e_rows;
    int *n_rows;     // per sparse layer: the rows received
    int n_sets, set; // 1 and 0 without activation sets
} qwen3_ep;

typedef struct qwen3_model {
    qwen3_config cfg;
    ct_backend *be;    // where every buffer below lives (host code reaches them through it)
    const ct_ops *ops; // the table it runs, bound to `be` (owned by the model)

    qwen3_param *params; // fixed order: embed, layers 0..L-1, final norm, lm_head (if untied)
    int n_params;
    size_t num_params; // total floats in param_mem
    float *param_mem;
    float *grad_mem; // same layout as param_mem
    qwen3_weights w; // named pointers into param_mem
    qwen3_weights g; // the same names into grad_mem

    qwen3_memory_opts mem_opts; // set before qwen3_plan

    // Activations, planned by qwen3_plan for a (B, T) batch; no allocation inside a step.
    int B, T;
    float *act_mem;
    size_t act_floats;
    void *acts; // layout private to src/model (qwen3_internal.h)
    // Pipeline parallelism (qwen3_plan_sets): n_sets whole activation blocks (acts and act_mem
    // each), set 0 qwen3_plan's; acts and act_mem are the one qwen3_use_set chose. 0: one.
    int n_sets;
    void **set_acts;
    float **set_mem;
    float *logits;    // (B, T, V), valid after qwen3_forward until qwen3_backward, which
                      // reuses the buffer for the logits' gradient; with loss_chunk only the
                      // last chunk's rows
    bool logits_bf16; // the logits are bf16 (uint16_t) values: bf16 mixed precision's head

    // Optional (NULL = none): the unit hook, the one place a parallelism strategy meets the
    // model. The units are the embedding (0), layer l (1 + l) and the head (L + 1: the final
    // norm, and lm_head when untied; a tied head reads unit 0's embedding), each a contiguous
    // range of param_mem (qwen3_units, model/qwen3_parallelize.h). The forward calls
    // QWEN3_UNIT_FORWARD before a unit reads its weights and QWEN3_UNIT_FORWARD_DONE after; the
    // backward QWEN3_UNIT_BACKWARD before and QWEN3_UNIT_BACKWARD_DONE once the unit's
    // gradients (but for a tied head's, which are the embedding's) are final. The backward
    // runs the units last to first, so at BACKWARD_DONE every gradient from the unit's first
    // element on is final: FSDP reduce-scatters the unit there, DDP starts its buckets.
    void (*unit_hook)(void *ctx, int unit, int event);
    void *unit_hook_ctx;
    // Optional (NULL = one process): tensor parallelism (qwen3_tp above), set by its strategy
    // after qwen3_plan.
    const qwen3_tp *tp;
    // Optional (NULL = none): context parallelism (qwen3_cp above, mem_opts.cp at qwen3_plan),
    // set by its strategy after qwen3_plan.
    const qwen3_cp *cp;
    // Optional (NULL = all experts here): expert parallelism (qwen3_ep above), set by its
    // strategy after qwen3_plan.
    const qwen3_ep *ep;

    // MoE: n_sparse sparse layers. Optional (NULL = none): the load-balancing component
    // (model/moe_balance.h, attached by moe_balance_init). The forward's routers write their
    // statistics into it, and the backward asks it for the aux loss's gradient after it has
    // reduced them; without one, nothing is counted and no aux gradient flows.
    int n_sparse;
    struct moe_balance *balance;

    // mem_opts.bf16: the weights rounded to bf16, param_mem's layout (qwen3_plan allocates it;
    // qwen3_refresh_bf16 fills it); NULL otherwise.
    uint16_t *param_bf16;
    // A forward-only bf16 model (qwen3_init_forward_only): param_bf16 is where its matrices
    // live, not a copy; parameter I/O writes and reads them there, and nothing refreshes it.
    bool weights16;
    // LoRA (model/qwen3_lora.h, qwen3_init_lora): the adapter on a frozen base, NULL otherwise.
    // The base has no grad_mem; its norm weights' gradients go to grad_sink, never read.
    struct qwen3_lora *lora;
    float *grad_sink;
} qwen3_model;

// The parameters a trainer trains: what its optimizer steps, clipping measures, data
// parallelism sums and checkpoints save. A model's own (m itself), or for a LoRA model
// (model/qwen3_lora.h) the adapter, as a model-shaped table: params under PEFT's names,
// param_mem and grad_mem its two fp32 buffers, cfg the base's, nothing else (no activations,
// no bf16 copy; never passed to qwen3_free).
qwen3_model *qwen3_trained(qwen3_model *m);
// Unit u's first element in qwen3_trained(m)'s buffer: the unit hook's "everything from here on
// is final" (qwen3_n_units + 1 entries; the last is the buffer's size).
void qwen3_trained_units(const qwen3_model *m, size_t *lo);

enum { QWEN3_UNIT_FORWARD, QWEN3_UNIT_FORWARD_DONE, QWEN3_UNIT_BACKWARD, QWEN3_UNIT_BACKWARD_DONE };
// The units (see unit_hook): qwen3_n_units of them; unit u is elements [lo[u], hi[u]) of
// param_mem's layout, which they tile in order.
int qwen3_n_units(const qwen3_config *cfg);
void qwen3_units(const qwen3_config *cfg, size_t *lo, size_t *hi);

// Bytes the model needs for a (B, T) step: parameters, gradients and activations.
typedef struct qwen3_memory {
    size_t params, grads, activations;
    size_t weights_bf16; // the bf16 copy of the weights under mem_opts.bf16, else 0
} qwen3_memory;
// These are exactly the sizes of param_mem, grad_mem and the activation buffers (act_mem plus
// the saved token ids) that qwen3_init + qwen3_plan allocate with the built-in CPU ops; the
// small bookkeeping structs (parameter table, pointer arrays) are not counted.
qwen3_memory qwen3_memory_plan(const qwen3_config *cfg, int B, int T);
// The same for another op table (its attention kernel sizes its own state and scratch) and
// memory options (NULL: none).
qwen3_memory qwen3_memory_plan_ops(const qwen3_config *cfg, const ct_ops *ops, int B, int T,
                                   const qwen3_memory_opts *opts);
// Whether layer l recomputes its forward in the backward.
bool qwen3_layer_checkpointed(int ac_every, int l);
// What layer l recomputes in the backward under opts (NULL: nothing): its whole forward
// (ac_every), its elementwise ops (ac_op), or nothing.
typedef enum qwen3_layer_ac { QWEN3_AC_NONE, QWEN3_AC_OPS, QWEN3_AC_LAYER } qwen3_layer_ac;
qwen3_layer_ac qwen3_layer_recompute(const qwen3_memory_opts *opts, int l);

// Flat elements [lo, hi) of param_mem's layout. Lists of them (ascending, disjoint) name the
// part of the model one process holds under sharding (checkpoints, HF loads of a shard).
typedef struct qwen3_range {
    uint64_t lo, hi;
} qwen3_range;

// The parameter table alone (cfg, params, n_params, num_params): no backend, no ops, no
// buffers, so code that moves weights between files in the model's layout (a streamed export,
// a rank's shard) knows names and offsets without holding the model. qwen3_free releases it.
int qwen3_init_layout(qwen3_model *m, const qwen3_config *cfg, ct_error *err);
// The tensor holding flat element i (< num_params): the table tiles [0, num_params) in order.
const qwen3_param *qwen3_param_at(const qwen3_model *m, size_t i);

// Builds the parameter table and allocates params + grads (zeroed) on backend be (NULL: the
// plain CPU one), running the op table ops (NULL = built-in CPU) as be binds it.
int qwen3_init_on(qwen3_model *m, const qwen3_config *cfg, ct_backend *be, const ct_ops *ops,
                  ct_error *err);
// qwen3_init_on the plain CPU backend.
int qwen3_init(qwen3_model *m, const qwen3_config *cfg, const ct_ops *ops, ct_error *err);
// The same without gradients, for a model that is never trained (generate, eval, an export): no
// grad_mem (NULL, and every m->g pointer NULL), and mem_opts = qwen3_forward_only_opts(opts).
// Optimizer state and fp32 masters live in the trainer, so an untrained model holds the weights
// and what its forward plans, nothing else. Each weight is held once, in the dtype its kernel
// reads (qwen3_param_in_bf16): under opts->bf16 the matrices that the bf16 kernels read (every
// linear layer, the embedding, the experts unless a plugin's fp32 kernel runs them) live only in
// param_bf16, and only the vectors (norms, biases, the expert bias) in param_mem, whose other
// pages are never written and so never mapped on the plain CPU backend (as FSDP's freed units).
// qwen3_zero_grad does nothing on it; qwen3_backward is a programming error (it asserts in a
// debug build and does nothing in a release one).
int qwen3_init_forward_only(qwen3_model *m, const qwen3_config *cfg, ct_backend *be,
                            const ct_ops *ops, const qwen3_memory_opts *opts, ct_error *err);
// The memory options a forward-only model runs with: opts (NULL: none) with full activation
// checkpointing, so each layer keeps only its input and one layer's working set serves all of
// them. A forward computes the same numbers either way; without a backward nothing is recomputed.
qwen3_memory_opts qwen3_forward_only_opts(const qwen3_memory_opts *opts);
// Whether tensor p of a model is held in bf16 only (a forward-only model under bf16, see above).
bool qwen3_param_in_bf16(const qwen3_model *m, const qwen3_param *p);
// Bytes a forward-only model of cfg holds for its weights under opts (NULL: fp32), as
// qwen3_init_forward_only allocates them (fp32 tensors x 4, bf16-held ones x 2).
size_t qwen3_forward_only_weight_bytes(const qwen3_config *cfg, const qwen3_memory_opts *opts);
// Allocates activation buffers for batches of B sequences of T tokens (T <= max positions).
int qwen3_plan(qwen3_model *m, int B, int T, ct_error *err);
void qwen3_free(qwen3_model *m);
// HF's num_parameters: the trained tensors, without the MoE expert bias (a buffer of ours that
// HF's format does not have); a tied embedding is one tensor in the table, so it counts once.
size_t qwen3_num_hf_parameters(const qwen3_model *m);

// Deterministic init from a seed, torchtitan's (qwen3_init.c): the embedding normal(0, 1); q, k,
// v and every gate_proj trunc_normal(0, 0.02); o_proj, up_proj, down_proj and the router
// trunc_normal(0, 0.02 / sqrt(2 (layer + 1))), those cut at +-2; the output layer (the tied
// embedding too) trunc_normal(0, hidden^-0.5) cut at 3 std; biases and buffers 0, norms 1.
typedef enum { QWEN3_INIT_CONST, QWEN3_INIT_NORMAL, QWEN3_INIT_TRUNC } qwen3_init_kind;
typedef struct qwen3_init_rule {
    qwen3_init_kind kind;
    double value; // CONST: the value; NORMAL, TRUNC: the std (mean 0)
    double cut;   // TRUNC: values are in [-cut, cut]
} qwen3_init_rule;
qwen3_init_rule qwen3_init_rule_of(const qwen3_config *c, const qwen3_param *p);
int qwen3_init_random(qwen3_model *m, uint64_t seed, ct_error *err);
// Tensor p's (one of m's params) values from the seed into x (p->numel floats, host memory); m
// may be a parameter table alone (qwen3_init_layout): tensor parallelism draws the global tensor
// and keeps its slice.
void qwen3_init_tensor(const qwen3_model *m, const qwen3_param *p, float *x, uint64_t seed);
// The same for the tensors that start in elements [lo, hi) only (FSDP fills one unit at a time):
// each gets the values qwen3_init_random gives it.
int qwen3_init_random_range(qwen3_model *m, uint64_t seed, size_t lo, size_t hi, ct_error *err);
const qwen3_param *qwen3_find_param(const qwen3_model *m, const char *name);

// Parameter I/O (qwen3_params.c): the weights live on the model's backend, and host code reads
// and writes them only through these. By HF name and element range [first, first + count):
int qwen3_params_write(qwen3_model *m, const char *name, size_t first, size_t count,
                       const float *in, ct_error *err);
// The whole parameter buffer (param_mem's layout) as host memory, for bulk I/O: the buffer itself
// on the plain CPU backend, else a copy (filled from the weights when `fill`). Release it, with
// `write_back` to make what was written there the weights. NULL (err set) when out of memory.
float *qwen3_params_view(const qwen3_model *m, bool fill, ct_error *err);
void qwen3_params_view_release(const qwen3_model *m, float *host, bool write_back);
// 1 and the first tensor in table order with a non-finite element (its index and value), or 0.
int qwen3_params_first_nonfinite(const qwen3_model *m, const qwen3_param **param, size_t *at,
                                 float *value);
// XXH64 of the parameter buffer (the replicas' agreement check).
uint64_t qwen3_params_hash(const qwen3_model *m);

// Checks n token ids: inputs in [0, vocab_size), targets (may be NULL) too or -100. The error
// names the position and value.
int qwen3_check_tokens(const qwen3_model *m, const int32_t *inputs, const int32_t *targets,
                       int64_t n, ct_error *err);

// One forward's inputs, (B, T) each as qwen3_plan sized them.
typedef struct qwen3_batch {
    const int32_t *inputs;  // token ids in [0, vocab_size)
    const int32_t *targets; // NULL = logits only; -100 = ignored
    // Block-causal attention (mem_opts.block_causal): the tokens' RoPE positions. A row's
    // documents start where positions[b, t] == 0 (positions[b, 0] must be 0) and count up by one
    // inside a document; each document is then computed exactly as if it were its own sequence
    // (B = 1, T = its length): attention within it only, positions from 0. The forward's backward
    // and any recomputation under activation checkpointing use the same documents. NULL = one
    // document per row (plain causal attention, as without block_causal).
    const int32_t *positions;
    // qwen3_batch_check accepted these arrays already (the trainer checks a step's data once,
    // and agrees with the other ranks on the outcome, before its first forward): the forward
    // does not check them again. false: the forward checks.
    bool checked;
    // LoRA dropout's key (model/qwen3_lora.h): with `sampled`, row b is the run's global sample
    // sample0 + b, and its masks depend on that index only (so ranks and micro-batches that
    // split a step draw what one process draws); without, on the count of training forwards.
    bool sampled;
    uint64_t sample0;
} qwen3_batch;

// Checks `rows` rows of T tokens (after qwen3_plan; rows may span several forwards' B rows):
// the token ids (qwen3_check_tokens) and, when given, the positions: the rule above (naming b,
// t, expected and found), block_causal planned, and, per forward of B rows, an attention kernel
// (a plugin's) whose state for these documents exceeds what it asked for at (B, T).
int qwen3_batch_check(const qwen3_model *m, const qwen3_batch *batch, int64_t rows, ct_error *err);

// Returns the sum of per-token cross-entropy over valid targets (0 without targets); *n_valid
// (if non-NULL) gets their count. Loss = sum / n_valid (global count under data parallelism).
// Returns NAN (and computes nothing) if the batch fails qwen3_batch_check or qwen3_plan was not
// run. With mem_opts.loss_chunk, targets NULL computes nothing past the final norm.
double qwen3_forward(qwen3_model *m, const qwen3_batch *batch, int64_t *n_valid);
// qwen3_forward for a training step whose qwen3_backward will get `loss_scale`: with
// mem_opts.loss_chunk it runs the head's backward chunk by chunk as it goes (so no logits are
// kept, and none are recomputed); without, it is qwen3_forward. Gradients accumulate, so call
// qwen3_zero_grad before it, not between it and qwen3_backward. Not on a model built by
// qwen3_init_forward_only (it asserts; a release build runs qwen3_forward).
double qwen3_forward_train(qwen3_model *m, const qwen3_batch *batch, float loss_scale,
                           int64_t *n_valid);
void qwen3_zero_grad(qwen3_model *m);
// Under mem_opts.bf16: rounds the weights into param_bf16. Call after the weights change (load,
// init, resume, each optimizer step), before the next forward. Does nothing otherwise, nor on a
// model whose bf16 weights are its only ones (weights16).
void qwen3_refresh_bf16(qwen3_model *m);
// Accumulates into grad_mem the gradient of loss_scale * (sum of token losses) of the last
// forward. loss_scale is 1/n_valid for the mean loss. Once per forward: a backward without a
// forward with targets before it does nothing. Not on a model built by qwen3_init_forward_only
// (no gradients): that asserts.
void qwen3_backward(qwen3_model *m, float loss_scale);

// Pipeline parallelism (model/qwen3.c): a pass over one stage, local layers [l0, l1), of a model
// that holds a rank's stages (cfg.n_parts). The forward starts at the embedding (l0 == 0 and the
// model has it) or from `in`, the previous stage's output (N, C rows on the backend), and ends at
// the loss (l1 == num_hidden_layers and the model has the head: the loss sum over the batch's
// targets is returned, their count in *n_valid when not NULL; the head's backward is never fused
// into it) or at the stage's output
// (qwen3_stage_output(m, l1), valid until the next forward; 0 is returned). The backward, right
// after that stage's forward, starts from loss_scale at the head or from dout (the gradient of
// the stage's output) and ends at the embedding or at the gradient of the stage's input
// (qwen3_stage_dinput, valid until the next pass). Gradients accumulate as qwen3_backward's.
// Under TP with sequence parallelism (m->tp) the input, output and their gradients are this
// rank's N / tp rows (its sequence shard), as the residual stream is. `train`: a training
// forward (a LoRA adapter's dropout on, PEFT's train mode), else validation's.
double qwen3_stage_forward(qwen3_model *m, const qwen3_batch *batch, int l0, int l1,
                           const float *in, bool train, int64_t *n_valid);
void qwen3_stage_backward(qwen3_model *m, int l0, int l1, const float *dout, float loss_scale);
float *qwen3_stage_output(const qwen3_model *m, int l1);
float *qwen3_stage_dinput(const qwen3_model *m);
// A pipeline rank runs several forwards before their backwards: qwen3_plan_sets gives the
// planned model n activation sets (n - 1 more copies of everything qwen3_plan allocated for the
// activations, laid out the same; n <= 1: nothing), and qwen3_use_set(m, j) makes set j the one
// the next forward fills and the next backward reads. A micro-batch's forward and backward in
// the same set, with no other pass in it between, compute what they compute alone: nothing is
// recomputed. qwen3_memory_plan_ops's activations are one set's.
int qwen3_plan_sets(qwen3_model *m, int n, ct_error *err);
void qwen3_use_set(qwen3_model *m, int j);

// ---------------------------------------------------------------------------------------------
// Generation (qwen3_generate.c): a KV cache and the training forward's layers over it, on the
// model's backend and op table. qwen3_gen_plan allocates everything once (the cache for max_len
// positions, one layer's activations for a prefill of max_len tokens, the host logits); prefill
// and decode then allocate nothing. Independent of qwen3_plan (training's buffers): a model may
// have both. Not thread-safe; one generation per qwen3_gen.
typedef struct qwen3_gen {
    qwen3_model *m;
    int max_len; // positions the cache holds (prompt + generated tokens)
    int len;     // positions filled so far
    // The last position's logits (V floats, host memory), after each prefill and decode; under
    // bf16 they hold bf16 values, as the training forward's bf16 head.
    float *logits;
    // Private to qwen3_generate.c: one backend buffer carved by its layout walk.
    float *mem;
    size_t floats;
    // L x (max_len, NKV, D) each: the keys after q/k norm and RoPE, and the values; fp32, or
    // under bf16 the bf16 cache, with kr and v holding the rows being computed.
    float *kcache, *vcache, *kr, *v;
    uint16_t *kcache16, *vcache16;
    float *rope_cos, *rope_sin; // (max_len, D/2)
    float *resid[2], *resid2, *ln, *rstd, *qkv, *qr, *q_rstd, *k_rstd, *rope_scratch, *atty;
    float *att_state, *dec_scratch, *gate_up, *h, *swiglu_scratch;
    float *probs, *route_w, *moe_state, *moe_scratch, *route_scratch;
    int32_t *expert, *ids;
    int route_threads;
    float *lnf, *lnf_rstd, *dev_logits, *mm_scratch;
    uint16_t *in16, *gate_up16, *lnf16;
    // bf16: prefill row counts with planned GEMM shapes (powers of two, then max_len); a prompt
    // runs padded to the next one. fp32 runs a prompt at its own length.
    int buckets[40], n_buckets;
} qwen3_gen;

// Bytes qwen3_gen_plan allocates for max_len positions with this op table and memory options
// (the backend buffer and the host logits), before anything is allocated.
size_t qwen3_gen_memory(const qwen3_config *cfg, const ct_ops *ops, const qwen3_memory_opts *opts,
                        int max_len);
// Plans generation on m (weights loaded; m->mem_opts set: bf16 runs the linear layers on the
// bf16 copy, which this refreshes) for up to max_len positions (<= max_position_embeddings).
int qwen3_gen_plan(qwen3_gen *g, qwen3_model *m, int max_len, ct_error *err);
void qwen3_gen_free(qwen3_gen *g);
// Keeps the cache's first `keep` positions (<= g->len) and runs ids[0, n) at positions
// [keep, keep + n) in one batched forward against them (bf16 near the cache's end: in pieces),
// filling the cache; g->len becomes keep + n and g->logits gets its last position's. keep 0 starts
// a sequence (the table's causal attention over the block); past 0 (a chat's new turn after its
// cached history) each row runs attention_decode over the cache rows [0, its position]. Errors
// (nothing runs): n < 1, keep > g->len, keep + n > max_len, an id outside the vocabulary.
int qwen3_gen_prefill(qwen3_gen *g, int keep, const int32_t *ids, int n, ct_error *err);
// Appends one token at position g->len (attention_decode against the cache); g->logits gets its
// logits. Errors: no prefill yet, the cache full, an id outside the vocabulary.
int qwen3_gen_decode(qwen3_gen *g, int32_t id, ct_error *err);
