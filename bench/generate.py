#!/usr/bin/env python3
"""Generation speed (issue 21): ctitan generate's prefill and decode at batch 1 against the
machine's bounds, and a plain PyTorch eager Qwen3 with a KV cache beside it, same machine, same
threads, same weights and prompts, in one run. Prints one JSON object (progress goes to stderr).
A benchmark, not a test: no pass mark.

Geometry: Qwen3-0.6B (hidden 1024, 28 layers, 16 heads / 8 kv heads, head_dim 128, intermediate
3072, vocab 151936, tied, rope_theta 1e6), random init (normal(0, 0.02) matrices, unit norms)
written as one F32 HF folder (bench/moe.py's writer). Prompts of --prompts tokens ("the" then
" the" repeated: one token each, checked), greedy, --new new tokens each; eos switched off
(generation_config.json's eos_token_id -1) so every prompt runs to its length.

ctitan: --repeats `ctitan generate --input` processes over the prompt list; `--timing` prints
each prompt's prefill time (qwen3_gen_prefill and the first token's sampling) and decode time
(the qwen3_gen_decode calls, new tokens - 1 of them, and the tokens' sampling; detokenizing
excluded). The best repeat of each length is reported. --bf16 adds the same run with
--training.mixed_precision_param bfloat16; --no-fp32 then leaves out the fp32 sides (ctitan's and
llama.cpp's), which halves the run on a busy machine, and the greedy ids are compared with
ctitan bf16's.

Bounds:
  prefill  MFU = achieved FLOP/s over the best 2048^3 OpenBLAS sgemm of this run (bench_step
           sgemm, measured before and after, same threads). FLOPs of a prefill of T tokens,
           counted exactly: 2 * N_layers * T (the layers' matmul parameters, every row) +
           2 * V * C (the lm_head, last row only) + 2 * L * NH * D * T * (T + 1) (causal QK^T
           and PV: query t sees t + 1 keys). Norms, RoPE, softmax and SwiGLU are not counted.
           bf16 sides' MFU is against oneDNN's bf16 2048^3 matmul of this run (bench_step bf16),
           never the fp32 peak (which gave bf16 prefill 144%).
  decode   tokens/s bound = measured bandwidth / bytes of weights read per token: every linear
           weight once, lm_head included (N_layers + V * C parameters; 4 bytes fp32, 2 bf16).
           The KV cache's reads are not in the bound (reported: kv_bytes_per_token at the
           prompt's length; ctitan's cache in its compute dtype, llama.cpp's in f16). Bandwidth: bench_step bandwidth, a C streaming read of a 1 GiB
           buffer, each of --threads OpenMP threads summing its slice with 64-byte vector
           loads, best of 5 before and after the whole run, best of 3 between the repeats of
           ctitan and llama.cpp; decode_of_bound uses the largest of them all. (numpy's
           float32 sum, used before, read at about half that rate on the 2-core machine, and
           llama.cpp's decode beat the bound built on it.)
  paired   This machine's memory rate moves with its neighbours' load (probes of 31 to 77 GB/s
           minutes apart), so each repeat (one process) of ctitan and llama.cpp also runs
           between two probes, and decode_of_paired_bound is the median (the lower middle of
           an even count) over the repeats of each one's decode against the larger probe
           around it (decode_of_paired_bound_runs: all of them, sorted).

llama.cpp: the CPU build that the npm package node-llama-cpp ships prebuilt (bench/setup-llama
installs it into assets/llama), on a GGUF that bench/gguf.py writes from the same HF folder (F32,
and BF16 with --bf16), fed ctitan's prompt ids, greedy, --threads threads (bench/llama_peer.mjs).
Its prefill is the time to the first new token, its decode the new - 1 tokens after, as
ctitan's --timing counts them. ctitan_vs_llama_cpp (and _bf16): prefill and decode speed ratios,
> 1 when ctitan is faster. ids_same_until: how many greedy ids agree with ctitan's.

PyTorch eager: HF Qwen3's eager path in plain torch (separate q/k/v/gate/up projections, q/k
norm, RoPE, repeat_kv, matmul + mask + fp32 softmax attention, the cache grown by torch.cat as
HF's DynamicCache does, lm_head on the last row only as generate's logits_to_keep=1), under
torch.inference_mode, in its own process with torch.set_num_threads(--threads). Its greedy ids
are compared with ctitan's (ids_match; near-ties may split them, not a failure).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "ref"))
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.dont_write_bytecode = True  # imports from the source tree; leave it clean

# The dense flavors' shapes (src/model/flavors.c), all tied.
GEOMETRIES = {
    "0.6B": dict(V=151936, C=1024, L=28, NH=16, NKV=8, D=128, F=3072),
    "1.7B": dict(V=151936, C=2048, L=28, NH=16, NKV=8, D=128, F=6144),
    "4B": dict(V=151936, C=2560, L=36, NH=32, NKV=8, D=128, F=9728),
}
COMMON = dict(eps=1e-6, theta=1000000.0, tied=True, bias=False, dtype="F32")
SEED = 1234


def log(msg):
    print(f"[generate] {msg}", file=sys.stderr, flush=True)


def layer_matmul_params(g):
    per_layer = (g["C"] * g["NH"] * g["D"] * 2 + g["C"] * g["NKV"] * g["D"] * 2
                 + 3 * g["C"] * g["F"])
    return g["L"] * per_layer


def prefill_flops(g, T):
    return (2 * layer_matmul_params(g) * T + 2 * g["V"] * g["C"]
            + 2 * g["L"] * g["NH"] * g["D"] * T * (T + 1))


def prompt_text(n):
    return "the" + " the" * (n - 1)


def bandwidth_gbs(bench, env, gib=1, repeats=5):
    """Streaming-read bandwidth in GB/s: bench_step bandwidth (C, OpenMP threads, wide loads)."""
    out = subprocess.run([bench, "bandwidth", str(gib), str(repeats)], check=True,
                         capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])["bandwidth_gbs"]


# ---- the PyTorch side (its own process) -----------------------------------------------------

def torch_worker(folder, prompts_path, new, threads):
    import torch
    import torch.nn.functional as F
    import moe
    import qwen3_ref
    torch.set_num_threads(threads)
    with open(os.path.join(folder, "config.json")) as f:
        cfg = json.load(f)
    P = moe.load_model(folder)
    prompts = json.load(open(prompts_path))
    L, NH, NKV, D = (cfg["num_hidden_layers"], cfg["num_attention_heads"],
                     cfg["num_key_value_heads"], cfg["head_dim"])
    eps = cfg["rms_norm_eps"]
    head = P.get("lm_head.weight", P["model.embed_tokens.weight"])
    max_len = max(len(p) for p in prompts) + new
    cos_all, sin_all = qwen3_ref.rope_cos_sin(cfg, max_len, torch.float32)
    norm = qwen3_ref.rms_norm

    def forward(ids, cache, pos):
        T = ids.shape[1]
        x = F.embedding(ids, P["model.embed_tokens.weight"])
        cos, sin = cos_all[pos:pos + T], sin_all[pos:pos + T]
        mask = None
        if T > 1:  # the prefill (pos 0): causal
            mask = torch.full((T, T), torch.finfo(torch.float32).min).triu(1)
        for i in range(L):
            p = "model.layers.%d." % i
            h = norm(x, P[p + "input_layernorm.weight"], eps)
            a = p + "self_attn."
            q = F.linear(h, P[a + "q_proj.weight"]).view(1, T, NH, D)
            k = F.linear(h, P[a + "k_proj.weight"]).view(1, T, NKV, D)
            v = F.linear(h, P[a + "v_proj.weight"]).view(1, T, NKV, D).transpose(1, 2)
            q = norm(q, P[a + "q_norm.weight"], eps).transpose(1, 2)
            k = norm(k, P[a + "k_norm.weight"], eps).transpose(1, 2)
            q = q * cos + qwen3_ref.rotate_half(q) * sin
            k = k * cos + qwen3_ref.rotate_half(k) * sin
            if cache[i] is not None:
                k = torch.cat([cache[i][0], k], dim=2)
                v = torch.cat([cache[i][1], v], dim=2)
            cache[i] = (k, v)
            kk, vv = qwen3_ref.repeat_kv(k, NH // NKV), qwen3_ref.repeat_kv(v, NH // NKV)
            att = torch.matmul(q, kk.transpose(2, 3)) * (D ** -0.5)
            if mask is not None:
                att = att + mask
            att = F.softmax(att, dim=-1, dtype=torch.float32)
            y = torch.matmul(att, vv).transpose(1, 2).reshape(1, T, NH * D)
            x = x + F.linear(y, P[a + "o_proj.weight"])
            h = norm(x, P[p + "post_attention_layernorm.weight"], eps)
            x = x + qwen3_ref.mlp(h, P, p + "mlp.")
        x = norm(x[:, -1:], P["model.norm.weight"], eps)
        return F.linear(x, head)[0, -1]

    out = []
    with torch.inference_mode():
        for prompt in prompts:
            cache = [None] * L
            t0 = time.perf_counter()
            logits = forward(torch.tensor([prompt]), cache, 0)
            t_prefill = time.perf_counter() - t0
            ids = [int(torch.argmax(logits))]
            t0 = time.perf_counter()
            for k in range(new - 1):
                logits = forward(torch.tensor([[ids[-1]]]), cache, len(prompt) + k)
                ids.append(int(torch.argmax(logits)))
            t_decode = time.perf_counter() - t0
            out.append({"n": len(prompt), "prefill_s": t_prefill, "decode_s": t_decode,
                        "n_decode": new - 1, "ids": ids})
    print(json.dumps(out))


# ---- the ctitan side ------------------------------------------------------------------------

# Each measured process's peak RSS in bytes, by what ran ("ctitan <options>", "llama.cpp <file>").
PEAK_RSS = {}


def run_measured(cmd, env):
    """subprocess.run's result (text, captured) with .peak_rss: this child's own high-water mark
    (os.wait4's rusage, not the largest of every child so far)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=env)
        _, status, usage = os.wait4(p.pid, 0)
        out.seek(0), err.seek(0)
        r = subprocess.CompletedProcess(cmd, os.waitstatus_to_exitcode(status), out.read(),
                                        err.read())
    r.peak_rss = usage.ru_maxrss * 1024
    return r


def ctitan_runs(ct, folder, tok, prompts, repeats, new, env, extra):
    """[(prompt ids, new ids, prefill s, decodes, decode s)] for the prompts, repeats times over."""
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for _ in range(repeats):
            for n in prompts:
                f.write(json.dumps({"prompt": prompt_text(n)}) + "\n")
        path = f.name
    try:
        r = run_measured([ct, "generate", "--model.hf_path", folder, "--model.tokenizer_path",
                          tok, "--input", path, "--temperature", "0", "--max_new_tokens",
                          str(new), "--json", "--timing"] + extra, env)
    finally:
        os.unlink(path)
    if r.returncode != 0:
        sys.exit("ctitan generate failed:\n" + r.stderr)
    PEAK_RSS["ctitan " + " ".join(extra)] = r.peak_rss
    rows = [json.loads(l) for l in r.stdout.splitlines() if l.strip()]
    times = [l.split() for l in r.stderr.splitlines() if l.startswith("ctitan: timing:")]
    assert len(rows) == len(times) == repeats * len(prompts), (r.stdout, r.stderr)
    out = []
    for row, t in zip(rows, times):
        # ctitan: timing: prefill N tokens in X s (R tokens/s), decode M tokens in Y s (...)
        assert row["stop"] == "length" and int(t[3]) == len(row["prompt_ids"]), (row, t)
        out.append((row["prompt_ids"], row["ids"], float(t[6]), int(t[11]), float(t[14])))
    return out


def best_by_length(runs):
    """Per prompt length: the best prefill and decode, and (paired runs) each run's decode
    tokens/s with the bandwidth probed around it."""
    best = {}
    for r in runs:
        n = len(r[0])
        b = best.setdefault(n, dict(prefill_s=r[2], decode_s=r[4], n_decode=r[3], ids=r[1],
                                    paired=[]))
        b["prefill_s"] = min(b["prefill_s"], r[2])
        if r[4] / r[3] < b["decode_s"] / b["n_decode"]:
            b["decode_s"], b["n_decode"] = r[4], r[3]
        if len(r) > 5:
            b["paired"].append((r[3] / r[4], r[5]))
    return best


def paired(run_once, repeats, probe, bws):
    """run_once() repeats times, a bandwidth probe between runs (and before the first, after the
    last): its rows, each with the larger probe around its run appended. The probes join bws."""
    rows, after = [], probe()
    bws.append(after)
    for _ in range(repeats):
        before, rs = after, run_once()
        after = probe()
        bws.append(after)
        rows += [r + (max(before, after),) for r in rs]
    return rows


# ---- the llama.cpp side ---------------------------------------------------------------------

def llama_runs(npm_dir, gguf, prompts, repeats, new, threads, env):
    """llama.cpp (node-llama-cpp's prebuilt CPU build) on the same prompt ids, greedy."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(prompts, f)
        path = f.name
    try:
        r = run_measured(["node", os.path.join(ROOT, "bench", "llama_peer.mjs"), gguf, path,
                          str(new), str(threads), str(repeats)], dict(env, CTITAN_LLAMA_NPM=npm_dir))
    finally:
        os.unlink(path)
    if r.returncode != 0:
        sys.exit("llama.cpp failed:\n" + r.stderr[-3000:])
    PEAK_RSS["llama.cpp " + os.path.basename(gguf)] = r.peak_rss
    out = json.loads(r.stdout.strip().splitlines()[-1])
    return [(prompts[[len(p) for p in prompts].index(x["n"])], x["ids"], x["prefill_s"],
             new - 1, x["decode_s"]) for x in out["runs"]]


def first_divergence(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def figures(g, T, b, peak, bw, wbytes):
    flops = prefill_flops(g, T)
    prefill_tps = T / b["prefill_s"]
    decode_tps = b["n_decode"] / b["decode_s"]
    bound = bw * 1e9 / wbytes
    pairs = {}
    if b["paired"]:  # each run against the memory's rate measured around it
        ratios = sorted(tps * wbytes / (pbw * 1e9) for tps, pbw in b["paired"])
        pairs = {"decode_of_paired_bound": round(ratios[(len(ratios) - 1) // 2], 4),
                 "decode_of_paired_bound_runs": [round(x, 4) for x in ratios]}
    return {"prefill_tokens_per_s": round(prefill_tps, 1),
            "prefill_gflops": round(flops / b["prefill_s"] / 1e9, 2),
            "prefill_mfu": round(flops / b["prefill_s"] / 1e9 / peak, 4),
            "decode_tokens_per_s": round(decode_tps, 3),
            "decode_ms_per_token": round(1e3 / decode_tps, 2),
            "decode_bound_tokens_per_s": round(bound, 3),
            "decode_of_bound": round(decode_tps / bound, 4), **pairs}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--prompts", default="128,512", help="prompt lengths in tokens")
    ap.add_argument("--new", type=int, default=32, help="new tokens per prompt")
    ap.add_argument("--repeats", type=int, default=2, help="runs of each prompt (the best kept)")
    ap.add_argument("--bf16", action="store_true", help="also ctitan with bf16 weights")
    ap.add_argument("--no-torch", action="store_true", help="leave out the PyTorch side")
    ap.add_argument("--no-fp32", action="store_true",
                    help="with --bf16: leave out the fp32 sides (ctitan's and llama.cpp's)")
    ap.add_argument("--geometry", choices=sorted(GEOMETRIES), default="0.6B")
    ap.add_argument("--llama", default=os.path.join(ROOT, "assets", "llama"),
                    help="folder where bench/setup-llama installed node-llama-cpp ('' skips it)")
    ap.add_argument("--torch-worker", nargs=2, metavar=("DIR", "PROMPTS"))
    args = ap.parse_args()
    if args.torch_worker:
        return torch_worker(*args.torch_worker, args.new, args.threads)

    import moe
    import gguf
    g = dict(GEOMETRIES[args.geometry], **COMMON)
    lengths = [int(x) for x in args.prompts.split(",")]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads),
               OPENBLAS_NUM_THREADS=str(args.threads))
    ct = os.path.join(args.build, "ctitan")
    bench = os.path.join(args.build, "bench_step")
    tok = os.path.join(ROOT, "assets", "qwen3-tokenizer")
    load_before = round(os.getloadavg()[0], 2)

    def gemm_peak(kind):  # "sgemm" (OpenBLAS fp32) or "bf16" (oneDNN), 2048^3, best of 5
        out = subprocess.run([bench, kind, "2048", "5"], check=True, capture_output=True,
                             text=True, env=env).stdout
        return json.loads(out.strip().splitlines()[-1])[kind + "_gflops"]

    def sgemm_peak():
        return gemm_peak("sgemm")

    n_layers, n_head = layer_matmul_params(g), g["V"] * g["C"]
    result = {"config": dict(g, prompts=lengths, new_tokens=args.new, batch=1),
              "threads": args.threads, "loadavg_1min_before": load_before,
              "flops_formula": "2*N_layers*T + 2*V*C + 2*L*NH*D*T*(T+1)",
              "weight_bytes_formula": "(N_layers + V*C) * (4 fp32 | 2 bf16)",
              "n_layers_matmul_params": n_layers, "lm_head_params": n_head}
    with tempfile.TemporaryDirectory() as tmp:
        folder = os.path.join(tmp, "model")
        log("writing the model (%.2f GB)" % ((n_layers + n_head) * 4 / 1e9))
        moe.write_model(folder, g, SEED, args.threads)
        with open(os.path.join(folder, "generation_config.json"), "w") as f:
            json.dump({"eos_token_id": -1}, f)  # no stop but the length
        log("sgemm peak, bandwidth")
        peaks, bws = [sgemm_peak()], [bandwidth_gbs(bench, env)]
        peaks16 = [gemm_peak("bf16")] if args.bf16 else []
        sides = {}
        fp32 = not (args.no_fp32 and args.bf16)

        def probe():
            return bandwidth_gbs(bench, env, repeats=3)

        if fp32:
            log("ctitan fp32")
            runs = paired(lambda: ctitan_runs(ct, folder, tok, lengths, 1, args.new, env, []),
                          args.repeats, probe, bws)
            sides["ctitan"] = (best_by_length(runs), 4)
        if args.bf16:
            log("ctitan bf16")
            runs16 = paired(lambda: ctitan_runs(
                ct, folder, tok, lengths, 1, args.new, env,
                ["--training.mixed_precision_param", "bfloat16"]), args.repeats, probe, bws)
            sides["ctitan_bf16"] = (best_by_length(runs16), 2)
        prompts = {len(r[0]): r[0] for r in (runs if fp32 else runs16)}
        assert sorted(prompts) == sorted(lengths), sorted(prompts)
        if not args.no_torch and fp32:
            log("pytorch eager")
            ppath = os.path.join(tmp, "prompts.json")
            json.dump([prompts[n] for _ in range(args.repeats) for n in lengths], open(ppath, "w"))
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--threads",
                                  str(args.threads), "--new", str(args.new), "--torch-worker",
                                  folder, ppath], check=True, capture_output=True, text=True,
                                 env=env).stdout
            trows = json.loads(out.strip().splitlines()[-1])
            sides["pytorch"] = (best_by_length(
                [(prompts[r["n"]], r["ids"], r["prefill_s"], r["n_decode"], r["decode_s"])
                 for r in trows]), 4)
        use_llama = bool(args.llama) and os.path.isdir(os.path.join(args.llama, "node_modules"))
        if args.llama and not use_llama:
            log(f"no llama.cpp at {args.llama} (bench/setup-llama installs it): left out")
        for dt, name, wb in ([("f32", "llama_cpp", 4)] if fp32 else []) + (
                [("bf16", "llama_cpp_bf16", 2)] if args.bf16 else []):
            if not use_llama:
                break
            log(f"llama.cpp {dt}: converting to GGUF")
            path = gguf.convert(folder, os.path.join(tmp, f"model-{dt}.gguf"), dt, tok)
            log(f"llama.cpp {dt}")
            sides[name] = (best_by_length(paired(lambda: llama_runs(
                args.llama, path, [prompts[n] for n in lengths], 1, args.new, args.threads,
                env), args.repeats, probe, bws)), wb)
            os.unlink(path)
        peaks.append(sgemm_peak())
        bws.append(bandwidth_gbs(bench, env))
        if args.bf16:
            peaks16.append(gemm_peak("bf16"))
    peak, bw = max(peaks), max(bws)
    result.update({"sgemm_peak_gflops": peak, "sgemm_runs_gflops": peaks,
                   "bandwidth_gbs": round(bw, 2), "bandwidth_runs_gbs": [round(b, 2) for b in bws],
                   "bandwidth_method": "bench_step bandwidth: C streaming read of 1 GiB over %d"
                                       " OpenMP threads, 64-byte loads, best of 5 (3 between"
                                       " repeats)" % args.threads})
    if peaks16:
        result.update({"bf16_peak_gflops": max(peaks16), "bf16_runs_gflops": peaks16})
    # Keys and values a position holds: ctitan's cache is in its compute dtype (fp32, or bf16),
    # llama.cpp's in f16 (its default type_k / type_v) whatever the weights.
    kv_per_pos = 2 * g["L"] * g["NKV"] * g["D"]
    ref = "ctitan" if "ctitan" in sides else "ctitan_bf16"  # whose greedy ids the others meet
    for name, (best, wb) in sides.items():
        wbytes = (n_layers + n_head) * wb
        # MFU against the peak of the dtype the products run in: bf16 sides against oneDNN's
        # bf16 matmul (over 100% against the fp32 peak said nothing).
        side_peak = max(peaks16) if wb == 2 else peak
        result[name] = {"weight_bytes_per_token": wbytes,
                        "mfu_peak": "bf16 (oneDNN)" if wb == 2 else "fp32 (OpenBLAS sgemm)"}
        for T in lengths:
            f = figures(g, T, best[T], side_peak, bw, wbytes)
            kv_size = 2 if name.startswith("llama") else wb
            f["kv_bytes_per_token"] = kv_per_pos * kv_size * (T + args.new // 2)
            if name != ref:
                f["ids_match_" + ref] = best[T]["ids"] == sides[ref][0][T]["ids"]
                f["ids_same_until"] = first_divergence(best[T]["ids"], sides[ref][0][T]["ids"])
            result[name][str(T)] = f
    if "pytorch" in sides:
        result["ctitan_vs_pytorch"] = {
            str(T): {"prefill": round(sides["pytorch"][0][T]["prefill_s"]
                                      / sides["ctitan"][0][T]["prefill_s"], 3),
                     "decode": round(result["ctitan"][str(T)]["decode_tokens_per_s"]
                                     / result["pytorch"][str(T)]["decode_tokens_per_s"], 3)}
            for T in lengths}
    for ours, peer in [("ctitan", "llama_cpp"), ("ctitan_bf16", "llama_cpp_bf16")]:
        if ours in sides and peer in sides:  # > 1: ctitan faster
            result[f"{ours}_vs_{peer}"] = {
                str(T): {"prefill": round(sides[peer][0][T]["prefill_s"]
                                          / sides[ours][0][T]["prefill_s"], 3),
                         "decode": round(result[ours][str(T)]["decode_tokens_per_s"]
                                         / result[peer][str(T)]["decode_tokens_per_s"], 3)}
                for T in lengths}
    result["peak_rss_gib"] = {k: round(v / 2**30, 3) for k, v in PEAK_RSS.items() if v}
    result["loadavg_1min_after"] = round(os.getloadavg()[0], 2)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
