"""Generation references (make_ref.py calls write for every variant): HF's greedy generate on
the variant's model, with each step's logits. Greedy generate with a KV cache computes, at every
step, the last row of the full forward over prompt + tokens so far (the cache only saves the
recomputation), so the reference is that: qwen3_ref.forward over the growing sequence, in fp32
like HF, argmax (first index among equal maxima, torch.argmax).

DIR/<variant>/generate.safetensors  F32: "prompt" (P,) the prompt's ids; "ids" (S,) the greedy
                   tokens; "logits" (S, V) step i's logits (the prompt's last position for i = 0,
                   then the position of ids[i-1]); "logits_f64" the same in fp64 (the scale of
                   fp32's own error)."""
import os

import torch

import qwen3_ref
import safetensors_ref

STEPS = 12


def greedy(params, cfg, prompt, steps):
    seq = list(prompt)
    ids, rows = [], []
    for _ in range(steps):
        with torch.no_grad():
            logits = qwen3_ref.forward(params, cfg, torch.tensor([seq]))[0, -1]
        nxt = int(torch.argmax(logits))
        rows.append(logits)
        ids.append(nxt)
        seq.append(nxt)
    return ids, torch.stack(rows)


def write(d, params, cfg, tokens, index):
    P = 2 + index % 6  # prompt lengths 2..7 across the variants
    prompt = [int(t) for t in tokens[:P]]
    ids, logits = greedy(params, cfg, prompt, STEPS)
    p64 = {k: t.double() for k, t in params.items()}
    seq = prompt + ids[:-1]
    with torch.no_grad():
        full64 = qwen3_ref.forward(p64, cfg, torch.tensor([seq]))[0, P - 1:]
    safetensors_ref.write_file(os.path.join(d, "generate.safetensors"), [
        ("prompt", torch.tensor(prompt, dtype=torch.float32)),
        ("ids", torch.tensor(ids, dtype=torch.float32)),
        ("logits", logits.float()),
        ("logits_f64", full64.float()),
    ], "F32")
