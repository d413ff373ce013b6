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


# Sampling: transformers' logits processors (generation/logits_process.py), as generate applies
# them: RepetitionPenaltyLogitsProcessor (also without do_sample), then with do_sample
# TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper and MinPLogitsWarper, in that order.
def hf_penalty(scores, history, penalty):
    score = torch.gather(scores, 0, history)
    score = torch.where(score < 0, score * penalty, score / penalty)
    return scores.scatter(0, history, score)


def hf_warp(scores, temperature, top_k, top_p, min_p=None, penalty=1.0, history=None):
    if penalty != 1.0:
        scores = hf_penalty(scores, history, penalty)
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
    if min_p is not None:
        probs = torch.softmax(scores, dim=-1)
        top_probs = probs.max(dim=-1, keepdim=True)[0]
        remove = probs < min_p * top_probs
        sorted_indices = torch.argsort(scores, descending=True, dim=-1)
        sorted_remove = torch.gather(remove, -1, sorted_indices)
        sorted_remove[..., :1] = False  # min_tokens_to_keep
        remove = sorted_remove.scatter(0, sorted_indices, sorted_remove)
        scores = scores.masked_fill(remove, -float("inf"))
    return torch.softmax(scores, dim=-1)


def write_sampling(out):
    """DIR/sample.safetensors: "logits" (R, V) fixed rows (random, with ties, with a peak),
    "history" (H,) the ids the repetition penalty sees (repeats, the peak's ids), and per case c
    of CASES "probs.c" (V): HF's distribution for the case applied to its row; for a case with a
    penalty also "penalized.c" (V): the penalty's scores alone (greedy takes their argmax)."""
    gen = torch.Generator().manual_seed(21)
    V = 1000
    rows = [torch.randn(V, generator=gen) * 2.0,
            torch.randn(V, generator=gen).round(),  # many exact ties
            torch.cat([torch.tensor([8.0, 7.5, 7.5]), torch.randn(V - 3, generator=gen)])]
    logits = torch.stack(rows).float()
    history = torch.cat([torch.tensor([0, 1, 2, 5, 5, 17, 3, 999, 17]),
                         torch.randint(0, V, (31,), generator=gen)])
    history = torch.cat([history, torch.argsort(logits[0], descending=True)[:3]])
    tensors = [("logits", logits), ("history", history.float())]
    for c, (row, t, k, p, min_p, penalty) in enumerate(CASES):
        tensors.append(("probs.%d" % c, hf_warp(logits[row], t, k, p, min_p or None, penalty,
                                                history)))
        if penalty != 1.0:
            tensors.append(("penalized.%d" % c, hf_penalty(logits[row], history, penalty)))
    safetensors_ref.write_file(os.path.join(out, "sample.safetensors"), tensors, "F32")


# (row, temperature, top_k, top_p, min_p (0: None), repetition penalty); the C test
# (test_sample.c) holds the same list.
CASES = [(0, 1.0, 0, 1.0, 0, 1.0), (0, 0.7, 50, 1.0, 0, 1.0), (0, 1.3, 0, 0.9, 0, 1.0),
         (0, 0.8, 40, 0.95, 0, 1.0), (1, 1.0, 10, 1.0, 0, 1.0), (1, 1.0, 0, 0.5, 0, 1.0),
         (1, 0.5, 3, 0.8, 0, 1.0), (2, 1.0, 2, 1.0, 0, 1.0), (2, 1.0, 0, 0.3, 0, 1.0),
         (2, 2.0, 0, 0.999, 0, 1.0), (0, 1.0, 1, 1.0, 0, 1.0), (0, 1.0, 0, 0.01, 0, 1.0),
         (0, 1.0, 0, 1.0, 0.05, 1.0), (0, 0.7, 20, 0.9, 0.1, 1.0), (1, 1.0, 0, 1.0, 0.3, 1.0),
         (2, 1.0, 0, 1.0, 1.0, 1.0), (0, 1.0, 0, 1.0, 0, 1.3), (0, 1.0, 0, 1.0, 0, 0.7),
         (2, 0.8, 0, 0.95, 0.05, 1.5), (1, 1.0, 0, 0.5, 0.2, 1.2)]
