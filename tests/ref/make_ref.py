#!/usr/bin/env python3
"""Generates the PyTorch reference data the C tests compare against (ctest fixture
`ref_generate`): make_ref.py --out DIR. Deterministic (fixed seeds) and fast (tiny models).

DIR/golden/        byte-exactness fixtures for the C safetensors writer:
                   single_{f32,bf16,f16}/model.safetensors, sharded_{f32,bf16}/ (max 100 bytes)
DIR/index.json     {"variants": [all names], "moe_variants": [the MoE ones]}
DIR/train/         training references (tests/ref/train_ref.py)
DIR/bf16/          bf16 mixed-precision training references, autocast and fp32
                   (tests/ref/bf16_ref.py)
DIR/lora/          PEFT's LoRA on frozen bases: gradients and AdamW steps (tests/ref/lora_ref.py)
DIR/topk_ties.json torch.topk's choices among tied router scores (tests/ref/topk_ties.py)
DIR/sample.safetensors  HF generate's sampling distributions on fixed logits (tests/ref/gen_ref.py)
DIR/<variant>/hf/  a Hugging Face folder: config.json + safetensors (single or sharded)
DIR/<variant>/tokens.npy        the token stream (dtype varies across variants)
DIR/<variant>/expected.safetensors  F32: "logits" (B,T,V) and the gradient of every parameter
                   under its HF name (tied: the embedding gradient holds both uses)
DIR/<variant>/generate.safetensors  greedy generation with each step's logits (gen_ref.py)
DIR/<variant>/meta.json         B, T, loss (f64 and f32), n_valid, params (HF state_dict order),
                   ignore_positions, weights_dtype, max_shard_bytes, weight_files ...

Windowing (torchtitan): sample b is tokens[b*(T+1) : (b+1)*(T+1)]; inputs are its first T
tokens, targets its last T. Then targets.flat[i] = -100 for every i in meta["ignore_positions"]
(indices into the (B*T) target array). The loss is the mean over the remaining targets.

The reference runs in fp32 like HF, on exactly the fp32 values the C side loads: weights stored as
BF16 are rounded first and the model runs on the rounded values. It also runs in fp64 and records
how far fp32 lands from it (meta["fp32_vs_f64"]), which is the scale the C tolerances sit on.

MoE variants (Qwen3MoeForCausalLM, see MOE_VARIANTS) have the same files. Their meta.json adds
"moe": true, the MoE config ("num_experts", "num_experts_per_tok", "moe_intermediate_size",
"norm_topk_prob", "decoder_sparse_step", "mlp_only_layers", "output_router_logits",
"router_aux_loss_coef") and "sparse_layers"; "ce"/"ce_f64" (mean cross-entropy), "aux"/"aux_f64"
(HF's load-balancing statistic over all sparse layers, reported even when unused) and "loss" =
ce + router_aux_loss_coef * aux iff output_router_logits, else ce (what backpropagates, so the
gradients are of it); "moe_load" [[tokens per expert] per sparse layer], "moe_idle_experts"
(experts with no token, per sparse layer), "moe_boundary_ties" (tokens whose K-th and (K+1)-th
probabilities are exactly equal, per sparse layer), "moe_min_gap" (the smallest nonzero gap
between those two, over all; null when K == E: choices that near could flip between two fp32
implementations, so the generator refuses gaps under MIN_GAP). expected.safetensors adds, per
sparse layer i, "router.i.logits" (N,E), "router.i.experts" (N,K; the chosen experts in torch.topk
order, as floats) and "router.i.weights" (N,K; after renormalisation), N = B*T tokens in order.
"""
import argparse
import json
import os
import shutil
import sys

import numpy as np
import torch

sys.dont_write_bytecode = True  # runs from the source tree; leave it clean
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qwen3_ref  # noqa: E402
import safetensors_ref  # noqa: E402
import train_ref  # noqa: E402
import bf16_ref  # noqa: E402
import topk_ties  # noqa: E402
import gen_ref  # noqa: E402
import lora_ref  # noqa: E402

# Each variant: architecture, storage and batch. Together they cover head_dim != C/NH, GQA ratios
# 1/2/3, tied and untied heads, attention bias on and off, F32 and BF16 weights, single files and
# shards, vocab larger than the ids used, ignored targets, and four token dtypes.
VARIANTS = [
    dict(name="mha_untied_f32", V=128, C=32, F=64, L=2, NH=4, NKV=4, D=8, tied=False, bias=False,
         dtype="F32", shard=0, tok="<u2", B=2, T=8, theta=10000.0, eps=1e-6, ignore=[]),
    dict(name="gqa2_hd16_tied_bias_bf16_sharded", V=160, C=32, F=48, L=2, NH=4, NKV=2, D=16,
         tied=True, bias=True, dtype="BF16", shard=4096, tok="<i4", B=3, T=5, theta=1e6,
         eps=1e-6, ignore=[]),
    dict(name="gqa3_untied_bias_f32_sharded", V=200, C=48, F=80, L=2, NH=6, NKV=2, D=12,
         tied=False, bias=True, dtype="F32", shard=12000, tok="<u4", B=1, T=17, theta=10000.0,
         eps=1e-6, ignore=[3, 16]),
    dict(name="gqa2_bigvocab_tied_bf16", V=300, ids=90, C=16, F=40, L=2, NH=2, NKV=1, D=24,
         tied=True, bias=False, dtype="BF16", shard=0, tok="<i8", B=2, T=11, theta=10000.0,
         eps=1e-5, ignore=[0, 12, 21]),
    dict(name="mqa3_untied_bf16_sharded", V=120, C=24, F=56, L=2, NH=3, NKV=1, D=10,
         tied=False, bias=False, dtype="BF16", shard=3000, tok="<u2", B=3, T=7, theta=1e6,
         eps=1e-6, ignore=[]),
    dict(name="mha_hd32_tied_bias_f32", V=256, C=40, F=37, L=2, NH=2, NKV=2, D=32, tied=True,
         bias=True, dtype="F32", shard=0, tok="<i4", B=1, T=13, theta=1e6, eps=1e-5,
         ignore=[]),
    dict(name="gqa2_untied_bias_bf16", V=100, C=24, F=64, L=2, NH=4, NKV=2, D=6, tied=False,
         bias=True, dtype="BF16", shard=0, tok="<u4", B=2, T=9, theta=500000.0, eps=1e-6,
         ignore=[5]),
    dict(name="gqa3_hd4_tied_f32_sharded", V=144, C=36, F=72, L=2, NH=6, NKV=2, D=4, tied=True,
         bias=False, dtype="F32", shard=6000, tok="<i8", B=3, T=6, theta=10000.0, eps=1e-6,
         ignore=[]),
]

# MoE variants (HF Qwen3MoeForCausalLM): E experts, top-K, expert width Fm, norm_topk_prob,
# decoder_sparse_step, mlp_only_layers, output_router_logits (aux) and router_aux_loss_coef. They
# cover norm on and off; dense and sparse layers mixed (step 1 with mlp_only [0]; step 2 with
# mlp_only [3], leaving only layer 1 sparse; step 1 with L=3 and K=E); K = 1, 2, 8 (with E = 16
# and E = 8 = K); aux on (coef 0.01, 0.02) and off; tied and untied; BF16; sharded; ignored
# targets; and three routing corner cases, made and checked by apply_special:
#   idle: 16 experts, K=1, 6 tokens: most experts get no token (zero gradients);
#   one:  the router sends every token to expert 2 (K=1) in both sparse layers;
#   ties: layer 0's router is zero (all probabilities equal), layer 1's is zero on four rows,
#         so torch.topk's order among equal values decides the experts.
MOE_VARIANTS = [
    dict(name="moe_e8k2_norm_aux_untied", V=128, C=32, F=48, L=2, NH=4, NKV=2, D=8, tied=False,
         bias=False, dtype="F32", shard=0, tok="<i4", B=2, T=7, theta=10000.0, eps=1e-6,
         ignore=[4], E=8, K=2, Fm=16, norm=True, step=1, mlp_only=[], aux=True, coef=0.02),
    dict(name="moe_mix_mlponly0_e6k1_tied_bias_bf16", V=112, C=24, F=40, L=4, NH=3, NKV=1, D=8,
         tied=True, bias=True, dtype="BF16", shard=0, tok="<u2", B=3, T=5, theta=1e6,
         eps=1e-6, ignore=[], E=6, K=1, Fm=12, norm=False, step=1, mlp_only=[0], aux=False,
         coef=0.001),
    dict(name="moe_step2_mlponly3_e16k8_sharded", V=144, C=40, F=64, L=4, NH=4, NKV=4, D=10,
         tied=False, bias=False, dtype="F32", shard=80000, tok="<u4", B=1, T=20, theta=10000.0,
         eps=1e-6, ignore=[0, 13], E=16, K=8, Fm=8, norm=True, step=2, mlp_only=[3], aux=True,
         coef=0.01),
    dict(name="moe_e8k8_nonorm_aux_tied", V=100, C=16, F=32, L=3, NH=2, NKV=1, D=8, tied=True,
         bias=False, dtype="F32", shard=0, tok="<i8", B=2, T=6, theta=10000.0, eps=1e-6,
         ignore=[], E=8, K=8, Fm=8, norm=False, step=1, mlp_only=[1], aux=True, coef=0.02),
    dict(name="moe_idle_e16k1_aux", V=120, C=24, F=40, L=2, NH=2, NKV=2, D=12, tied=False,
         bias=False, dtype="F32", shard=0, tok="<u2", B=2, T=3, theta=10000.0, eps=1e-6,
         ignore=[], E=16, K=1, Fm=8, norm=False, step=1, mlp_only=[], aux=True, coef=0.02,
         special="idle"),
    dict(name="moe_one_expert_k1_aux", V=96, C=32, F=48, L=2, NH=4, NKV=4, D=8, tied=False,
         bias=False, dtype="F32", shard=0, tok="<i4", B=2, T=6, theta=10000.0, eps=1e-6,
         ignore=[], E=4, K=1, Fm=16, norm=False, step=1, mlp_only=[], aux=True, coef=0.02,
         special="one"),
    dict(name="moe_ties_zero_router_k2", V=104, C=24, F=32, L=2, NH=2, NKV=1, D=12, tied=False,
         bias=False, dtype="F32", shard=0, tok="<i4", B=2, T=5, theta=10000.0, eps=1e-6,
         ignore=[], E=8, K=2, Fm=8, norm=True, step=1, mlp_only=[], aux=True, coef=0.02,
         special="ties"),
]
ONE_EXPERT = 2  # where "one" sends every token (not 0, which a wrong tie order might favour)
TIE_ROWS = [1, 3, 4, 6]  # layer 1's zero router rows in "ties"
MIN_GAP = 1e-5  # smallest gap allowed between the K-th and (K+1)-th probability, unless equal

GOLDEN_TENSORS = [
    ("model.embed_tokens.weight", (7, 4)),
    ("model.norm.weight", (4,)),
    ("lm_head.weight", (7, 4)),
    ("model.layers.0.mlp.up_proj.weight", (6, 4)),
]


def golden_entries():
    out = []
    for k, (name, shape) in enumerate(GOLDEN_TENSORS):
        n = int(np.prod(shape))
        vals = [((i * 7919 + k * 104729) % 2001 - 1000) / 256.0 * (k + 1) for i in range(n)]
        out.append((name, torch.tensor(vals, dtype=torch.float64).to(torch.float32).reshape(shape)))
    return out


def write_golden(out):
    g = os.path.join(out, "golden")
    shutil.rmtree(g, ignore_errors=True)
    entries = golden_entries()
    for dt in ("F32", "BF16", "F16"):
        d = os.path.join(g, "single_" + dt.lower())
        os.makedirs(d)
        safetensors_ref.write_file(os.path.join(d, "model.safetensors"), entries, dt)
    for dt in ("F32", "BF16"):
        safetensors_ref.write_folder(os.path.join(g, "sharded_" + dt.lower()), entries, dt, 100)


def hf_config(v):
    """A config.json as transformers writes it for Qwen3ForCausalLM (Qwen3MoeForCausalLM when
    the variant has experts, v["E"])."""
    c = {
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": v["bias"],
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "head_dim": v["D"],
        "hidden_act": "silu",
        "hidden_size": v["C"],
        "initializer_range": 0.02,
        "intermediate_size": v["F"],
        "max_position_embeddings": 64,
        "max_window_layers": v["L"],
        "model_type": "qwen3",
        "num_attention_heads": v["NH"],
        "num_hidden_layers": v["L"],
        "num_key_value_heads": v["NKV"],
        "rms_norm_eps": v["eps"],
        "rope_scaling": None,
        "rope_theta": v["theta"],
        "sliding_window": None,
        "tie_word_embeddings": v["tied"],
        "torch_dtype": {"F32": "float32", "BF16": "bfloat16"}[v["dtype"]],
        "transformers_version": "4.51.0",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": v["V"],
    }
    if v.get("E"):
        c.update(moe_keys(v))
        c["architectures"] = ["Qwen3MoeForCausalLM"]
        c["model_type"] = "qwen3_moe"
    return c


def moe_keys(v):
    """The MoE config keys, under their HF names (config.json and qwen3_ref's cfg alike)."""
    return {
        "num_experts": v["E"], "num_experts_per_tok": v["K"], "moe_intermediate_size": v["Fm"],
        "norm_topk_prob": v["norm"], "decoder_sparse_step": v["step"],
        "mlp_only_layers": list(v["mlp_only"]), "output_router_logits": v["aux"],
        "router_aux_loss_coef": v["coef"],
    }


def model_cfg(v):
    cfg = {
        "vocab_size": v["V"], "hidden_size": v["C"], "intermediate_size": v["F"],
        "num_hidden_layers": v["L"], "num_attention_heads": v["NH"],
        "num_key_value_heads": v["NKV"], "head_dim": v["D"], "rms_norm_eps": v["eps"],
        "rope_theta": v["theta"], "tie_word_embeddings": v["tied"], "attention_bias": v["bias"],
    }
    if v.get("E"):
        cfg.update(moe_keys(v))
    return cfg


def make_params(cfg, gen):
    """Random weights large enough that every path (attention mixing, norms, biases) matters."""
    params = {}
    for name, shape in qwen3_ref.param_shapes(cfg):
        if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
            t = 1.0 + 0.2 * torch.randn(shape, generator=gen)
        elif name.endswith(".bias"):
            t = 0.2 * torch.randn(shape, generator=gen)
        elif name == "model.embed_tokens.weight":
            t = 0.25 * torch.randn(shape, generator=gen)
        else:
            t = torch.randn(shape, generator=gen) * (0.8 / shape[1] ** 0.5)
        params[name] = t.to(torch.float32)
    return params


def rel_l2(a, b):
    return float((a.double() - b.double()).norm() / max(float(b.double().norm()), 1e-30))


def apply_special(params, v, cfg):
    """Shapes the routers of the corner-case variants (see MOE_VARIANTS)."""
    layers = qwen3_ref.sparse_layers(cfg)
    gate = ["model.layers.%d.mlp.gate.weight" % i for i in layers]
    if v.get("special") == "one":
        # A constant embedding column stays a positive coordinate of every token's router input
        # (RMS norm scales it, the residual stream keeps it); a router row reading only that
        # coordinate, which the other rows ignore, then wins every token.
        params["model.embed_tokens.weight"][:, 0] = 2.0
        for g in gate:
            params[g][:, 0] = 0.0
            params[g][ONE_EXPERT] = 0.0
            params[g][ONE_EXPERT, 0] = 1.0
    elif v.get("special") == "ties":
        params[gate[0]].zero_()  # logits exactly 0: every probability is 1/E
        params[gate[1]][TIE_ROWS] = 0.0


def check_moe(v, cfg, r, r64, order):
    """The generator's own assertions on a MoE run; returns the routing statistics for meta."""
    name, E, K = v["name"], v["E"], v["K"]
    load, idle, ties, gaps = [], [], [], []
    for a, b in zip(r["routers"], r64["routers"]):
        if not torch.equal(a["selected"], b["selected"]):
            raise RuntimeError("%s: layer %d routes differently in fp64" % (name, a["layer"]))
        n = torch.bincount(a["selected"].reshape(-1), minlength=E)
        load.append([int(c) for c in n])
        idle.append(int((n == 0).sum()))
        t, g = qwen3_ref.topk_margin(a["probs"], K)
        ties.append(t)
        if g is not None:
            gaps.append(g)
        for e in range(E):  # experts without tokens have zero (not missing) gradients
            q = "model.layers.%d.mlp.experts.%d." % (a["layer"], e)
            if n[e] == 0 and any(r["grads"][q + w].any() for w in
                                 ("gate_proj.weight", "up_proj.weight", "down_proj.weight")):
                raise RuntimeError("%s: %s has no token but a gradient" % (name, q))
    min_gap = min(gaps) if gaps else None
    if min_gap is not None and min_gap < MIN_GAP:
        raise RuntimeError("%s: a top-k choice hangs on a gap of %.2e" % (name, min_gap))
    sp = v.get("special")
    if sp == "idle" and not all(idle):
        raise RuntimeError("%s: every expert got tokens: %s" % (name, load))
    if sp == "one" and not all(bool((a["selected"] == ONE_EXPERT).all()) for a in r["routers"]):
        raise RuntimeError("%s: not every token chose expert %d: %s" % (name, ONE_EXPERT, load))
    if sp == "ties" and (ties[0] != v["B"] * v["T"] or ties[1] == 0):
        raise RuntimeError("%s: top-k boundary ties per layer %s" % (name, ties))
    if sp != "ties" and any(ties):
        raise RuntimeError("%s: unplanned exact ties %s" % (name, ties))
    return dict(moe_load=load, moe_idle_experts=idle, moe_boundary_ties=ties, moe_min_gap=min_gap)


def write_variant(out, v, seed):
    d = os.path.join(out, v["name"])
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(os.path.join(d, "hf"))
    gen = torch.Generator().manual_seed(seed)
    cfg = model_cfg(v)
    moe = bool(v.get("E"))
    params = make_params(cfg, gen)
    if moe:
        apply_special(params, v, cfg)
    # The C side loads the stored values; the reference must see the same ones.
    params = {k: safetensors_ref.round_to(t, v["dtype"]) for k, t in params.items()}
    order = [n for n, _ in qwen3_ref.param_shapes(cfg)]
    with open(os.path.join(d, "hf", "config.json"), "w") as f:
        json.dump(hf_config(v), f, indent=2, sort_keys=True)
        f.write("\n")
    files = safetensors_ref.write_folder(os.path.join(d, "hf"), [(n, params[n]) for n in order],
                                         v["dtype"], v["shard"])
    if v["shard"] and len(files) < 2:
        raise RuntimeError("%s: shard size %d gives one file" % (v["name"], v["shard"]))

    B, T = v["B"], v["T"]
    n_ids = v.get("ids", v["V"])
    extra = 3  # trailing tokens the windowing must not use
    tokens = torch.randint(0, n_ids, (B * (T + 1) + extra,), generator=gen).numpy()
    np.save(os.path.join(d, "tokens.npy"), tokens.astype(v["tok"]))
    gen_ref.write(d, params, cfg, tokens, seed)  # DIR/<variant>/generate.safetensors
    inputs, targets = qwen3_ref.windows(tokens, B, T)
    flat = targets.reshape(-1)
    for i in v["ignore"]:
        flat[i] = qwen3_ref.IGNORE_INDEX
    targets = flat.reshape(B, T)

    if moe:
        r = qwen3_ref.run_full(params, cfg, inputs, targets, torch.float32)
        r64 = qwen3_ref.run_full(params, cfg, inputs, targets, torch.float64)
        logits, loss, n_valid, grads = r["logits"], r["loss"], r["n_valid"], r["grads"]
        logits64, loss64, grads64 = r64["logits"], r64["loss"], r64["grads"]
        routing = check_moe(v, cfg, r, r64, order)
    else:
        logits, loss, n_valid, grads = qwen3_ref.run(params, cfg, inputs, targets, torch.float32)
        logits64, loss64, _, grads64 = qwen3_ref.run(params, cfg, inputs, targets, torch.float64)

    expected = [("logits", logits)] + [(n, grads[n]) for n in order]
    if moe:
        for a in r["routers"]:
            p = "router.%d." % a["layer"]
            expected += [(p + "logits", a["logits"]), (p + "experts", a["selected"].float()),
                         (p + "weights", a["weights"])]
    safetensors_ref.write_file(os.path.join(d, "expected.safetensors"), expected, "F32")
    meta = {
        "name": v["name"],
        "B": B,
        "T": T,
        "loss": float(loss),
        "loss_f32": float(loss.to(torch.float32)),
        "loss_f64": float(loss64),
        "n_valid": n_valid,
        "grad_norm": float(torch.sqrt(sum(grads[n].double().pow(2).sum() for n in order))),
        "ignore_positions": v["ignore"],
        "tokens_dtype": v["tok"],
        "weights_dtype": v["dtype"],
        "weight_files": files,
        "max_shard_bytes": v["shard"],
        "params": order,
        "fp32_vs_f64": {
            "logits_max_abs": float((logits.double() - logits64).abs().max()),
            "loss_rel": abs(float(loss) - float(loss64)) / abs(float(loss64)),
            "grad_max_rel_l2": max(rel_l2(grads[n], grads64[n]) for n in order),
        },
    }
    if moe:
        meta.update(moe=True, **moe_keys(v), sparse_layers=qwen3_ref.sparse_layers(cfg),
                    ce=float(r["ce"]), ce_f64=float(r64["ce"]), aux=float(r["aux"]),
                    aux_f64=float(r64["aux"]), **routing)
        # Expert gradients are where MoE arithmetic differs most; the router's separately.
        routers = [n for n in order if n.endswith("mlp.gate.weight")]
        meta["fp32_vs_f64"].update(
            ce_rel=abs(float(r["ce"]) - float(r64["ce"])) / abs(float(r64["ce"])),
            aux_rel=abs(float(r["aux"]) - float(r64["aux"])) / abs(float(r64["aux"])),
            router_grad_max_rel_l2=max(rel_l2(grads[n], grads64[n]) for n in routers),
            same_selection=True)  # check_moe refuses otherwise
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    return meta


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)  # deterministic reductions, and the machine is small
    os.makedirs(args.out, exist_ok=True)
    write_golden(args.out)
    names, moe_names = [], []
    for k, v in enumerate(VARIANTS + MOE_VARIANTS):
        meta = write_variant(args.out, v, 1234 + k)
        names.append(v["name"])
        if v.get("E"):
            moe_names.append(v["name"])
        if not args.quiet:
            e = meta["fp32_vs_f64"]
            print("%-34s loss %.6f (n_valid %d)  fp32 vs f64: logits %.1e loss %.1e grads %.1e" % (
                v["name"], meta["loss"], meta["n_valid"], e["logits_max_abs"], e["loss_rel"],
                e["grad_max_rel_l2"]))
            if v.get("E"):
                print("%34s ce %.6f aux %.6f load %s gap %s ties %s" % (
                    "", meta["ce"], meta["aux"], meta["moe_load"], meta["moe_min_gap"],
                    meta["moe_boundary_ties"]))
    with open(os.path.join(args.out, "index.json"), "w") as f:
        json.dump({"variants": names, "moe_variants": moe_names}, f, indent=2)
        f.write("\n")
    train_ref.write_all(args.out, args.quiet)  # DIR/train/: training parity, AdamW, schedules
    bf16_ref.write_all(args.out, args.quiet)  # DIR/bf16/: autocast bf16 training
    topk_ties.write(args.out)  # DIR/topk_ties.json: torch.topk on tied router scores
    gen_ref.write_sampling(args.out)  # DIR/sample.safetensors: HF's sampling distributions
    lora_ref.write_all(args.out, args.quiet)  # DIR/lora/: PEFT's LoRA, gradients and AdamW
    return 0


if __name__ == "__main__":
    sys.exit(main())
