#!/usr/bin/env bash
# MFU's peak is the same from run to run: measured once per machine, CPU model, thread count and
# GEMM dtype, cached (CTITAN_CACHE_DIR here), reused, and the log says which peak and where it
# came from; a bf16 run's is a bf16 GEMM's, never the fp32 line (nor an fp32 run's the bf16 one);
# metrics.peak_gflops wins; lines of other machines and garbage in the cache are left alone; a
# cached peak below what a step achieved is measured again.
set -u
: "${CTITAN_BIN:?run through ctest}" "${CTITAN_TMP:?}" "${CTITAN_REF_DIR:?}"
source "$(dirname "$0")/checks.bash" # ok, bad, finish
tmp=$CTITAN_TMP; rm -rf "$tmp"; mkdir -p "$tmp"
export CTITAN_CACHE_DIR=$tmp/cache
hf=$CTITAN_REF_DIR/train/const_clip_tied_bias
run() { # NAME [options]: one short run; the log in $tmp/NAME.log
  local name=$1; shift
  "$CTITAN_BIN" train --model.backend hf --model.hf_path "$hf/hf" --training.dataset_path \
    "$hf/tokens.npy" --training.steps 2 --training.seq_len 8 --training.local_batch_size 2 \
    --checkpoint.enable false --metrics.log_freq 1 --job.dump_folder "$tmp/$name" "$@" \
    >"$tmp/$name.log" 2>&1 || bad "$name: $(tail -3 "$tmp/$name.log")"
}
peak() { sed -n 's/^mfu: against a peak of \([0-9.]*\) GFLOP\/s per rank.*/\1/p' "$tmp/$1.log"; }

printf 'garbage line\nother-host\tSome CPU\t2\t999.0\n' >"$tmp/seed.tsv"
mkdir -p "$CTITAN_CACHE_DIR"; cp "$tmp/seed.tsv" "$CTITAN_CACHE_DIR/peak_gflops.tsv"
run first
grep -q "^mfu: against a peak of .*(sgemm measured now, cached in $CTITAN_CACHE_DIR/peak_gflops.tsv)" \
  "$tmp/first.log" && ok || bad "first run: $(grep '^mfu' "$tmp/first.log")"
run second
grep -q "^mfu: .*(fp32 GEMMs measured once for this machine and [0-9]* thread(s), cached in $CTITAN_CACHE_DIR" \
  "$tmp/second.log" && ok || bad "second run: $(grep '^mfu' "$tmp/second.log")"
[ -n "$(peak first)" ] && [ "$(peak first)" = "$(peak second)" ] && ok ||
  bad "peaks differ: $(peak first) vs $(peak second)"
[ "$(head -2 "$CTITAN_CACHE_DIR/peak_gflops.tsv")" = "$(cat "$tmp/seed.tsv")" ] && ok ||
  bad "the other lines of the cache were not kept: $(cat "$CTITAN_CACHE_DIR/peak_gflops.tsv")"
[ "$(wc -l <"$CTITAN_CACHE_DIR/peak_gflops.tsv")" -eq 3 ] && ok || bad "one line added per machine"
# bf16: not the fp32 line; its own, measured on the bf16 GEMM, then reused.
grep -q "	fp32	" "$CTITAN_CACHE_DIR/peak_gflops.tsv" && ok || bad "no fp32 key in the cache"
run bf16 --training.mixed_precision_param bfloat16
grep -q "^mfu: against a peak of .*(bf16 GEMM measured now, cached in " "$tmp/bf16.log" && ok ||
  bad "bf16 run: $(grep '^mfu' "$tmp/bf16.log")"
run bf16b --training.mixed_precision_param bfloat16
grep -q "^mfu: .*(bf16 GEMMs measured once for this machine" "$tmp/bf16b.log" &&
  [ "$(peak bf16)" = "$(peak bf16b)" ] && ok || bad "bf16 rerun: $(grep '^mfu' "$tmp/bf16b.log")"
[ "$(grep -c "	bf16	" "$CTITAN_CACHE_DIR/peak_gflops.tsv")" -eq 1 ] && ok ||
  bad "one bf16 line: $(cat "$CTITAN_CACHE_DIR/peak_gflops.tsv")"
run third
[ "$(peak third)" = "$(peak first)" ] && ok || bad "fp32 after bf16: $(peak third) vs $(peak first)"
# A cached peak below what a step achieved (measured while the machine was busy): measured again
# once, its line replaced, and the log says so; the later MFUs are against the new peak.
line=$(grep "	fp32	" "$CTITAN_CACHE_DIR/peak_gflops.tsv")
sed -i "s/^\(.*	fp32	\).*/\10.001/" "$CTITAN_CACHE_DIR/peak_gflops.tsv"
run low
grep -q "^mfu: against a peak of 0.0 GFLOP" "$tmp/low.log" &&
  grep -q "^mfu: step 1 ran at .* GFLOP/s, above the peak of 0.0: measured again, .* (sgemm measured now, cached in " \
    "$tmp/low.log" && ok || bad "a low cached peak: $(grep '^mfu' "$tmp/low.log")"
new_peak=$(sed -n "s/^.*	fp32	//p" "$CTITAN_CACHE_DIR/peak_gflops.tsv")
[ "$(grep -c "	fp32	" "$CTITAN_CACHE_DIR/peak_gflops.tsv")" -eq 1 ] &&
  "$CTITAN_PYTHON" -c "import sys; sys.exit(0 if float(sys.argv[1]) > 1 else 1)" "$new_peak" && ok ||
  bad "the low line was not replaced: $(cat "$CTITAN_CACHE_DIR/peak_gflops.tsv")"
"$CTITAN_PYTHON" - "$tmp/low/metrics.jsonl" "$new_peak" <<'PY' && ok || bad "mfu after the new peak"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"mfu"' in l]
sys.exit(0 if rows and all(r["mfu"] < 1 for r in rows) else 1)
PY
run fixed --metrics.peak_gflops 123.5
[ "$(peak fixed)" = "123.5" ] && grep -q "(metrics.peak_gflops)" "$tmp/fixed.log" && ok ||
  bad "configured peak: $(grep '^mfu' "$tmp/fixed.log")"
# The MFU in metrics.jsonl is the achieved rate over that peak (both are rounded there: tflops to
# 4 decimals, mfu to 5).
"$CTITAN_PYTHON" - "$tmp/fixed/metrics.jsonl" <<'PY' && ok || bad "mfu is not tflops / 123.5 GFLOP/s"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"mfu"' in l]
sys.exit(0 if rows and all(abs(r["mfu"] - r["tflops"] * 1e3 / 123.5) <= 0.5e-5 + 0.5e-4 * 1e3 / 123.5
                           for r in rows) else 1)
PY
finish
