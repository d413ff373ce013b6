#!/usr/bin/env python3
"""tp_add_bias.py SRC DST: the HF folder SRC (fp32 safetensors, one file) as DST with
attention_bias true: q/k/v/o_proj biases of every layer drawn from normal(0, 0.02), seed 0.
tests/tp.sh trains it at TP=2 against one process."""
import json, os, shutil, struct, sys

import numpy as np

src, dst = sys.argv[1:3]
os.makedirs(dst, exist_ok=True)
for f in os.listdir(src):
    if f != "model.safetensors":
        shutil.copy(os.path.join(src, f), dst)
cfg = json.load(open(os.path.join(src, "config.json")))
cfg["attention_bias"] = True
json.dump(cfg, open(os.path.join(dst, "config.json"), "w"), indent=2)
with open(os.path.join(src, "model.safetensors"), "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
    data = f.read()
tensors = {k: np.frombuffer(data[v["data_offsets"][0]:v["data_offsets"][1]], np.float32)
           for k, v in header.items() if k != "__metadata__"}
rng = np.random.default_rng(0)
hd, nh, nkv, c = cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["hidden_size"]
shapes = {}
for l in range(cfg["num_hidden_layers"]):
    for name, size in (("q", nh * hd), ("k", nkv * hd), ("v", nkv * hd), ("o", c)):
        key = f"model.layers.{l}.self_attn.{name}_proj.bias"
        tensors[key] = (0.02 * rng.standard_normal(size)).astype(np.float32)
        shapes[key] = [size]
out, off, blobs = {"__metadata__": {"format": "pt"}}, 0, []
for k in sorted(tensors):
    b = tensors[k].tobytes()
    out[k] = {"dtype": "F32", "shape": shapes.get(k, header.get(k, {}).get("shape")),
              "data_offsets": [off, off + len(b)]}
    blobs.append(b)
    off += len(b)
h = json.dumps(out).encode()
h += b" " * (-len(h) % 8)
with open(os.path.join(dst, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
