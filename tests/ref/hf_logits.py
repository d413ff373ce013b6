#!/usr/bin/env python3
"""Logits of an HF Qwen3 folder with the PyTorch reference model, for export round-trip tests.

usage: hf_logits.py HFDIR TOKENS.npy B T OUT.f32

Reads HFDIR/config.json and the safetensors (one file or index + shards, validated by
safetensors_ref), refuses missing or unexpected keys (a tied lm_head is absent by design), runs
qwen3_ref.forward in fp32 on the first B*T tokens as a (B, T) batch and writes the (B, T, V)
logits as raw little-endian float32.
"""
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qwen3_ref  # noqa: E402
import safetensors_ref  # noqa: E402


def main(argv):
    if len(argv) != 6:
        print(__doc__.strip().split("\n")[2], file=sys.stderr)
        return 2
    folder, tokens_path, B, T, out = argv[1], argv[2], int(argv[3]), int(argv[4]), argv[5]
    with open(os.path.join(folder, "config.json")) as f:
        cfg = json.load(f)
    loaded = safetensors_ref.load_folder(folder)
    expected = {name: shape for name, shape in qwen3_ref.param_shapes(cfg)}
    missing = sorted(set(expected) - set(loaded))
    unexpected = sorted(set(loaded) - set(expected))
    if missing or unexpected:
        print("hf_logits: %s: missing %s, unexpected %s" % (folder, missing, unexpected),
              file=sys.stderr)
        return 1
    for name, shape in expected.items():
        if tuple(loaded[name].shape) != tuple(shape):
            print("hf_logits: %s: %s has shape %s, config.json implies %s"
                  % (folder, name, list(loaded[name].shape), list(shape)), file=sys.stderr)
            return 1
    params = {k: v.to(torch.float32) for k, v in loaded.items()}
    tokens = np.load(tokens_path).astype(np.int64)[: B * T]
    inputs = torch.from_numpy(tokens).reshape(B, T)
    with torch.no_grad():
        logits = qwen3_ref.forward(params, cfg, inputs)
    logits.to(torch.float32).numpy().astype("<f4").tofile(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
