#!/usr/bin/env python3
"""`ctitan export --merge` against PEFT's merge, computed independently in numpy.

A tiny dense Qwen3 and a tiny MoE one (a dense layer among sparse ones, per-expert keys) are
written as HF folders; an adapter folder is written by hand the way PEFT's save_pretrained writes
it (adapter_config.json from json.dumps(indent=2, sort_keys=True), adapter_model.safetensors with
PeftModel's keys, the adapter name removed, metadata {"format": "pt"}, tensors ordered as the
safetensors library orders them). The merged export must equal W + (B @ A) * scaling (numpy,
float64, rounded to fp32) within 1e-6 relative (measured: at most 7.7e-8, fp32 summation order),
with every tensor the adapter leaves alone bit-identical to the base. Also: the same adapter with
transformers' prefix-less keys merges to the same bits, BF16 bases and adapters are read, and a bad
adapter is refused in one line that names what is wrong.
"""
import json
import os
import shutil
import struct
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.environ["CTITAN_SOURCE_DIR"], "tests", "ref"))
from checks import check, summary  # noqa: E402

BIN, TMP = os.environ["CTITAN_BIN"], os.environ["CTITAN_TMP"]
rng = np.random.default_rng(31)


def st_write(path, tensors, dtype="F32"):
    """A safetensors file as the Python library writes it: compact header, the metadata first,
    tensors by (alignment, name), padded with spaces to 8 bytes."""
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name], dtype=np.float32)
        if dtype == "BF16":  # round to nearest even
            u = a.view(np.uint32).astype(np.uint64)
            b = (((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)).tobytes()
        else:
            b = a.tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def st_read(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        raw = data[v["data_offsets"][0]:v["data_offsets"][1]]
        if v["dtype"] == "BF16":
            a = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            a = np.frombuffer(raw, np.float32)
        out[k] = a.reshape(v["shape"])
    return out, header.get("__metadata__")


def base_folder(name, cfg, dtype="F32"):
    """config.json and random weights, every tensor transformers' Qwen3 has; returns them as
    stored (BF16 values widened)."""
    d = os.path.join(TMP, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    C, V, D = cfg["hidden_size"], cfg["vocab_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * D, cfg["num_key_value_heads"] * D
    t = {"model.embed_tokens.weight": (V, C), "model.norm.weight": (C,), "lm_head.weight": (V, C)}
    for l in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % l
        t.update({p + "input_layernorm.weight": (C,), p + "post_attention_layernorm.weight": (C,),
                  p + "self_attn.q_proj.weight": (q, C), p + "self_attn.k_proj.weight": (kv, C),
                  p + "self_attn.v_proj.weight": (kv, C), p + "self_attn.o_proj.weight": (C, q),
                  p + "self_attn.q_norm.weight": (D,), p + "self_attn.k_norm.weight": (D,)})
        if cfg.get("num_experts") and l not in cfg.get("mlp_only_layers", []):
            E, F = cfg["num_experts"], cfg["moe_intermediate_size"]
            t[p + "mlp.gate.weight"] = (E, C)
            for e in range(E):
                for m, s in (("gate_proj", (F, C)), ("up_proj", (F, C)), ("down_proj", (C, F))):
                    t[p + "mlp.experts.%d.%s.weight" % (e, m)] = s
        else:
            F = cfg["intermediate_size"]
            t.update({p + "mlp.gate_proj.weight": (F, C), p + "mlp.up_proj.weight": (F, C),
                      p + "mlp.down_proj.weight": (C, F)})
    w = {k: rng.standard_normal(s).astype(np.float32) * 0.1 for k, s in t.items()}
    if dtype == "BF16":
        w = {k: st_bf16(v) for k, v in w.items()}
    st_write(os.path.join(d, "model.safetensors"), w, dtype)
    return d, w


def adapter_folder(name, base_w, targets, r, alpha, rslora, prefix="base_model.model.",
                   dtype="F32", edit=None, cfg_edit=None):
    """A PEFT adapter folder; returns it and {base weight name: (A, B)}."""
    d = os.path.join(TMP, name)
    os.makedirs(d, exist_ok=True)
    cfg = {"alpha_pattern": {}, "auto_mapping": None, "base_model_name_or_path": "tiny/qwen3",
           "bias": "none", "corda_config": None, "eva_config": None, "exclude_modules": None,
           "fan_in_fan_out": False, "inference_mode": True, "init_lora_weights": True,
           "layer_replication": None, "layers_pattern": None, "layers_to_transform": None,
           "loftq_config": {}, "lora_alpha": alpha, "lora_bias": False, "lora_dropout": 0.05,
           "megatron_config": None, "megatron_core": "megatron.core", "modules_to_save": None,
           "peft_type": "LORA", "peft_version": "0.17.1", "qalora_group_size": 16, "r": r,
           "rank_pattern": {}, "revision": None, "target_modules": sorted(targets),
           "target_parameters": None, "task_type": "CAUSAL_LM", "trainable_token_indices": None,
           "use_dora": False, "use_qalora": False, "use_rslora": rslora}
    cfg.update(cfg_edit or {})
    with open(os.path.join(d, "adapter_config.json"), "w") as f:
        f.write(json.dumps(cfg, indent=2, sort_keys=True))
    pairs, tensors = {}, {}
    for k, w in base_w.items():
        mod = k.split(".")[-2]
        if w.ndim != 2 or mod not in targets:
            continue
        A = rng.uniform(-1, 1, (r, w.shape[1])).astype(np.float32) / np.sqrt(w.shape[1])
        B = rng.standard_normal((w.shape[0], r)).astype(np.float32) * 0.05
        if dtype == "BF16":  # what the merge sees: the adapter's values as stored
            A, B = [st_bf16(x) for x in (A, B)]
        pairs[k] = (A, B)
        stem = prefix + k[: -len(".weight")]
        tensors[stem + ".lora_A.weight"] = A
        tensors[stem + ".lora_B.weight"] = B
    if edit:
        edit(tensors)
    st_write(os.path.join(d, "adapter_model.safetensors"), tensors, dtype)
    return d, pairs


def st_bf16(x):
    u = x.view(np.uint32).astype(np.uint64)
    return ((((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32)).view(np.float32)


def export(base, adapter, out, extra=()):
    cmd = [BIN, "export", "--merge", "--model.hf_path", base, "--lora.adapter_path", adapter,
           "--output", out, "--dtype", "float32"] + list(extra)
    return subprocess.run(cmd, capture_output=True, text=True)


def check_merge(label, base_w, pairs, out, scale):
    got, meta = st_read(os.path.join(out, "model.safetensors"))
    check(meta == {"format": "pt"}, "%s: metadata %r" % (label, meta))
    # A tied lm_head is left out; ours is untied, so every base tensor is there.
    check(set(got) == set(base_w), "%s: tensors %s" % (label, sorted(set(got) ^ set(base_w))))
    worst, same = 0.0, True
    for k, w in base_w.items():
        if k not in got:
            continue
        if k in pairs:
            A, B = pairs[k]
            want = (w.astype(np.float64) + (B.astype(np.float64) @ A.astype(np.float64)) * scale)
            err = np.abs(got[k] - want).max() / np.abs(want).max()
            worst = max(worst, err)
        else:
            same &= np.array_equal(got[k], w)
    check(len(pairs) > 0, "%s: nothing adapted" % label)
    check(worst <= 1e-6, "%s: merged error %.3g > 1e-6" % (label, worst))
    check(same, "%s: an unadapted tensor changed" % label)
    print("%s: %d tensors merged, worst relative error %.3g" % (label, len(pairs), worst))
    return got


def one_line_error(label, r, *needles):
    lines = r.stderr.strip().splitlines()
    check(r.returncode == 1, "%s: exit %d (%s)" % (label, r.returncode, r.stderr.strip()))
    check(len(lines) == 1, "%s: %d lines: %r" % (label, len(lines), r.stderr))
    for n in needles:
        check(n in r.stderr, "%s: %r not in %r" % (label, n, r.stderr.strip()))


dense_cfg = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 64,
             "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
             "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
             "tie_word_embeddings": False, "torch_dtype": "float32"}
moe_cfg = dict(dense_cfg, architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe",
               num_hidden_layers=3, num_experts=4, num_experts_per_tok=2,
               moe_intermediate_size=8, decoder_sparse_step=1, mlp_only_layers=[1],
               norm_topk_prob=True, router_aux_loss_coef=0.001)

# Dense: attention and down_proj, alpha / r.
base, base_w = base_folder("dense", dense_cfg)
targets = ["q_proj", "v_proj", "o_proj", "down_proj"]
ad, pairs = adapter_folder("dense_lora", base_w, targets, r=4, alpha=16, rslora=False)
r = export(base, ad, os.path.join(TMP, "dense_out"))
check(r.returncode == 0, "dense export: %s" % r.stderr)
check("r 4" in r.stdout and "tiny/qwen3" in r.stdout, "dense report: %r" % r.stdout)
if r.returncode == 0:
    merged = check_merge("dense", base_w, pairs, os.path.join(TMP, "dense_out"), 16 / 4)
    with open(os.path.join(TMP, "dense_out", "config.json")) as f:
        check(json.load(f)["hidden_size"] == 16, "dense: config.json")
    # transformers' adapter integration saves the same keys without PeftModel's prefix.
    ad2 = os.path.join(TMP, "dense_lora_noprefix")
    os.makedirs(ad2)
    shutil.copy(os.path.join(ad, "adapter_config.json"), ad2)
    first, _ = st_read(os.path.join(ad, "adapter_model.safetensors"))
    st_write(os.path.join(ad2, "adapter_model.safetensors"),
             {k[len("base_model.model."):]: v for k, v in first.items()})
    r = export(base, ad2, os.path.join(TMP, "dense_out2"))
    check(r.returncode == 0, "prefix-less export: %s" % r.stderr)
    if r.returncode == 0:
        again, _ = st_read(os.path.join(TMP, "dense_out2", "model.safetensors"))
        check(all(np.array_equal(again[k], merged[k]) for k in merged),
              "prefix-less keys merge differently")

# MoE: every linear projection (each expert's own A and B), rsLoRA, a BF16 base and adapter.
base, base_w = base_folder("moe", moe_cfg, "BF16")
all_linear = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ad, pairs = adapter_folder("moe_lora", base_w, all_linear, r=8, alpha=8, rslora=True,
                           dtype="BF16")
check(any(".experts.3.up_proj" in k for k in pairs), "moe: no per-expert pair")
r = export(base, ad, os.path.join(TMP, "moe_out"))
check(r.returncode == 0, "moe export: %s" % r.stderr)
if r.returncode == 0:
    check_merge("moe", base_w, pairs, os.path.join(TMP, "moe_out"), 8 / np.sqrt(8))

# Refusals through the command line: one line each, naming what is wrong.
k0 = "base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight"
bad = {
    "missing": ({"edit": lambda t: t.pop(k0)}, [k0, "missing"]),
    "shape": ({"edit": lambda t: t.update({k0: np.zeros((4, 15), np.float32)})},
              [k0, "expected shape [4, 16], found [4, 15]"]),
    "rank": ({"edit": lambda t: t.update({k0: np.zeros((2, 16), np.float32)})},
             [k0, "rank 2", "r is 4"]),
    "untargeted": ({"edit": lambda t: t.update(
        {k0.replace("q_proj", "k_proj"): np.zeros((4, 16), np.float32)})},
        ["k_proj", "target_modules"]),
    "peft_type": ({"cfg_edit": {"peft_type": "IA3"}}, ["peft_type", "LORA", "IA3"]),
    "bias": ({"cfg_edit": {"bias": "all"}}, ["bias", "none", "all"]),
    "regex": ({"cfg_edit": {"target_modules": ".*q_proj"}}, ["target_modules", "regular"]),
    "dora": ({"cfg_edit": {"use_dora": True}}, ["use_dora", "true"]),
}
base, base_w = os.path.join(TMP, "dense"), st_read(os.path.join(TMP, "dense", "model.safetensors"))[0]
for label, (kw, needles) in bad.items():
    ad, _ = adapter_folder("bad_" + label, base_w, targets, r=4, alpha=16, rslora=False, **kw)
    r = export(base, ad, os.path.join(TMP, "bad_out_" + label))
    one_line_error(label, r, *needles)
    print(label + ":", r.stderr.strip())
    check(not os.path.exists(os.path.join(TMP, "bad_out_" + label, "model.safetensors")),
          "%s: wrote weights" % label)
ad, _ = adapter_folder("pickle", base_w, targets, r=4, alpha=16, rslora=False)
os.rename(os.path.join(ad, "adapter_model.safetensors"), os.path.join(ad, "adapter_model.bin"))
one_line_error("pickle", export(base, ad, os.path.join(TMP, "bad_out_pickle")),
               "adapter_model.bin", "convert")
summary()
