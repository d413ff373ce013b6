#!/usr/bin/env python3
"""A PyTorch Qwen3 dense model, written from docs (design.md) to follow Hugging Face
modeling_qwen3.py's arithmetic step for step (transformers is not installed here).

Parameters are a plain dict {HF name: tensor}; the model is a function of it, so the reference
gradients come out keyed by HF name. With tie_word_embeddings, lm_head reads
model.embed_tokens.weight, and autograd sums both contributions into that one gradient.

`dtype` selects the compute precision: torch.float32 reproduces HF (fp32 weights, fp32
activations); torch.float64 gives a near-exact answer to measure how far fp32 is from it.
"""
import torch
import torch.nn.functional as F

IGNORE_INDEX = -100


def param_shapes(cfg):
    """[(HF name, shape)] in the order HF's state_dict lists them."""
    C, V, Fi = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"]
    NH, NKV, D = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    bias = cfg.get("attention_bias", False)
    out = [("model.embed_tokens.weight", (V, C))]
    for i in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % i
        out.append((p + "self_attn.q_proj.weight", (NH * D, C)))
        if bias:
            out.append((p + "self_attn.q_proj.bias", (NH * D,)))
        out.append((p + "self_attn.k_proj.weight", (NKV * D, C)))
        if bias:
            out.append((p + "self_attn.k_proj.bias", (NKV * D,)))
        out.append((p + "self_attn.v_proj.weight", (NKV * D, C)))
        if bias:
            out.append((p + "self_attn.v_proj.bias", (NKV * D,)))
        out.append((p + "self_attn.o_proj.weight", (C, NH * D)))
        if bias:
            out.append((p + "self_attn.o_proj.bias", (C,)))
        out.append((p + "self_attn.q_norm.weight", (D,)))
        out.append((p + "self_attn.k_norm.weight", (D,)))
        out.append((p + "mlp.gate_proj.weight", (Fi, C)))
        out.append((p + "mlp.up_proj.weight", (Fi, C)))
        out.append((p + "mlp.down_proj.weight", (C, Fi)))
        out.append((p + "input_layernorm.weight", (C,)))
        out.append((p + "post_attention_layernorm.weight", (C,)))
    out.append(("model.norm.weight", (C,)))
    if not cfg.get("tie_word_embeddings", False):
        out.append(("lm_head.weight", (V, C)))
    return out


def rms_norm(x, w, eps):
    # Qwen3RMSNorm: statistics in fp32 (or wider), then the weight.
    in_dtype = x.dtype
    h = x.to(torch.float32) if in_dtype != torch.float64 else x
    var = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(var + eps)
    return w * h.to(in_dtype)


def rope_cos_sin(cfg, T, dtype):
    """(T, D) cos and sin tables, as Qwen3RotaryEmbedding builds them (fp32 angles)."""
    D = cfg["head_dim"]
    base = cfg.get("rope_theta", 10000.0)
    ang_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    inv_freq = 1.0 / (base ** (torch.arange(0, D, 2, dtype=torch.int64).to(ang_dtype) / D))
    pos = torch.arange(T, dtype=torch.int64).to(ang_dtype)
    freqs = pos[:, None] @ inv_freq[None, :]  # (T, D/2), the outer product HF computes by matmul
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def repeat_kv(x, n_rep):
    # (B, NKV, T, D) -> (B, NKV*n_rep, T, D); query head h reads kv head h // n_rep.
    B, NKV, T, D = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None, :, :].expand(B, NKV, n_rep, T, D).reshape(B, NKV * n_rep, T, D)


def linear(x, params, name, bias):
    w = params[name + ".weight"]
    b = params[name + ".bias"] if bias else None
    return F.linear(x, w, b)


def attention(x, params, p, cfg, cos, sin):
    B, T, _ = x.shape
    NH, NKV, D = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps = cfg.get("rms_norm_eps", 1e-6)
    bias = cfg.get("attention_bias", False)
    q = linear(x, params, p + "q_proj", bias).view(B, T, -1, D)
    k = linear(x, params, p + "k_proj", bias).view(B, T, -1, D)
    v = linear(x, params, p + "v_proj", bias).view(B, T, -1, D)
    q = rms_norm(q, params[p + "q_norm.weight"], eps).transpose(1, 2)  # (B, NH, T, D)
    k = rms_norm(k, params[p + "k_norm.weight"], eps).transpose(1, 2)  # (B, NKV, T, D)
    v = v.transpose(1, 2)
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    k = repeat_kv(k, NH // NKV)
    v = repeat_kv(v, NH // NKV)
    att = torch.matmul(q, k.transpose(2, 3)) * (D**-0.5)  # (B, NH, T, T)
    mask = torch.full((T, T), torch.finfo(att.dtype).min, dtype=att.dtype).triu(1)
    att = att + mask
    soft_dtype = torch.float64 if att.dtype == torch.float64 else torch.float32
    att = F.softmax(att, dim=-1, dtype=soft_dtype).to(q.dtype)
    y = torch.matmul(att, v).transpose(1, 2).reshape(B, T, NH * D)
    return linear(y, params, p + "o_proj", bias)


def mlp(x, params, p):
    g = F.linear(x, params[p + "gate_proj.weight"])
    u = F.linear(x, params[p + "up_proj.weight"])
    return F.linear(F.silu(g) * u, params[p + "down_proj.weight"])


def forward(params, cfg, inputs):
    """inputs (B, T) int64 -> logits (B, T, V) in the parameters' dtype."""
    B, T = inputs.shape
    dtype = params["model.embed_tokens.weight"].dtype
    eps = cfg.get("rms_norm_eps", 1e-6)
    cos, sin = rope_cos_sin(cfg, T, dtype)
    h = F.embedding(inputs, params["model.embed_tokens.weight"])
    for i in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % i
        h = h + attention(rms_norm(h, params[p + "input_layernorm.weight"], eps), params,
                          p + "self_attn.", cfg, cos, sin)
        h = h + mlp(rms_norm(h, params[p + "post_attention_layernorm.weight"], eps), params,
                    p + "mlp.")
    h = rms_norm(h, params["model.norm.weight"], eps)
    head = "model.embed_tokens.weight" if cfg.get("tie_word_embeddings", False) else "lm_head.weight"
    return F.linear(h, params[head])


def loss_fn(logits, targets):
    """Mean cross-entropy over targets != -100, over all vocab columns, in fp32 (or wider).
    Returns (loss, n_valid)."""
    wide = torch.float64 if logits.dtype == torch.float64 else torch.float32
    lg = logits.to(wide).reshape(-1, logits.shape[-1])
    tg = targets.reshape(-1)
    n_valid = int((tg != IGNORE_INDEX).sum())
    total = F.cross_entropy(lg, tg, ignore_index=IGNORE_INDEX, reduction="sum")
    return total / n_valid, n_valid


def windows(tokens, B, T):
    """torchtitan windowing: sample i is tokens[i*(T+1) : (i+1)*(T+1)]; input = first T,
    labels = last T. Returns (inputs, targets) as (B, T) int64."""
    t = torch.as_tensor(tokens, dtype=torch.int64)[: B * (T + 1)].reshape(B, T + 1)
    return t[:, :-1].clone(), t[:, 1:].clone()  # clones: callers edit targets in place


def run(params, cfg, inputs, targets, dtype=torch.float32):
    """Forward + backward in `dtype`. Returns (logits, loss, n_valid, {name: grad})."""
    ps = {k: v.detach().to(dtype).clone().requires_grad_(True) for k, v in params.items()}
    logits = forward(ps, cfg, inputs)
    loss, n_valid = loss_fn(logits, targets)
    loss.backward()
    grads = {k: v.grad.detach() for k, v in ps.items()}
    return logits.detach(), loss.detach(), n_valid, grads
