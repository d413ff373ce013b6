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


# Sampling: transformers' logits warpers (generation/logits_process.py), as generate applies them
# with do_sample: TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper, in that order.
def hf_warp(scores, temperature, top_k, top_p):
    scores = scores / temperature
    if top_k > 0:
        k = min(max(top_k, 1), scores.size(-1))
        remove = scores < torch.topk(scores, k)[0][..., -1, None]
        scores = scores.masked_fill(remove, -float("inf"))
    if top_p < 1.0:
        sorted_logits, sorted_indices = torch.sort(scores, descending=False)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        sorted_remove = cumulative <= (1 - top_p)
        sorted_remove[..., -1:] = 0
        remove = sorted_remove.scatter(0, sorted_indices, sorted_remove)
        scores = scores.masked_fill(remove, -float("inf"))
    return torch.softmax(scores, dim=-1)


def write_sampling(out):
    """DIR/sample.safetensors: "logits" (R, V) fixed rows (random, with ties, with a peak) and per
    case c "probs.c" (V): HF's distribution for case c of CASES applied to its row."""
    gen = torch.Generator().manual_seed(21)
    V = 1000
    rows = [torch.randn(V, generator=gen) * 2.0,
            torch.randn(V, generator=gen).round(),  # many exact ties
            torch.cat([torch.tensor([8.0, 7.5, 7.5]), torch.randn(V - 3, generator=gen)])]
    logits = torch.stack(rows).float()
    tensors = [("logits", logits)]
    for c, (row, t, k, p) in enumerate(CASES):
        tensors.append(("probs.%d" % c, hf_warp(logits[row], t, k, p)))
    safetensors_ref.write_file(os.path.join(out, "sample.safetensors"), tensors, "F32")


# (row, temperature, top_k, top_p); the C test (test_sample.c) holds the same list.
CASES = [(0, 1.0, 0, 1.0), (0, 0.7, 50, 1.0), (0, 1.3, 0, 0.9), (0, 0.8, 40, 0.95),
         (1, 1.0, 10, 1.0), (1, 1.0, 0, 0.5), (1, 0.5, 3, 0.8), (2, 1.0, 2, 1.0),
         (2, 1.0, 0, 0.3), (2, 2.0, 0, 0.999), (0, 1.0, 1, 1.0), (0, 1.0, 0, 0.01)]
