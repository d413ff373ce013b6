#!/usr/bin/env python3
"""Forward+backward of one fixed Qwen3 geometry, ctitan vs the PyTorch reference, same machine,
same thread count, same run. Prints one JSON object. A benchmark, not a test: no pass mark.

Geometry (issue 2): hidden 512, 4 layers, 8 heads / 4 kv heads, head_dim 64, intermediate 1536,
vocab 151936, tied embeddings (as the small Qwen3 models), seq 256, batch 2.

FLOPs per token as torchtitan counts them: 6*N + 12*L*NH*D*T, where N counts the parameters
that take part in matmuls (a tied embedding once, as the lm_head). MFU is against the best
2048^3 OpenBLAS sgemm rate measured in the same run with the same threads.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "ref"))

GEOMETRY = dict(V=151936, C=512, L=4, NH=8, NKV=4, D=64, F=1536, eps=1e-6, theta=1000000.0,
                tied=True, bias=False, dtype="F32")


def matmul_params(g):
    per_layer = g["C"] * g["NH"] * g["D"] * 2 + g["C"] * g["NKV"] * g["D"] * 2 + 3 * g["C"] * g["F"]
    return g["L"] * per_layer + g["V"] * g["C"]


def write_model(folder, seed):
    import numpy as np
    import torch
    import make_ref
    import qwen3_ref
    import safetensors_ref
    v = dict(GEOMETRY)
    cfg = make_ref.model_cfg(v)
    # A trained-model-like scale (normal(0, 0.02) matrices, unit norms), so the loss starts
    # near log(V) as a real first step would.
    gen = torch.Generator().manual_seed(seed)
    params = {n: torch.ones(s) if len(s) == 1 else 0.02 * torch.randn(s, generator=gen)
              for n, s in qwen3_ref.param_shapes(cfg)}
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        conf = make_ref.hf_config(v)
        conf["max_position_embeddings"] = 40960
        json.dump(conf, f, indent=2, sort_keys=True)
    order = [n for n, _ in qwen3_ref.param_shapes(cfg)]
    safetensors_ref.write_folder(folder, [(n, params[n]) for n in order], "F32", 0)
    return cfg


def torch_worker(folder, tokens, B, T, steps, threads):
    """Runs in its own process so that its peak RSS is its own."""
    import numpy as np
    import torch
    import qwen3_ref
    import safetensors_ref
    torch.set_num_threads(threads)
    with open(os.path.join(folder, "config.json")) as f:
        cfg = json.load(f)
    params = {k: t.clone().requires_grad_(True) for k, t in safetensors_ref.load_folder(folder).items()}
    inputs, targets = qwen3_ref.windows(np.load(tokens), B, T)
    best, loss = 1e30, None
    for step in range(steps + 1):  # the first is warm-up
        t0 = time.perf_counter()
        for p in params.values():
            p.grad = None
        logits = qwen3_ref.forward(params, cfg, inputs)
        loss, _ = qwen3_ref.loss_fn(logits, targets)
        loss.backward()
        dt = time.perf_counter() - t0
        if step > 0:
            best = min(best, dt)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(json.dumps({"ms_per_step": best * 1e3, "loss": float(loss), "peak_rss_mib": peak}))


def run_json(cmd, env):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--torch-worker", nargs=4, metavar=("DIR", "TOKENS", "B", "T"))
    args = ap.parse_args()
    B, T = 2, 256
    if args.torch_worker:
        d, tok, b, t = args.torch_worker
        return torch_worker(d, tok, int(b), int(t), args.steps, args.threads)

    import numpy as np
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), OPENBLAS_NUM_THREADS=str(args.threads))
    bench = os.path.join(args.build, "bench_step")
    with tempfile.TemporaryDirectory() as tmp:
        folder = os.path.join(tmp, "model")
        write_model(folder, seed=1234)
        tokens = os.path.join(tmp, "tokens.npy")
        np.save(tokens, np.random.default_rng(0).integers(0, GEOMETRY["V"], B * (T + 1)).astype(np.int32))
        peak = run_json([bench, "sgemm", "2048", "5"], env)["sgemm_gflops"]
        c = run_json([bench, "step", folder, tokens, str(B), str(T), str(args.steps)], env)
        t = run_json([sys.executable, os.path.abspath(__file__), "--threads", str(args.threads),
                      "--steps", str(args.steps), "--torch-worker", folder, tokens, str(B), str(T)], env)
    g = GEOMETRY
    flops = (6 * matmul_params(g) + 12 * g["L"] * g["NH"] * g["D"] * T) * B * T
    result = {"config": dict(g, T=T, B=B), "threads": args.threads, "sgemm_peak_gflops": peak,
              "flops_per_step": flops}
    for name, r in (("ctitan", c), ("pytorch", t)):
        gflops = flops / (r["ms_per_step"] * 1e-3) / 1e9
        result[name] = {"ms_per_step": round(r["ms_per_step"], 2), "gflops": round(gflops, 2),
                        "mfu": round(gflops / peak, 4), "peak_rss_mib": round(r["peak_rss_mib"], 1),
                        "loss": r["loss"]}
    result["speedup_vs_pytorch"] = round(t["ms_per_step"] / c["ms_per_step"], 3)
    result["rss_ratio_vs_pytorch"] = round(c["peak_rss_mib"] / t["peak_rss_mib"], 3)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
