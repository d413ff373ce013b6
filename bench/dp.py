#!/usr/bin/env python3
"""Data-parallel training over real OpenMPI ranks, one global batch in every configuration.

The model, data and global batch are the same everywhere, so only the split of the work
between ranks and threads changes. Prints one JSON object (progress goes to stderr). A
benchmark, not a test: no pass mark.

Configurations (issue 5), each `ctitan train` for --steps optimizer steps:
  np1             -np 1, 2 threads, local batch 2 x 2 accumulation micro-steps
  np2             -np 2, 1 thread per rank, local batch 2, ZeRO-1 (the default), overlap on
  np2_no_overlap  as np2 with --comm.overlap false (does overlapping the gradient
                  reduction with the backward help?)
  np2_replicate   as np2 with a replicated optimizer (DDP: replicate 2, shard 1)
Every rank computes micro-batches of the same size (2 sequences), so np1 and np2 do the same
arithmetic per micro-step and their losses should agree to ~1e-6.

Per configuration, averaged over the steps after the first --warmup (default 2):
tokens/s in total and per worker, step time, seconds per step blocked in MPI on rank 0 and
its share of the step, peak RSS of every rank (measured around each rank's process, and the
metrics line's memory_peak_gib, which is rank 0's), MFU as ctitan reports it (against its own
per-rank sgemm peak, so np1's and np2's MFU use different peaks). comm_s counts every second
rank 0 spends blocked in MPI, including waiting for a slower rank: on a busy machine it holds
straggler time as well as transfer time.
scaling_efficiency = tps_total(np2 variant) / tps_total(np1).

On a 2-core machine, 2 ranks x 1 thread against 1 rank x 2 threads is a test of the overhead
of data parallelism (gradient reduction, optimizer sharding, duplicated memory), not of
scaling: both use the same 2 cores.
"""
import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FULL = dict(n_layers=4, dim=512, n_heads=8, n_kv_heads=4, head_dim=64, ffn_dim=1536)
QUICK = dict(n_layers=2, dim=128, n_heads=4, n_kv_heads=2, head_dim=64, ffn_dim=512)
VOCAB = 151936  # the debugmodel flavor's (the real Qwen3 vocabulary), not overridden

GLOBAL_BATCH = 4
MICRO_BATCH = 2  # per rank per micro-step in every configuration

# name -> (ranks, threads per rank, extra keys)
CONFIGS = [
    ("np1", 1, 2, {}),
    ("np2", 2, 1, {}),
    ("np2_no_overlap", 2, 1, {"comm.overlap": "false"}),
    ("np2_replicate", 2, 1, {"parallelism.data_parallel_replicate_degree": "2",
                             "parallelism.data_parallel_shard_degree": "1"}),
]


def log(msg):
    print(f"[dp] {msg}", file=sys.stderr, flush=True)


def rank_wrapper(out_dir, cmd):
    """Runs one rank's process as a child, then records that child's peak RSS. mpirun starts this
    in place of ctitan; the child inherits the MPI environment, so MPI_Init works as usual."""
    rank = os.environ.get("OMPI_COMM_WORLD_RANK", "0")
    rc = subprocess.call(cmd)
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    with open(os.path.join(out_dir, f"rss.{rank}"), "w") as f:
        f.write(f"{peak_kib}\n")
    sys.exit(rc)


def mean(xs):
    return sum(xs) / len(xs)


def run_config(name, ranks, threads, extra, args, model, tokens, work):
    dump = os.path.join(work, name)
    shutil.rmtree(dump, ignore_errors=True)
    os.makedirs(dump)
    keys = {
        "model.flavor": "debugmodel",
        **{f"model.{k}": str(v) for k, v in model.items()},
        "training.dataset_path": tokens,
        "training.seq_len": str(args.seq_len),
        "training.local_batch_size": str(MICRO_BATCH),
        "training.global_batch_size": str(GLOBAL_BATCH),
        "training.steps": str(args.steps),
        "lr_scheduler.warmup_steps": "2",
        "metrics.log_freq": "1",
        "checkpoint.enable": "false",
        "parallelism.threads_per_rank": str(threads),
        "job.dump_folder": dump,
        **extra,
    }
    ctitan = [os.path.join(args.build, "ctitan"), "train"]
    for k, v in keys.items():
        ctitan += [f"--{k}", v]
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(ranks),
           sys.executable, os.path.abspath(__file__), "--rank-wrapper", dump, "--"] + ctitan
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_btl="self,vader")
    env.pop("OMP_NUM_THREADS", None)  # threads_per_rank decides
    log(f"{name}: -np {ranks}, {threads} thread(s) per rank ...")
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    with open(os.path.join(dump, "stdout.log"), "w") as f:
        f.write(p.stdout + p.stderr)
    if p.returncode != 0:
        sys.stderr.write((p.stdout + p.stderr)[-4000:])
        raise SystemExit(f"[dp] {name}: mpirun exited {p.returncode} (log in {dump}/stdout.log)")
    with open(os.path.join(dump, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    steps = [r for r in rows if r["step"] > args.warmup]
    if not steps:
        raise SystemExit(f"[dp] {name}: no steps after the first {args.warmup} in metrics.jsonl")
    tokens_per_step = GLOBAL_BATCH * args.seq_len
    step_s = [tokens_per_step / r["tps_total"] for r in steps]
    step_mean = mean(step_s)
    comm = mean([r["comm_s"] for r in steps])
    rss = []
    for r in range(ranks):
        with open(os.path.join(dump, f"rss.{r}")) as f:
            rss.append(round(int(f.read()) / 1024.0 ** 2, 3))
    res = {
        "ranks": ranks,
        "threads_per_rank": threads,
        "micro_batch": MICRO_BATCH,
        "grad_accum": GLOBAL_BATCH // (MICRO_BATCH * ranks),
        "options": extra,
        "tps_total": round(tokens_per_step / step_mean, 1),
        "tps_per_worker": round(tokens_per_step / step_mean / ranks, 1),
        "step_s": round(step_mean, 4),
        "step_s_median": round(sorted(step_s)[len(step_s) // 2], 4),
        "step_s_min": round(min(step_s), 4),
        "comm_s_per_step": round(comm, 4),
        "comm_share": round(comm / step_mean, 4),
        "mfu": round(mean([r["mfu"] for r in steps]), 4),
        "peak_rss_gib_per_rank": rss,
        "memory_peak_gib_rank0": max(r["memory_peak_gib"] for r in rows),
        "wall_s": round(wall, 1),
        "losses": [r["loss"] for r in rows],
    }
    log(f"{name}: {res['tps_total']:.0f} tok/s total, step {res['step_s']:.3f} s, "
        f"comm {1e3 * comm:.1f} ms ({100 * res['comm_share']:.1f}%), rss {rss} GiB, "
        f"wall {wall:.0f} s")
    return res


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--rank-wrapper":
        return rank_wrapper(sys.argv[2], sys.argv[4:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=8, help="optimizer steps per configuration")
    ap.add_argument("--warmup", type=int, default=2, help="first steps left out of the averages")
    ap.add_argument("--seq-len", type=int, default=None, help="default 256 (64 with --quick)")
    ap.add_argument("--quick", action="store_true",
                    help="a small model (2 layers, dim 128, seq 64) for a fast smoke run")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--work", default=None, help="keep the run folders here (default: a temp dir)")
    args = ap.parse_args()
    if args.seq_len is None:
        args.seq_len = 64 if args.quick else 256
    if args.steps <= args.warmup:
        ap.error(f"--steps ({args.steps}) must exceed --warmup ({args.warmup})")
    if shutil.which("mpirun") is None:
        raise SystemExit("[dp] mpirun not found: install OpenMPI (make deps)")
    model = QUICK if args.quick else FULL

    import numpy as np
    load_before = round(os.getloadavg()[0], 2)  # other work on the machine skews every number
    tmp = None
    work = args.work
    if work is None:
        tmp = tempfile.TemporaryDirectory(prefix="ctitan-dp-")
        work = tmp.name
    os.makedirs(work, exist_ok=True)
    try:
        tokens = os.path.join(work, "tokens.npy")
        np.save(tokens, np.random.default_rng(0).integers(0, VOCAB, 2_000_000).astype(np.int32))
        runs = {name: run_config(name, r, th, extra, args, model, tokens, work)
                for name, r, th, extra in CONFIGS}
    finally:
        if tmp is not None:
            tmp.cleanup()

    base = runs["np1"]
    for name, r in runs.items():
        if name == "np1":
            continue
        r["scaling_efficiency"] = round(r["tps_total"] / base["tps_total"], 4)
        n = min(len(r["losses"]), len(base["losses"]))
        r["loss_max_rel_diff_vs_np1"] = max(
            abs(a - b) / abs(b) for a, b in zip(r["losses"][:n], base["losses"][:n]))
    for r in runs.values():
        r["loss_last"] = r.pop("losses")[-1]
    result = {
        "model": dict(flavor="debugmodel", vocab=VOCAB, **model),
        "seq_len": args.seq_len,
        "global_batch": GLOBAL_BATCH,
        "batch_note": f"every rank runs micro-batches of {MICRO_BATCH} sequences: np1 "
                      f"accumulates {GLOBAL_BATCH // MICRO_BATCH} of them, np2 one per rank",
        "tokens_per_step": GLOBAL_BATCH * args.seq_len,
        "steps": args.steps,
        "averaged_steps": f"{args.warmup + 1}..{args.steps}",
        "cores": os.cpu_count(),
        "loadavg_1min_before": load_before,
        "loadavg_1min_after": round(os.getloadavg()[0], 2),
        "runs": runs,
        "overlap_speedup": round(runs["np2_no_overlap"]["step_s"] / runs["np2"]["step_s"], 4),
        "zero1_vs_replicate": {
            "step_s_ratio": round(runs["np2"]["step_s"] / runs["np2_replicate"]["step_s"], 4),
            "rss_rank0_gib": [runs["np2"]["peak_rss_gib_per_rank"][0],
                              runs["np2_replicate"]["peak_rss_gib_per_rank"][0]],
        },
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
