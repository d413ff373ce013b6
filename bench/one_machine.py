#!/usr/bin/env python3
"""The seed's model on one machine: Qwen3-4B's geometry evaluated and generated in bf16, with
peak RSS, beside llama.cpp on the same weights and prompt ids.

- eval: `ctitan eval --model.flavor 4B` at torchtitan's random init over real text (the seed's
  first-step loss is 12.43: ln(151936) + 1/2), bf16, and its peak RSS;
- generate: a folder with the geometry and random weights stored as BF16 (8 GB for 4B), greedy,
  bf16, a KV cache of --cache_len positions; peak RSS against the bound
  1.1 x the bf16 weights + the KV cache + 0.3 GiB, and prefill/decode tokens/s;
- llama.cpp (node-llama-cpp's prebuilt CPU build, bench/setup-llama) on a BF16 GGUF of the same
  folder (bench/gguf.py), the same prompt ids and threads: tokens/s, its peak RSS, and whether
  its greedy ids equal ctitan's.

Prints one JSON object. Needs about 17 GB of disk in the temporary folder (the BF16 folder and
its GGUF) and 12 GB of memory."""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "tests", "ref"), os.path.join(ROOT, "bench")]
sys.dont_write_bytecode = True
import generate  # noqa: E402  (the runners of bench/generate.py)

GIB = 1 << 30


def log(msg):
    print(f"[one_machine] {msg}", file=sys.stderr, flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--geometry", choices=sorted(generate.GEOMETRIES), default="4B")
    ap.add_argument("--cache_len", type=int, default=2048)
    ap.add_argument("--prompt", type=int, default=128, help="prompt length in tokens")
    ap.add_argument("--new", type=int, default=16, help="new tokens")
    ap.add_argument("--eval_seq_len", type=int, default=1024)
    ap.add_argument("--eval_steps", type=int, default=2)
    ap.add_argument("--llama", default=os.path.join(ROOT, "assets", "llama"))
    ap.add_argument("--tmp", default=None, help="where the folder and GGUF go")
    args = ap.parse_args()
    import gguf
    g = dict(generate.GEOMETRIES[args.geometry], **generate.COMMON)
    g["dtype"] = "BF16"
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads),
               OPENBLAS_NUM_THREADS=str(args.threads))
    ct = os.path.join(args.build, "ctitan")
    tok = os.path.join(ROOT, "assets", "qwen3-tokenizer")
    n_params = generate.layer_matmul_params(g) + g["V"] * g["C"]
    weights = 2 * n_params  # the norms are a rounding error here
    kv = 2 * g["L"] * args.cache_len * g["NKV"] * g["D"] * 2  # bf16 keys and values
    result = {"geometry": args.geometry, "threads": args.threads, "params": n_params,
              "loadavg_1min_before": round(os.getloadavg()[0], 2)}

    log("eval at random init")
    r = generate.run_measured(
        [ct, "eval", "--model.flavor", args.geometry, "--model.tokenizer_path", tok,
         "--training.dataset_path", os.path.join(ROOT, "assets", "corpus", "small.txt"),
         "--training.seq_len", str(args.eval_seq_len), "--training.local_batch_size", "1",
         "--steps", str(args.eval_steps), "--training.mixed_precision_param", "bfloat16",
         "--json"], env)
    if r.returncode != 0:
        sys.exit("eval failed:\n" + r.stderr[-3000:])
    e = json.loads(r.stdout)
    result["eval_bf16_random_init"] = {
        "loss": e["loss"], "step_losses": e["step_losses"], "tokens": e["tokens"],
        "expected": "ln(151936) + 1/2 = 12.43 (the seed's), +-0.05",
        "peak_rss_gib": round(r.peak_rss / GIB, 3)}

    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        folder = os.path.join(tmp, "model")
        log("writing the %s folder as BF16 (%.2f GB)" % (args.geometry, weights / 1e9))
        subprocess.run([sys.executable, "-c", "import sys; sys.path[:0] = %r; import moe; "
                        "moe.write_model(%r, %r, %d, %d)" % (sys.path[:2], folder, g,
                                                              generate.SEED, args.threads)],
                       check=True, env=env)
        with open(os.path.join(folder, "generation_config.json"), "w") as f:
            json.dump({"eos_token_id": -1}, f)  # no stop but the length
        log("ctitan generate bf16")
        runs = generate.ctitan_runs(ct, folder, tok, [args.prompt], 1, args.new, env,
                                    ["--training.mixed_precision_param", "bfloat16",
                                     "--cache_len", str(args.cache_len)])
        ours = generate.best_by_length(runs)[len(runs[0][0])]
        rss = list(generate.PEAK_RSS.values())[-1]
        bound = 1.1 * weights + kv + 0.3 * GIB
        sides = {"ctitan_bf16": ours}
        result["ctitan_bf16"] = {"peak_rss_gib": round(rss / GIB, 3),
                                 "bound_gib": round(bound / GIB, 3),
                                 "weights_gib": round(weights / GIB, 3),
                                 "kv_cache_gib": round(kv / GIB, 3)}
        if os.path.isdir(os.path.join(args.llama, "node_modules")):
            log("llama.cpp bf16: converting to GGUF")
            path = gguf.convert(folder, os.path.join(tmp, "model-bf16.gguf"), "bf16", tok)
            shutil.rmtree(folder)  # the disk holds one of the two at a time
            log("llama.cpp bf16")
            lr = generate.llama_runs(args.llama, path, [runs[0][0]], 1, args.new, args.threads,
                                     env)
            sides["llama_cpp_bf16"] = generate.best_by_length(lr)[len(runs[0][0])]
            result["llama_cpp_bf16"] = {
                "peak_rss_gib": round(list(generate.PEAK_RSS.values())[-1] / GIB, 3),
                "ids_same_until": generate.first_divergence(lr[0][1], runs[0][1])}
        else:
            log("no llama.cpp (bench/setup-llama installs it): left out")
    for name, b in sides.items():
        result[name].update({"prefill_tokens_per_s": round(args.prompt / b["prefill_s"], 2),
                             "decode_tokens_per_s": round(b["n_decode"] / b["decode_s"], 3)})
    if "llama_cpp_bf16" in sides:
        result["ctitan_vs_llama_cpp_bf16"] = {
            k: round(result["ctitan_bf16"][k] / result["llama_cpp_bf16"][k], 3)
            for k in ("prefill_tokens_per_s", "decode_tokens_per_s")}
    result["loadavg_1min_after"] = round(os.getloadavg()[0], 2)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
