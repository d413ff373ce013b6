#!/usr/bin/env python3
"""Training, ctitan against PyTorch, side by side: the same model, weights, tokens, optimizer,
thread count and number of steps, on the same machine in one run. Prints one JSON object
(also --out FILE); progress goes to stderr. A benchmark, not a test: no pass mark.

Configs (issue 8), each one F32 HF folder written here (matrices normal(0, 0.02), norms 1, as
bench/moe.py writes them) that both sides load, and random tokens in range:
  c1   bench/forward_backward.py's geometry (hidden 512, 4 layers, 8 heads / 4 kv heads,
       head_dim 64, ffn 1536, vocab 151936, tied), seq 256, local batch 2
  c2   the same at seq 2048, local batch 2 (slow on PyTorch: ~13 GiB, ~45 s a step on 2 cores)
  moe  the debugmodel_moe flavor's geometry (src/model/flavors.c: hidden 128, 4 layers, all
       sparse, 4 heads / 2 kv, head_dim 64, 8 experts, top-2, expert width 128, untied, HF's
       aux loss at 0.001), seq 256, local batch 2

Each side runs in its own child process, one after the other, for --steps optimizer steps:
  ctitan   `ctitan train --model.backend hf`, shuffle off, no checkpoints, a metrics line per
           step, MFU peak given (so it does not measure its own), plus --ctitan-args verbatim
  pytorch  tests/ref/qwen3_ref.py's model, torch.optim.AdamW, cross-entropy (+ the aux loss for
           MoE, as ctitan's loss has it), backward, clip_grad_norm_, step; no torch.compile
Both: AdamW lr 8e-4, betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on every parameter, constant
lr (no warmup), clipping at 1.0, step s on windows s*B .. s*B+B-1 of T+1 tokens (torchtitan's).

Per side, over the steps after the first (warm-up): mean step time, tokens/s, MFU (FLOPs per
token as ctitan's metrics count them, 6*N + 12*L*NH*D*T, N the matmul parameters, MoE's active
ones, against the best 2048^3 sgemm of this run, measured before and after), peak RSS of the
child (wait4; includes loading the weights), and every step's loss and gradient norm (before
clipping; PyTorch's clip_grad_norm_ reduces in fp32, a few 1e-5 relative off at this size by an
fp64 check of c1's first step; ctitan's sums in double). Same weights and data make the first
losses agree to fp32 rounding: loss_step1_rel_diff. ratios: ctitan / PyTorch for tokens/s
(> 1: ctitan faster) and peak RSS (< 1: ctitan smaller). ctitan's own log adds its planned
memory (the "memory estimate" line; planned_activations_gib is its activations part), its
memory_peak_gib, its per-step mfu (against sgemm_gflops_before, the peak it is given) and the
OpenBLAS build that ran (openblas_threads: "OpenMP's threads" or "its own threads").
--ac runs ctitan twice more, with full activation checkpointing (ctitan_ac_full) and with
selective "op" checkpointing (ctitan_ac_op: GEMM and attention outputs kept, elementwise ops
recomputed), and adds per mode ratios.ac_<mode>_activations (planned activations without / with),
ac_<mode>_peak_rss, ac_<mode>_step_time (with / without) and ac_<mode>_losses_equal
(checkpointing changes no bit; the automatic loss chunk does, 64 MiB with checkpointing against
256 MiB without, unless --ctitan-args fixes training.loss_chunk_tokens).

--precision bf16 adds, per config, ctitan with training.mixed_precision_param = "bfloat16"
(ctitan_bf16) and PyTorch with its forward under torch.autocast("cpu", dtype=torch.bfloat16)
(pytorch_bf16), each with mfu_bf16_peak against oneDNN's bf16 2048^3 matmul measured in the same
run (bf16_gflops_before/after), and ratios.bf16_tokens_per_s (ctitan bf16 / PyTorch autocast),
bf16_over_fp32_tokens_per_s, bf16_planned_activations and bf16_peak_rss (bf16 / fp32 ctitan), and
bf16_loss_mean_abs_diff_vs_autocast.

By default glibc's malloc keeps its own settings, as a PyTorch user gets it. --malloc heap runs
both sides as bench/moe.py does (freed memory kept in the heap, no mmap, no trim): PyTorch
allocates each step's tensors afresh, and fresh mmaps fault in page by page, so heap is faster
for it (c1 on a 2-core VM: ~2.7 against ~3.6 s a step) but raises its peak RSS (c2: 17.6
against 12.9 GiB, too near a 24 GiB machine's limit). ctitan allocates once: neither setting
touches its steps.
"""
import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True  # imports from the source tree; leave it clean
import forward_backward  # noqa: E402  (bench/; also puts tests/ref on sys.path)
import moe  # noqa: E402

DENSE = forward_backward.GEOMETRY
MOE = dict(V=151936, C=128, L=4, NH=4, NKV=2, D=64, F=512, E=8, K=2, Fm=128, eps=1e-6,
           theta=1000000.0, tied=False, bias=False, dtype="F32", norm=True, step=1, mlp_only=[],
           aux=True, coef=0.001)
MODELS = {"dense": DENSE, "moe": MOE}
CONFIGS = {"c1": ("dense", 256, 2), "c2": ("dense", 2048, 2), "moe": ("moe", 256, 2)}
OPT = dict(lr=8e-4, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, max_norm=1.0, warmup=0)
SEED = 1234
BF16_ARGS = "--training.mixed_precision_param bfloat16"
AC_MODES = {"full": "--activation_checkpoint.mode full",
            "op": "--activation_checkpoint.mode selective "
                  "--activation_checkpoint.selective_ac_option op"}


def log(msg):
    print(f"[train] {msg}", file=sys.stderr, flush=True)


def flops_per_token(g, T):
    n = moe.active_params(g) if g.get("E") else forward_backward.matmul_params(g)
    return 6 * n + 12 * g["L"] * g["NH"] * g["D"] * T


# ---- children -------------------------------------------------------------------------------

def write_worker(kind, folder, tokens, n_tokens, threads):
    import numpy as np
    g = MODELS[kind]
    moe.write_model(folder, g, SEED, threads)
    ids = np.random.default_rng(SEED).integers(0, g["V"], n_tokens)
    np.save(tokens, ids.astype(np.int32))


def torch_worker(folder, tokens, B, T, steps, threads, bf16=False):
    """PyTorch's training loop; progress on stderr, one JSON line on stdout. bf16: the forward
    under torch.autocast("cpu", dtype=torch.bfloat16), the loss from the logits upcast to fp32
    (as HF computes it), parameters, gradients and AdamW in fp32."""
    import contextlib
    import numpy as np
    import torch
    import qwen3_ref
    torch.set_num_threads(threads)
    with open(os.path.join(folder, "config.json")) as f:
        cfg = json.load(f)
    params = moe.load_model(folder)
    plist = [p.requires_grad_(True) for p in params.values()]
    opt = torch.optim.AdamW(plist, lr=OPT["lr"], betas=(OPT["beta1"], OPT["beta2"]),
                            eps=OPT["eps"], weight_decay=OPT["weight_decay"])
    data = np.load(tokens)
    aux_coef = cfg.get("router_aux_loss_coef", 0.001) if cfg.get("output_router_logits") else 0
    losses, norms = [], []

    def step():
        s = len(losses)
        t0 = time.perf_counter()
        inputs, targets = qwen3_ref.windows(data[s * B * (T + 1):], B, T)
        for p in plist:
            p.grad = None
        with (torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()):
            logits, routers = qwen3_ref.forward_full(params, cfg, inputs)
        loss, _ = qwen3_ref.loss_fn(logits.float(), targets)
        if routers and aux_coef:
            aux = qwen3_ref.aux_loss([r["logits"] for r in routers], cfg["num_experts"],
                                     cfg["num_experts_per_tok"])
            loss = loss + aux_coef * aux
        loss.backward()
        for p in plist:  # an expert no token chose: a zero gradient, decayed all the same
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        norms.append(float(torch.nn.utils.clip_grad_norm_(plist, OPT["max_norm"])))
        opt.step()
        losses.append(float(loss))
        print(f"step {s + 1}/{steps}  loss {losses[-1]:.4f}  grad_norm {norms[-1]:.4f}  "
              f"{time.perf_counter() - t0:.2f} s", file=sys.stderr, flush=True)

    times, _ = moe.timed_steps(step, steps - 1)  # its first step is the warm-up
    print(json.dumps({"step_s": [ms * 1e-3 for ms in times["ms"]], "losses": losses,
                      "grad_norms": norms}))


# ---- the driver -----------------------------------------------------------------------------

def run_child(label, cmd, env, show):
    """Runs cmd to the end with stdout (and stderr) piped, forwarding the lines show() picks to
    stderr; returns (all lines, peak RSS GiB of the child itself, wall s)."""
    log(f"{label} ...")
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                         text=True)
    lines = []
    for line in p.stdout:
        lines.append(line.rstrip("\n"))
        if show(line):
            print(f"[train] {label}: {line.rstrip()}", file=sys.stderr, flush=True)
    p.stdout.close()
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        sys.stderr.write("\n".join(lines[-40:]) + "\n")
        raise SystemExit(f"[train] {label}: {shlex.join(cmd)} exited {p.returncode}")
    return lines, ru.ru_maxrss / 2**20, time.perf_counter() - t0


def ctitan_side(name, args, folder, tokens, B, T, peak, env, work, extra=""):
    dump = os.path.join(work, "dump-" + name + re.sub(r"\W+", "_", extra))
    keys = {
        "model.backend": "hf", "model.hf_path": folder, "training.dataset_path": tokens,
        "training.seq_len": T, "training.local_batch_size": B, "training.steps": args.steps,
        "training.shuffle": "false", "training.max_norm": OPT["max_norm"],
        "optimizer.lr": OPT["lr"], "optimizer.beta1": OPT["beta1"],
        "optimizer.beta2": OPT["beta2"], "optimizer.eps": OPT["eps"],
        "optimizer.weight_decay": OPT["weight_decay"],
        "optimizer.decay_norms_and_embeddings": "true",
        "lr_scheduler.warmup_steps": OPT["warmup"], "checkpoint.enable": "false",
        "metrics.log_freq": 1, "metrics.peak_gflops": peak,
        "parallelism.threads_per_rank": args.threads, "job.dump_folder": dump,
    }
    cmd = [os.path.join(args.build, "ctitan"), "train"]
    for k, v in keys.items():
        cmd += [f"--{k}", str(v)]
    cmd += shlex.split(args.ctitan_args) + shlex.split(extra)  # last: they win over the keys
    lines, rss, wall = run_child(f"{name} ctitan{' ' + extra if extra else ''}", cmd, env,
                                 lambda s: re.match(r"(step |memory estimate|error|op profile|  \S)",
                                                    s))
    with open(os.path.join(dump, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    rows = [r for r in rows if "loss" in r]
    if len(rows) != args.steps:
        raise SystemExit(f"[train] {name} ctitan: {len(rows)} metrics rows, not {args.steps}")
    plan = next((s for s in lines if s.startswith("memory estimate")), None)
    total = re.search(r"total ([0-9.]+) GiB", plan or "")
    # The OpenBLAS build that ran ("OpenMP's threads" or "its own threads": README, Dependencies)
    blas = next((m.group(1) for m in map(lambda s: re.search(r"OpenBLAS on ([^;]*)", s), lines)
                 if m), None)
    # The MiB figure: the GiB one has 3 decimals, too few for a small config's ratios.
    acts = re.search(r"activations [0-9.]+ GiB \(([0-9.]+) MiB", plan or "")
    side = {"step_s": [B * T / r["tps"] for r in rows[1:]],
            "losses": [r["loss"] for r in rows], "grad_norms": [r["grad_norm"] for r in rows],
            "peak_rss_gib": rss, "memory_peak_gib_reported": max(r["memory_peak_gib"]
                                                                 for r in rows),
            "mfu_reported": [r["mfu"] for r in rows[1:]],
            "planned_memory_gib": float(total.group(1)) if total else None,
            "planned_activations_gib": round(float(acts.group(1)) / 1024, 5) if acts else None,
            "planned_memory_line": plan, "openblas_threads": blas, "wall_s": wall,
            "command": shlex.join(cmd)}
    return side


def torch_side(name, args, folder, tokens, B, T, env, bf16=False):
    cmd = [sys.executable, os.path.abspath(__file__), "--threads", str(args.threads), "--steps",
           str(args.steps), "--torch-worker", folder, tokens, str(B), str(T)]
    cmd += ["--torch-autocast"] if bf16 else []
    lines, rss, wall = run_child(f"{name} pytorch{' bf16' if bf16 else ''}", cmd, env,
                                 lambda s: not s.startswith("{"))
    side = json.loads(next(s for s in reversed(lines) if s.startswith("{")))
    side.update(peak_rss_gib=rss, wall_s=wall)
    return side


def summarise(side, B, T, fpt, peak):
    step = sum(side["step_s"]) / len(side["step_s"])
    tps = B * T / step
    out = {"step_s": round(step, 4), "step_s_each": [round(s, 4) for s in side["step_s"]],
           "tokens_per_s": round(tps, 1), "mfu": round(tps * fpt / 1e9 / peak, 4),
           "peak_rss_gib": round(side["peak_rss_gib"], 3), "losses": side["losses"],
           "grad_norms": side["grad_norms"], "wall_s": round(side["wall_s"], 1)}
    for k, v in side.items():
        if k not in out and k != "step_s":
            out[k] = v
    return out


def machine():
    u = os.uname()
    cpu = None
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name")), None)
    except OSError:
        pass
    return {"sysname": u.sysname, "release": u.release, "version": u.version,
            "machine": u.machine, "node": u.nodename, "cpu_model": cpu, "cpus": os.cpu_count()}


def git_commit(args):
    # The source tree first, else the tree the binary was built in (a copied bench/).
    for d in (ROOT, os.path.dirname(os.path.realpath(os.path.join(args.build, "ctitan")))):
        r = subprocess.run(["git", "-C", d, "rev-parse", "HEAD"], capture_output=True, text=True)
        if r.returncode == 0:
            return r.stdout.strip()
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--configs", default="c1,c2,moe", help="a subset of c1,c2,moe")
    ap.add_argument("--steps", type=int, default=4,
                    help="optimizer steps per side; the first is warm-up, left out of the means")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--ctitan-args", default="", help="extra `ctitan train` arguments, verbatim")
    ap.add_argument("--ac", action="store_true",
                    help="also run ctitan with full and with selective \"op\" activation "
                         "checkpointing: planned activations, peak RSS and step time against the "
                         "run without (ratios.ac_*)")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                    help="bf16: also ctitan with training.mixed_precision_param = bfloat16 and "
                         "PyTorch under CPU autocast bf16 (ctitan_bf16, pytorch_bf16), MFU also "
                         "against a oneDNN bf16 2048^3 peak, and ratios.bf16_*")
    ap.add_argument("--out", help="also write the JSON here")
    ap.add_argument("--tmp", help="folder for the HF folders and tokens (default: system temp)")
    ap.add_argument("--malloc", choices=["default", "heap"], default="default",
                    help="heap: keep freed memory, no mmap, no trim (bench/moe.py's setting)")
    ap.add_argument("--torch-worker", nargs=4, metavar=("DIR", "TOKENS", "B", "T"),
                    help=argparse.SUPPRESS)
    ap.add_argument("--torch-autocast", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--write-worker", nargs=4, metavar=("KIND", "DIR", "TOKENS", "N"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.write_worker:
        kind, d, tok, n = args.write_worker
        return write_worker(kind, d, tok, int(n), args.threads)
    if args.torch_worker:
        d, tok, b, t = args.torch_worker
        return torch_worker(d, tok, int(b), int(t), args.steps, args.threads, args.torch_autocast)
    names = [c for c in args.configs.split(",") if c]
    bad = [c for c in names if c not in CONFIGS]
    if bad or not names:
        ap.error(f"--configs: unknown {bad or 'empty'}; known: {','.join(CONFIGS)}")
    if args.steps < 2:
        ap.error("--steps must be at least 2 (the first is warm-up)")

    # This process stays small (no numpy, no torch): a child's peak RSS starts at its parent's.
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads),
               OPENBLAS_NUM_THREADS=str(args.threads))
    if args.malloc == "heap":
        env.update(MALLOC_MMAP_MAX_="0", MALLOC_TRIM_THRESHOLD_=str(1 << 40))
    bench = os.path.join(args.build, "bench_step")

    def gemm_peak(kind):  # "sgemm" (OpenBLAS fp32) or "bf16" (oneDNN)
        out = subprocess.run([bench, kind, "2048", "5"], check=True, env=env,
                             capture_output=True, text=True).stdout
        return json.loads(out)[kind + "_gflops"]

    def sgemm_peak():
        return gemm_peak("sgemm")

    t_start = time.perf_counter()
    result = {"threads": args.threads, "steps": args.steps, "timed_steps": f"2..{args.steps}",
              "machine": machine(), "ctitan_commit": git_commit(args),
              "ctitan_args": args.ctitan_args,
              "malloc": "default" if args.malloc == "default" else "heap, no mmap, no trim",
              "optimizer": dict(OPT, name="AdamW", decay="every parameter", lr_schedule="constant"),
              "loadavg_1min_before": round(os.getloadavg()[0], 2)}
    result["sgemm_gflops_before"] = peak = sgemm_peak()
    log(f"sgemm 2048^3: {peak:.1f} GFLOP/s with {args.threads} thread(s)")
    bf16 = args.precision == "bf16"
    if bf16:
        result["bf16_gflops_before"] = gemm_peak("bf16")
        log(f"oneDNN bf16 2048^3: {result['bf16_gflops_before']:.1f} GFLOP/s")
    raw = {}
    with tempfile.TemporaryDirectory(prefix="ctitan-train-bench-", dir=args.tmp) as work:
        for kind in sorted({CONFIGS[c][0] for c in names}):
            folder, tokens = os.path.join(work, kind), os.path.join(work, kind + ".npy")
            n = max(args.steps * B * (T + 1) for k, T, B in (CONFIGS[c] for c in names)
                    if k == kind)
            log(f"writing the {kind} HF folder and {n} tokens ...")
            subprocess.run([sys.executable, os.path.abspath(__file__), "--threads",
                            str(args.threads), "--write-worker", kind, folder, tokens, str(n)],
                           check=True, env=env)
        for c in names:
            kind, T, B = CONFIGS[c]
            folder, tokens = os.path.join(work, kind), os.path.join(work, kind + ".npy")
            raw[c] = (ctitan_side(c, args, folder, tokens, B, T, peak, env, work),
                      torch_side(c, args, folder, tokens, B, T, env),
                      {m: ctitan_side(c, args, folder, tokens, B, T, peak, env, work, extra)
                       for m, extra in AC_MODES.items()} if args.ac else {},
                      (ctitan_side(c, args, folder, tokens, B, T, peak, env, work, BF16_ARGS),
                       torch_side(c, args, folder, tokens, B, T, env, bf16=True)) if bf16 else ())
    result["sgemm_gflops_after"] = sgemm_peak()
    # A busy machine lowers the rate: MFU uses the better of the two.
    peak = result["sgemm_peak_gflops"] = max(peak, result["sgemm_gflops_after"])
    if bf16:
        result["bf16_gflops_after"] = gemm_peak("bf16")
        bf16_peak = result["bf16_peak_gflops"] = max(result["bf16_gflops_before"],
                                                     result["bf16_gflops_after"])

    result["configs"] = {}
    for c in names:
        kind, T, B = CONFIGS[c]
        g = MODELS[kind]
        fpt = flops_per_token(g, T)
        ct, pt = (summarise(s, B, T, fpt, peak) for s in raw[c][:2])
        l0, l1 = ct["losses"][0], pt["losses"][0]
        result["configs"][c] = {
            "model": dict(g, T=T, B=B, max_position_embeddings=40960),
            "tokens_per_step": B * T, "flops_per_token": fpt,
            "ctitan": ct, "pytorch": pt,
            "loss_step1_rel_diff": abs(l0 - l1) / abs(l1),
            "loss_max_rel_diff": max(abs(a - b) / abs(b)
                                     for a, b in zip(ct["losses"], pt["losses"])),
            "ratios": {"tokens_per_s": round(ct["tokens_per_s"] / pt["tokens_per_s"], 3),
                       "peak_rss": round(ct["peak_rss_gib"] / pt["peak_rss_gib"], 3)},
        }
        for mode, side in raw[c][2].items():
            ac = summarise(side, B, T, fpt, peak)
            result["configs"][c][f"ctitan_ac_{mode}"] = ac
            result["configs"][c]["ratios"].update({
                f"ac_{mode}_activations": round(ct["planned_activations_gib"] /
                                                ac["planned_activations_gib"], 3),
                f"ac_{mode}_peak_rss": round(ct["peak_rss_gib"] / ac["peak_rss_gib"], 3),
                f"ac_{mode}_step_time": round(ac["step_s"] / ct["step_s"], 3),
                f"ac_{mode}_losses_equal": ac["losses"] == ct["losses"]})
        if bf16:
            cb, pb = (summarise(s, B, T, fpt, peak) for s in raw[c][3])
            cb["mfu_bf16_peak"] = round(cb["tokens_per_s"] * fpt / 1e9 / bf16_peak, 4)
            pb["mfu_bf16_peak"] = round(pb["tokens_per_s"] * fpt / 1e9 / bf16_peak, 4)
            result["configs"][c].update(ctitan_bf16=cb, pytorch_bf16=pb)
            result["configs"][c]["ratios"].update({
                "bf16_tokens_per_s": round(cb["tokens_per_s"] / pb["tokens_per_s"], 3),
                "bf16_over_fp32_tokens_per_s": round(cb["tokens_per_s"] / ct["tokens_per_s"], 3),
                "bf16_planned_activations": round(cb["planned_activations_gib"] /
                                                  ct["planned_activations_gib"], 3),
                "bf16_peak_rss": round(cb["peak_rss_gib"] / ct["peak_rss_gib"], 3),
                "bf16_loss_mean_abs_diff_vs_autocast": sum(
                    abs(a - b) for a, b in zip(cb["losses"], pb["losses"])) / len(cb["losses"])})
            log(f"{c} bf16: ctitan {cb['tokens_per_s']:.0f} tok/s "
                f"({cb['mfu_bf16_peak']:.0%} of the bf16 peak); pytorch autocast "
                f"{pb['tokens_per_s']:.0f} tok/s")
        log(f"{c}: ctitan {ct['tokens_per_s']:.0f} tok/s, {ct['peak_rss_gib']:.2f} GiB; "
            f"pytorch {pt['tokens_per_s']:.0f} tok/s, {pt['peak_rss_gib']:.2f} GiB; "
            f"step-1 loss rel diff {result['configs'][c]['loss_step1_rel_diff']:.2e}")
    result["loadavg_1min_after"] = round(os.getloadavg()[0], 2)
    result["wall_s"] = round(time.perf_counter() - t_start, 1)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
