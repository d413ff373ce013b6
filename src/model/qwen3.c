// The Qwen3 decoder, forward and backward, as Hugging Face's modeling_qwen3.py computes it.
// Every number is produced by an op from m->ops; this file only wires the blocks. Shapes use
// N = B*T tokens, C hidden, NH/NKV query/kv heads of D, F the MLP width, V the vocabulary.
//
// Forward of one layer (HF Qwen3DecoderLayer):
//   x2 = x  + o_proj(attention(rope(q_norm(q_proj(ln1))), rope(k_norm(k_proj(ln1))), v_proj(ln1)))
//   y  = x2 + down_proj(silu(gate_proj(ln2)) * up_proj(ln2)),   ln1 = norm1(x), ln2 = norm2(x2)
// or, in a sparse layer (HF Qwen3MoeSparseMoeBlock),
//   y  = x2 + sum_k w_k * expert_{e_k}(ln2),  (e, w) = top-K of softmax(router(ln2))
// q|k|v and gate|up each run as one GEMM over the fused weights (qwen3.h); the elementwise steps
// between GEMMs run as ct_ops' fused kernels (q/k norm + RoPE, residual add + norm, SwiGLU over
// the fused rows), which compute what the separate ops would, bit for bit.
// Backward keeps one running gradient of the residual stream (dresid) and adds each block's
// contribution to it.
#include <assert.h>
#include <math.h>
#include <string.h>

#include "model/moe_balance.h"
#include "model/qwen3.h"
#include "model/qwen3_internal.h"
#include "model/qwen3_lora.h"
#include "ops/moe_router.h"

static qwen3_dims model_dims(const qwen3_model *m) {
    return qwen3_dims_of(&m->cfg, m->B, m->T);
}

// A linear layer, out = inp @ w^T + bias: under bf16 mixed precision the table's bf16 kernel on
// w's bf16 copy (the same offset in param_bf16) and the input's saved bf16 copy inp16, with the
// output in bf16 into out16 when given (and in the backward its gradient dout16), else the fp32
// matmul.
static void linear_forward(const qwen3_model *m, float *out, uint16_t *out16, const float *inp,
                           const uint16_t *inp16, const float *w, const float *bias, int N, int C,
                           int OC) {
    qwen3_linear(m, ((const qwen3_acts *)m->acts)->mm_scratch, out, out16, inp, inp16, w, bias, N,
                 C, OC);
}

static void linear_backward(const qwen3_model *m, float *dinp, float *dw, float *dbias,
                            const float *dout, const uint16_t *dout16, const float *inp,
                            const uint16_t *inp16, const float *w, int N, int C, int OC) {
    const ct_ops *op = m->ops;
    if (m->mem_opts.bf16)
        op->matmul_bf16_backward(op, dinp, dw, dbias, ((const qwen3_acts *)m->acts)->mm_scratch,
                                 dout, dout16, inp, inp16, m->param_bf16 + (w - m->param_mem), N, C,
                                 OC);
    else
        op->matmul_backward(dinp, dw, dbias, dout, inp, w, N, C, OC);
}

// Under bf16, where torch's autocast produces a bf16 tensor: x (n) rounded to bf16 in place, and
// saved in x16 unless it is NULL. Nothing in fp32 runs.
static void to_bf16(const qwen3_model *m, uint16_t *x16, float *x, size_t n) {
    if (m->mem_opts.bf16) m->ops->round_to_bf16(x16, x, n);
}

// Attention under bf16: the table's bf16 kernel when it has one (the flash kernel: the products
// rounded as torch's autocast rounds them), else its fp32 kernel on the bf16-rounded q, k, v.
static bool attention_in_bf16(const qwen3_model *m) {
    return m->mem_opts.bf16 && m->ops->attention_bf16_forward && m->ops->attention_bf16_backward;
}

// Under bf16: the staging x (n) of a saved bf16 activation, widened back from x16 for a kernel
// that reads fp32. Nothing in fp32 runs (x is the activation itself).
static void from_bf16(const qwen3_model *m, float *x, const uint16_t *x16, size_t n) {
    if (m->mem_opts.bf16) m->ops->bf16_to_f32(x, x16, n);
}

// ---------------------------------------------------------------------------------------------
// Tensor parallelism with sequence parallelism (qwen3_tp, qwen3.h). Without it the shard is all
// N rows at offset 0 and every collective is skipped, so one process runs the plain path.

// Rows of this rank's sequence shard.
static int sp_rows(const qwen3_model *m, int N) {
    return m->tp ? N / m->tp->size : N;
}

// Where this rank's rows start in a full (N, C) buffer that a gather fills.
static size_t sp_offset(const qwen3_model *m, int N, int C) {
    return m->tp ? (size_t)m->tp->rank * sp_rows(m, N) * C : 0;
}

static void tp_gather(const qwen3_model *m, float *buf, size_t n) {
    if (m->tp) m->tp->gather(m->tp->ctx, buf, n);
}

static void tp_reduce_scatter(const qwen3_model *m, float *buf, size_t n) {
    if (m->tp) m->tp->reduce_scatter(m->tp->ctx, buf, n);
}

// The gradient of the sequence shard (Ns, C) as full rows (N, C) in `full`: copied to this
// rank's rows, then gathered. Without TP, `full` is the shard itself.
static const float *tp_full_rows(const qwen3_model *m, float *full, const float *shard, int N,
                                 int C) {
    if (!m->tp) return shard;
    const size_t n = (size_t)sp_rows(m, N) * C;
    m->be->copy(m->be, full + sp_offset(m, N, C), shard, n * sizeof(float));
    tp_gather(m, full, n);
    return full;
}

// The rows of `x` (N, C) whose input id is another rank's vocabulary (host_ids -1) set to zero:
// the vocab-parallel embedding's lookup and its gradient.
static void tp_zero_foreign_rows(const qwen3_model *m, float *x, int N, int C) {
    const int32_t *ids = m->tp->host_ids;
    for (int i = 0; i < N;) {
        if (ids[i] >= 0) {
            i++;
            continue;
        }
        int j = i;
        while (j < N && ids[j] < 0) j++;
        m->be->zero(m->be, x + (size_t)i * C, (size_t)(j - i) * C * sizeof(float));
        i = j;
    }
}

// ---------------------------------------------------------------------------------------------
// Block-causal documents (qwen3_batch.positions). With documents, the q/k norm + RoPE kernel sees
// the N tokens as one sequence (B = 1, T = N: q and k are (B,T,H,D) contiguous, the same
// memory) whose RoPE rows are each token's own (pos_cos, pos_sin), and attention runs once per
// document on its range of tokens (B = 1, T = its length) with its own piece of the state, so
// each document is computed as if it were alone. Without, the plain (B, T) calls.

typedef struct rope_rows {
    const float *cos, *sin;
    int B, T;
} rope_rows;

static rope_rows rope_of(const qwen3_acts *s, qwen3_dims d) {
    if (s->n_docs || s->cp_rows >= 0) return (rope_rows){s->pos_cos, s->pos_sin, 1, d.N};
    return (rope_rows){s->rope_cos, s->rope_sin, d.B, d.T};
}

// Where a layer's keys and values go (k, v: what q/k norm + RoPE writes, T rows each sequence;
// k16, v16: where their bf16 values are kept, NULL for none) and what its attention reads
// (k_all, v_all, or k16_all, v16_all over a bf16 cache): the layer's own activations; or a KV
// cache's rows at pos and its rows [0, pos + T); or, with a bf16 cache, the layer's own rows
// whose bf16 values go to the cache (a prefill at position 0 reads the rows, anything later
// the cache).
typedef struct kv_rows {
    float *k, *v;
    uint16_t *k16, *v16;
    const float *k_all, *v_all;
    const uint16_t *k16_all, *v16_all;
} kv_rows;

static kv_rows kv_of(const qwen3_layer_acts *a, const qwen3_pass *p, int l) {
    const size_t KV = (size_t)p->d.NKV * p->d.D, layer = (size_t)l * p->cache_len * KV;
    if (p->kcache16) {
        uint16_t *k0 = p->kcache16 + layer, *v0 = p->vcache16 + layer;
        return (kv_rows){
            a->kr, a->v, k0 + (size_t)p->pos * KV, v0 + (size_t)p->pos * KV, a->kr, a->v, k0, v0};
    }
    if (!p->kcache) return (kv_rows){a->kr, a->v, a->kr16, a->v16, a->kr, a->v, NULL, NULL};
    float *k0 = p->kcache + layer, *v0 = p->vcache + layer;
    return (kv_rows){
        k0 + (size_t)p->pos * KV, v0 + (size_t)p->pos * KV, a->kr16, a->v16, k0, v0, NULL, NULL};
}

// out, state = attention(q, k, v) of the pass: the table's kernel (its bf16 one when
// attention_in_bf16) over (B, T), or over each document; over a cache past position 0,
// attention_decode for each of the T rows (B = 1) over the cache rows [0, pos + t]: the causal
// kernels take queries and keys of one length, and a row against the cache is decode's
// contract (one row: decode; T rows: a prefill after cached positions, the rows one after the
// other, each parallel over its heads).
static void attention_forward(const qwen3_model *m, qwen3_layer_acts *a, const qwen3_pass *p,
                              kv_rows kv) {
    const ct_ops *op = m->ops;
    const qwen3_dims d = p->d;
    if ((p->kcache || p->kcache16) && p->pos > 0) {
        const size_t QD = (size_t)d.NH * d.D;
        for (int t = 0; t < d.T; t++)
            if (kv.k16_all)
                op->attention_decode_bf16(a->atty + t * QD, p->dec_scratch, a->qr + t * QD,
                                          kv.k16_all, kv.v16_all, p->pos + t + 1, d.NH, d.NKV, d.D);
            else
                op->attention_decode(a->atty + t * QD, p->dec_scratch, a->qr + t * QD, kv.k_all,
                                     kv.v_all, p->pos + t + 1, d.NH, d.NKV, d.D);
        return;
    }
    if (m->cp) {
        qwen3_ring_forward(m, a, attention_in_bf16(m));
        return;
    }
    const ct_attention_bf16_forward_fn fwd =
        attention_in_bf16(m) ? op->attention_bf16_forward : op->attention_forward;
    if (!p->n_docs) {
        fwd(a->atty, a->att, a->qr, kv.k_all, kv.v_all, d.B, d.T, d.NH, d.NKV, d.D);
        return;
    }
    for (int i = 0; i < p->n_docs; i++) {
        const qwen3_doc *doc = &p->docs[i];
        const size_t q = (size_t)doc->start * d.NH * d.D, k = (size_t)doc->start * d.NKV * d.D;
        fwd(a->atty + q, a->att + doc->state, a->qr + q, kv.k_all + k, kv.v_all + k, 1, doc->len,
            d.NH, d.NKV, d.D);
    }
}

// dq, dk, dv from datty, as attention_forward ran (each document's backward reuses the
// whole scratch: they run one after the other).
static void attention_backward_docs(const qwen3_model *m, const qwen3_layer_acts *a,
                                    qwen3_acts *s) {
    const ct_ops *op = m->ops;
    const qwen3_dims d = model_dims(m);
    if (m->cp) {
        qwen3_ring_backward(m, a, s, attention_in_bf16(m));
        return;
    }
    const ct_attention_bf16_backward_fn bwd =
        attention_in_bf16(m) ? op->attention_bf16_backward : op->attention_backward;
    if (!s->n_docs) {
        bwd(s->dq, s->dk, s->dv, s->att_scratch, s->datty, a->atty, a->att, a->qr, a->kr, a->v, d.B,
            d.T, d.NH, d.NKV, d.D);
        return;
    }
    for (int i = 0; i < s->n_docs; i++) {
        const qwen3_doc *doc = &s->docs[i];
        const size_t q = (size_t)doc->start * d.NH * d.D, kv = (size_t)doc->start * d.NKV * d.D;
        bwd(s->dq + q, s->dk + kv, s->dv + kv, s->att_scratch, s->datty + q, a->atty + q,
            a->att + doc->state, a->qr + q, a->kr + kv, a->v + kv, 1, doc->len, d.NH, d.NKV, d.D);
    }
}

// ---------------------------------------------------------------------------------------------
// Attention block: a->resid2 (N,C) = a->resid + attn(input_layernorm(a->resid)), and a->ln2 =
// post_attention_layernorm(a->resid2) in the same pass (the next block's input).
// gemms false (the op policy's recomputation) runs only the elementwise ops, from the kept
// outputs of the GEMMs and attention (a->qkv, a->resid2): the norms and q/k norm + RoPE.
// Layer l's keys and values go where the pass says (kv_of).

static void attention_block_forward(const qwen3_model *m, const qwen3_layer_weights *w,
                                    qwen3_layer_acts *a, const qwen3_pass *p, int l, bool gemms) {
    const ct_ops *op = m->ops;
    const qwen3_dims d = p->d;
    const int QD = d.NH * d.D, QKV = (d.NH + 2 * d.NKV) * d.D;
    const size_t N = (size_t)d.N;
    const float eps = m->cfg.rms_norm_eps;
    // Sequence parallelism: the norms on this rank's Ns rows, gathered into the full rows the
    // GEMMs read (Ns = N and nothing gathered in one process).
    const int Ns = sp_rows(m, d.N);
    const size_t own = sp_offset(m, d.N, d.C);
    op->rmsnorm_forward(a->ln1 + own, a->ln1_rstd, a->resid, w->input_norm, Ns, d.C, eps);
    tp_gather(m, a->ln1, (size_t)Ns * d.C);
    to_bf16(m, a->ln1_16, a->ln1, N * d.C);
    if (gemms) {
        qwen3_linear(m, p->mm_scratch, a->qkv, NULL, a->ln1, a->ln1_16, w->wqkv, w->bqkv, d.N, d.C,
                     QKV);        // (N,QKV)
        if (p->lora && m->lora) { // PEFT: the base output (bf16 under autocast), plus the branch
            const int KVD = d.NKV * d.D;
            to_bf16(m, NULL, a->qkv, N * QKV);
            qwen3_lora_forward(m, l, LORA_Q, a->qkv, NULL, QKV, a->ln1, a->ln1_16, d.N);
            qwen3_lora_forward(m, l, LORA_K, a->qkv + QD, NULL, QKV, a->ln1, a->ln1_16, d.N);
            qwen3_lora_forward(m, l, LORA_V, a->qkv + QD + KVD, NULL, QKV, a->ln1, a->ln1_16, d.N);
        }
        to_bf16(m, a->qkv16, a->qkv, N * QKV);
    } else {
        from_bf16(m, a->qkv, a->qkv16, N * QKV);
    }
    // q_norm/k_norm (one (D) weight, each head's vector its own row), then RoPE.
    const kv_rows kv = kv_of(a, p, l);
    op->qk_norm_rope_forward(op, a->qr, kv.k, kv.v, a->q_rstd, a->k_rstd, p->rope_scratch, a->qkv,
                             w->q_norm, w->k_norm, p->rope_cos, p->rope_sin, p->rope_B, p->rope_T,
                             d.NH, d.NKV, d.D, eps);
    to_bf16(m, a->qr16, a->qr, N * QD); // autocast's matmuls read q, k and v in bf16
    to_bf16(m, kv.k16, kv.k, N * d.NKV * d.D);
    to_bf16(m, kv.v16, kv.v, N * d.NKV * d.D);
    if (!gemms) {
        // The fused add + norm below gives exactly these bits for its norm (fused.c's contract).
        op->rmsnorm_forward(a->ln2 + own, a->ln2_rstd, a->resid2, w->post_norm, Ns, d.C, eps);
        tp_gather(m, a->ln2, (size_t)Ns * d.C);
        to_bf16(m, a->ln2_16, a->ln2, N * d.C);
        return;
    }
    attention_forward(m, a, p, kv);
    to_bf16(m, a->atty16, a->atty, N * QD);
    // o_proj is row-parallel under TP: its (N,C) partial sums go to p->part, are summed onto the
    // shards, then added to the residual; the bias enters once (rank 0's partial).
    float *o = m->tp ? p->part : a->resid2;
    const float *bo = m->tp && m->tp->rank != 0 ? NULL : w->bo;
    qwen3_linear(m, p->mm_scratch, o, NULL, a->atty, a->atty16, w->wo, bo, d.N, QD, d.C); // (N,C)
    tp_reduce_scatter(m, o, (size_t)Ns * d.C);
    to_bf16(m, NULL, o, (size_t)Ns * d.C);
    if (p->lora) qwen3_lora_forward(m, l, LORA_O, o, NULL, d.C, a->atty, a->atty16, d.N);
    op->add_rmsnorm_forward(op, a->resid2, a->ln2 + own, a->ln2_rstd, a->resid, o, w->post_norm, Ns,
                            d.C, eps);
    tp_gather(m, a->ln2, (size_t)Ns * d.C);
    to_bf16(m, a->ln2_16, a->ln2, N * d.C);
}

// On entry s->dresid is the gradient of a->resid2; on exit, of a->resid.
static void attention_block_backward(const qwen3_model *m, int l, const qwen3_layer_weights *w,
                                     qwen3_layer_weights *g, const qwen3_layer_acts *a,
                                     qwen3_acts *s) {
    const ct_ops *op = m->ops;
    const qwen3_dims d = model_dims(m);
    const int QD = d.NH * d.D, QKV = (d.NH + 2 * d.NKV) * d.D;
    const size_t N = (size_t)d.N;
    const int Ns = sp_rows(m, d.N);
    // Under TP, the output gradient's full rows (in dln, free until q|k|v's input gradient); the
    // bias gradient once (rank 0's; the strategy sums the replicated tensors over the group).
    const float *dout = tp_full_rows(m, s->dln, s->dresid, d.N, d.C);
    float *dbo = m->tp && m->tp->rank != 0 ? NULL : g->bo;
    linear_backward(m, s->datty, g->wo, dbo, dout, NULL, a->atty, a->atty16, w->wo, d.N, QD, d.C);
    qwen3_lora_backward(m, l, LORA_O, s->datty, dout, NULL, d.C, a->atty, a->atty16, d.N);
    from_bf16(m, a->atty, a->atty16, N * QD);
    from_bf16(m, a->qr, a->qr16, N * QD);
    from_bf16(m, a->kr, a->kr16, N * d.NKV * d.D);
    from_bf16(m, a->v, a->v16, N * d.NKV * d.D);
    if (attention_in_bf16(m)) to_bf16(m, NULL, s->datty, N * QD); // a bf16 output's gradient
    attention_backward_docs(m, a, s);
    from_bf16(m, a->qkv, a->qkv16, N * QKV);
    const rope_rows r = rope_of(s, d);
    op->qk_norm_rope_backward(op, s->dqkv, g->q_norm, g->k_norm, s->dq, s->dk, s->dv, a->qkv,
                              w->q_norm, w->k_norm, a->q_rstd, a->k_rstd, r.cos, r.sin, r.B, r.T,
                              d.NH, d.NKV, d.D);
    linear_backward(m, s->dln, g->wqkv, g->bqkv, s->dqkv, NULL, a->ln1, a->ln1_16, w->wqkv, d.N,
                    d.C, QKV);
    const int KVD = d.NKV * d.D;
    qwen3_lora_backward(m, l, LORA_Q, s->dln, s->dqkv, NULL, QKV, a->ln1, a->ln1_16, d.N);
    qwen3_lora_backward(m, l, LORA_K, s->dln, s->dqkv + QD, NULL, QKV, a->ln1, a->ln1_16, d.N);
    qwen3_lora_backward(m, l, LORA_V, s->dln, s->dqkv + QD + KVD, NULL, QKV, a->ln1, a->ln1_16,
                        d.N);
    tp_reduce_scatter(m, s->dln, (size_t)Ns * d.C);
    op->rmsnorm_backward_add(op, s->dresid, g->input_norm, s->dtmp, s->dln, a->resid, w->input_norm,
                             a->ln1_rstd, Ns, d.C);
}

// The gradient of a block's input ln2 = post_attention_layernorm(resid2) in s->dln, added into
// s->dresid (which then holds the gradient of resid2). Under TP, dln holds the full rows' partial
// gradients, summed onto the shards, unless `own` (a sparse layer under EP with TP: its shard's).
static void post_norm_backward(const qwen3_model *m, const qwen3_layer_weights *w,
                               qwen3_layer_weights *g, const qwen3_layer_acts *a, qwen3_acts *s,
                               bool own) {
    const qwen3_dims d = model_dims(m);
    const int Ns = sp_rows(m, d.N);
    if (!own) tp_reduce_scatter(m, s->dln, (size_t)Ns * d.C);
    m->ops->rmsnorm_backward_add(m->ops, s->dresid, g->post_norm, s->dtmp, s->dln, a->resid2,
                                 w->post_norm, a->ln2_rstd, Ns, d.C);
}

// ---------------------------------------------------------------------------------------------
// Dense MLP block: out (N,C) = a->resid2 + down(silu(gate(ln2)) * up(ln2)). A sparse (MoE)
// layer replaces this pair of functions. gemms false: only SwiGLU, from the kept a->gate_up.
// Under bf16 with the table's bf16 SwiGLU, gate|up and h (and in the backward dgate|up) stay
// bf16 from GEMM to GEMM, as under torch's autocast; else an fp32 SwiGLU runs between them.

static void mlp_block_forward(const qwen3_model *m, int l, const qwen3_layer_weights *w,
                              qwen3_layer_acts *a, const qwen3_pass *p, float *out, bool gemms) {
    const ct_ops *op = m->ops;
    const qwen3_dims d = p->d;
    const size_t N = (size_t)d.N;
    if (qwen3_mlp_bf16(op, &m->mem_opts)) {
        if (gemms) {
            qwen3_linear(m, p->mm_scratch, NULL, a->gate_up16, a->ln2, a->ln2_16, w->w_gate_up,
                         NULL, d.N, d.C, 2 * d.F);
            if (p->lora) {
                qwen3_lora_forward(m, l, LORA_GATE, NULL, a->gate_up16, 2 * d.F, a->ln2, a->ln2_16,
                                   d.N);
                qwen3_lora_forward(m, l, LORA_UP, NULL, a->gate_up16 + d.F, 2 * d.F, a->ln2,
                                   a->ln2_16, d.N);
            }
        }
        op->swiglu_rows_bf16_forward(a->h16, a->gate_up16, d.N, d.F);
    } else if (gemms) {
        qwen3_linear(m, p->mm_scratch, a->gate_up, NULL, a->ln2, a->ln2_16, w->w_gate_up, NULL, d.N,
                     d.C, 2 * d.F);
        if (p->lora && m->lora) {
            to_bf16(m, NULL, a->gate_up, N * 2 * d.F);
            qwen3_lora_forward(m, l, LORA_GATE, a->gate_up, NULL, 2 * d.F, a->ln2, a->ln2_16, d.N);
            qwen3_lora_forward(m, l, LORA_UP, a->gate_up + d.F, NULL, 2 * d.F, a->ln2, a->ln2_16,
                               d.N);
        }
        to_bf16(m, a->gate_up16, a->gate_up, N * 2 * d.F);
    } else {
        from_bf16(m, a->gate_up, a->gate_up16, N * 2 * d.F);
    }
    if (!qwen3_mlp_bf16(op, &m->mem_opts)) {
        op->swiglu_rows_forward(op, a->h, p->swiglu_scratch, a->gate_up, d.N, d.F); // (N,F)
        to_bf16(m, a->h16, a->h, N * d.F);
    }
    if (!gemms) return;
    // down_proj is row-parallel under TP: partial sums in p->part, summed onto the shards.
    const int Ns = sp_rows(m, d.N);
    float *y = m->tp ? p->part : out;
    qwen3_linear(m, p->mm_scratch, y, NULL, a->h, a->h16, w->w_down, NULL, d.N, d.F, d.C); // (N,C)
    tp_reduce_scatter(m, y, (size_t)Ns * d.C);
    to_bf16(m, NULL, y, (size_t)Ns * d.C);
    if (p->lora) qwen3_lora_forward(m, l, LORA_DOWN, y, NULL, d.C, a->h, a->h16, d.N);
    op->add(out, a->resid2, y, (int64_t)Ns * d.C);
}

// On entry s->dresid is the gradient of the block output; on exit, of a->resid2.
static void mlp_block_backward(const qwen3_model *m, int l, const qwen3_layer_weights *w,
                               qwen3_layer_weights *g, const qwen3_layer_acts *a, qwen3_acts *s) {
    const ct_ops *op = m->ops;
    const qwen3_dims d = model_dims(m);
    const float *dout = tp_full_rows(m, s->dln, s->dresid, d.N, d.C); // dln: free until gate|up's
    linear_backward(m, s->dh, g->w_down, NULL, dout, NULL, a->h, a->h16, w->w_down, d.N, d.F, d.C);
    qwen3_lora_backward(m, l, LORA_DOWN, s->dh, dout, NULL, d.C, a->h, a->h16, d.N);
    // In place: gate_up's last reader is this backward, so it takes its own gradient.
    if (qwen3_mlp_bf16(op, &m->mem_opts)) {
        op->swiglu_rows_bf16_backward(a->gate_up16, s->dh, a->gate_up16, d.N, d.F);
        linear_backward(m, s->dln, g->w_gate_up, NULL, NULL, a->gate_up16, a->ln2, a->ln2_16,
                        w->w_gate_up, d.N, d.C, 2 * d.F);
        qwen3_lora_backward(m, l, LORA_GATE, s->dln, NULL, a->gate_up16, 2 * d.F, a->ln2, a->ln2_16,
                            d.N);
        qwen3_lora_backward(m, l, LORA_UP, s->dln, NULL, a->gate_up16 + d.F, 2 * d.F, a->ln2,
                            a->ln2_16, d.N);
    } else {
        from_bf16(m, a->gate_up, a->gate_up16, (size_t)d.N * 2 * d.F);
        float *dgate_up = a->gate_up;
        op->swiglu_rows_backward(op, dgate_up, s->swiglu_scratch, s->dh, a->gate_up, d.N, d.F);
        linear_backward(m, s->dln, g->w_gate_up, NULL, dgate_up, NULL, a->ln2, a->ln2_16,
                        w->w_gate_up, d.N, d.C, 2 * d.F);
        qwen3_lora_backward(m, l, LORA_GATE, s->dln, dgate_up, NULL, 2 * d.F, a->ln2, a->ln2_16,
                            d.N);
        qwen3_lora_backward(m, l, LORA_UP, s->dln, dgate_up + d.F, NULL, 2 * d.F, a->ln2, a->ln2_16,
                            d.N);
    }
    post_norm_backward(m, w, g, a, s, false);
}

// ---------------------------------------------------------------------------------------------
// Sparse MoE block: out (N,C) = a->resid2 + experts(ln2) routed by the router. The routing
// statistics for the load-balancing loss and the expert bias are summed as a side effect.

// A weight's bf16 copy: the same offset in param_bf16 (refreshed once per optimizer step).
static const uint16_t *bf16_copy(const qwen3_model *m, const float *w) {
    return m->param_bf16 + (w - m->param_mem);
}

// The pass's `count` adds the routing statistics of these tokens to the balance component; a
// recomputation (activation checkpointing) must not count them twice, generation not at all.
// Under TP (MoE without EP) the router is replicated and runs on the gathered ln2, so every rank
// of the group routes all N rows alike and counts the same statistics (the balance component
// sums them over the data-parallel ranks only); the experts are cut by width (Fm/tp each), so
// the expert kernel's (N,C) output is a partial sum, in p->part, summed onto the sequence shards
// as down_proj's. Under EP with TP (etp 1, qwen3_ep.shard) the router and the dispatch see only
// this rank's Nr = N/tp rows of ln2 (the first Nr rows of probs, expert and route_w), and the
// combined output is the shard's, whole: the statistics are then summed over the TP ranks too.
static void moe_block_forward(const qwen3_model *m, int l, const qwen3_layer_weights *w,
                              qwen3_layer_acts *a, const qwen3_pass *p, float *out) {
    const ct_ops *op = m->ops;
    const qwen3_dims d = p->d;
    const int Nr = qwen3_moe_rows(m, d.N);
    const size_t own = Nr < d.N ? sp_offset(m, d.N, d.C) : 0;
    qwen3_linear(m, p->mm_scratch, a->probs, NULL, a->ln2 + own, a->ln2_16 ? a->ln2_16 + own : NULL,
                 w->router, NULL, Nr, d.C, d.E); // logits (Nr,E)
    to_bf16(m, NULL, a->probs, (size_t)Nr * d.E);
    op->moe_route_forward(a->expert, a->route_w, a->probs, w->expert_bias, Nr, d.E, d.K,
                          m->cfg.norm_topk_prob, p->route_scratch, p->route_threads);
    const size_t row = (size_t)a->sparse_index * d.E;
    if (p->count && m->balance)
        op->moe_route_stats(m->balance->load + row, m->balance->prob + row, a->expert, a->probs, Nr,
                            d.E, d.K);
    float *y = m->tp ? p->part : out;
    const ct_moe_lora *lora = p->lora ? qwen3_lora_experts(m, l) : NULL;
    const bool bf16x = qwen3_bf16_experts(&m->mem_opts);
    if (lora && bf16x) // PEFT's per-expert LoRA, inside the expert kernel
        op->moe_bf16_lora_forward(op, y, a->moe_state, p->moe_scratch, a->ln2_16, a->expert,
                                  a->route_w, bf16_copy(m, w->experts), lora, d.N, d.C, d.Fm, d.E,
                                  d.K);
    else if (lora)
        op->moe_lora_forward(y, a->moe_state, p->moe_scratch, a->ln2, a->expert, a->route_w,
                             w->experts, lora, d.N, d.C, d.Fm, d.E, d.K);
    else if (m->ep)
        qwen3_ep_forward(m, w, a, y);
    else if (bf16x)
        op->moe_bf16_forward(op, y, a->moe_state, p->moe_scratch, a->ln2_16, a->expert, a->route_w,
                             bf16_copy(m, w->experts), d.N, d.C, d.Fm, d.E, d.K);
    else
        op->moe_forward(y, a->moe_state, p->moe_scratch, a->ln2, a->expert, a->route_w, w->experts,
                        d.N, d.C, d.Fm, d.E, d.K);
    const int Ns = sp_rows(m, d.N);
    if (Nr == d.N) tp_reduce_scatter(m, y, (size_t)Ns * d.C);
    op->add(out, a->resid2, y, (int64_t)Ns * d.C);
}

// On entry s->dresid is the gradient of the block output; on exit, of a->resid2. ln2 reaches
// the loss through the experts and through the router (via the routing weights and, when set,
// the load-balancing loss): both input gradients are summed.
// Under TP the experts read the output gradient's full rows (gathered into dtmp, free until the
// router's input gradient); their routing-weight gradient (dweight) is then this rank's part of
// the sum over the group, and so are the router's logit, weight and input gradients that follow
// from it linearly: the strategy sums the router's over the group, the reduce-scatter in
// post_norm_backward the input's. The aux loss's gradient (aux_dprob) is the same on every rank
// (the same global statistics), so only rank 0 adds it, as o_proj's bias. Under EP with TP
// (qwen3_ep.shard) every rank has its own rows: the shard's output gradient as is, every rank's
// aux gradient on its rows, and dln the shard's (no reduce-scatter).
static void moe_block_backward(const qwen3_model *m, int l, const qwen3_layer_weights *w,
                               qwen3_layer_weights *g, const qwen3_layer_acts *a, qwen3_acts *s) {
    const ct_ops *op = m->ops;
    const qwen3_dims d = model_dims(m);
    const int Nr = qwen3_moe_rows(m, d.N);
    const size_t own = Nr < d.N ? sp_offset(m, d.N, d.C) : 0;
    const float *dout = Nr < d.N ? s->dresid : tp_full_rows(m, s->dtmp, s->dresid, d.N, d.C);
    // The bf16 experts take ln2's saved bf16 copy; the fp32 ones (a plugin's) its widened values.
    const ct_moe_lora *lora = qwen3_lora_experts(m, l);
    const bool bf16x = qwen3_bf16_experts(&m->mem_opts);
    if (lora && bf16x) {
        op->moe_bf16_lora_backward(op, s->dln, s->dweight, s->moe_scratch, dout, a->moe_state,
                                   a->ln2_16, a->expert, a->route_w, bf16_copy(m, w->experts), lora,
                                   d.N, d.C, d.Fm, d.E, d.K);
    } else if (lora) {
        from_bf16(m, a->ln2, a->ln2_16, (size_t)d.N * d.C);
        op->moe_lora_backward(s->dln, s->dweight, s->moe_scratch, dout, a->moe_state, a->ln2,
                              a->expert, a->route_w, w->experts, lora, d.N, d.C, d.Fm, d.E, d.K);
    } else if (m->ep) {
        qwen3_ep_backward(m, w, g, a, s->dln, s->dweight, dout);
    } else if (bf16x) {
        op->moe_bf16_backward(op, s->dln, s->dweight, g->experts, s->moe_scratch, dout,
                              a->moe_state, a->ln2_16, a->expert, a->route_w,
                              bf16_copy(m, w->experts), d.N, d.C, d.Fm, d.E, d.K);
    } else {
        from_bf16(m, a->ln2, a->ln2_16, (size_t)d.N * d.C);
        op->moe_backward(s->dln, s->dweight, g->experts, s->moe_scratch, dout, a->moe_state, a->ln2,
                         a->expert, a->route_w, w->experts, d.N, d.C, d.Fm, d.E, d.K);
    }
    const bool aux = s->aux_active && (!m->tp || m->tp->rank == 0 || Nr < d.N);
    op->moe_route_backward(s->dlogits, s->dweight, aux ? s->aux_dprob : NULL, a->probs, a->expert,
                           a->route_w, Nr, d.E, d.K, m->cfg.norm_topk_prob);
    linear_backward(m, s->dtmp, g->router, NULL, s->dlogits, NULL, a->ln2 + own,
                    a->ln2_16 ? a->ln2_16 + own : NULL, w->router, Nr, d.C, d.E);
    op->add(s->dln, s->dln, s->dtmp, (int64_t)Nr * d.C);
    post_norm_backward(m, w, g, a, s, Nr < d.N);
}

// ---------------------------------------------------------------------------------------------

int qwen3_check_tokens(const qwen3_model *m, const int32_t *inputs, const int32_t *targets,
                       int64_t n, ct_error *err) {
    const int V = m->tp ? m->tp->vocab_total : m->cfg.vocab_size;
    for (int64_t i = 0; i < n; i++) {
        if (inputs[i] < 0 || inputs[i] >= V)
            return ct_fail(err, "input token %d at position %lld is outside the vocabulary [0, %d)",
                           inputs[i], (long long)i, V);
        if (targets && targets[i] != QWEN3_IGNORE_INDEX && (targets[i] < 0 || targets[i] >= V))
            return ct_fail(err,
                           "target %d at position %lld is outside the vocabulary [0, %d) and is "
                           "not %d (ignore)",
                           targets[i], (long long)i, V, QWEN3_IGNORE_INDEX);
    }
    return 0;
}

void qwen3_layer_forward(const qwen3_model *m, int l, qwen3_layer_acts *a, const qwen3_pass *p,
                         float *out, bool gemms) {
    const qwen3_layer_weights *w = &m->w.layers[l];
    attention_block_forward(m, w, a, p, l, gemms);
    if (a->sparse_index < 0)
        mlp_block_forward(m, l, w, a, p, out, gemms);
    else if (gemms)
        moe_block_forward(m, l, w, a, p, out);
}

// Training's pass over the planned batch: k and v into the layer's own activations, the
// documents of the last forward, the plan's scratch.
static qwen3_pass train_pass(const qwen3_model *m, bool count) {
    const qwen3_acts *s = m->acts;
    qwen3_pass p = {.d = model_dims(m), .docs = s->docs, .n_docs = s->n_docs, .count = count};
    const rope_rows r = rope_of(s, p.d);
    p.rope_cos = r.cos, p.rope_sin = r.sin, p.rope_B = r.B, p.rope_T = r.T;
    p.rope_scratch = s->dq; // free until the backward
    p.swiglu_scratch = s->swiglu_scratch, p.moe_scratch = s->moe_scratch;
    p.route_scratch = s->route_scratch, p.route_threads = s->route_threads;
    p.mm_scratch = s->mm_scratch;
    p.part = m->tp ? s->dtmp : NULL; // dtmp: free in the forward and where a backward recomputes
    p.lora = m->lora != NULL;
    return p;
}

// Layer l's forward: s->layers[l].resid -> the next layer's resid (or resid_out). `ac` says
// which pass: the forward (QWEN3_AC_NONE), or a recomputation in the backward: all of it
// (QWEN3_AC_LAYER: the routing statistics are not counted again) or only the elementwise ops
// (QWEN3_AC_OPS: the GEMM and attention outputs, the routing among them, were kept).
static void layer_forward(qwen3_model *m, int l, qwen3_layer_ac ac) {
    qwen3_acts *s = m->acts;
    const int L = m->cfg.num_hidden_layers;
    float *out = l + 1 < L ? s->layers[l + 1].resid : s->resid_out;
    const qwen3_pass p = train_pass(m, ac == QWEN3_AC_NONE);
    qwen3_layer_forward(m, l, &s->layers[l], &p, out, ac != QWEN3_AC_OPS);
}

// Tokens per pass of the loss head: all of them, or mem_opts.loss_chunk.
static int head_rows(const qwen3_model *m) {
    const int N = m->B * m->T, chunk = m->mem_opts.loss_chunk;
    return chunk > 0 && chunk < N ? chunk : N;
}

// Loss parallel (TP): the cross-entropy of rows [r0, r0 + R) whose logits lg (R, V) are this
// rank's vocabulary columns. When the logits were just computed (`fresh`), each row's max is
// gathered and its sum of exponentials and target logit are summed over the group; a backward
// of logits kept from the forward reuses them. Then the losses (when given) and, with
// `backward`, the scaled gradient in place of the logits.
static void tp_loss(qwen3_model *m, int r0, int R, bool fresh, void *lg, bool bf16, float *losses,
                    bool backward, float scale) {
    const qwen3_tp *tp = m->tp;
    const ct_ops *op = m->ops;
    const int V = m->cfg.vocab_size;
    const int32_t *t = tp->targets + r0;
    if (fresh) {
        op->cross_entropy_tp_max(tp->ce_max + (size_t)tp->rank * R, lg, bf16, R, V);
        tp->gather(tp->ctx, tp->ce_max, (size_t)R);
        op->cross_entropy_tp_sums(tp->ce_sums, tp->ce_max, tp->size, lg, bf16, t, R, V);
        tp->allreduce(tp->ctx, tp->ce_sums, 2 * (size_t)R);
    }
    op->cross_entropy_tp_finish(losses, backward ? lg : NULL, tp->ce_max, tp->size, tp->ce_sums, lg,
                                bf16, t, scale, R, V);
}

// The loss head over token rows [r0, r1) and s->logits: `logits` computes them, `forward` the
// per-token cross-entropy, `backward` dlogits (scaled) in place, the input gradient into those
// rows of s->dln and the lm_head gradient.
static void head_rows_pass(qwen3_model *m, int r0, int r1, bool logits, bool forward, bool backward,
                           float loss_scale) {
    qwen3_acts *s = m->acts;
    const ct_ops *op = m->ops;
    const qwen3_dims d = model_dims(m);
    const int R = r1 - r0;
    const float *lnf = s->lnf + (size_t)r0 * d.C;
    const uint16_t *lnf16 = s->lnf16 ? s->lnf16 + (size_t)r0 * d.C : NULL;
    float *dlnf = s->dln + (size_t)r0 * d.C;
    // A tied lm_head shares its gradient with the embedding: both add into g.embed.
    uint16_t *logits16 = s->logits16; // bf16: bf16 logits, the loss in fp32, bf16 dlogits
    float *logits32 = logits16 ? NULL : s->logits;
    if (logits) {
        linear_forward(m, logits32, logits16, lnf, lnf16, m->w.lm_head, NULL, R, d.C, d.V); // (R,V)
        if (logits32) to_bf16(m, NULL, logits32, (size_t)R * d.V); // bf16 with a plugin's loss
    }
    const int32_t *t = s->targets + r0;
    float *losses = s->losses + r0;
    if (m->tp && (forward || backward)) {
        tp_loss(m, r0, R, logits, logits16 ? (void *)logits16 : (void *)logits32, logits16 != NULL,
                forward ? losses : NULL, backward, loss_scale);
    } else if (forward &&
               backward) { // training's chunked head: the loss and its gradient in one pass
        if (logits16) {
            op->cross_entropy_bf16_forward_backward(losses, logits16, logits16, t, loss_scale,
                                                    s->ce_scratch, R, d.V);
        } else if (op->cross_entropy_forward_backward) {
            op->cross_entropy_forward_backward(losses, logits32, logits32, t, loss_scale, NULL, R,
                                               d.V);
        } else {
            op->cross_entropy_forward(losses, logits32, t, R, d.V);
            op->cross_entropy_backward(logits32, logits32, t, loss_scale, R, d.V);
        }
    } else if (forward) {
        if (logits16)
            op->cross_entropy_bf16_forward(losses, logits16, t, R, d.V);
        else
            op->cross_entropy_forward(losses, logits32, t, R, d.V);
    } else if (backward) {
        if (logits16)
            op->cross_entropy_bf16_backward(logits16, logits16, t, loss_scale, R, d.V);
        else
            op->cross_entropy_backward(logits32, logits32, t, loss_scale, R, d.V);
    }
    if (!backward) return;
    linear_backward(m, dlnf, m->g.lm_head, NULL, logits32, logits16, lnf, lnf16, m->w.lm_head, R,
                    d.C, d.V);
}

// ---------------------------------------------------------------------------------------------
// Block-causal positions.

// The documents of positions (checked: each row starts at 0, then counts up or restarts at 0)
// into docs (NULL: only counted); returns how many. *state gets the attention state they take
// in a layer, *scratch the most scratch one of them needs. A batch whose rows are each one
// document gives 0: the plain path computes exactly that.
static int positions_docs(const qwen3_model *m, const int32_t *positions, qwen3_doc *docs,
                          size_t *state, size_t *scratch) {
    const qwen3_dims d = model_dims(m);
    int n = 0;
    bool split = false;
    *state = *scratch = 0;
    for (int b = 0; b < d.B; b++) {
        const int32_t *p = positions + (size_t)b * d.T;
        for (int t0 = 0, t1; t0 < d.T; t0 = t1) {
            for (t1 = t0 + 1; t1 < d.T && p[t1] != 0;) t1++;
            const int len = t1 - t0;
            split |= len < d.T;
            if (docs) docs[n] = (qwen3_doc){b * d.T + t0, len, *state};
            n++;
            *state += m->ops->attention_state_floats(1, len, d.NH, d.NKV, d.D);
            const size_t sc = m->ops->attention_scratch_floats(1, len, d.NH, d.NKV, d.D);
            if (sc > *scratch) *scratch = sc;
        }
    }
    return split ? n : 0;
}

// Positions (B, T) against the rule: each row starts a document at 0, then counts up by one or
// starts the next at 0.
static int check_positions(const qwen3_model *m, const int32_t *positions, int64_t rows,
                           ct_error *err) {
    const int T = m->T;
    for (int64_t b = 0; b < rows; b++) {
        for (int t = 0; t < T; t++) {
            const int32_t p = positions[(size_t)b * T + t];
            if (t == 0 && p != 0)
                return ct_fail(err,
                               "positions[%lld, 0] is %d, expected 0 (a row starts a document)",
                               (long long)b, p);
            const int32_t next = t ? positions[(size_t)b * T + t - 1] + 1 : 0;
            if (p != 0 && p != next)
                return ct_fail(err,
                               "positions[%lld, %d] is %d, expected %d (the document goes on) or 0 "
                               "(a new one starts)",
                               (long long)b, t, p, next);
        }
    }
    return 0;
}

int qwen3_batch_check(const qwen3_model *m, const qwen3_batch *batch, int64_t rows, ct_error *err) {
    if (!m->acts) return ct_fail(err, "the model is not planned (qwen3_plan)");
    const qwen3_dims d = model_dims(m);
    if (qwen3_check_tokens(m, batch->inputs, batch->targets, rows * d.T, err) != 0) return -1;
    if (!batch->positions) return 0;
    const qwen3_acts *s = m->acts;
    if (!s->docs_next) // mem_opts.block_causal was off at qwen3_plan
        return ct_fail(err, "positions need a model planned with block-causal attention "
                            "(mem_opts.block_causal)");
    if (m->cp) // a rank holds two chunks of each row: their rule, and no documents to list
        return qwen3_cp_check_positions(m, batch->positions, rows, err);
    if (check_positions(m, batch->positions, rows, err) != 0) return -1;
    // Each document's attention call needs its own piece of the state and, one at a time, the
    // scratch: within what the kernel asked for at (B, T) (always so for the built-in kernels,
    // whose sizes are linear or quadratic in T and linear in B; a plugin's are checked here),
    // for each forward's B rows.
    const size_t planned_state = m->ops->attention_state_floats(d.B, d.T, d.NH, d.NKV, d.D);
    const size_t planned_scratch = m->ops->attention_scratch_floats(d.B, d.T, d.NH, d.NKV, d.D);
    for (int64_t r = 0; r < rows; r += d.B) {
        size_t state, scratch;
        const int split =
            positions_docs(m, batch->positions + (size_t)r * d.T, NULL, &state, &scratch);
        if (split && (state > planned_state || scratch > planned_scratch))
            return ct_fail(err,
                           "the attention kernel needs %zu floats of state and %zu of scratch "
                           "for the documents of rows %lld.., more than the %zu and %zu it asked "
                           "for at batch %d x seq_len %d",
                           state, scratch, (long long)r, planned_state, planned_scratch, d.B, d.T);
    }
    return 0;
}

// The forward's documents, from its positions (NULL: one per row): the list, and each token's
// RoPE rows (row p of the tables for a token at position p, one copy per document), copied
// only when they differ from the last forward's (a training run repeats its packing rarely,
// but validation and a test's repeated batches do).
static void take_docs(qwen3_model *m, const int32_t *positions) {
    qwen3_acts *s = m->acts;
    size_t state, scratch;
    const int n = positions ? positions_docs(m, positions, s->docs_next, &state, &scratch) : 0;
    if (n == s->n_docs && (n == 0 || !memcmp(s->docs, s->docs_next, (size_t)n * sizeof *s->docs)))
        return;
    s->n_docs = n;
    if (!n) return;
    memcpy(s->docs, s->docs_next, (size_t)n * sizeof *s->docs);
    const size_t half = (size_t)m->cfg.head_dim / 2;
    for (int i = 0; i < n; i++) {
        const size_t at = (size_t)s->docs[i].start * half,
                     bytes = s->docs[i].len * half * sizeof(float);
        m->be->copy(m->be, s->pos_cos + at, s->rope_cos, bytes);
        m->be->copy(m->be, s->pos_sin + at, s->rope_sin, bytes);
    }
}

static void unit_event(qwen3_model *m, int unit, int event) {
    if (m->unit_hook) m->unit_hook(m->unit_hook_ctx, unit, event);
}

// The vocab-parallel embedding (TP): this rank's vocabulary rows looked up (zero for the ids
// of other ranks' rows) into full (N,C) rows, summed onto the sequence shards: the first
// layer's input.
static void tp_embed(qwen3_model *m, const int32_t *inputs) {
    qwen3_acts *s = m->acts;
    const qwen3_tp *tp = m->tp;
    const qwen3_dims d = model_dims(m);
    for (int i = 0; i < d.N; i++) {
        const int32_t id = inputs[i] - tp->vocab_lo;
        tp->host_ids[i] = id >= 0 && id < d.V ? id : -1;
        tp->host_targets[i] = id >= 0 && id < d.V ? id : 0; // a row to look up, zeroed below
    }
    m->be->write(m->be, tp->ids, tp->host_targets, (size_t)d.N * sizeof(int32_t));
    const int Ns = sp_rows(m, d.N);
    qwen3_embed(m, s->dtmp, tp->ids, d.N);
    tp_zero_foreign_rows(m, s->dtmp, d.N, d.C);
    tp_reduce_scatter(m, s->dtmp, (size_t)Ns * d.C);
    m->be->copy(m->be, s->layers[0].resid, s->dtmp, (size_t)Ns * d.C * sizeof(float));
}

// The targets as this rank's vocabulary columns (TP): local index, -1 on another rank, -100
// ignored.
static void tp_targets(qwen3_model *m, const int32_t *targets) {
    const qwen3_tp *tp = m->tp;
    const qwen3_dims d = model_dims(m);
    for (int i = 0; i < d.N; i++) {
        const int32_t t = targets[i], lt = t - tp->vocab_lo;
        tp->host_targets[i] = t == QWEN3_IGNORE_INDEX ? t : lt >= 0 && lt < d.V ? lt : -1;
    }
    m->be->write(m->be, tp->targets, tp->host_targets, (size_t)d.N * sizeof(int32_t));
}

// Whether a pass over local layers [l0, l1) starts at the embedding / ends at the head.
static bool has_embed(const qwen3_model *m, int l0) {
    return l0 == 0 && !m->cfg.no_embed;
}
static bool has_head(const qwen3_model *m, int l1) {
    return l1 == m->cfg.num_hidden_layers && !m->cfg.no_head;
}

// The forward of local layers [l0, l1): from the embedding, or from `in` (a pipeline stage's
// input rows); to the loss, or to the stage's output (qwen3_stage_output).
static double forward(qwen3_model *m, const qwen3_batch *batch, int l0, int l1, const float *in,
                      bool train, bool head_backward, float loss_scale, int64_t *n_valid) {
    qwen3_acts *s = m->acts;
    if (n_valid) *n_valid = 0;
    if (!s) return NAN;
    s->have_targets = false;
    s->head_done = false;
    s->aux_active = false;
    const ct_ops *op = m->ops;
    const qwen3_dims d = model_dims(m);
    const int L = l1;
    if (!batch->checked && qwen3_batch_check(m, batch, d.B, NULL) != 0) return NAN;
    const int32_t *targets = batch->targets;
    ct_backend *be = m->be;
    be->write(be, s->inputs, batch->inputs, (size_t)d.N * sizeof(int32_t));
    if (m->cp)
        qwen3_cp_positions(m, batch->positions);
    else
        take_docs(m, batch->positions);
    if (m->lora) { // PEFT's train mode (dropout on) for a training forward, eval mode else
        m->lora->training = train;
        // A new mask (recomputations keep this one); a pipeline rank counts its first stage's.
        if (train && l0 == 0) m->lora->forwards++;
        m->lora->token0 =
            (batch->sampled ? batch->sample0 : m->lora->forwards * (uint64_t)d.B) * (uint64_t)d.T;
    }

    if (m->balance) moe_balance_forward_begin(m->balance, qwen3_moe_rows(m, d.N));
    if (!has_embed(m, l0)) {
        // Under sequence parallelism the residual stream, so a stage's input, is this rank's rows.
        be->copy(be, s->layers[l0].resid, in, (size_t)sp_rows(m, d.N) * d.C * sizeof(float));
    } else {
        unit_event(m, 0, QWEN3_UNIT_FORWARD);
        if (m->tp)
            tp_embed(m, batch->inputs);
        else
            qwen3_embed(m, s->layers[0].resid, s->inputs, d.N); // (N,C)
        unit_event(m, 0, QWEN3_UNIT_FORWARD_DONE);
    }
    for (int l = l0; l < l1; l++) {
        unit_event(m, 1 + l, QWEN3_UNIT_FORWARD);
        layer_forward(m, l, QWEN3_AC_NONE);
        unit_event(m, 1 + l, QWEN3_UNIT_FORWARD_DONE);
    }
    if (!has_head(m, l1)) { // a pipeline stage: its output goes on; its backward takes dout
        s->have_targets = true;
        return 0.0;
    }
    unit_event(m, L + 1, QWEN3_UNIT_FORWARD);
    const int Ns = sp_rows(m, d.N);
    op->rmsnorm_forward(s->lnf + sp_offset(m, d.N, d.C), s->lnf_rstd, s->resid_out, m->w.final_norm,
                        Ns, d.C, m->cfg.rms_norm_eps);
    tp_gather(m, s->lnf, (size_t)Ns * d.C); // the head reads every row (its vocabulary columns)
    to_bf16(m, s->lnf16, s->lnf, (size_t)d.N * d.C);
    const int rows = head_rows(m);
    if (!targets) {
        if (rows == d.N) head_rows_pass(m, 0, d.N, true, false, false, 0.0f);
        unit_event(m, L + 1, QWEN3_UNIT_FORWARD_DONE);
        return 0.0;
    }
    be->write(be, s->targets, targets, (size_t)d.N * sizeof(int32_t));
    if (m->tp) tp_targets(m, targets);
    // Chunked, a training forward also runs the head's backward while each chunk's logits are
    // at hand; whole, the logits stay for qwen3_backward.
    const bool fused = head_backward && rows < d.N;
    for (int r0 = 0; r0 < d.N; r0 += rows)
        head_rows_pass(m, r0, r0 + rows < d.N ? r0 + rows : d.N, true, true, fused, loss_scale);
    unit_event(m, L + 1, QWEN3_UNIT_FORWARD_DONE);
    double sum = 0.0;
    op->loss_sum(&sum, s->losses, s->targets, QWEN3_IGNORE_INDEX, d.N);
    int64_t count = 0;
    for (int i = 0; i < d.N; i++) count += targets[i] != QWEN3_IGNORE_INDEX;
    if (n_valid) *n_valid = count;
    s->have_targets = true;
    s->head_done = fused;
    return sum;
}

double qwen3_forward(qwen3_model *m, const qwen3_batch *batch, int64_t *n_valid) {
    return forward(m, batch, 0, m->cfg.num_hidden_layers, NULL, false, false, 0.0f, n_valid);
}

double qwen3_forward_train(qwen3_model *m, const qwen3_batch *batch, float loss_scale,
                           int64_t *n_valid) {
    const bool trains = m->grad_mem || m->lora;
    assert(trains && "qwen3_forward_train on a model built without gradients");
    return forward(m, batch, 0, m->cfg.num_hidden_layers, NULL, trains, trains, loss_scale,
                   n_valid);
}

void qwen3_refresh_bf16(qwen3_model *m) {
    if (m->param_bf16 && !m->weights16)
        m->ops->f32_to_bf16(m->param_bf16, m->param_mem, m->num_params);
}

void qwen3_zero_grad(qwen3_model *m) {
    if (m->grad_mem) m->be->zero(m->be, m->grad_mem, m->num_params * sizeof(float));
    qwen3_lora_zero_grad(m);
}

// The backward of local layers [l0, l1) after their forward: from the loss, or from dout (the
// gradient of a pipeline stage's output); to the embedding, or to s->dresid (the stage input's).
static void backward(qwen3_model *m, int l0, int l1, const float *dout, float loss_scale) {
    qwen3_acts *s = m->acts;
    assert((m->grad_mem || m->lora) && "qwen3_backward on a model built without gradients");
    if (!m->grad_mem && !m->lora) return;
    if (!s || !s->have_targets) return; // no loss was computed: nothing to differentiate
    const ct_ops *op = m->ops;
    const qwen3_dims d = model_dims(m);
    // The head: done by qwen3_forward_train (chunked), or from the logits kept (whole; in place,
    // m->logits holds gradients from here on), or by recomputing each chunk's logits.
    const int rows = head_rows(m), L = m->cfg.num_hidden_layers;
    const bool head = has_head(m, l1);
    // MoE: the balance component reduces the forward's routing statistics (over the ranks: a
    // collective, here, before the first unit's) and gives the aux loss's gradient, if any.
    const float *aux_dprob = m->balance ? moe_balance_backward_begin(m->balance) : NULL;
    s->aux_active = aux_dprob != NULL;
    if (aux_dprob) m->be->write(m->be, s->aux_dprob, aux_dprob, (size_t)d.E * sizeof *s->aux_dprob);
    if (!head) m->be->copy(m->be, s->dresid, dout, (size_t)sp_rows(m, d.N) * d.C * sizeof(float));
    if (head) unit_event(m, L + 1, QWEN3_UNIT_BACKWARD);
    if (head && !s->head_done) {
        for (int r0 = 0; r0 < d.N; r0 += rows)
            head_rows_pass(m, r0, r0 + rows < d.N ? r0 + rows : d.N, rows < d.N, false, true,
                           loss_scale);
    }
    const int Ns = sp_rows(m, d.N);
    if (head) {
        tp_reduce_scatter(m, s->dln, (size_t)Ns * d.C); // the head's partial input gradient
        op->rmsnorm_backward(s->dresid, m->g.final_norm, s->dln, s->resid_out, m->w.final_norm,
                             s->lnf_rstd, Ns, d.C);
        // Parameters are laid out embed, layers, final norm, lm_head: each point below finalises
        // a suffix of the buffer (a tied head is the embedding, final only at the very end).
        unit_event(m, L + 1, QWEN3_UNIT_BACKWARD_DONE);
    }
    for (int l = l1 - 1; l >= l0; l--) {
        const qwen3_layer_acts *a = &s->layers[l];
        unit_event(m, 1 + l, QWEN3_UNIT_BACKWARD);
        // A checkpointed layer's saved activations (all, or the elementwise ops' outputs) were
        // overwritten by later layers: run its forward again (all of it rewrites the next layer's
        // input with the same bits, unused by now).
        if (a->recompute != QWEN3_AC_NONE) layer_forward(m, l, a->recompute);
        if (a->sparse_index >= 0)
            moe_block_backward(m, l, &m->w.layers[l], &m->g.layers[l], a, s);
        else
            mlp_block_backward(m, l, &m->w.layers[l], &m->g.layers[l], a, s);
        attention_block_backward(m, l, &m->w.layers[l], &m->g.layers[l], a, s);
        unit_event(m, 1 + l, QWEN3_UNIT_BACKWARD_DONE);
    }
    if (!has_embed(m, l0)) { // a pipeline stage: s->dresid is its input's gradient
    } else if (unit_event(m, 0, QWEN3_UNIT_BACKWARD),
               !m->g.embed) { // a frozen base (LoRA): no embedding gradient
    } else if (m->tp) { // this rank's vocabulary rows take the gradient of their tokens' full rows
        tp_full_rows(m, s->dln, s->dresid, d.N, d.C);
        tp_zero_foreign_rows(m, s->dln, d.N, d.C);
        op->embedding_backward(m->g.embed, s->dln, m->tp->ids, d.N, d.C);
    } else {
        op->embedding_backward(m->g.embed, s->dresid, s->inputs, d.N, d.C);
    }
    if (has_embed(m, l0)) unit_event(m, 0, QWEN3_UNIT_BACKWARD_DONE);
    s->have_targets = false; // the logits buffer now holds gradients
    s->head_done = false;
    s->aux_active = false;
}

void qwen3_backward(qwen3_model *m, float loss_scale) {
    backward(m, 0, m->cfg.num_hidden_layers, NULL, loss_scale);
}

double qwen3_stage_forward(qwen3_model *m, const qwen3_batch *batch, int l0, int l1,
                           const float *in, bool train, int64_t *n_valid) {
    return forward(m, batch, l0, l1, in, train, false, 0.0f, n_valid);
}

void qwen3_stage_backward(qwen3_model *m, int l0, int l1, const float *dout, float loss_scale) {
    backward(m, l0, l1, dout, loss_scale);
}

float *qwen3_stage_output(const qwen3_model *m, int l1) {
    const qwen3_acts *s = m->acts;
    return l1 < m->cfg.num_hidden_layers ? s->layers[l1].resid : s->resid_out;
}

float *qwen3_stage_dinput(const qwen3_model *m) {
    return ((const qwen3_acts *)m->acts)->dresid;
}
