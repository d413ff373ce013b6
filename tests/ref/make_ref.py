#!/usr/bin/env python3
"""Generates the PyTorch reference data the C tests compare against (ctest fixture
`ref_generate`): make_ref.py --out DIR. Deterministic (fixed seeds) and fast (tiny models).

DIR/golden/        byte-exactness fixtures for the C safetensors writer:
                   single_{f32,bf16,f16}/model.safetensors, sharded_{f32,bf16}/ (max 100 bytes)
DIR/index.json     {"variants": [names]}
DIR/train/         training references (tests/ref/train_ref.py)
DIR/topk_ties.json torch.topk's choices among tied router scores (tests/ref/topk_ties.py)
DIR/<variant>/hf/  a Hugging Face folder: config.json + safetensors (single or sharded)
DIR/<variant>/tokens.npy        the token stream (dtype varies across variants)
DIR/<variant>/expected.safetensors  F32: "logits" (B,T,V) and the gradient of every parameter
                   under its HF name (tied: the embedding gradient holds both uses)
DIR/<variant>/meta.json         B, T, loss (f64 and f32), n_valid, params (HF state_dict order),
                   ignore_positions, weights_dtype, max_shard_bytes, weight_files ...

Windowing (torchtitan): sample b is tokens[b*(T+1) : (b+1)*(T+1)]; inputs are its first T
tokens, targets its last T. Then targets.flat[i] = -100 for every i in meta["ignore_positions"]
(indices into the (B*T) target array). The loss is the mean over the remaining targets.

The reference runs in fp32 like HF, on exactly the fp32 values the C side loads: weights stored as
BF16 are rounded first and the model runs on the rounded values. It also runs in fp64 and records
how far fp32 lands from it (meta["fp32_vs_f64"]), which is the scale the C tolerances sit on.
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
import topk_ties  # noqa: E402

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
    """A config.json as transformers writes it for Qwen3ForCausalLM."""
    return {
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


def model_cfg(v):
    return {
        "vocab_size": v["V"], "hidden_size": v["C"], "intermediate_size": v["F"],
        "num_hidden_layers": v["L"], "num_attention_heads": v["NH"],
        "num_key_value_heads": v["NKV"], "head_dim": v["D"], "rms_norm_eps": v["eps"],
        "rope_theta": v["theta"], "tie_word_embeddings": v["tied"], "attention_bias": v["bias"],
    }


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


def write_variant(out, v, seed):
    d = os.path.join(out, v["name"])
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(os.path.join(d, "hf"))
    gen = torch.Generator().manual_seed(seed)
    cfg = model_cfg(v)
    params = make_params(cfg, gen)
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
    inputs, targets = qwen3_ref.windows(tokens, B, T)
    flat = targets.reshape(-1)
    for i in v["ignore"]:
        flat[i] = qwen3_ref.IGNORE_INDEX
    targets = flat.reshape(B, T)

    logits, loss, n_valid, grads = qwen3_ref.run(params, cfg, inputs, targets, torch.float32)
    logits64, loss64, _, grads64 = qwen3_ref.run(params, cfg, inputs, targets, torch.float64)

    expected = [("logits", logits)] + [(n, grads[n]) for n in order]
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
    names = []
    for k, v in enumerate(VARIANTS):
        meta = write_variant(args.out, v, 1234 + k)
        names.append(v["name"])
        if not args.quiet:
            e = meta["fp32_vs_f64"]
            print("%-34s loss %.6f (n_valid %d)  fp32 vs f64: logits %.1e loss %.1e grads %.1e" % (
                v["name"], meta["loss"], meta["n_valid"], e["logits_max_abs"], e["loss_rel"],
                e["grad_max_rel_l2"]))
    with open(os.path.join(args.out, "index.json"), "w") as f:
        json.dump({"variants": names}, f, indent=2)
        f.write("\n")
    train_ref.write_all(args.out, args.quiet)  # DIR/train/: training parity, AdamW, schedules
    topk_ties.write(args.out)  # DIR/topk_ties.json: torch.topk on tied router scores
    return 0


if __name__ == "__main__":
    sys.exit(main())
