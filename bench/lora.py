#!/usr/bin/env python3
"""LoRA's step against full fine-tuning on the c1-sized model (bench/dp.py's c1: 4 layers,
hidden 512, 8/4 heads of 64, ffn 1536, the real 151936 vocabulary, tied), in one run: the two
trainings alternate (full, LoRA, full, LoRA, ...) so that both see the same machine load, each
a fresh `ctitan train` of --steps steps on random tokens. tokens/s is the median over the
steps after the first two (warm-up) of each run's metrics.jsonl, then the median over the
rounds. Issue 31's target: LoRA >= 1.35 x full.

    bench/lora.py [--build build] [--steps 8] [--rounds 2] [--seq-len 512] [--rank 16]

Prints one JSON object: {"full_tps", "lora_tps", "ratio", "runs": [...]}.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np

C1 = dict(n_layers=4, dim=512, n_heads=8, n_kv_heads=4, head_dim=64, ffn_dim=1536)
VOCAB = 151936


def run(args, work, name, extra):
    dump = os.path.join(work, name)
    cmd = [os.path.join(args.build, "ctitan"), "train", "--model.flavor", "debugmodel",
           "--training.dataset_path", os.path.join(work, "tokens.npy"),
           "--training.seq_len", str(args.seq_len), "--training.local_batch_size", "2",
           "--training.steps", str(args.steps), "--lr_scheduler.warmup_steps", "2",
           "--metrics.log_freq", "1", "--metrics.peak_gflops", "100",
           "--checkpoint.enable", "false", "--job.dump_folder", dump] + extra
    for k, v in C1.items():
        cmd += ["--model." + k, str(v)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{name}: {p.stdout[-2000:]}{p.stderr[-2000:]}")
    rows = [json.loads(line) for line in open(os.path.join(dump, "metrics.jsonl"))]
    tps = [r["tps"] for r in rows if "tps" in r and "loss" in r][2:]
    return statistics.median(tps)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--rank", type=int, default=16)
    args = ap.parse_args()
    lora = ["--lora.rank", str(args.rank), "--lora.alpha", str(2 * args.rank),
            "--lora.target_modules", "all-linear"]
    with tempfile.TemporaryDirectory() as work:
        np.save(os.path.join(work, "tokens.npy"),
                np.random.default_rng(0).integers(0, VOCAB, 400_000).astype(np.int32))
        runs = []
        for i in range(args.rounds):
            runs.append(dict(round=i, full_tps=run(args, work, "full%d" % i, []),
                             lora_tps=run(args, work, "lora%d" % i, lora)))
            print(json.dumps(runs[-1]), file=sys.stderr)
    full = statistics.median(r["full_tps"] for r in runs)
    lo = statistics.median(r["lora_tps"] for r in runs)
    print(json.dumps(dict(full_tps=full, lora_tps=lo, ratio=round(lo / full, 3), runs=runs)))


if __name__ == "__main__":
    main()
