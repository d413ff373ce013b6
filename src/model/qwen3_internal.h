// Private to src/model/qwen3*.c: the activation layout behind qwen3_model.acts, shared by the
// layout code (qwen3_layout.c) and the forward/backward (qwen3.c).
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/qwen3.h"

// N = B*T tokens. Everything a layer's backward reads, saved by its forward.
typedef struct qwen3_layer_acts {
    float *resid;          // (N,C) layer input: the residual stream
    float *ln1, *ln1_rstd; // (N,C), (N) input_layernorm
    float *qkv;            // (N,NH*D + 2*NKV*D) the fused q|k|v projection, before the norms
    float *v;              // (N,NKV*D) its v part, contiguous: what attention reads
    float *q_rstd;         // (N*NH) q_norm, one per head
    float *k_rstd;         // (N*NKV)
    float *qr;             // (B,T,NH,D) q after q_norm and RoPE: what attention reads
    float *kr;             // (B,T,NKV,D)
    float *att;            // attention state, ops->attention_state_floats()
    float *atty;           // (N,NH*D) attention output, o_proj input
    float *resid2;         // (N,C) resid + o_proj(atty)
    float *ln2, *ln2_rstd; // (N,C), (N) post_attention_layernorm
    // Dense MLP (NULL in a sparse layer):
    float *gate_up; // (N,2F) the fused gate|up projection, row by row
    float *h;       // (N,F) silu(gate) * up, down_proj input
    // Sparse MoE block (NULL in a dense layer):
    float *probs;     // (N,E) router logits, turned into their softmax in place
    int32_t *expert;  // (N,K) chosen experts, in the router's top-k order
    float *route_w;   // (N,K) their routing weights
    float *moe_state; // ops->moe_state_floats(): what the expert kernel's backward reads
    int sparse_index; // this layer's row in the balance statistics and among expert biases
    // bf16 mixed precision: the activations torch's autocast keeps in bf16 (or casts to bf16 for
    // a product) are saved here in bf16, each the size of its fp32 namesake, and the namesakes
    // then point at the model's shared fp32 staging (qwen3_acts.stage_*): the forward computes
    // into the staging and rounds it (to_bf16 in qwen3.c), the backward widens back what it
    // reads in fp32. NULL in fp32 runs.
    uint16_t *ln1_16, *qkv16, *v16, *qr16, *kr16, *atty16, *ln2_16, *gate_up16, *h16;
    // Activation checkpointing. QWEN3_AC_LAYER: only resid is this layer's own; every other
    // buffer above is the shared recompute set, which the layer's forward fills again during the
    // backward. QWEN3_AC_OPS: the outputs of GEMMs and attention (qkv, att, atty, resid2,
    // gate_up, probs, expert, route_w, moe_state) are its own; the elementwise ops' outputs
    // (ln1, v, qr, kr, ln2, h and the rstds) are the shared set's, recomputed from them.
    qwen3_layer_ac recompute;
} qwen3_layer_acts;

// Block-causal attention: one document of the packed batch, tokens [start, start + len) of the
// N, all in one row; `state` is where its attention state starts in a layer's `att` (the sum
// of attention_state_floats(1, len) over the documents before it).
typedef struct qwen3_doc {
    int32_t start, len;
    size_t state;
} qwen3_doc;

typedef struct qwen3_acts {
    qwen3_layer_acts *layers;   // L entries
    float *rope_cos, *rope_sin; // (T, D/2)
    float *resid_out;           // (N,C) output of the last layer
    float *lnf, *lnf_rstd;      // (N,C), (N) model.norm
    uint16_t *lnf16;            // bf16: lnf saved in bf16 (lnf is then stage_ln)
    float *logits;              // (N,V), or (loss_chunk,V); backward turns it into dlogits in place
    uint16_t *logits16;         // bf16 head (qwen3_head_bf16): the same buffer, holding bf16 logits
    float *ce_scratch;          // bf16 head: V floats per thread for the loss, past the logits
    float *mm_scratch; // mem_opts.bf16: the largest matmul_bf16_scratch_floats of the model's GEMMs
    float *losses;     // (N) per-token cross-entropy
    // Gradient scratch, reused by every layer (backward visits one layer at a time). From dq
    // to dlogits it shares memory with `logits` (see qwen3_acts_layout).
    float *dresid;         // (N,C) gradient of the residual stream
    float *dln, *dtmp;     // (N,C) gradient of a norm output; a second contribution to sum in
    float *dq, *datty;     // (N,NH*D); dq is also the fused q/k kernels' forward scratch
    float *dk, *dv;        // (N,NKV*D)
    float *dqkv;           // (N,NH*D + 2*NKV*D) gradient of the fused projection's output
    float *dh;             // (N,F) gradient of h
    float *swiglu_scratch; // ops->swiglu_rows_scratch_floats(), for swiglu_rows_*
    float *att_scratch;    // ops->attention_scratch_floats()
    float *moe_scratch;    // ops->moe_scratch_floats() (MoE models only)
    float *route_scratch;  // moe_route_scratch_floats(E, route_threads): a wide router's top-k
    int route_threads;     // the threads route_scratch was planned for
    float *dweight;        // (N,K) gradient of the routing weights
    float *dlogits;        // (N,E) gradient of the router logits
    float *aux_dprob;      // (E) the load-balancing loss's gradient per router probability
    // bf16: the fp32 staging of the layers' bf16 activations (NULL in fp32 runs). The MLP's h
    // stages in dh.
    float *stage_ln, *stage_qkv, *stage_atty, *stage_qr, *stage_kr, *stage_v, *stage_gate_up;
    bool aux_active; // the balance component gave this backward an aux gradient (aux_dprob)
    // Copies of the last forward's tokens, (N) each: backward needs them after the caller's
    // buffers may be gone.
    int32_t *inputs, *targets;
    bool have_targets; // the last forward computed a loss, so backward has something to do
    bool head_done;    // qwen3_forward_train ran the chunked head's backward: dln holds dlnf
    // Block-causal (mem_opts.block_causal). docs: the documents of the last forward's positions
    // (qwen3_batch.positions), which its backward and recomputations use (n_docs == 0: one per
    // row, the plain path); docs_next: where the next forward lists its own before it compares
    // them with docs. pos_cos, pos_sin (N, D/2) then hold each token's rows of the RoPE tables.
    // The lists are host memory, N entries each (the most documents a batch can hold).
    float *pos_cos, *pos_sin;
    // Context parallelism (mem_opts.cp): pos_cos, pos_sin hold each token's rows at its global
    // position, filled for rank cp_rows (-1: not yet); the ring's buffers: cp_kv, cp_kv_floats of
    // peers' keys and values and their gradients; cp_out (N, NH*D) and cp_lse (NH, N), a pair's
    // output before the merge; cp_di (NH, N), the pair backward's scratch.
    // Block-causal under CP: cp_doc (backend, N) each token's document start as a global index
    // of its sequence (its global index minus its position), from the host's cp_doc_host (N),
    // when cp_docs (the last forward had positions).
    int cp_rows;
    float *cp_kv, *cp_out, *cp_lse, *cp_di;
    size_t cp_kv_floats;
    int32_t *cp_doc, *cp_doc_host;
    bool cp_docs;
    qwen3_doc *docs, *docs_next;
    int n_docs;
} qwen3_acts;

// How one forward of the layers runs (qwen3_layer_forward): training's over the planned batch,
// saving each layer's activations, or generation's over a KV cache, one layer's activations
// reused by all (keep nothing). The layer body is the same; only where k and v go, which
// attention runs and the scratch differ.
typedef struct qwen3_pass {
    qwen3_dims d; // the rows: B sequences of T tokens (generation: B = 1, T = the new tokens)
    // The q/k norm + RoPE kernel's rows: rope_B x rope_T tokens reading these table rows
    // (block-causal documents: 1 x N over each token's own rows).
    const float *rope_cos, *rope_sin;
    int rope_B, rope_T;
    const qwen3_doc *docs; // block-causal documents (n_docs 0: one per row)
    int n_docs;
    // A KV cache (NULL: k and v are the layer's own kr and v, and attention reads them): layer
    // l's keys and values go to rows [pos, pos + T) of its (cache_len, NKV, D) block, after L
    // such blocks for the layers before; attention then reads rows [0, pos + T): the table's
    // causal kernel at pos 0, past it attention_decode for each row t over rows [0, pos + t]
    // (decode: T = 1; a prefill after cached positions: T rows). Under bf16 the cache is
    // kcache16/vcache16 instead (k and v hold bf16 values there): the rows are computed in the
    // layer's kr and v, their bf16 values cached, and past pos 0 attention_decode_bf16 reads it.
    float *kcache, *vcache;
    uint16_t *kcache16, *vcache16;
    int cache_len, pos;
    float *dec_scratch; // attention_decode_scratch_floats(cache_len, NH, D)
    // Scratch: the fused q/k kernels', SwiGLU's, the expert kernel's, a wide router's (planned
    // for route_threads), the bf16 GEMMs'.
    float *rope_scratch, *swiglu_scratch, *moe_scratch, *route_scratch, *mm_scratch;
    int route_threads;
    // Tensor parallelism (m->tp): an (N,C) buffer for a row-parallel GEMM's partial sums, which
    // a reduce-scatter sums onto the sequence shards (NULL without TP).
    float *part;
    bool count; // the routers add their statistics to the model's balance component
    bool lora;  // the adapted projections add their LoRA branch (training's pass; qwen3_lora.h)
} qwen3_pass;

// Layer l's forward over pass p: a->resid -> out, through the activations a points at. gemms
// false (the op-level recomputation) runs only the elementwise ops from the kept GEMM and
// attention outputs. The one layer body of training, verify and generation (qwen3.c).
void qwen3_layer_forward(const qwen3_model *m, int l, qwen3_layer_acts *a, const qwen3_pass *p,
                         float *out, bool gemms);

// A frozen model (LoRA's base, qwen3_init_lora): held as qwen3_init_forward_only holds it (no
// grad_mem, each weight once in its kernel's dtype), planned with opts as given, and its
// backward computes input gradients only.
int qwen3_init_frozen(qwen3_model *m, const qwen3_config *cfg, ct_backend *be, const ct_ops *ops,
                      const qwen3_memory_opts *opts, ct_error *err);
// Context parallelism (qwen3_ring.c, m->cp set): each token's RoPE rows (pos_cos, pos_sin) at
// its position: its global index (positions NULL; once per rank) or, block-causal, its offset in
// its document, whose start each token's cp_doc then holds; a layer's ring attention, forward
// (a->atty and the lse in a->att from a->qr, a->kr, a->v) and backward (s->dq, s->dk, s->dv
// from s->datty), on the table's attention_pair kernels (bf16: their bf16 rounding).
// qwen3_cp_check_positions: the rule of qwen3_batch's positions as one rank sees its two chunks
// of each row (each chunk goes on by one or restarts at 0, and no document starts before the
// sequence: position <= global index).
void qwen3_cp_positions(qwen3_model *m, const int32_t *positions);
int qwen3_cp_check_positions(const qwen3_model *m, const int32_t *positions, int64_t rows,
                             ct_error *err);
void qwen3_ring_forward(const qwen3_model *m, qwen3_layer_acts *a, bool bf16);
void qwen3_ring_backward(const qwen3_model *m, const qwen3_layer_acts *a, qwen3_acts *s, bool bf16);

// Expert parallelism (qwen3_ep.c, m->ep set): a sparse layer's experts on its routing (a->expert,
// a->route_w) into y (N,C); the backward's input gradient dx (N,C, overwritten), the routing
// weights' gradient dweight (N,K) and the local experts' weight gradients (+=) from dout. Under
// m->ep->shard, N is this rank's qwen3_moe_rows (its sequence shard of ln2).
void qwen3_ep_forward(const qwen3_model *m, const qwen3_layer_weights *w, const qwen3_layer_acts *a,
                      float *y);
void qwen3_ep_backward(const qwen3_model *m, const qwen3_layer_weights *w, qwen3_layer_weights *g,
                       const qwen3_layer_acts *a, float *dx, float *dweight, const float *dout);

// The token rows a sparse layer routes: the N rows, or this rank's sequence shard under EP with
// TP (qwen3_ep.shard).
static inline int qwen3_moe_rows(const qwen3_model *m, int N) {
    return m->ep && m->ep->shard ? N / m->tp->size : N;
}

// Whether a MoE model's experts run the table's bf16 kernels (moe_bf16_*): mem_opts.bf16 and
// .bf16_experts.
static inline bool qwen3_bf16_experts(const qwen3_memory_opts *opts) {
    return opts && opts->bf16 && opts->bf16_experts;
}

// bf16 mixed precision's loss head: the lm_head writes bf16 logits and the cross-entropy reads
// them, as torch's autocast does (unless a plugin's cross-entropy, fp32 by the ABI, replaced the
// table's: then the logits stay fp32).
static inline bool qwen3_head_bf16(const ct_ops *ops, const qwen3_memory_opts *opts) {
    return opts && opts->bf16 && ops->cross_entropy_bf16_forward &&
           ops->cross_entropy_bf16_backward && ops->cross_entropy_bf16_forward_backward;
}

// bf16 mixed precision's dense MLP: gate|up and h stay bf16 through the table's bf16 SwiGLU
// (unless a plugin's SwiGLU, fp32 by the ABI, replaced it).
static inline bool qwen3_mlp_bf16(const ct_ops *ops, const qwen3_memory_opts *opts) {
    return opts && opts->bf16 && ops->swiglu_rows_bf16_forward && ops->swiglu_rows_bf16_backward;
}

// Lays the activations out from `base` (NULL: only count) into `a` (its `layers` may be NULL
// when counting) and returns the floats needed. The same walk sizes and carves, so the plan
// and the allocation cannot disagree.
size_t qwen3_acts_layout(qwen3_acts *a, float *base, const qwen3_config *cfg, const ct_ops *ops,
                         int B, int T, const qwen3_memory_opts *opts);

// RoPE tables exactly as HF builds them in fp32, for positions [0, T): cos_t, sin_t (T, D/2).
void qwen3_rope_tables(float *cos_t, float *sin_t, int T, int D, double theta);
// The same tables written to backend buffers cos_t, sin_t (T, D/2) each.
int qwen3_rope_write(ct_backend *be, float *cos_t, float *sin_t, int T, const qwen3_config *c,
                     ct_error *err);

// A linear layer, out = inp @ w^T + bias: under bf16 mixed precision the table's bf16 kernel on
// w's bf16 copy (the same offset in param_bf16) and the input's bf16 copy inp16, with the output
// in bf16 into out16 when given; else the fp32 matmul. scratch: the bf16 kernel's, planned for
// this shape. The layers (qwen3.c: training's and generation's) and both heads (the loss head,
// generation's last row).
static inline void qwen3_linear(const qwen3_model *m, float *scratch, float *out, uint16_t *out16,
                                const float *inp, const uint16_t *inp16, const float *w,
                                const float *bias, int N, int C, int OC) {
    if (m->mem_opts.bf16)
        m->ops->matmul_bf16_forward(m->ops, out, out16, scratch, inp, inp16,
                                    m->param_bf16 + (w - m->param_mem), bias, N, C, OC);
    else
        m->ops->matmul_forward(out, inp, w, bias, N, C, OC);
}

// The embedding rows of ids (N) into out (N, C): from param_bf16 where the model holds the table
// in bf16 only (weights16), else from the fp32 table.
static inline void qwen3_embed(const qwen3_model *m, float *out, const int32_t *ids, int N) {
    const float *table = m->w.embed;
    if (m->weights16)
        m->ops->embedding_bf16_forward(out, ids, m->param_bf16 + (table - m->param_mem), N,
                                       m->cfg.hidden_size);
    else
        m->ops->embedding_forward(out, ids, table, N, m->cfg.hidden_size);
}

// A bump allocator over one buffer (base NULL: count only). Every piece starts on a 64-byte
// boundary. The activations' layout and generation's walk with it, so a plan counts exactly what
// the same walk then carves.
typedef struct carve {
    float *base;
    size_t off;
} carve;

static inline float *carve_take(carve *cv, size_t n) {
    float *p = cv->base ? cv->base + cv->off : NULL;
    cv->off += (n + 15) / 16 * 16;
    return p;
}
