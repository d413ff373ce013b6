#!/usr/bin/env bash
# `ctitan train` end to end on the real Qwen3 tokenizer and real text (nlp-corpus): the
# random-init loss, memory_peak_gib against the measured peak RSS, bit-exact resume (after
# SIGTERM and SIGINT, with shuffle on), SIGKILL after checkpoints and during checkpoint writes,
# export round trips, no non-finite checkpoint after skipped steps, and one clear error per
# config/data/memory error class.
set -u
: "${CTITAN_BIN:?run through ctest}" "${CTITAN_ASSETS_DIR:?}" "${CTITAN_TMP:?}" "${CTITAN_PYTHON:?}"
source "$(dirname "$0")/checks.bash" # ok, bad, finish
expect_err() { # NAME PATTERN CMD...: exit 1 with one 'ctitan: error:' line matching PATTERN
  local name=$1 pattern=$2; shift 2
  local out; out=$("$@" 2>&1 >/dev/null); local rc=$?
  if [ $rc -eq 1 ] && [ "$(grep -c '^ctitan: error:' <<<"$out")" -eq 1 ] &&
     grep -qE -- "$pattern" <<<"$out"; then ok; else bad "$name (rc $rc): $out"; fi
}

ct=$CTITAN_BIN
tmp=$CTITAN_TMP; rm -rf "$tmp"; mkdir -p "$tmp"
tokdir=$CTITAN_ASSETS_DIR/qwen3-tokenizer
text=$CTITAN_ASSETS_DIR/corpus/small.txt
# A small native run: the real vocabulary (151936) on a 2-layer body; shuffle on.
# train_args DUMP [--key value ...] sets ARGS: the options given replace the defaults below.
# train DUMP [...] runs it; background runs use "$ct" train "${ARGS[@]}" & so $! is ctitan.
train_args() {
  local dump=$1; shift
  declare -A opt=(
    [model.flavor]=debugmodel [model.n_layers]=2 [model.tokenizer_path]=$tokdir
    [training.dataset_path]=$text [training.seq_len]=32 [training.local_batch_size]=2
    [training.steps]=8 [training.shuffle]=true [lr_scheduler.warmup_steps]=2
    [lr_scheduler.decay_ratio]=0.5 [lr_scheduler.decay_type]=cosine [optimizer.lr]=3e-3
    [metrics.log_freq]=1 [metrics.peak_gflops]=100 [checkpoint.interval]=2
    [checkpoint.keep_latest_k]=2 [debug.seed]=7 [job.dump_folder]=$dump)
  while [ $# -ge 2 ]; do opt[${1#--}]=$2; shift 2; done
  ARGS=()
  local k
  for k in "${!opt[@]}"; do ARGS+=("--$k" "${opt[$k]}"); done
}
train() { train_args "$@"; "$ct" train "${ARGS[@]}"; }
losses() { "$CTITAN_PYTHON" -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(" ".join(repr(r["loss"]) for r in rows if "loss" in r))' "$1/metrics.jsonl"; }

# --- a straight run
if train "$tmp/straight" --checkpoint.last_save_in_hf true --checkpoint.export_dtype bfloat16 \
  >"$tmp/straight.log" 2>&1; then ok; else bad "straight run: $(tail -5 "$tmp/straight.log")"; fi
straight=$(losses "$tmp/straight")
[ "$(wc -w <<<"$straight")" -eq 8 ] && ok || bad "straight run logged: $straight"

# --- random-init first-step loss lies in [ln V, ln V + 1]
"$CTITAN_PYTHON" - "$straight" <<'PY' && ok || bad "first-step loss out of range: $straight"
import math, sys
first = float(sys.argv[1].split()[0])
sys.exit(0 if math.log(151936) <= first <= math.log(151936) + 1 else 1)
PY
# the loss falls (torchtitan's init: 12.30 -> 11.94 in these 8 steps; normal(0, 0.02) fell faster)
"$CTITAN_PYTHON" -c 'import sys; l=[float(x) for x in sys.argv[1].split()]; sys.exit(0 if l[-1] < l[0] - 0.25 else 1)' "$straight" &&
  ok || bad "loss did not fall: $straight"

# --- same config, same seed: bit-identical losses
train "$tmp/again" >/dev/null 2>&1
[ "$(losses "$tmp/again")" = "$straight" ] && ok || bad "rerun differs: $(losses "$tmp/again") vs $straight"
# Each checkpoint of this model is 230 MB (weights and moments): a run's checkpoints are removed
# once no later check reads them, so the test needs about 1.5 GB of disk.
rm -rf "$tmp/again/checkpoint"

# Helpers for runs in the background. alive PID: the process exists and is not a zombie (bash
# has not waited for it yet). resumed_step LOG: the step of the "resumed from" line, if any.
# dedup_losses DUMP: for each step the loss of the last row logged (a resumed run logs again the
# steps after its checkpoint), then "|" and how many rows were logged again.
alive() { local st; read -r _ _ st _ <"/proc/$1/stat" 2>/dev/null && [ "$st" != Z ]; }
resumed_step() { sed -n 's/^resumed from .* at step \([0-9]*\) .*/\1/p' "$1" | head -n 1; }
dedup_losses() { "$CTITAN_PYTHON" -c '
import json, sys
rows, n = {}, 0
for l in open(sys.argv[1]):
    r = json.loads(l)
    if "loss" in r: rows[r["step"]] = r["loss"]; n += 1
print(" ".join(repr(rows[k]) for k in sorted(rows)) + "|%d" % (n - len(rows)))' "$1/metrics.jsonl"; }
# wait_for_line FILE PATTERN PID: polls (up to 5 minutes) until FILE has a line matching PATTERN,
# or PID has exited. No timing assumption: a loaded machine only makes it wait longer.
wait_for_line() {
  for _ in $(seq 6000); do
    grep -q "$2" "$1" 2>/dev/null && return 0
    alive "$3" || return 1
    sleep 0.05
  done
  return 1
}

# --- stop with SIGTERM, or SIGINT, after a checkpoint, resume: the losses of every step are
# bit-identical. Both signals are acknowledged at once, finish the step, save a checkpoint and
# exit 128 + the signal (`ctitan train --help`, architecture.md). bash starts background jobs
# with SIGINT ignored: the run gets it only because ctitan installs its own handler.
declare -A signo=([TERM]=15 [INT]=2)
for sig in TERM INT; do
  d=$tmp/stop$sig
  train_args "$d"
  "$ct" train "${ARGS[@]}" >"$d.log" 2>&1 &
  pid=$!
  wait_for_line "$d.log" "^checkpoint: saved step" $pid || bad "SIG$sig: no checkpoint line before exit"
  kill -$sig $pid 2>/dev/null
  wait $pid; rc=$?
  [ $rc -eq $((128 + ${signo[$sig]})) ] && ok || bad "SIG$sig exit code $rc: $(tail -3 "$d.log")"
  grep -q "^ctitan: .*stopping after this step with a checkpoint" "$d.log" && ok ||
    bad "SIG$sig: not acknowledged at once: $(tail -3 "$d.log")"
  stop=$(sed -n "s/^stopped by signal ${signo[$sig]} at step \([0-9]*\);.*/\1/p" "$d.log")
  [ -n "$stop" ] && [ "$stop" -lt 8 ] && ok || bad "SIG$sig: no 'stopped by signal' line before step 8: $(tail -3 "$d.log")"
  grep -q "^checkpoint: saved step $stop " "$d.log" && ok || bad "SIG$sig: no checkpoint at the stop step $stop"
  # The resumed run saves only at its end (the interval is not in the config hash).
  train "$d" --checkpoint.interval 100 >"$d.2.log" 2>&1 && ok || bad "resume after SIG$sig failed: $(tail -3 "$d.2.log")"
  [ "$(resumed_step "$d.2.log")" = "$stop" ] && ok || bad "SIG$sig: did not resume from step $stop: $(grep resumed "$d.2.log")"
  [ "$(losses "$d")" = "$straight" ] && ok || bad "SIG$sig: resumed losses $(losses "$d") != $straight"
  rm -rf "$d/checkpoint"
done

# --- a second Ctrl-C exits at once, without a checkpoint. The second one is sent as soon as the
# first is acknowledged; steps take about a second here, so it lands in the same step unless the
# machine stalls for that long, and then the trial (which ended cleanly) is run again.
for trial in 1 2 3; do
  d=$tmp/twice$trial
  train_args "$d" --training.seq_len 512 --training.local_batch_size 4 --training.steps 50
  "$ct" train "${ARGS[@]}" >"$d.log" 2>&1 &
  pid=$!
  wait_for_line "$d.log" '^step ' $pid || bad "Ctrl-C twice: no step logged"
  kill -INT $pid
  wait_for_line "$d.log" 'stopping after this step' $pid
  kill -INT $pid 2>/dev/null
  wait $pid; rc=$?
  grep -q "stopped by signal" "$d.log" && [ $trial -lt 3 ] && continue # the step ended first
  [ $rc -eq 130 ] && grep -q "^ctitan: second interrupt: exiting now without a checkpoint" "$d.log" &&
    ! grep -q "stopped by signal" "$d.log" && ok || bad "Ctrl-C twice (rc $rc): $(tail -4 "$d.log")"
  break
done

# --- SIGKILL after checkpoints and during checkpoint writes (checkpoints every step), as one
# chain of runs in one dump folder rather than a fresh run per trial: each run resumes where the
# one before was killed, and is itself killed at an event chosen at random and detected by
# polling (no timing assumption), alternately
#   saved: the line "checkpoint: saved step N" has appeared (N = S+1, where S is the step the run
#          resumed from), then a random 0-0.19 s more; the kill lands in the next step, its row
#          or its save, or later, so the next run resumes from N or later;
#   tmp:   the temporary folder of checkpoint N exists (N = S+1 or S+2; a save too quick to see
#          is passed over for the next one); when the folder is still there after the kill, the
#          next run resumes from exactly N-1 and logs step N again.
# Up to 6 kills while an event has a step after it, then a run to the end: the losses are the
# straight run's, each step logged once.
d=$tmp/killed
kills=0 landed=0 in_save=0 lo=0 hi=0 what=
for run in 1 2 3 4 5 6 7; do
  log=$d.$run.log
  train_args "$d" --checkpoint.interval 1
  "$ct" train "${ARGS[@]}" >"$log" 2>&1 &
  pid=$!
  S=0
  if [ $run -gt 1 ]; then # where the previous kill left the checkpoints
    wait_for_line "$log" "^resumed from" $pid && S=$(resumed_step "$log")
    [ "$S" -ge $lo ] && [ "$S" -le $hi ] && ok || bad "kill $kills ($what): the next run resumed from step $S, expected $lo..$hi: $(grep -m1 '^resumed\|^weights' "$log")"
  fi
  mode=end
  if [ $run -le 6 ] && [ $((run % 2)) -eq 1 ] && [ "$S" -le 5 ]; then mode=saved N=$((S + 1)); fi
  if [ $run -le 6 ] && [ $((run % 2)) -eq 0 ] && [ "$S" -le 6 ]; then
    mode=tmp N=$((S + 1 + RANDOM % 2))
    [ $N -le 7 ] || N=7
  fi
  hit=
  if [ $mode != end ]; then
    for _ in $(seq 15000); do # up to 5 minutes
      if [ $mode = saved ]; then
        grep -q "^checkpoint: saved step $N " "$log" && hit=$N
      else
        for f in "$d"/checkpoint/step-*.tmp-*; do
          [ -e "$f" ] || continue
          f=${f##*/step-}
          [ "${f%%.tmp-*}" -ge $N ] && hit=${f%%.tmp-*}
        done
      fi
      if [ -n "$hit" ]; then
        [ $mode = saved ] && sleep "$(printf '0.%02d' $((RANDOM % 20)))"
        kill -KILL $pid 2>/dev/null
        break
      fi
      alive $pid || break
      sleep 0.02
    done
  fi
  wait $pid 2>/dev/null; rc=$?
  if [ $mode = end ]; then
    [ $rc -eq 0 ] && ok || bad "the last run of the SIGKILL chain failed ($rc): $(tail -3 "$log")"
    break
  fi
  kills=$((kills + 1)) what="$mode at step $N, run $run resumed from $S"
  during=0
  [ $mode = tmp ] && [ -n "$hit" ] && compgen -G "$d/checkpoint/step-$hit.tmp-*" >/dev/null && during=1
  [ -n "$hit" ] && [ $rc -eq 137 ] && landed=$((landed + 1))
  in_save=$((in_save + during))
  if [ $rc -ne 137 ]; then lo=8 hi=8 # not killed: it finished
  elif [ $during -eq 1 ]; then lo=$((hit - 1)) hi=$((hit - 1)) what="$what, killed while writing $hit"
  else lo=${hit:-$N} hi=8; fi
done
got=$(dedup_losses "$d") again=${got#*|} got=${got%|*}
[ "$got" = "$straight" ] && ok || bad "SIGKILL chain: losses $got != $straight"
compgen -G "$d/checkpoint/*.tmp-*" >/dev/null && bad "SIGKILL chain: left a temporary folder" || ok
rm -rf "$d/checkpoint"
# The events cannot be missed (each leaves a step to run) and each kill moves the chain on by at
# most a step or two, so most of the 6 kills happen, after a checkpoint. Every kill during a
# write made a row that the resumed run logs again; metrics.jsonl drops the old one on resume,
# so each step appears once.
[ $kills -ge 4 ] && [ $landed -ge $((kills - 1)) ] && ok || bad "SIGKILL chain: $landed of $kills kills landed at their event"
[ $in_save -ge 1 ] && [ "$again" -eq 0 ] && ok ||
  bad "SIGKILL chain: $in_save kills during a checkpoint write, $again rows in metrics.jsonl twice"
echo "SIGKILL chain: $landed of $kills kills landed at their event, $in_save during a checkpoint write; $again rows twice" >&2

# --- keep_latest_k = 2
[ "$(ls -d "$tmp/straight/checkpoint"/step-* | wc -l)" -eq 2 ] && ok || bad "keep_latest_k: $(ls "$tmp/straight/checkpoint")"

# --- export: F32 gives the checkpoint's exact loss in verify; BF16 stores BF16; no missing keys
"$CTITAN_PYTHON" -c "import numpy as np, sys; np.save(sys.argv[1], np.arange(200, 1200, dtype=np.int32) * 97 % 151643)" "$tmp/tokens.npy"
vf() { "$ct" verify --model.hf_path "$1" --training.dataset_path "$tmp/tokens.npy" --training.seq_len 16 --training.local_batch_size 2 --json | tail -n 1; }
ck=$tmp/straight/checkpoint/step-8
"$ct" export --checkpoint "$ck" --output "$tmp/export32" --dtype float32 >/dev/null 2>&1 && ok || bad "export f32"
"$ct" export --checkpoint "$ck" --output "$tmp/export16" --dtype bfloat16 >/dev/null 2>&1 && ok || bad "export bf16"
a=$(vf "$ck"); b=$(vf "$tmp/export32")
"$CTITAN_PYTHON" -c 'import json,sys; a,b=json.loads(sys.argv[1]),json.loads(sys.argv[2]); sys.exit(0 if a["loss"]==b["loss"] and b["missing"]==[] and b["unexpected"]==[] else 1)' "$a" "$b" &&
  ok || bad "export f32 round trip: $a vs $b"
"$ct" inspect "$tmp/export16" | grep -q "model.embed_tokens.weight *BF16" && ok || bad "bf16 export dtype"
[ -f "$tmp/export16/tokenizer.json" ] && ok || bad "export has no tokenizer.json"
"$ct" inspect "$tmp/straight/hf" | grep -q "model.embed_tokens.weight *BF16" && ok || bad "last_save_in_hf export"

# --- initial_load_path: start from the exported HF folder; its first loss is far below a fresh one
train "$tmp/fromhf" --checkpoint.initial_load_path "$tmp/export32" --checkpoint.initial_load_in_hf true \
  --training.steps 2 --lr_scheduler.warmup_steps 0 --lr_scheduler.decay_ratio 0 --checkpoint.enable false \
  >"$tmp/fromhf.log" 2>&1 && ok || bad "initial_load_path run: $(tail -3 "$tmp/fromhf.log")"
grep -q "weights: $tmp/export32" "$tmp/fromhf.log" && ok || bad "initial_load_path not used"
"$CTITAN_PYTHON" -c 'import sys; a=float(sys.argv[1].split()[0]); b=float(sys.argv[2].split()[-1]); sys.exit(0 if a < b + 0.5 and a < 11.5 else 1)' \
  "$(losses "$tmp/fromhf")" "$straight" && ok || bad "loaded model's loss $(losses "$tmp/fromhf") vs trained $straight"

# --- validation rows, epochs, plot
train "$tmp/val" --validation.enable true --validation.dataset_path "$text" --validation.freq 2 \
  --validation.steps 2 --checkpoint.enable false --training.dataset_path "$CTITAN_ASSETS_DIR/corpus/nlp-corpus.txt" \
  >"$tmp/val.log" 2>&1 && ok || bad "validation run: $(tail -3 "$tmp/val.log")"
[ "$(grep -c '"val_loss"' "$tmp/val/metrics.jsonl")" -eq 4 ] && ok || bad "validation rows: $(grep -c val_loss "$tmp/val/metrics.jsonl")"
grep -q "perplexity" "$tmp/val.log" && ok || bad "no validation line"
head -c 1000 "$text" >"$tmp/tiny.txt"   # a few windows only: several epochs in 8 steps
# The run's peak RSS as the kernel measured it (wait4's ru_maxrss, what `/usr/bin/time -v` prints
# as "Maximum resident set size") goes to epochs.maxrss, for the memory check below.
train_args "$tmp/epochs" --training.dataset_path "$tmp/tiny.txt" --checkpoint.enable false
"$CTITAN_PYTHON" -c '
import resource, subprocess, sys
rc = subprocess.call(sys.argv[2:])
open(sys.argv[1], "w").write("%d\n" % resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
sys.exit(rc)' "$tmp/epochs.maxrss" "$ct" train "${ARGS[@]}" >"$tmp/epochs.log" 2>&1 &&
  grep -q "data: epoch 1 begins" "$tmp/epochs.log" && ok || bad "epoch rollover not logged: $(grep data: "$tmp/epochs.log")"

# --- memory_peak_gib (the process's own getrusage at each logged step) against the peak RSS
# measured from outside, on the epochs run: no checkpoint or export comes after its last row, and
# the step loop allocates nothing. The last row must be at most the measured peak plus the %.4f
# rounding, and at most 0.0005 GiB below it: measured 486824 KiB = 0.46427 GiB against 0.4643
# reported (3e-5 GiB, the rounding). Under the sanitizers (make check runs this test under ASan
# too) freeing the buffers at exit writes ASan's shadow memory after the last row: measured
# 0.5609 against 0.5468 (0.014 GiB), so the band below is 0.15 GiB there.
below=0.0005
grep -qs '^CTITAN_SANITIZE:BOOL=ON' "${CTITAN_BUILD_DIR:-}/CMakeCache.txt" && below=0.15
"$CTITAN_PYTHON" - "$tmp/epochs/metrics.jsonl" "$(cat "$tmp/epochs.maxrss")" $below <<'PY' && ok || bad "memory_peak_gib vs measured peak RSS"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
reported, measured, below = rows[-1]["memory_peak_gib"], int(sys.argv[2]) / 2**20, float(sys.argv[3])
ok = measured - below <= reported <= measured + 0.0001 and \
     all(a["memory_peak_gib"] <= b["memory_peak_gib"] for a, b in zip(rows, rows[1:]))
print("memory_peak_gib %.4f, measured peak RSS %.5f GiB (%s KiB): %s" % (reported, measured,
      sys.argv[2], "ok" if ok else "outside [measured - %g, measured + 0.0001] or not monotone" % below),
      file=sys.stderr)
sys.exit(0 if ok else 1)
PY
"$ct" plot --input "$tmp/val" >/dev/null 2>&1 && [ -s "$tmp/val/loss.png" ] && ok || bad "plot"

# --- non-finite steps are skipped, then the run stops with an error; nothing non-finite is
# saved. lr 1e30 makes step 1's update huge (finite); from step 2 on the gradient norm is NaN,
# step 2 is skipped, and the second skip in a row (step 3) stops the run before its save. With a
# checkpoint every step, steps 1 and 2 are saved: every tensor of both (weights and AdamW
# moments) is finite, and the skipped step's checkpoint holds step 1's weights and moments byte
# for byte.
expect_err nonfinite '2 non-finite steps in a row' train "$tmp/nan" --optimizer.lr 1e30 \
  --training.max_skipped_steps 1 --lr_scheduler.warmup_steps 0 --lr_scheduler.decay_ratio 0 \
  --checkpoint.interval 1 --checkpoint.keep_latest_k 0 --training.max_norm 0
nanck=$tmp/nan/checkpoint
[ "$(cd "$nanck" 2>/dev/null && echo step-*)" = "step-1 step-2" ] && ok || bad "nonfinite: checkpoints $(ls "$nanck" 2>&1)"
"$CTITAN_PYTHON" - "$nanck"/step-*/*.safetensors <<'PY' && ok || bad "nonfinite: a checkpoint holds non-finite values"
import json, struct, sys
import numpy as np
bad = 0
for path in sys.argv[1:]:
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    for name, t in header.items():
        if name == "__metadata__": continue
        assert t["dtype"] == "F32", (path, name, t["dtype"])
        a, b = t["data_offsets"]
        x = np.frombuffer(raw, np.float32, (b - a) // 4, 8 + n + a)
        if not np.isfinite(x).all():
            bad += 1
            print("%s: %s has %d non-finite values" % (path, name, (~np.isfinite(x)).sum()), file=sys.stderr)
sys.exit(1 if bad or not sys.argv[1:] else 0)
PY
for f in model.safetensors optimizer-00000-of-00001.safetensors; do
  cmp -s "$nanck/step-1/$f" "$nanck/step-2/$f" && ok || bad "nonfinite: the skipped step changed $f"
done

# --- errors: config, data, memory
printf '[training]\nseq_len = 32\nstepz = 4\n' >"$tmp/typo.toml"
expect_err unknown_key 'typo.toml:3.*stepz.*did you mean.*steps' "$ct" train --config "$tmp/typo.toml"
printf '[training]\nseq_len = "long"\n' >"$tmp/type.toml"
expect_err wrong_type 'type.toml:2.*seq_len' "$ct" train --config "$tmp/type.toml"
expect_err unknown_option 'training.lr' "$ct" train --training.lr 3
expect_err missing_data 'no_such_file.txt' train "$tmp/e1" --training.dataset_path "$tmp/no_such_file.txt"
: >"$tmp/empty.txt"
expect_err empty_data 'empty.txt' train "$tmp/e2" --training.dataset_path "$tmp/empty.txt"
printf '{"text": "fine"}\n{"txt": "no text"}\n' >"$tmp/notext.jsonl"
expect_err jsonl_no_text 'notext.jsonl:2' train "$tmp/e3" --training.dataset_path "$tmp/notext.jsonl"
"$CTITAN_PYTHON" -c "import numpy as np, sys; np.save(sys.argv[1], np.full(1000, 151936, np.int64))" "$tmp/oov.npy"
expect_err npy_out_of_vocab 'oov.npy.*151936' train "$tmp/e4" --training.dataset_path "$tmp/oov.npy"
expect_err seq_over_positions 'seq_len 50000 exceeds' train "$tmp/e5" --training.seq_len 50000
expect_err memory_refusal 'needs about [0-9.]+ GiB.*allow_overcommit' train "$tmp/e6" --model.flavor 32B --model.n_layers 0
expect_err batch_divisibility 'global_batch_size' train "$tmp/e7" --training.global_batch_size 3

finish
