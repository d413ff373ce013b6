#!/usr/bin/env python3
"""Data-parallel training over real OpenMPI ranks, one global batch in every configuration.

The model, data and global batch are the same everywhere, so only the split of the work
between ranks and threads changes. Prints one JSON object (progress goes to stderr). A
benchmark, not a test: no pass mark.

Configurations (issue 5), each `ctitan train` for --steps optimizer steps:
  np1             -np 1, 2 threads, local batch 2 x 2 accumulation micro-steps
  np2             -np 2, 1 thread per rank, local batch 2, ZeRO-1 (data_parallel_shard_mode
                  zero1; the default before FSDP), overlap on; c1's zero1_np2
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

Sharding modes (FSDP against ZeRO-1), on two models (--models):
  c1     the model above (FULL; QUICK with --quick), seq_len --seq-len
  state  parameters, gradients and AdamW state dominate memory: hidden 512, 32 layers,
         8/4 heads, head_dim 64, intermediate 8192, the real 151936 vocabulary, UNTIED
         embeddings, seq_len 32 (whatever --quick or --seq-len say). Parameters:
           embedding and lm_head   2 x 151936 x 512                     = 155,582,464
           per layer  q, o 2 x 512 x 512, k, v 2 x 512 x 256, q/k_norm 2 x 64,
                      2 norms 2 x 512, MLP 3 x 512 x 8192               =  13,370,496
           32 layers                                                    = 427,855,872
           final norm                                                   =         512
           total P                                                      = 583,438,848
         (ctitan prints the same count.) fp32 params, grads and AdamW moments: 16P = 8.69 GiB
         in one process, against some 20 MB of logits and activations a micro-batch. Why this
         shape and not, say, hidden 1024 x 8 layers: FSDP holds, besides the shard's 16P/N, the
         largest unit in flight, and the loss head's weights and gradient exist whole at once
         (the chunked loss writes the gradient as it goes), 2 x 4 x V x C bytes: 0.58 GiB here,
         1.16 GiB at hidden 1024, where 8 layers of 12.6M parameters would leave the per-rank
         peak at np=4 near 0.45 of np=1 (measured 2.96 against 6.26 GiB). Ideal per rank:
         FSDP 16P/N + 0.58 GiB (np=4: 2.75 GiB, 0.32 of np=1). ZeRO-1 (8 + 8/N)P and
         replication 16P per rank do not fit 4 and 2 ranks on this 24 GiB machine: state runs
         only fsdp_np1/2/4 and zero1_np2.
New configurations, for each model (each a real `mpirun` run of `ctitan train`):
  fsdp_np1, fsdp_np2, fsdp_np4   --parallelism.data_parallel_shard_mode fsdp at -np 1, 2, 4
  zero1_np2, zero1_np4           --parallelism.data_parallel_shard_mode zero1 at -np 2, 4
  replicate_np2                  replicate 2, shard 1 (for c1 this is np2_replicate above,
                                 run once under that name)
-np 1 runs 2 threads, more ranks 1 thread each (np=4 is oversubscribed on 2 cores). The
global batch stays 4: micro-batches of 2 sequences, or 1 at np=4. A run's name is
<model>_<config> (c1_fsdp_np2, state_zero1_np4); the four runs above keep their names.
Besides the figures above, each run reports comm_hidden_s (seconds of communication a step
overlapped with compute, from metrics.jsonl; null where the rows lack it) and rss_max_gib. The
summary "sharding" gives fsdp_np2 / zero1_np2 tokens/s on c1 (target >= 0.9) and, on state,
each run's largest per-rank peak RSS over fsdp_np1's (target for fsdp_np4 <= 0.35).
--models and --configs (names as above, without or with the model prefix) run a part;
--dry-run prints the mpirun commands and runs nothing. A run that fails is recorded with its
error and log tail, the others go on, and the script exits 1 after printing the JSON.
"""
import argparse
import json
import os
import resource
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FULL = dict(n_layers=4, dim=512, n_heads=8, n_kv_heads=4, head_dim=64, ffn_dim=1536)
QUICK = dict(n_layers=2, dim=128, n_heads=4, n_kv_heads=2, head_dim=64, ffn_dim=512)
# Parameters, gradients and AdamW state dominate: 583M parameters, 8.69 GiB of state in one
# process, against some 20 MB of activations (see the docstring).
STATE = dict(n_layers=32, dim=512, n_heads=8, n_kv_heads=4, head_dim=64, ffn_dim=8192,
             tie_embeddings="false")
# The state model's runs (the others would not fit this machine, see the docstring).
STATE_CONFIGS = {"fsdp_np1", "fsdp_np2", "fsdp_np4", "zero1_np2"}
STATE_SEQ_LEN = 32
VOCAB = 151936  # the debugmodel flavor's (the real Qwen3 vocabulary), not overridden

GLOBAL_BATCH = 4
MICRO_BATCH = 2  # per rank per micro-step, where the rank count allows (1 at np=4)

# name -> (ranks, threads per rank, extra keys): c1 only, the names and JSON of issue 5
CONFIGS = [
    ("np1", 1, 2, {}),
    ("np2", 2, 1, {"parallelism.data_parallel_shard_mode": "zero1"}),
    ("np2_no_overlap", 2, 1, {"parallelism.data_parallel_shard_mode": "zero1",
                              "comm.overlap": "false"}),
    ("np2_replicate", 2, 1, {"parallelism.data_parallel_replicate_degree": "2",
                             "parallelism.data_parallel_shard_degree": "1"}),
]
FSDP = {"parallelism.data_parallel_shard_mode": "fsdp"}
ZERO1 = {"parallelism.data_parallel_shard_mode": "zero1"}
# The sharding comparison, for every model: name -> (ranks, extra keys); threads 2 // ranks.
SHARD_CONFIGS = [
    ("fsdp_np1", 1, FSDP),
    ("fsdp_np2", 2, FSDP),
    ("fsdp_np4", 4, FSDP),
    ("zero1_np2", 2, ZERO1),
    ("zero1_np4", 4, ZERO1),
    ("replicate_np2", 2, CONFIGS[3][3]),
]
LEGACY = {n for n, *_ in CONFIGS}
# the same commands, run once
ALIASES = {"c1_replicate_np2": "np2_replicate", "c1_zero1_np2": "np2"}
MODELS = ("c1", "state")


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


def plan(models, selected):
    """The runs to make, in order: (run name, model name, ranks, threads, extra keys)."""
    runs = []
    if "c1" in models:
        runs += [(n, "c1", r, th, extra) for n, r, th, extra in CONFIGS]
    for m in models:
        for n, r, extra in SHARD_CONFIGS:
            name = f"{m}_{n}"
            if name in ALIASES or (m == "state" and n not in STATE_CONFIGS):
                continue
            runs.append((name, m, r, max(1, 2 // r), extra))
    if selected:
        def wanted(run):
            name, m = run[0], run[1]
            short = name[len(m) + 1:] if name.startswith(m + "_") else name
            alias = [a for a, b in ALIASES.items() if b == name]
            return (name in selected or short in selected
                    or any(a in selected or a[len(m) + 1:] in selected for a in alias))
        runs = [run for run in runs if wanted(run)]
    return runs


def run_config(name, ranks, threads, extra, args, model, seq_len, tokens, work, env_extra=None):
    """One `mpirun ... ctitan train` run. The batch keys in extra, and model's "flavor", replace
    the defaults (bench/parallel.py's modes); env_extra is added to the ranks' environment."""
    dump = os.path.join(work, name)
    gbatch = int(extra.get("training.global_batch_size", GLOBAL_BATCH))
    micro = int(extra.get("training.local_batch_size", min(MICRO_BATCH, gbatch // ranks)))
    assert "training.local_batch_size" in extra or gbatch % (micro * ranks) == 0
    keys = {
        "model.flavor": model.get("flavor", "debugmodel"),
        **{f"model.{k}": str(v) for k, v in model.items() if k != "flavor"},
        "training.dataset_path": tokens,
        "training.seq_len": str(seq_len),
        "training.local_batch_size": str(micro),
        "training.global_batch_size": str(gbatch),
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
    if args.dry_run:
        print(f"# {name}: -np {ranks}, {threads} thread(s) per rank, micro-batch {micro}")
        print(shlex.join(cmd))
        return None
    shutil.rmtree(dump, ignore_errors=True)
    os.makedirs(dump)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_btl="self,vader")
    env.pop("OMP_NUM_THREADS", None)  # threads_per_rank decides
    env.update(env_extra or {})
    log(f"{name}: -np {ranks}, {threads} thread(s) per rank ...")
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    out = p.stdout + p.stderr
    with open(os.path.join(dump, "stdout.log"), "w") as f:
        f.write(out)

    def failed(why):
        log(f"{name}: FAILED: {why} (log in {dump}/stdout.log)")
        sys.stderr.write(out[-4000:])
        return {"ranks": ranks, "threads_per_rank": threads, "options": extra, "error": why,
                "log_tail": out[-2000:], "wall_s": round(wall, 1)}

    if p.returncode != 0:
        said = [ln for ln in out.splitlines() if "error" in ln.lower()][:1]
        return failed(f"mpirun exited {p.returncode}" + (f": {said[0].strip()}" if said else ""))
    try:
        with open(os.path.join(dump, "metrics.jsonl")) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    except OSError as e:
        return failed(f"no metrics.jsonl: {e}")
    rows = [r for r in rows if "loss" in r]
    steps = [r for r in rows if r["step"] > args.warmup]
    if not steps:
        return failed(f"no steps after the first {args.warmup} in metrics.jsonl")
    tokens_per_step = gbatch * seq_len
    step_s = [tokens_per_step / r["tps_total"] for r in steps]
    step_mean = mean(step_s)
    comm = mean([r["comm_s"] for r in steps])
    # comm_hidden_s comes with FSDP; null until every row has it.
    hidden = (round(mean([r["comm_hidden_s"] for r in steps]), 4)
              if all("comm_hidden_s" in r for r in steps) else None)
    rss = []
    for r in range(ranks):
        try:
            with open(os.path.join(dump, f"rss.{r}")) as f:
                rss.append(round(int(f.read()) / 1024.0 ** 2, 3))
        except OSError:
            rss.append(None)
    res = {
        "ranks": ranks,
        "threads_per_rank": threads,
        "micro_batch": micro,
        "grad_accum": max(1, gbatch // (micro * ranks)),
        "options": extra,
        "tps_total": round(tokens_per_step / step_mean, 1),
        "tps_per_worker": round(tokens_per_step / step_mean / ranks, 1),
        "step_s": round(step_mean, 4),
        "step_s_median": round(sorted(step_s)[len(step_s) // 2], 4),
        "step_s_min": round(min(step_s), 4),
        "comm_s_per_step": round(comm, 4),
        "comm_share": round(comm / step_mean, 4),
        "comm_hidden_s_per_step": hidden,
        "mfu": round(mean([r["mfu"] for r in steps]), 4),
        "peak_rss_gib_per_rank": rss,
        "rss_max_gib": max((x for x in rss if x is not None), default=None),
        "memory_peak_gib_rank0": max(r["memory_peak_gib"] for r in rows),
        "wall_s": round(wall, 1),
        "losses": [r["loss"] for r in rows],
    }
    log(f"{name}: {res['tps_total']:.0f} tok/s total, step {res['step_s']:.3f} s, "
        f"comm {1e3 * comm:.1f} ms ({100 * res['comm_share']:.1f}%), hidden "
        f"{'n/a' if hidden is None else f'{1e3 * hidden:.1f} ms'}, rss {rss} GiB, "
        f"wall {wall:.0f} s")
    return res


def ratio(a, b, digits=4):
    return None if a is None or b is None or b == 0 else round(a / b, digits)


def parse_run_args(ap):
    """The options this script shares with bench/parallel.py, parsed with ap's own: (the args,
    the models asked for)."""
    ap.add_argument("--steps", type=int, default=8, help="optimizer steps per configuration")
    ap.add_argument("--warmup", type=int, default=2, help="first steps left out of the averages")
    ap.add_argument("--seq-len", type=int, default=None,
                    help=f"c1's, default 256 (64 with --quick); state's is {STATE_SEQ_LEN}")
    ap.add_argument("--quick", action="store_true",
                    help="a small c1 (2 layers, dim 128, seq 64) for a fast smoke run")
    ap.add_argument("--models", default=",".join(MODELS),
                    help="comma-separated, of: " + ", ".join(MODELS))
    ap.add_argument("--dry-run", action="store_true",
                    help="print the mpirun command of each run, run nothing")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--work", default=None, help="keep the run folders here (default: a temp dir)")
    args = ap.parse_args()
    if args.seq_len is None:
        args.seq_len = 64 if args.quick else 256
    if args.steps <= args.warmup:
        ap.error(f"--steps ({args.steps}) must exceed --warmup ({args.warmup})")
    models = [m for m in args.models.split(",") if m]
    for m in models:
        if m not in MODELS:
            ap.error(f"--models: unknown model {m!r} (known: {', '.join(MODELS)})")
    return args, models


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--rank-wrapper":
        return rank_wrapper(sys.argv[2], sys.argv[4:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--configs", default="",
                    help="comma-separated run names (default: all), e.g. np1,fsdp_np2 or "
                         "state_zero1_np4")
    args, models = parse_run_args(ap)
    selected = {c for c in args.configs.split(",") if c}
    known = {n for n, *_ in plan(MODELS, set())} | set(ALIASES)
    known |= {n for n, *_ in CONFIGS} | {n for n, *_ in SHARD_CONFIGS}
    for c in selected:
        if c not in known:
            ap.error(f"--configs: unknown run {c!r} (known: {', '.join(sorted(known))})")
    runs_todo = plan(models, selected)
    if not runs_todo:
        ap.error("--models and --configs select no run")
    c1 = QUICK if args.quick else FULL
    spec = {"c1": (c1, args.seq_len), "state": (STATE, STATE_SEQ_LEN)}
    if args.dry_run:
        for name, m, r, th, extra in runs_todo:
            run_config(name, r, th, extra, args, spec[m][0], spec[m][1], "TOKENS.npy",
                       args.work or "WORK")
        return
    if shutil.which("mpirun") is None:
        raise SystemExit("[dp] mpirun not found: install OpenMPI (make deps)")

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
        runs = {}
        for name, m, r, th, extra in runs_todo:
            runs[name] = run_config(name, r, th, extra, args, spec[m][0], spec[m][1], tokens,
                                    work)
            runs[name]["model"] = m
    finally:
        if tmp is not None:
            tmp.cleanup()

    ok = {n: r for n, r in runs.items() if "error" not in r}
    # Losses and scaling against the same model's one-rank run (np1 for c1's four runs).
    for name, r in ok.items():
        m = r["model"]
        base_name = "np1" if name in LEGACY else f"{m}_fsdp_np1"
        base = ok.get(base_name)
        if base is None or name == base_name:
            continue
        key = "" if base_name == "np1" else "_" + base_name
        r["scaling_efficiency" + key] = round(r["tps_total"] / base["tps_total"], 4)
        n = min(len(r["losses"]), len(base["losses"]))
        r[f"loss_max_rel_diff_vs_{base_name}"] = max(
            abs(a - b) / abs(b) for a, b in zip(r["losses"][:n], base["losses"][:n]))
    for r in ok.values():
        r["loss_last"] = r.pop("losses")[-1]

    def get(name, key):
        return ok.get(name, {}).get(key)

    sharding = {}
    if "c1" in models:
        sharding["c1"] = {
            "fsdp_np2_over_zero1_np2_tps": ratio(get("c1_fsdp_np2", "tps_total"),
                                                 get("np2", "tps_total")),
            "target": ">= 0.9",
        }
    if "state" in models:
        base = get("state_fsdp_np1", "rss_max_gib")
        sharding["state"] = {
            "rss_max_over_fsdp_np1": {
                n[len("state_"):]: ratio(get(n, "rss_max_gib"), base, 3)
                for n in runs if n.startswith("state_") and n != "state_fsdp_np1"},
            "target": "fsdp_np4 <= 0.35",
        }
    model_desc = {"c1": dict(flavor="debugmodel", vocab=VOCAB, seq_len=args.seq_len, **c1),
                  "state": dict(flavor="debugmodel", vocab=VOCAB, seq_len=STATE_SEQ_LEN,
                                **STATE)}
    legacy = LEGACY <= ok.keys()
    result = {
        "model": dict(flavor="debugmodel", vocab=VOCAB, **c1),
        "models": {m: model_desc[m] for m in models},
        "seq_len": args.seq_len,
        "global_batch": GLOBAL_BATCH,
        "batch_note": f"every rank runs micro-batches of {MICRO_BATCH} sequences (1 at np=4): "
                      f"np1 accumulates {GLOBAL_BATCH // MICRO_BATCH} of them, np2 one per rank",
        "tokens_per_step": GLOBAL_BATCH * args.seq_len,
        "steps": args.steps,
        "averaged_steps": f"{args.warmup + 1}..{args.steps}",
        "cores": os.cpu_count(),
        "loadavg_1min_before": load_before,
        "loadavg_1min_after": round(os.getloadavg()[0], 2),
        "runs": runs,
        "aliases": ALIASES,
        "overlap_speedup": (round(runs["np2_no_overlap"]["step_s"] / runs["np2"]["step_s"], 4)
                            if legacy else None),
        "zero1_vs_replicate": ({
            "step_s_ratio": round(runs["np2"]["step_s"] / runs["np2_replicate"]["step_s"], 4),
            "rss_rank0_gib": [runs["np2"]["peak_rss_gib_per_rank"][0],
                              runs["np2_replicate"]["peak_rss_gib_per_rank"][0]],
        } if legacy else None),
        "sharding": sharding,
        "failed": sorted(n for n in runs if n not in ok),
    }
    print(json.dumps(result, indent=2))
    if result["failed"]:
        log(f"failed: {', '.join(result['failed'])}")
        sys.exit(1)


if __name__ == "__main__":
    main()
