#!/usr/bin/env python3
"""ep_craft.py SRC DST MODE[+MODE]: the HF folder SRC (a debugmodel_moe export, fp32 safetensors,
one file) as DST for tests/ep.sh, each mode applied in turn.
  mixed  layer 0 dense (mlp_only_layers [0]: gate/up/down of intermediate_size drawn from
         normal(0, 0.02), seed 0, its router and experts dropped), top-3, norm_topk_prob false.
  one    top-1, and every sparse layer's expert_bias 100 for expert 3, 0 elsewhere: the bias
         decides the choice, so every token goes to expert 3 and the others get none."""
import json, os, shutil, struct, sys

import numpy as np

src, dst, mode = sys.argv[1:4]
os.makedirs(dst, exist_ok=True)
for f in os.listdir(src):
    if f != "model.safetensors":
        shutil.copy(os.path.join(src, f), dst)
cfg = json.load(open(os.path.join(src, "config.json")))
with open(os.path.join(src, "model.safetensors"), "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
    data = f.read()
header.pop("__metadata__", None)
tensors = {k: (np.frombuffer(data[v["data_offsets"][0]:v["data_offsets"][1]], np.float32),
               v["shape"]) for k, v in header.items()}
for mode in mode.split("+"):
    if mode == "mixed":
        cfg["mlp_only_layers"] = [0]
        cfg["norm_topk_prob"] = False
        cfg["num_experts_per_tok"] = 3
        for k in [k for k in tensors if k.startswith("model.layers.0.mlp.")]:
            del tensors[k]
        rng = np.random.default_rng(0)
        c, f = cfg["hidden_size"], cfg["intermediate_size"]
        for name, shape in (("gate", [f, c]), ("up", [f, c]), ("down", [c, f])):
            tensors[f"model.layers.0.mlp.{name}_proj.weight"] = (
                (0.02 * rng.standard_normal(shape[0] * shape[1])).astype(np.float32), shape)
    elif mode == "one":
        cfg["num_experts_per_tok"] = 1
        e = cfg["num_experts"]
        for l in range(cfg["num_hidden_layers"]):
            if l in cfg.get("mlp_only_layers", []):
                continue
            b = np.zeros(e, np.float32)
            b[3] = 100.0
            tensors[f"model.layers.{l}.mlp.expert_bias"] = (b, [e])
    else:
        sys.exit(f"unknown mode {mode}")
json.dump(cfg, open(os.path.join(dst, "config.json"), "w"), indent=2)
out, off, blobs = {"__metadata__": {"format": "pt"}}, 0, []
for k in sorted(tensors):
    b = tensors[k][0].tobytes()
    out[k] = {"dtype": "F32", "shape": tensors[k][1], "data_offsets": [off, off + len(b)]}
    blobs.append(b)
    off += len(b)
h = json.dumps(out).encode()
h += b" " * (-len(h) % 8)
with open(os.path.join(dst, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(h)))
    f.write(h)
    for b in blobs:
        f.write(b)
