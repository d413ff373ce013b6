#!/usr/bin/env python3
"""torch.topk's choice among tied router probabilities, for tests/test_moe_ops.c.

topk_ties.py --out DIR writes DIR/topk_ties.json:
  {"cases": [{"E": E, "K": K, "N": rows, "logits": [N*E small integers],
              "indices": [N*K torch.topk(softmax(logits), K).indices]}]}
The logits are small integers, so equal logits give bit-equal probabilities in any softmax and
distinct ones stay distinct: the C router and torch see the same ties. E and K cover both of
torch's CPU paths (partial_sort when 64*K <= E, else nth_element + sort).
"""
import argparse
import json
import os

import torch

ES = [2, 3, 4, 5, 7, 8, 16, 60, 64, 65, 128, 200]


def ks_for(E):
    ks = set(range(1, min(E, 9) + 1))
    ks |= {k for k in (15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 127, 128, 199) if k <= E}
    ks |= {max(1, E // 2), E - 1, E}
    return sorted(k for k in ks if 1 <= k <= E)


def rows_for(E, gen):
    """Tie-heavy rows: all equal, alternating, blocks, few distinct values, sorted runs."""
    rows = [
        [0] * E,
        [e % 2 for e in range(E)],
        [(e + 1) % 2 for e in range(E)],
        [e // 3 % 2 for e in range(E)],
        [e // 5 for e in range(E)],
        [-(e // 4) for e in range(E)],
        [e % 3 for e in range(E)],
    ]
    for hi in (2, 3, 5):
        rows.append(torch.randint(0, hi, (E,), generator=gen).tolist())
    return rows


def cases():
    gen = torch.Generator().manual_seed(7)
    out = []
    for E in ES:
        for K in ks_for(E):
            rows = rows_for(E, gen)
            logits = torch.tensor(rows, dtype=torch.float32)
            probs = torch.softmax(logits, dim=-1)  # as HF's router: fp32 softmax, then topk
            idx = torch.topk(probs, K, dim=-1).indices
            out.append(dict(E=E, K=K, N=len(rows), logits=[int(v) for r in rows for v in r],
                            indices=idx.flatten().tolist()))
    return out


def write(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "topk_ties.json"), "w") as f:
        json.dump({"cases": cases()}, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    write(ap.parse_args().out)
