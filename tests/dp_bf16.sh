#!/usr/bin/env bash
# Data parallel with training.mixed_precision_reduce = "bfloat16" (issue 18), under real mpirun,
# ZeRO-1 and replicated (FSDP's bf16 reduction is in fsdp.sh)
# on a tiny reference model with bf16 mixed precision: the gradients go out as bf16 (each
# addition rounded to bf16) and come back into the fp32 gradient. Checked: the log says so; a
# rerun is bit-identical (the sums are deterministic); ZeRO-1 and replicated state give the same
# bits (two ranks: one addition either way); and the curve stays within a bound of the float32
# reduction's.
set -u
: "${CTITAN_BIN:?run through ctest}" "${CTITAN_REF_DIR:?}" "${CTITAN_TMP:?}" "${CTITAN_PYTHON:?}"
source "$(dirname "$0")/mpi_test.bash"
tmp=$CTITAN_TMP
rm -rf "$tmp"; mkdir -p "$tmp"
case=$CTITAN_REF_DIR/bf16/dense_odd_gqa3_untied_f32

# run NAME REDUCE [--key value ...]: 2 ranks, 12 steps, bf16 GEMMs, gradients summed in REDUCE
run() {
  local name=$1 reduce=$2; shift 2
  mpirun --oversubscribe --bind-to none -np 2 "$CTITAN_BIN" train --model.backend hf \
    --model.hf_path "$case/hf" --training.dataset_path "$case/tokens.npy" --training.seq_len 12 \
    --training.local_batch_size 2 --training.steps 12 --training.shuffle false \
    --lr_scheduler.warmup_steps 2 --optimizer.lr 3e-3 --metrics.log_freq 1 \
    --metrics.peak_gflops 100 --checkpoint.enable false --parallelism.threads_per_rank 1 \
    --training.mixed_precision_param bfloat16 --training.mixed_precision_reduce "$reduce" \
    --parallelism.data_parallel_shard_mode zero1 --job.dump_folder "$tmp/$name" "$@" >"$tmp/$name.log" 2>&1 ||
    bad "$name: rc $?: $(tail -3 "$tmp/$name.log")"
}
losses() { grep -o '"loss":[^,}]*' "$tmp/$1/metrics.jsonl" | cut -d: -f2 | tr '\n' ' '; }

run fp32 float32
run bf16 bfloat16
run bf16_again bfloat16
run bf16_replicated bfloat16 --parallelism.data_parallel_replicate_degree 2 \
  --parallelism.data_parallel_shard_degree 1
grep -q "gradient bucket(s) of up to .*, in bfloat16$" "$tmp/bf16.log" && ok ||
  bad "the log does not say the gradients are reduced in bfloat16: $(grep '^comm' "$tmp/bf16.log")"
grep -q "gradient bucket(s) of up to .*, in float32$" "$tmp/fp32.log" && ok || bad "fp32 reduce not logged"
[ -n "$(losses bf16)" ] && [ "$(losses bf16)" = "$(losses bf16_again)" ] && ok ||
  bad "bf16 reduce: rerun differs: $(losses bf16) vs $(losses bf16_again)"
[ "$(losses bf16)" = "$(losses bf16_replicated)" ] && ok ||
  bad "bf16 reduce: ZeRO-1 and replicated differ: $(losses bf16) vs $(losses bf16_replicated)"
# The bf16 sums against the fp32 ones, 12 steps: measured mean |diff| 4.4e-4 (bound 5e-3), and
# they must differ (else nothing went out in bf16).
"$CTITAN_PYTHON" - "$(losses bf16)" "$(losses fp32)" <<'PY' && ok || bad "bf16 reduce curve: $(losses bf16) vs $(losses fp32)"
import sys
a, b = ([float(x) for x in s.split()] for s in sys.argv[1:3])
d = sum(abs(x - y) for x, y in zip(a, b)) / len(a)
print(f"bf16 against fp32 reduction, 12 steps: mean |loss diff| {d:.2e} (bound 5e-3)")
sys.exit(0 if len(a) == len(b) == 12 and 0 < d <= 5e-3 else 1)
PY

finish
