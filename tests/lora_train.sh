#!/usr/bin/env bash
# LoRA through the trainer (issue 31): the first step's loss is the base model's (B = 0); the
# checkpoints hold the adapter and its AdamW state, not the base; a resume is bit for bit; DDP,
# ZeRO-1 and FSDP (the base sharded, the adapter under ZeRO-1) over 2 ranks equal one process on
# the same global batch, bit for bit, dense and MoE, fp32 and bf16; FSDP and HSDP over 4 within
# 1e-6; an FSDP run resumes bit for bit under FSDP and in one process; a MoE model's bf16 experts
# with adapters under FSDP equal one process and resume bit for bit; refusals (an unknown module,
# a rank disagreeing with lora.adapter_path's, a resume on another base) are one line each. A LoRA run exports a PEFT
# adapter folder (the checkpoint's adapter bit for bit) that a run, eval and export --merge start
# from; a MoE model's holds every expert's adapter under PEFT's per-expert keys.
set -u
: "${CTITAN_BIN:?run through ctest}" "${CTITAN_TMP:?}" "${CTITAN_REF_DIR:?}" "${CTITAN_PYTHON:?}"
source "$(dirname "$0")/mpi_test.bash" # ok, bad, finish, same, Open MPI's settings
ct=$CTITAN_BIN
tmp=$CTITAN_TMP; rm -rf "$tmp"; mkdir -p "$tmp"
ref=$CTITAN_REF_DIR/lora/untied_all_f32
base=(--model.backend hf
      --training.seq_len 12 --training.shuffle false --lr_scheduler.warmup_steps 1
      --optimizer.lr 0.01 --metrics.log_freq 1 --metrics.peak_gflops 100)
lora=(--lora.rank 4 --lora.alpha 8 --lora.target_modules all-linear)
run() { # NP DUMP [options]: a run of the model in $HF (default: the reference's) with the base
  # options, its output in DUMP.log
  local np=$1 dump=$2; shift 2
  local model=(--model.hf_path "${HF:-$ref/hf}" --training.dataset_path "${DATA:-$ref/tokens.npy}")
  if [ "$np" -eq 1 ]; then
    OMP_NUM_THREADS=1 "$ct" train "${base[@]}" "${model[@]}" --job.dump_folder "$dump" "$@" \
      >"$dump.log" 2>&1
  else
    mpirun --oversubscribe --bind-to none -np "$np" "$ct" train "${base[@]}" "${model[@]}" \
      --job.dump_folder "$dump" --parallelism.threads_per_rank 1 "$@" >"$dump.log" 2>&1
  fi
}
evloss() { "$CTITAN_PYTHON" -c 'import json,sys; d=json.load(sys.stdin); print(repr(d[sys.argv[1]][0] if sys.argv[1] == "step_losses" else d["loss"]))' "$1"; }
loss1() { "$CTITAN_PYTHON" -c 'import json,sys; print(repr(json.loads(open(sys.argv[1]).readline())["loss"]))' "$1/metrics.jsonl"; }

# The first step: with B = 0 the loss is the full model's, bit for bit.
run 1 "$tmp/full" --training.steps 1 --training.local_batch_size 2 --checkpoint.enable false &&
  run 1 "$tmp/one" --training.steps 1 --training.local_batch_size 2 --checkpoint.enable false \
    "${lora[@]}" && ok || bad "first-step runs: $(tail -3 "$tmp/one.log")"
[ "$(loss1 "$tmp/full")" = "$(loss1 "$tmp/one")" ] && ok ||
  bad "first step: LoRA loss $(loss1 "$tmp/one"), the base's $(loss1 "$tmp/full")"
grep -q "^lora: rank 4, alpha 8 (scaling 2), dropout 0, all-linear: 5504 adapter parameters (28 tensors); the base is frozen$" "$tmp/one.log" &&
  ok || bad "the lora line: $(grep '^lora:' "$tmp/one.log")"

# Straight: 4 steps, a checkpoint every 2; the checkpoint holds the adapter only.
run 1 "$tmp/a" --training.steps 4 --training.local_batch_size 2 --checkpoint.interval 2 \
  "${lora[@]}" && ok || bad "straight run: $(tail -3 "$tmp/a.log")"
keys=$("$CTITAN_PYTHON" -c '
import json, struct, sys
f = open(sys.argv[1], "rb"); n = struct.unpack("<Q", f.read(8))[0]; h = json.loads(f.read(n))
h.pop("__metadata__", None)
print(len(h), all(k.startswith("base_model.model.model.layers.") and ".lora_" in k for k in h))
' "$tmp/a/checkpoint/step-4/model.safetensors")
[ "$keys" = "28 True" ] && ok || bad "the checkpoint's model: $keys (expected the 28 adapter tensors)"
grep -q '"base_xxh64"' "$tmp/a/checkpoint/step-4/state.json" && ok || bad "no base identity in state.json"

# Its export is a PEFT adapter folder: the step-4 adapter, bit for bit, under PEFT's keys.
"$ct" export --checkpoint "$tmp/a/checkpoint/step-4" --output "$tmp/a-peft" >"$tmp/a-peft.log" 2>&1 &&
  grep -q '"peft_type": "LORA"' "$tmp/a-peft/adapter_config.json" && ok ||
  bad "export of a LoRA checkpoint: $(tail -3 "$tmp/a-peft.log")"
same_tensors() { # A B: the two safetensors files hold the same tensors, bit for bit
  "$CTITAN_PYTHON" - "$1" "$2" <<'PY'
import json, struct, sys
def read(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
    h.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in h.items()}
a, b = read(sys.argv[1]), read(sys.argv[2])
sys.exit(0 if a == b and len(a) > 0 else 1)
PY
}
same_tensors "$tmp/a/checkpoint/step-4/model.safetensors" "$tmp/a-peft/adapter_model.safetensors" &&
  ok || bad "the exported adapter differs from the checkpoint's"

# Resume from step 2: the same bits at step 4.
mkdir -p "$tmp/b" && cp -r "$tmp/a/checkpoint" "$tmp/b/" && rm -rf "$tmp/b/checkpoint/step-4"
run 1 "$tmp/b" --training.steps 4 --training.local_batch_size 2 --checkpoint.interval 2 \
  "${lora[@]}" && grep -q "resumed from .*step-2 " "$tmp/b.log" && ok ||
  bad "resume: $(tail -3 "$tmp/b.log")"
cmp -s "$tmp/a/checkpoint/step-4/model.safetensors" "$tmp/b/checkpoint/step-4/model.safetensors" &&
  cmp -s "$tmp/a/checkpoint/step-4/optimizer-00000-of-00001.safetensors" \
    "$tmp/b/checkpoint/step-4/optimizer-00000-of-00001.safetensors" && ok ||
  bad "resume: the adapter or its AdamW state at step 4 differ from the straight run's"

# With dropout the masks continue from the checkpoint's count of forwards: the same bits too.
for d in da db; do
  [ $d = db ] && mkdir -p "$tmp/db" && cp -r "$tmp/da/checkpoint" "$tmp/db/" &&
    rm -rf "$tmp/db/checkpoint/step-4"
  run 1 "$tmp/$d" --training.steps 4 --training.local_batch_size 2 --checkpoint.interval 2 \
    "${lora[@]}" --lora.dropout 0.2 && ok || bad "dropout run $d: $(tail -3 "$tmp/$d.log")"
done
grep -q "resumed from .*step-2 " "$tmp/db.log" &&
  cmp -s "$tmp/da/checkpoint/step-4/model.safetensors" "$tmp/db/checkpoint/step-4/model.safetensors" &&
  ok || bad "dropout 0.2: the resumed adapter at step 4 differs from the straight run's"
[ "$(loss1 "$tmp/da")" != "$(loss1 "$tmp/a")" ] || "$CTITAN_PYTHON" -c '
import json, sys
a = [json.loads(l)["loss"] for l in open(sys.argv[1]) if "\"loss\"" in l]
b = [json.loads(l)["loss"] for l in open(sys.argv[2]) if "\"loss\"" in l]
sys.exit(0 if a[1:] != b[1:] else 1)' "$tmp/da/metrics.jsonl" "$tmp/a/metrics.jsonl" && ok ||
  bad "dropout 0.2 leaves the losses as without"

# DDP and ZeRO-1 over 2 ranks: the straight run's global batch of 2 (one sequence per rank).
run 1 "$tmp/g1" --training.steps 3 --training.local_batch_size 1 --training.global_batch_size 2 \
  --checkpoint.interval 3 "${lora[@]}" && ok || bad "np1 accum 2: $(tail -3 "$tmp/g1.log")"
run 2 "$tmp/ddp" --training.steps 3 --training.local_batch_size 1 --checkpoint.interval 3 \
  --parallelism.data_parallel_replicate_degree 2 "${lora[@]}" && ok ||
  bad "DDP: $(tail -3 "$tmp/ddp.log")"
same "$tmp/ddp" "$tmp/g1" 0 0 0 && ok || bad "DDP np2 differs from np1"
run 2 "$tmp/zero1" --training.steps 3 --training.local_batch_size 1 --checkpoint.interval 3 \
  --parallelism.data_parallel_shard_mode zero1 "${lora[@]}" && ok ||
  bad "ZeRO-1: $(tail -3 "$tmp/zero1.log")"
# (ZeRO-1's gradient norm sums the two shards' squares in another order: measured 3e-16.)
same "$tmp/zero1" "$tmp/g1" 0 1e-14 0 && ok || bad "ZeRO-1 np2 differs from np1"

# FSDP over 2 ranks (the default data parallelism): the base sharded, gathered, never a gradient.
run 2 "$tmp/fsdp" --training.steps 3 --training.local_batch_size 1 --checkpoint.interval 3 \
  "${lora[@]}" && grep -q "gathers in float32, the frozen base: no gradients" "$tmp/fsdp.log" &&
  ok || bad "LoRA under FSDP: $(tail -3 "$tmp/fsdp.log")"
same "$tmp/fsdp" "$tmp/g1" 0 1e-14 0 && ok || bad "LoRA under FSDP np2 differs from np1"
# bf16: the base held in bf16 only, its shard too (its norms whole on every rank); with dropout
# and a validation of the whole split, 9 windows (the rank without a last batch still runs the
# forward's gathers).
bf=(--training.mixed_precision_param bfloat16 --lora.dropout 0.2 --validation.enable true
    --validation.dataset_path "$ref/tokens.npy" --validation.freq 1 --validation.steps -1)
run 1 "$tmp/g1b" --training.steps 3 --training.local_batch_size 1 --training.global_batch_size 2 \
  --checkpoint.interval 3 "${lora[@]}" "${bf[@]}" && ok || bad "np1 bf16: $(tail -3 "$tmp/g1b.log")"
run 2 "$tmp/fsdpb" --training.steps 3 --training.local_batch_size 1 --checkpoint.interval 3 \
  "${lora[@]}" "${bf[@]}" && ok || bad "LoRA under FSDP, bf16: $(tail -3 "$tmp/fsdpb.log")"
same "$tmp/fsdpb" "$tmp/g1b" 0 1e-14 0 && ok || bad "LoRA under FSDP np2 bf16 differs from np1"
[ "$(grep val_loss "$tmp/fsdpb/metrics.jsonl")" = "$(grep val_loss "$tmp/g1b/metrics.jsonl")" ] &&
  [ "$(grep -c val_loss "$tmp/g1b/metrics.jsonl")" = 3 ] && ok ||
  bad "LoRA under FSDP: the validation losses differ from one process's"
# FSDP over 4 and HSDP 2 x 2 (a global batch of 4): the adapter's gradients are summed in another
# order than one process's accumulation (measured 2e-8 in the loss, 9e-8 in the weights).
if full; then
  run 1 "$tmp/g4" --training.steps 3 --training.local_batch_size 1 --training.global_batch_size 4 \
    --checkpoint.interval 3 "${lora[@]}" && ok || bad "np1 accum 4: $(tail -3 "$tmp/g4.log")"
  for r in 1 2; do
    run 4 "$tmp/fsdp4-$r" --training.steps 3 --training.local_batch_size 1 --checkpoint.interval 3 \
      --parallelism.data_parallel_replicate_degree $r "${lora[@]}" && ok ||
      bad "LoRA under FSDP np4, $r replica(s): $(tail -3 "$tmp/fsdp4-$r.log")"
    same "$tmp/fsdp4-$r" "$tmp/g4" 1e-6 1e-6 1e-6 && ok || bad "LoRA FSDP np4 ($r replicas) vs np1"
  done
fi
# A MoE model under FSDP (every expert adapted): one process's run, bit for bit; its checkpoints
# resume bit for bit under FSDP and in one process; its final export is the checkpoint's adapter.
moe=$CTITAN_REF_DIR/lora/moe_mixed_all_f32
mrun() { HF=$moe/hf DATA=$moe/tokens.npy run "$@" --training.steps 4 --training.local_batch_size 1 \
  --checkpoint.interval 2 "${lora[@]}"; }
mrun 1 "$tmp/m1" --training.global_batch_size 2 && mrun 2 "$tmp/mf" --checkpoint.last_save_in_hf true &&
  ok || bad "MoE under FSDP: $(tail -3 "$tmp/mf.log")"
same "$tmp/mf" "$tmp/m1" 0 1e-14 0 && ok || bad "MoE: LoRA under FSDP np2 differs from np1"
for np in 2 1; do
  mkdir -p "$tmp/mf$np" && cp -r "$tmp/mf/checkpoint" "$tmp/mf$np/" && rm -rf "$tmp/mf$np/checkpoint/step-4"
  mrun $np "$tmp/mf$np" --training.global_batch_size 2 && grep -q "resumed from .*step-2 " "$tmp/mf$np.log" &&
    cmp -s "$tmp/mf/checkpoint/step-4/model.safetensors" "$tmp/mf$np/checkpoint/step-4/model.safetensors" &&
    ok || bad "MoE: the FSDP checkpoint resumed on $np rank(s) differs at step 4"
done
same_tensors "$tmp/mf/checkpoint/step-4/model.safetensors" "$tmp/mf/hf/adapter_model.safetensors" &&
  ok || bad "MoE: the FSDP run's export differs from its checkpoint's adapter"

# With dropout too: the masks follow each sample's place in the run, not the rank or micro-batch.
run 1 "$tmp/g1d" --training.steps 3 --training.local_batch_size 1 --training.global_batch_size 2 \
  --checkpoint.interval 3 "${lora[@]}" --lora.dropout 0.2 && ok || bad "np1 dropout: $(tail -3 "$tmp/g1d.log")"
run 2 "$tmp/ddpd" --training.steps 3 --training.local_batch_size 1 --checkpoint.interval 3 \
  --parallelism.data_parallel_replicate_degree 2 "${lora[@]}" --lora.dropout 0.2 && ok ||
  bad "DDP dropout: $(tail -3 "$tmp/ddpd.log")"
same "$tmp/ddpd" "$tmp/g1d" 0 0 0 && ok || bad "DDP np2 with dropout differs from np1"

# Refusals, one line each.
refused() { # NAME PATTERN NP [options]
  local name=$1 pattern=$2 np=$3; shift 3
  run "$np" "$tmp/$name" --training.steps 1 --training.local_batch_size 1 "$@"
  local rc=$?
  if [ $rc -ne 0 ] && [ "$(grep -c '^ctitan: error:' "$tmp/$name.log")" -ge 1 ] &&
    grep -qE -- "$pattern" "$tmp/$name.log"; then ok; else bad "$name: rc $rc: $(tail -3 "$tmp/$name.log")"; fi
}
refused module 'unknown module "qkv_proj"' 1 --lora.rank 4 --lora.target_modules q_proj,qkv_proj
refused adapter-rank "lora.rank = 8, but .*adapter_config.json has r 4" 1 --lora.rank 8 \
  --lora.adapter_path "$tmp/a-peft"
refused cp "LoRA under context parallelism is not supported yet" 2 "${lora[@]}" \
  --parallelism.context_parallel_degree 2
# A MoE model (test_lora.c has the arithmetic): all-linear adapts each expert under PEFT's
# per-expert keys; a run from its export starts at eval's loss with the adapter, bit for bit; the
# merged export's eval loss is the adapter's within rounding.
HF=$moe/hf DATA=$moe/tokens.npy run 1 "$tmp/moe" --training.steps 2 --training.local_batch_size 2 \
  --checkpoint.interval 2 --checkpoint.last_save_in_hf true "${lora[@]}" &&
  "$CTITAN_PYTHON" - "$tmp/moe/hf/adapter_model.safetensors" <<'PY' && ok || bad "MoE run: $(tail -3 "$tmp/moe.log")"
import json, struct, sys
f = open(sys.argv[1], "rb"); n = struct.unpack("<Q", f.read(8))[0]; h = json.loads(f.read(n))
sys.exit(0 if "base_model.model.model.layers.1.mlp.experts.5.down_proj.lora_B.weight" in h and
         "base_model.model.model.layers.0.mlp.gate_proj.lora_A.weight" in h else 1)
PY
HF=$moe/hf DATA=$moe/tokens.npy run 1 "$tmp/moe-f" --training.steps 1 --training.local_batch_size 2 \
  --checkpoint.enable false --lora.adapter_path "$tmp/moe/hf" && ok ||
  bad "a MoE run from the adapter: $(tail -3 "$tmp/moe-f.log")"
mev=(--training.dataset_path "$moe/tokens.npy" --training.seq_len 12 --training.shuffle false
     --training.local_batch_size 2 --json)
OMP_NUM_THREADS=1 "$ct" eval --model.backend hf --model.hf_path "$moe/hf" "${mev[@]}" \
  --lora.adapter_path "$tmp/moe/hf" >"$tmp/moe-ev.json" 2>"$tmp/moe-ev.log" &&
  [ "$(evloss step_losses <"$tmp/moe-ev.json")" = "$(loss1 "$tmp/moe-f")" ] && ok ||
  bad "MoE: eval with the adapter $(evloss step_losses <"$tmp/moe-ev.json"), the run from it $(loss1 "$tmp/moe-f")"
"$ct" export --merge --model.hf_path "$moe/hf" --lora.adapter_path "$tmp/moe/hf" \
  --output "$tmp/moe-merged" >"$tmp/moe-merged.log" 2>&1 &&
  OMP_NUM_THREADS=1 "$ct" eval --model.backend hf --model.hf_path "$tmp/moe-merged" "${mev[@]}" \
    >"$tmp/moe-ev-merged.json" 2>>"$tmp/moe-merged.log" &&
  "$CTITAN_PYTHON" -c 'import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); sys.exit(0 if abs(a - b) <= 1e-5 * abs(b) else 1)' \
    "$(evloss loss <"$tmp/moe-ev-merged.json")" "$(evloss loss <"$tmp/moe-ev.json")" && ok ||
  bad "MoE merged: $(tail -3 "$tmp/moe-merged.log")"
# bf16 experts, every expert adapted (test_lora.c has the arithmetic against autocast), with
# dropout: FSDP over 2 ranks equals one process on the same global batch, and a resume from step 2
# on the guarded backend (--debug.guard_device_memory: the new kernels touch backend memory only
# inside backend calls) gives the straight run's adapter and AdamW state at step 4, bit for bit.
bm=(--training.mixed_precision_param bfloat16 --lora.dropout 0.2)
mrun 1 "$tmp/mb" --training.global_batch_size 2 "${bm[@]}" && grep -q "MoE experts" "$tmp/mb.log" &&
  ok || bad "MoE bf16: $(tail -3 "$tmp/mb.log")"
if full; then # (the sanitizer pass runs the fp32 MoE model under FSDP above)
  mrun 2 "$tmp/mbf" "${bm[@]}" && ok || bad "MoE bf16 under FSDP: $(tail -3 "$tmp/mbf.log")"
  same "$tmp/mbf" "$tmp/mb" 0 1e-14 0 && ok || bad "MoE bf16: LoRA under FSDP np2 differs from np1"
fi
mkdir -p "$tmp/mb2" && cp -r "$tmp/mb/checkpoint" "$tmp/mb2/" && rm -rf "$tmp/mb2/checkpoint/step-4"
mrun 1 "$tmp/mb2" --training.global_batch_size 2 "${bm[@]}" --debug.guard_device_memory true &&
  grep -q "resumed from .*step-2 " "$tmp/mb2.log" &&
  cmp -s "$tmp/mb/checkpoint/step-4/model.safetensors" "$tmp/mb2/checkpoint/step-4/model.safetensors" &&
  cmp -s "$tmp/mb/checkpoint/step-4/optimizer-00000-of-00001.safetensors" \
    "$tmp/mb2/checkpoint/step-4/optimizer-00000-of-00001.safetensors" && ok ||
  bad "MoE bf16: the resumed adapter or its AdamW state at step 4 differ: $(tail -3 "$tmp/mb2.log")"
# The final export (last_save_in_hf) writes the same folder; a run started from it
# (lora.adapter_path alone: the [lora] keys are the file's) has, at its first step, the loss eval
# gives base + adapter on that batch, bit for bit, and not the base's (B is trained, non-zero);
# the merged model's eval loss is the adapter's within rounding.
run 1 "$tmp/e" --training.steps 4 --training.local_batch_size 2 --checkpoint.interval 4 \
  --checkpoint.last_save_in_hf true "${lora[@]}" && cmp -s "$tmp/e/hf/adapter_model.safetensors" \
  "$tmp/a-peft/adapter_model.safetensors" && cmp -s "$tmp/e/hf/adapter_config.json" \
  "$tmp/a-peft/adapter_config.json" && ok || bad "the final export: $(tail -3 "$tmp/e.log")"
run 1 "$tmp/f" --training.steps 1 --training.local_batch_size 2 --checkpoint.enable false \
  --lora.adapter_path "$tmp/e/hf" &&
  grep -q "^lora: rank 4, alpha 8 (scaling 2), dropout 0, all-linear: 5504 adapter" "$tmp/f.log" &&
  grep -q "^lora: the adapter starts as $tmp/e/hf's$" "$tmp/f.log" &&
  ok || bad "a run from the adapter: $(tail -3 "$tmp/f.log")"
ev=(--training.dataset_path "$ref/tokens.npy" --training.seq_len 12 --training.shuffle false
    --training.local_batch_size 2 --json)
OMP_NUM_THREADS=1 "$ct" eval --model.backend hf --model.hf_path "$ref/hf" "${ev[@]}" \
  --lora.adapter_path "$tmp/e/hf" >"$tmp/ev-lora.json" 2>"$tmp/ev-lora.log" && ok ||
  bad "eval with the adapter: $(tail -3 "$tmp/ev-lora.log")"
first=$(evloss step_losses <"$tmp/ev-lora.json")
[ "$first" = "$(loss1 "$tmp/f")" ] && [ "$first" != "$(loss1 "$tmp/full")" ] && ok ||
  bad "eval's first step with the adapter $first, the run from it $(loss1 "$tmp/f"), the base $(loss1 "$tmp/full")"
"$ct" export --merge --model.hf_path "$ref/hf" --lora.adapter_path "$tmp/e/hf" \
  --output "$tmp/merged" >"$tmp/merged.log" 2>&1 &&
  OMP_NUM_THREADS=1 "$ct" eval --model.backend hf --model.hf_path "$tmp/merged" "${ev[@]}" \
    >"$tmp/ev-merged.json" 2>>"$tmp/merged.log" && ok || bad "merged: $(tail -3 "$tmp/merged.log")"
"$CTITAN_PYTHON" -c 'import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); sys.exit(0 if abs(a - b) <= 1e-5 * abs(b) else 1)' \
  "$(evloss loss <"$tmp/ev-merged.json")" "$(evloss loss <"$tmp/ev-lora.json")" && ok ||
  bad "merged eval loss $(evloss loss <"$tmp/ev-merged.json"), base + adapter $(evloss loss <"$tmp/ev-lora.json")"

# generate --lora.adapter_path: base + adapter in prefill and decode, greedy ids equal to the
# merged model's, and not the base's. A model with the ref's layers and a 10000-token slice of
# Qwen3's vocabulary (its embedding and head widened with seeded values), the real tokenizer.
mkdir -p "$tmp/g/hf" && cp "$CTITAN_ASSETS_DIR"/qwen3-tokenizer/tokenizer.json \
  "$CTITAN_ASSETS_DIR"/qwen3-tokenizer/tokenizer_config.json "$tmp/g/hf/"
"$CTITAN_PYTHON" - "$ref/hf" "$tmp/g/hf" <<'PY'
import array, json, random, struct, sys
src, dst = sys.argv[1], sys.argv[2]
b = open(src + "/model.safetensors", "rb").read(); n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n]); h.pop("__metadata__", None)
V, rnd, out = 10000, random.Random(5), {}
for k, v in h.items():
    d, shape = b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]], list(v["shape"])
    if k in ("model.embed_tokens.weight", "lm_head.weight"):
        d += array.array("f", (rnd.gauss(0, 0.5) for _ in range((V - shape[0]) * shape[1]))).tobytes()
        shape[0] = V
    out[k] = (shape, d)
hdr, off = {}, 0
for k in sorted(out):
    hdr[k] = {"dtype": "F32", "shape": out[k][0], "data_offsets": [off, off + len(out[k][1])]}
    off += len(out[k][1])
hb = json.dumps(hdr).encode(); hb += b" " * (-len(hb) % 8)
with open(dst + "/model.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(hb)) + hb + b"".join(out[k][1] for k in sorted(out)))
c = json.load(open(src + "/config.json")); c.update(vocab_size=V, eos_token_id=-1)
json.dump(c, open(dst + "/config.json", "w"))
PY
# (lr 0.1, so that 3 steps move greedy decoding off the base's.)
OMP_NUM_THREADS=1 "$ct" train "${base[@]/#0.01/0.1}" --model.hf_path "$tmp/g/hf" \
  --training.dataset_path "$ref/tokens.npy" \
  --job.dump_folder "$tmp/g/run" --training.steps 3 --training.local_batch_size 2 \
  --checkpoint.interval 3 --checkpoint.last_save_in_hf true "${lora[@]}" >"$tmp/g/run.log" 2>&1 &&
  "$ct" export --merge --model.hf_path "$tmp/g/hf" --lora.adapter_path "$tmp/g/run/hf" \
    --output "$tmp/g/merged" >"$tmp/g/merged.log" 2>&1 && ok ||
  bad "the generation model's run or merge: $(tail -n 3 "$tmp/g/run.log"; tail -n 3 "$tmp/g/merged.log")"
gen=("$ct" generate --temperature 0 --json --max_new_tokens 8 --prompt "Hello, world")
"${gen[@]}" --model.hf_path "$tmp/g/hf" --lora.adapter_path "$tmp/g/run/hf" >"$tmp/g/lora.json" \
  2>"$tmp/g/lora.err" && "${gen[@]}" --model.hf_path "$tmp/g/merged" >"$tmp/g/merged.json" \
  2>/dev/null && "${gen[@]}" --model.hf_path "$tmp/g/hf" >"$tmp/g/base.json" 2>/dev/null && ok ||
  bad "generate: $(tail -3 "$tmp/g/lora.err")"
cmp -s "$tmp/g/lora.json" "$tmp/g/merged.json" && ! cmp -s "$tmp/g/lora.json" "$tmp/g/base.json" &&
  ok || bad "generate with the adapter $(cat "$tmp/g/lora.json"), merged $(cat "$tmp/g/merged.json"), base $(cat "$tmp/g/base.json")"

# Another base under the same config (the same folder, one weight changed): refused.
mkdir -p "$tmp/mybase" && cp -r "$ref/hf" "$tmp/mybase/hf"
HF=$tmp/mybase/hf run 1 "$tmp/c" --training.steps 2 --training.local_batch_size 2 \
  --checkpoint.interval 2 "${lora[@]}" && ok || bad "the run on a copy: $(tail -3 "$tmp/c.log")"
"$CTITAN_PYTHON" - "$tmp/mybase/hf/model.safetensors" <<'PY'
import struct, sys
p = sys.argv[1]; b = bytearray(open(p, "rb").read()); n = struct.unpack("<Q", b[:8])[0]
b[8 + n + 100] ^= 1  # one bit of one weight
open(p, "wb").write(bytes(b))
PY
HF=$tmp/mybase/hf run 1 "$tmp/c" --training.steps 4 --training.local_batch_size 2 \
  --checkpoint.interval 2 "${lora[@]}"
grep -q "^ctitan: error: the checkpoint's LoRA adapter was trained on another base" "$tmp/c.log" &&
  ok || bad "a resume on another base: $(tail -3 "$tmp/c.log")"
finish
