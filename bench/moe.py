#!/usr/bin/env python3
"""MoE forward+backward: ctitan's grouped and loop expert kernels against PyTorch, same machine,
same threads, same weights and tokens, in one run. Prints one JSON object (progress goes to
stderr). A benchmark, not a test: no pass mark.

Geometry: Qwen3-30B-A3B (hidden 2048, 32 heads / 4 kv heads, head_dim 128, moe_intermediate
768, top-8, norm_topk_prob, vocab 151936, untied, rope_theta 1e6, eps 1e-6) cut to 2 layers,
both sparse, and 16 experts. Tokens: batch 1 x seq 256 unless --batch/--seq say otherwise.

Two levels, each side in its own process (so each peak RSS is that side's own; it includes
loading the weights), 1 warm-up step then the median of --steps timed steps:
  model     the whole step of the 2-layer model (zero grads, forward, CE loss, backward; the
            load-balancing loss off), from one F32 HF folder (Qwen3MoeForCausalLM) written
            here: ctitan grouped, ctitan loop, torch loop (qwen3_ref, HF's per-expert loop) and
            torch bmm (below). The vocabulary head is most of this step's arithmetic.
  moe_layer one sparse block alone (router matmul, routing, experts; forward, then backward
            from a random upstream gradient, parameter gradients zeroed each step) on inputs
            both sides generate bit for bit alike (bench_step's counter-based uniform
            generator, reproduced here in numpy), so they route identically.

torch bmm: the expert weights are held stacked, transposed once at load as torchtitan's
GroupedExperts keeps them: (E, C, 2F) gate|up and (E, F, C) down leaves. Token slots are sorted
by expert and padded to the busiest expert's count, and two torch.bmm calls run every expert at
once; padding rows read a zero row and carry weight 0. (Stacked in HF's (E, 2F, C) / (E, C, F)
orientation instead, bmm's weight gradients come out transposed and AccumulateGrad copies them
strided into the leaves' layout: in one profile here that copy took 2.9 s of a 7.3 s layer
step.) torch_best is the faster of loop and bmm.

MFU is the grouped step's achieved rate against the best 2048^3 OpenBLAS sgemm of this run
(measured before and after), with FLOPs counted as ctitan's metrics do for MoE (active
parameters): 6 * N + 12 * L * NH * D * T per token, N = lm_head + per layer (attention + E*C
router + K*3*C*Fm experts).

Every side runs with glibc told to keep freed memory (MALLOC_MMAP_MAX_=0,
MALLOC_TRIM_THRESHOLD_ huge; --default-malloc turns this off). PyTorch allocates each step's
activations and gradients afresh, and by default glibc maps big blocks anew each time, so they
page-fault in again every step; on this VM that was over half of PyTorch's layer step. ctitan
allocates once, so the setting does not touch its steps.

Every number here moves when something else runs on the machine. Each side reports its median
cpu_share (CPU time / (threads * wall); ~1 means its threads had the cores) and sys_ms (kernel
time per step: page faults on fresh memory, BLAS threads yielding), and the run reports the load
average before and after: compare sides only when their cpu_share agrees.
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "ref"))
sys.dont_write_bytecode = True  # imports from the source tree; leave it clean

GEOMETRY = dict(V=151936, C=2048, L=2, NH=32, NKV=4, D=128, F=6144, E=16, K=8, Fm=768,
                eps=1e-6, theta=1000000.0, tied=False, bias=False, dtype="F32", norm=True,
                step=1, mlp_only=[], aux=False, coef=0.001)
SEED = 1234


def log(msg):
    print(f"[moe] {msg}", file=sys.stderr, flush=True)


# ---- the HF folder --------------------------------------------------------------------------

def write_model(folder, g, seed, threads):
    """One model.safetensors in g["dtype"] (F32, or BF16 rounded to nearest even), streamed
    tensor by tensor (the model is 3 GiB; the reference writer would hold several copies of it).
    Matrices normal(0, 0.02), norms 1, so the loss starts near log(V) as a real first step's
    would. numpy's generator, one stream per tensor and row block, `threads` blocks at a time:
    torch.randn would take half a minute here."""
    from concurrent.futures import ThreadPoolExecutor
    import numpy as np
    import make_ref
    import qwen3_ref
    import safetensors_ref
    cfg = make_ref.model_cfg(g)
    os.makedirs(folder, exist_ok=True)
    conf = make_ref.hf_config(g)
    conf["max_position_embeddings"] = 40960
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(conf, f, indent=2, sort_keys=True)
    shapes = sorted(qwen3_ref.param_shapes(cfg), key=lambda e: e[0].encode("utf-8"))
    dtype = g.get("dtype", "F32")
    assert dtype in ("F32", "BF16"), dtype
    size = 4 if dtype == "F32" else 2
    parts, off = ['{"__metadata__":{"format":"pt"}'], 0
    for name, shape in shapes:
        n = size * int(np.prod(shape))
        parts.append('%s:{"dtype":"%s","shape":[%s],"data_offsets":[%d,%d]}' % (
            safetensors_ref.header_str(name), dtype, ",".join(map(str, shape)), off, off + n))
        off += n
    h = (",".join(parts) + "}").encode("utf-8")
    h += b" " * ((8 - (8 + len(h)) % 8) % 8)

    def fill(out, key):
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=key)))
        rng.standard_normal(out=out, dtype=np.float32)
        out *= np.float32(0.02)

    with open(os.path.join(folder, "model.safetensors"), "wb") as f, \
            ThreadPoolExecutor(threads) as pool:
        f.write(len(h).to_bytes(8, "little") + h)
        for i, (name, shape) in enumerate(shapes):
            if len(shape) == 1:
                t = np.ones(shape, dtype="<f4")
            else:
                t = np.empty(shape, dtype="<f4")
                bounds = np.linspace(0, shape[0], threads + 1).astype(int)
                jobs = [pool.submit(fill, t[a:b], (i, j))
                        for j, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])) if b > a]
                for job in jobs:
                    job.result()
            if dtype == "BF16":  # to nearest even (no NaN here)
                u = t.view("<u4")
                u += np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))
                t = (u >> np.uint32(16)).astype("<u2")
            f.write(memoryview(t))
    return cfg


def load_model(folder):
    """{name: float32 tensor} read straight into fresh memory (no mapping, no second copy)."""
    import numpy as np
    import torch
    path = os.path.join(folder, "model.safetensors")
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        arr = np.fromfile(path, dtype="<f4", count=(b - a) // 4, offset=8 + n + a)
        out[name] = torch.from_numpy(arr).reshape(info["shape"])
    return out


# ---- the bmm formulation --------------------------------------------------------------------

def moe_block_bmm(x, params, p, cfg, bias=None):
    """qwen3_ref.moe_block's contract (same routing, same result up to summation order) with
    the experts as two batched matmuls over stacked weights params[p + "experts.w13"] (E, C, 2F)
    (gate then up along the last axis) and params[p + "experts.w2"] (E, F, C)."""
    import torch
    import torch.nn.functional as F
    import qwen3_ref
    B, T, C = x.shape
    E, K = cfg["num_experts"], cfg["num_experts_per_tok"]
    w13, w2 = params[p + "experts.w13"], params[p + "experts.w2"]
    Fm = w2.shape[1]
    x = x.reshape(-1, C)
    N = x.shape[0]
    router_logits = F.linear(x, params[p + "gate.weight"])
    weights, selected, probs = qwen3_ref.route(router_logits, K, cfg.get("norm_topk_prob", False),
                                               bias)
    weights = weights.to(x.dtype)
    # The plan (integers only, no gradient): slot s = n*K + k goes to row e*cap + its rank among
    # e's slots; unused rows point at token N (a zero row) and slot S (weight 0).
    with torch.no_grad():
        flat = selected.reshape(-1)
        S = flat.numel()
        sorted_e, order = torch.sort(flat, stable=True)
        counts = torch.bincount(flat, minlength=E)
        cap = int(counts.max())
        starts = torch.cumsum(counts, 0) - counts
        rows = sorted_e * cap + torch.arange(S) - starts[sorted_e]
        tok_of_row = torch.full((E * cap,), N, dtype=torch.long)
        tok_of_row[rows] = order // K
        slot_of_row = torch.full((E * cap,), S, dtype=torch.long)
        slot_of_row[rows] = order
    xg = torch.cat([x, x.new_zeros(1, C)])[tok_of_row].view(E, cap, C)
    gu = torch.bmm(xg, w13)  # (E, cap, 2F)
    h = F.silu(gu[..., :Fm]) * gu[..., Fm:]
    y = torch.bmm(h, w2).view(E * cap, C)
    wrow = torch.cat([weights.reshape(-1), weights.new_zeros(1)])[slot_of_row]
    out = x.new_zeros(N + 1, C).index_add(0, tok_of_row, y * wrow[:, None])[:N]
    info = dict(logits=router_logits, selected=selected, weights=weights, probs=probs)
    return out.reshape(B, T, C), info


def stack_experts(params, p, E):
    """Replaces the experts' per-expert HF leaves with moe_block_bmm's two stacked ones."""
    import torch
    q = [p + "experts.%d." % e for e in range(E)]
    params[p + "experts.w13"] = torch.stack(
        [torch.cat([params.pop(s + "gate_proj.weight"), params.pop(s + "up_proj.weight")]).t()
         for s in q]).requires_grad_(True)
    params[p + "experts.w2"] = torch.stack(
        [params.pop(s + "down_proj.weight").t() for s in q]).requires_grad_(True)


# ---- torch workers (each in its own process) ------------------------------------------------

def timed_steps(step, steps):
    """Per timed step: wall ms, CPU ms of all threads, kernel-mode ms (as bench_step.c's), and
    the last step's result."""
    import resource
    ms, cpu, sys_ms = [], [], []
    for s in range(steps + 1):  # the first is warm-up
        t0, c0 = time.perf_counter(), time.process_time()
        k0 = resource.getrusage(resource.RUSAGE_SELF).ru_stime
        r = step()
        if s > 0:
            ms.append((time.perf_counter() - t0) * 1e3)
            cpu.append((time.process_time() - c0) * 1e3)
            sys_ms.append((resource.getrusage(resource.RUSAGE_SELF).ru_stime - k0) * 1e3)
    return {"ms": ms, "cpu_ms": cpu, "sys_ms": sys_ms}, r


def torch_model_worker(folder, tokens, B, T, impl, steps, threads):
    import numpy as np
    import torch
    import qwen3_ref
    torch.set_num_threads(threads)
    with open(os.path.join(folder, "config.json")) as f:
        cfg = json.load(f)
    params = load_model(folder)
    if impl == "bmm":
        for i in qwen3_ref.sparse_layers(cfg):
            stack_experts(params, "model.layers.%d.mlp." % i, cfg["num_experts"])
        qwen3_ref.moe_block = moe_block_bmm  # forward_full looks it up at call time
    for t in params.values():
        t.requires_grad_(True)
    inputs, targets = qwen3_ref.windows(np.load(tokens), B, T)

    def step():
        for t in params.values():
            t.grad = None
        loss, _ = qwen3_ref.loss_fn(qwen3_ref.forward(params, cfg, inputs), targets)
        loss.backward()
        return float(loss)

    times, loss = timed_steps(step, steps)
    print(json.dumps(dict(times, moe_impl=impl, loss=loss)))


def uniform(n, seed, stream, scale):
    """bench_step.c's fill_uniform in numpy, bit for bit (uint64 arithmetic wraps)."""
    import numpy as np
    out = np.empty(n, dtype=np.float32)
    base = np.uint64(((seed * 16 + stream) << 40) + 0x9E3779B97F4A7C15 & (2**64 - 1))
    chunk = 1 << 22
    with np.errstate(over="ignore"):
        for a in range(0, n, chunk):
            z = np.arange(a, min(n, a + chunk), dtype=np.uint64) + base
            z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            z ^= z >> np.uint64(31)
            u = (z >> np.uint64(40)).astype(np.float64) * 2.0**-24 * 2.0 - 1.0
            out[a:a + len(z)] = (u * scale).astype(np.float32)
    return out


def torch_moe_worker(N, C, Fm, E, K, impl, seed, steps, threads):
    import torch
    import qwen3_ref
    torch.set_num_threads(threads)
    unit, init = math.sqrt(3.0), 0.02 * math.sqrt(3.0)  # bench_step.c's, bit for bit
    x = torch.from_numpy(uniform(N * C, seed, 0, unit)).view(1, N, C).requires_grad_(True)
    router = torch.from_numpy(uniform(E * C, seed, 1, init)).view(E, C).requires_grad_(True)
    w = torch.from_numpy(uniform(E * 3 * Fm * C, seed, 2, init)).view(E, 3 * Fm * C)
    dout = torch.from_numpy(uniform(N * C, seed, 3, unit / N)).view(1, N, C)
    cfg = dict(num_experts=E, num_experts_per_tok=K, norm_topk_prob=True,
               moe_intermediate_size=Fm)
    params = {"gate.weight": router}
    if impl == "bmm":
        w13 = w[:, :2 * Fm * C].reshape(E, 2 * Fm, C).transpose(1, 2)
        w2 = w[:, 2 * Fm * C:].reshape(E, C, Fm).transpose(1, 2)
        params["experts.w13"] = w13.contiguous().requires_grad_(True)
        params["experts.w2"] = w2.contiguous().requires_grad_(True)
        block = moe_block_bmm
    else:
        for e in range(E):
            b = w[e]
            params["experts.%d.gate_proj.weight" % e] = b[:Fm * C].view(Fm, C).clone()
            params["experts.%d.up_proj.weight" % e] = b[Fm * C:2 * Fm * C].view(Fm, C).clone()
            params["experts.%d.down_proj.weight" % e] = b[2 * Fm * C:].view(C, Fm).clone()
        for t in params.values():
            t.requires_grad_(True)
        block = qwen3_ref.moe_block
    del w
    leaves = list(params.values()) + [x]

    def step():
        for t in leaves:
            t.grad = None
        y, _ = block(x, params, "", cfg)
        y.backward(dout)
        return y.detach()

    times, y = timed_steps(step, steps)
    dw = [t.grad for k, t in params.items() if k != "gate.weight"]
    print(json.dumps(dict(
        times, moe_impl=impl,
        out_dot_dout=float((y.double() * dout.double()).sum()),
        dx_norm=float(x.grad.double().norm()),
        dw_norm=float(sum(float(g.double().pow(2).sum()) for g in dw) ** 0.5),
        drouter_norm=float(router.grad.double().norm()))))


def torch_peak_worker(threads):
    """torch.mm's best 2048^3 rate: how fast PyTorch's own BLAS is here, for reading its ms."""
    import torch
    torch.set_num_threads(threads)
    a = torch.rand(2048, 2048)
    best = 1e30
    for _ in range(5):
        t0 = time.perf_counter()
        torch.mm(a, a)
        best = min(best, time.perf_counter() - t0)
    print(json.dumps({"mm_gflops": round(2 * 2048**3 / best / 1e9, 2)}))


# ---- the driver -----------------------------------------------------------------------------

def run_side(name, cmd, env):
    """Runs one side to completion; returns its JSON line plus its own peak RSS (wait4)."""
    log(f"{name} ...")
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, env=env)
    out = p.stdout.read().decode()
    p.stdout.close()
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise SystemExit(f"[moe] {name}: {' '.join(cmd)} exited {p.returncode}")
    r = json.loads(out.strip().splitlines()[-1])
    r["ms_median"] = statistics.median(r["ms"])
    r["peak_rss_mib"] = round(ru.ru_maxrss / 1024.0, 1)
    log(f"{name}: median {r['ms_median']:.1f} ms of {[round(m, 1) for m in r['ms']]}, "
        f"rss {r['peak_rss_mib']:.0f} MiB, wall {time.perf_counter() - t0:.0f} s")
    return r


def work_dir(choice, g):
    """Where the HF folder goes: --tmp, else /dev/shm when it has room (RAM: no disk traffic in
    the loads, and a full disk is common on shared machines), else the system temp dir."""
    import shutil
    need = 4 * total_params(g) + (64 << 20)
    for d in ([choice] if choice else ["/dev/shm", tempfile.gettempdir()]):
        if os.path.isdir(d) and shutil.disk_usage(d).free >= need:
            return d
    raise SystemExit(f"[moe] no room for the {need / 2**30:.2f} GiB model folder in "
                     f"{choice or '/dev/shm or ' + tempfile.gettempdir()} (--tmp DIR)")


def total_params(g):
    """Every parameter (untied embedding and head, norms), all layers sparse; without
    importing torch, which would swell this process and so every child's peak RSS."""
    C, D = g["C"], g["D"]
    attn = 2 * C * g["NH"] * D + 2 * C * g["NKV"] * D + 2 * D
    moe = g["E"] * C + g["E"] * 3 * C * g["Fm"]
    return 2 * g["V"] * C + g["L"] * (attn + moe + 2 * C) + C


def active_params(g):
    attn = 2 * g["C"] * g["NH"] * g["D"] + 2 * g["C"] * g["NKV"] * g["D"]
    moe = g["E"] * g["C"] + g["K"] * 3 * g["C"] * g["Fm"]
    return g["V"] * g["C"] + g["L"] * (attn + moe)


def summarise(sides, flops, threads):
    """{side: {ms, ...}} plus the ratios the issue asks for (> 1: grouped is faster)."""
    out = {}
    for name, r in sides.items():
        med = r["ms_median"]
        s = {"ms_per_step": round(med, 1), "ms_best": round(min(r["ms"]), 1),
             "ms_steps": [round(m, 1) for m in r["ms"]],
             "gflops": round(flops / (med * 1e-3) / 1e9, 2),
             "peak_rss_mib": r["peak_rss_mib"],
             # CPU time over threads x wall: near 1 when the threads had the cores to themselves
             # (OpenMP spin-waits count as CPU), lower on a busy machine or in serial code.
             "cpu_share": round(statistics.median(r["cpu_ms"]) / med / threads, 3),
             # Kernel time per step: page faults on fresh memory, idle BLAS threads yielding.
             "sys_ms": round(statistics.median(r["sys_ms"]), 1)}
        for k in ("loss", "out_dot_dout", "dx_norm", "dw_norm", "drouter_norm"):
            if k in r:
                s[k] = r[k]
        out[name] = s
    g = sides["ctitan_grouped"]["ms_median"]
    loop, tl, tb = (sides[k]["ms_median"] for k in ("ctitan_loop", "torch_loop", "torch_bmm"))
    out["torch_best"] = "torch_bmm" if tb < tl else "torch_loop"
    out["ratios"] = {"loop/grouped": round(loop / g, 3), "torch_loop/grouped": round(tl / g, 3),
                     "torch_bmm/grouped": round(tb / g, 3),
                     "torch_best/grouped": round(min(tl, tb) / g, 3)}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3, help="timed steps per side (median)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--experts", type=int, default=GEOMETRY["E"])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--only", choices=["model", "moe_layer"], help="run one level")
    ap.add_argument("--tmp", help="folder for the 3 GiB model (default /dev/shm if it has room)")
    ap.add_argument("--default-malloc", action="store_true",
                    help="glibc's default mmap threshold (slower for PyTorch: see malloc)")
    ap.add_argument("--torch-model-worker", nargs=5, metavar=("DIR", "TOKENS", "B", "T", "IMPL"),
                    help=argparse.SUPPRESS)
    ap.add_argument("--torch-moe-worker", nargs=7,
                    metavar=("N", "C", "F", "E", "K", "IMPL", "SEED"), help=argparse.SUPPRESS)
    ap.add_argument("--torch-peak-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--write-model-worker", nargs=2, metavar=("DIR", "E"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.write_model_worker:
        d, e = args.write_model_worker
        write_model(d, dict(GEOMETRY, E=int(e)), SEED, args.threads)
        return
    if args.torch_peak_worker:
        return torch_peak_worker(args.threads)
    if args.torch_model_worker:
        d, tok, b, t, impl = args.torch_model_worker
        return torch_model_worker(d, tok, int(b), int(t), impl, args.steps, args.threads)
    if args.torch_moe_worker:
        n, c, f, e, k, impl, seed = args.torch_moe_worker
        return torch_moe_worker(int(n), int(c), int(f), int(e), int(k), impl, int(seed),
                                args.steps, args.threads)

    import numpy as np
    g = dict(GEOMETRY, E=args.experts)
    B, T = args.batch, args.seq
    N = B * T
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads),
               OPENBLAS_NUM_THREADS=str(args.threads))
    if not args.default_malloc:
        # glibc serves big blocks with fresh mmaps, so each step's new tensors fault in page by
        # page (PyTorch's CPU allocator has no cache; ctitan plans its buffers once): keep every
        # block in the heap, never trimmed, and let later steps reuse the pages.
        env.update(MALLOC_MMAP_MAX_="0", MALLOC_TRIM_THRESHOLD_=str(1 << 40))
    bench = os.path.join(args.build, "bench_step")
    me = [sys.executable, os.path.abspath(__file__), "--threads", str(args.threads), "--steps",
          str(args.steps)]
    t_start = time.perf_counter()
    load_before = round(os.getloadavg()[0], 2)  # other work on the machine skews every number
    result = {"config": dict(g, B=B, T=T), "threads": args.threads, "steps": args.steps,
              "malloc": "default" if args.default_malloc else "heap, no mmap, no trim",
              "loadavg_1min_before": load_before}

    def sgemm_peak():
        return json.loads(subprocess.run([bench, "sgemm", "2048", "10"], check=True, env=env,
                                         capture_output=True, text=True).stdout)["sgemm_gflops"]

    # Measured again at the end: a busy machine lowers it, and MFU uses the better of the two.
    result["sgemm_gflops_before"] = peak = sgemm_peak()
    result["torch_mm_2048_gflops"] = json.loads(subprocess.run(
        me + ["--torch-peak-worker"], check=True, env=env, capture_output=True,
        text=True).stdout)["mm_gflops"]

    if args.only in (None, "model"):
        flops = (6 * active_params(g) + 12 * g["L"] * g["NH"] * g["D"] * T) * N
        with tempfile.TemporaryDirectory(prefix="ctitan-moe-", dir=work_dir(args.tmp, g)) as tmp:
            folder = os.path.join(tmp, "model")
            t0 = time.perf_counter()
            # In a child: the driver stays small, and a child's peak RSS counts its parent's
            # resident memory at the fork.
            subprocess.run(me + ["--write-model-worker", folder, str(g["E"])], check=True, env=env)
            tokens = os.path.join(tmp, "tokens.npy")
            np.save(tokens, np.random.default_rng(0).integers(0, g["V"], B * (T + 1))
                    .astype(np.int32))
            log(f"wrote the {os.path.getsize(os.path.join(folder, 'model.safetensors')) / 2**30:.2f}"
                f" GiB HF folder in {time.perf_counter() - t0:.0f} s")
            sides = {}
            for impl in ("grouped", "loop"):
                sides["ctitan_" + impl] = run_side(
                    "model ctitan_" + impl,
                    [bench, "step", folder, tokens, str(B), str(T), str(args.steps), impl], env)
            for impl in ("loop", "bmm"):
                sides["torch_" + impl] = run_side(
                    "model torch_" + impl,
                    me + ["--torch-model-worker", folder, tokens, str(B), str(T), impl], env)
        m = summarise(sides, flops, args.threads)
        m["flops_per_step"] = flops
        m["active_params"] = active_params(g)
        result["model"] = m

    if args.only in (None, "moe_layer"):
        E, K, C, Fm = g["E"], g["K"], g["C"], g["Fm"]
        flops = 6 * (E * C + K * 3 * C * Fm) * N
        dims = [str(N), str(C), str(Fm), str(E), str(K)]
        sides = {}
        for impl in ("grouped", "loop"):
            sides["ctitan_" + impl] = run_side(
                "moe_layer ctitan_" + impl,
                [bench, "moe"] + dims + [str(args.steps), impl, str(SEED)], env)
        for impl in ("loop", "bmm"):
            sides["torch_" + impl] = run_side(
                "moe_layer torch_" + impl,
                me + ["--torch-moe-worker"] + dims + [impl, str(SEED)], env)
        m = summarise(sides, flops, args.threads)
        m["shape"] = dict(N=N, C=C, F=Fm, E=E, K=K)
        m["flops_per_step"] = flops
        result["moe_layer"] = m

    result["sgemm_gflops_after"] = sgemm_peak()
    peak = result["sgemm_peak_gflops"] = max(peak, result["sgemm_gflops_after"])
    for level in ("model", "moe_layer"):
        if level in result:
            m = result[level]
            m["mfu_grouped"] = round(m["ctitan_grouped"]["gflops"] / peak, 4)
    result["loadavg_1min_after"] = round(os.getloadavg()[0], 2)
    result["wall_s"] = round(time.perf_counter() - t_start, 1)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
