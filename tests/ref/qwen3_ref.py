#!/usr/bin/env python3
"""A PyTorch Qwen3 model, dense and mixture-of-experts, written from docs (design.md) to follow
Hugging Face modeling_qwen3.py / modeling_qwen3_moe.py's arithmetic step for step (transformers
is not installed here).

Parameters are a plain dict {HF name: tensor}; the model is a function of it, so the reference
gradients come out keyed by HF name. With tie_word_embeddings, lm_head reads
model.embed_tokens.weight, and autograd sums both contributions into that one gradient.

`dtype` selects the compute precision: torch.float32 reproduces HF (fp32 weights, fp32
activations); torch.float64 gives a near-exact answer to measure how far fp32 is from it.

MoE (Qwen3MoeForCausalLM; the config carries num_experts > 0): layer i is sparse iff
i not in mlp_only_layers and (i+1) % decoder_sparse_step == 0. A sparse layer's router is
mlp.gate.weight (E, C); its experts are mlp.experts.{e}.{gate,up,down}_proj.weight. The
load-balancing loss (aux) is HF's load_balancing_loss_func without an attention mask; the loss
adds router_aux_loss_coef * aux iff output_router_logits. forward_full also takes the
aux-loss-free expert bias (torchtitan): {layer: (E,)} added to the probabilities for the choice
only.
"""
import torch
import torch.nn.functional as F

IGNORE_INDEX = -100


def is_sparse(cfg, i):
    """Whether layer i has a sparse MoE block (HF's Qwen3MoeDecoderLayer rule)."""
    only = cfg.get("mlp_only_layers") or []
    return (cfg.get("num_experts", 0) > 0 and i not in only and
            (i + 1) % cfg.get("decoder_sparse_step", 1) == 0)


def sparse_layers(cfg):
    return [i for i in range(cfg["num_hidden_layers"]) if is_sparse(cfg, i)]


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
        if is_sparse(cfg, i):
            # Qwen3MoeSparseMoeBlock registers the router, then the experts in order.
            E, Fm = cfg["num_experts"], cfg["moe_intermediate_size"]
            out.append((p + "mlp.gate.weight", (E, C)))
            for e in range(E):
                q = p + "mlp.experts.%d." % e
                out.append((q + "gate_proj.weight", (Fm, C)))
                out.append((q + "up_proj.weight", (Fm, C)))
                out.append((q + "down_proj.weight", (C, Fm)))
        else:
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
    """(T, D) cos and sin tables, as Qwen3RotaryEmbedding builds them (fp32 angles). Like HF it
    turns autocast off here: under bf16 autocast the angles' matmul would otherwise run in
    bf16."""
    with torch.autocast("cpu", enabled=False):
        return _rope_cos_sin(cfg, T, dtype)


def _rope_cos_sin(cfg, T, dtype):
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


def route(router_logits, K, norm, bias=None):
    """The router after its linear layer: softmax over all experts in fp32 (or wider), top-k
    (torch.topk, so its order among equal values), renormalised iff `norm`. With `bias` (E,)
    (aux-loss-free balancing) the choice is topk(probs + bias) and the weights stay the
    unbiased probabilities. Returns (weights (N,K), selected (N,K), probs (N,E))."""
    wide = torch.float64 if router_logits.dtype == torch.float64 else torch.float32
    probs = F.softmax(router_logits, dim=1, dtype=wide)
    if bias is None:
        weights, selected = torch.topk(probs, K, dim=-1)
    else:
        _, selected = torch.topk(probs + bias.to(wide), K, dim=-1)
        weights = probs.gather(1, selected)
    if norm:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, selected, probs


def moe_block(x, params, p, cfg, bias=None):
    """Qwen3MoeSparseMoeBlock: x (B, T, C) -> (y (B, T, C), {"logits", "selected", "weights",
    "probs"}). Experts run in ascending order over the tokens routed to them, each adding its
    weighted output into y; experts with no tokens are skipped."""
    B, T, C = x.shape
    E, K = cfg["num_experts"], cfg["num_experts_per_tok"]
    x = x.reshape(-1, C)
    router_logits = F.linear(x, params[p + "gate.weight"])  # (N, E)
    weights, selected, probs = route(router_logits, K, cfg.get("norm_topk_prob", False), bias)
    weights = weights.to(x.dtype)
    y = torch.zeros_like(x)
    mask = F.one_hot(selected, num_classes=E).permute(2, 1, 0)  # (E, K, N)
    for e in range(E):
        slot, tok = torch.where(mask[e])
        if tok.numel() == 0:
            continue
        out = mlp(x[tok], params, p + "experts.%d." % e) * weights[tok, slot, None]
        y.index_add_(0, tok, out)
    info = dict(logits=router_logits, selected=selected, weights=weights, probs=probs)
    return y.reshape(B, T, C), info


def aux_loss(router_logits, E, K, selected=None):
    """HF's load_balancing_loss_func without an attention mask: one statistic over the
    concatenated router logits of all sparse layers, E * sum_{k,e} f[k,e] * p[e]. HF takes the
    choices f counts from its own top-k of the logits; `selected` (per layer (N, K)) replaces
    them with the experts actually chosen, which differ under the aux-loss-free bias."""
    cat = torch.cat(list(router_logits), dim=0)
    routing = F.softmax(cat, dim=-1)
    if selected is None:
        _, chosen = torch.topk(routing, K, dim=-1)
    else:
        chosen = torch.cat(list(selected), dim=0)
    # HF's .float() (fp32 even when autocast leaves the logits and routing in bf16; fp64 runs
    # keep fp64)
    mask = F.one_hot(chosen, E).to(torch.float64 if routing.dtype == torch.float64
                                   else torch.float32)  # (rows, K, E)
    tokens_per_expert = torch.mean(mask, dim=0)  # (K, E)
    prob_per_expert = torch.mean(routing, dim=0)  # (E,)
    return torch.sum(tokens_per_expert * prob_per_expert.unsqueeze(0)) * E


def forward_full(params, cfg, inputs, expert_bias=None):
    """inputs (B, T) int64 -> (logits (B, T, V) in the parameters' dtype, [router info per
    sparse layer, with "layer" added]). expert_bias: None or {layer: (E,) tensor}."""
    B, T = inputs.shape
    dtype = params["model.embed_tokens.weight"].dtype
    eps = cfg.get("rms_norm_eps", 1e-6)
    cos, sin = rope_cos_sin(cfg, T, dtype)
    h = F.embedding(inputs, params["model.embed_tokens.weight"])
    routers = []
    for i in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % i
        h = h + attention(rms_norm(h, params[p + "input_layernorm.weight"], eps), params,
                          p + "self_attn.", cfg, cos, sin)
        x = rms_norm(h, params[p + "post_attention_layernorm.weight"], eps)
        if is_sparse(cfg, i):
            bias = expert_bias.get(i) if expert_bias is not None else None
            y, info = moe_block(x, params, p + "mlp.", cfg, bias)
            info["layer"] = i
            routers.append(info)
            h = h + y
        else:
            h = h + mlp(x, params, p + "mlp.")
    h = rms_norm(h, params["model.norm.weight"], eps)
    head = "model.embed_tokens.weight" if cfg.get("tie_word_embeddings", False) else "lm_head.weight"
    return F.linear(h, params[head]), routers


def forward(params, cfg, inputs):
    """inputs (B, T) int64 -> logits (B, T, V) in the parameters' dtype."""
    return forward_full(params, cfg, inputs)[0]


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


def run_full(params, cfg, inputs, targets, dtype=torch.float32, expert_bias=None):
    """Forward + backward in `dtype`. Returns a dict: logits, loss (what backpropagates), ce,
    aux (HF's load-balancing statistic, None for dense; part of loss iff output_router_logits),
    n_valid, grads {name: grad} (zeros for experts that got no token) and routers (per sparse
    layer: layer, logits, selected, weights, probs; all detached)."""
    ps = {k: v.detach().to(dtype).clone().requires_grad_(True) for k, v in params.items()}
    logits, routers = forward_full(ps, cfg, inputs, expert_bias)
    ce, n_valid = loss_fn(logits, targets)
    loss, aux = ce, None
    if routers:
        chosen = [r["selected"] for r in routers] if expert_bias is not None else None
        aux = aux_loss([r["logits"] for r in routers], cfg["num_experts"],
                       cfg["num_experts_per_tok"], chosen)
        if cfg.get("output_router_logits", False):
            loss = ce + cfg.get("router_aux_loss_coef", 0.001) * aux
    loss.backward()
    grads = {k: v.grad.detach() if v.grad is not None else torch.zeros_like(v.detach())
             for k, v in ps.items()}
    routers = [{k: (v.detach() if torch.is_tensor(v) else v) for k, v in r.items()}
               for r in routers]
    return dict(logits=logits.detach(), loss=loss.detach(), ce=ce.detach(),
                aux=None if aux is None else aux.detach(), n_valid=n_valid, grads=grads,
                routers=routers)


def run(params, cfg, inputs, targets, dtype=torch.float32):
    """Forward + backward in `dtype`. Returns (logits, loss, n_valid, {name: grad})."""
    r = run_full(params, cfg, inputs, targets, dtype)
    return r["logits"], r["loss"], r["n_valid"], r["grads"]


def topk_margin(scores, K):
    """How safely top-K picks from scores (N, E): (tokens whose K-th and (K+1)-th largest are
    exactly equal, the smallest nonzero gap between them or None when K == E). A small nonzero
    gap is a choice two fp32 implementations may make differently."""
    if K >= scores.shape[1]:
        return 0, None
    top = torch.sort(scores.double(), dim=1, descending=True)[0]
    gap = top[:, K - 1] - top[:, K]
    ties = int((gap == 0).sum())
    rest = gap[gap > 0]
    return ties, float(rest.min()) if rest.numel() else None
