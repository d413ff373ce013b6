#!/usr/bin/env bash
# Resume as a user meets it: a refused resume names each changed key (old -> new) and leaves the
# dump folder as it was; metrics.jsonl holds each step once after a resume from an older
# checkpoint; the log shows only the keys that differ from the defaults.
set -u
: "${CTITAN_BIN:?run through ctest}" "${CTITAN_TMP:?}" "${CTITAN_REF_DIR:?}" "${CTITAN_PYTHON:?}"
source "$(dirname "$0")/checks.bash" # ok, bad, finish
tmp=$CTITAN_TMP; rm -rf "$tmp"; mkdir -p "$tmp"
hf=$CTITAN_REF_DIR/train/const_clip_tied_bias
run() { # DUMP [options]
  local dump=$1; shift
  "$CTITAN_BIN" train --model.backend hf --model.hf_path "$hf/hf" --training.dataset_path \
    "$hf/tokens.npy" --training.steps 6 --training.local_batch_size 2 \
    --lr_scheduler.warmup_steps 2 --checkpoint.interval 2 \
    --metrics.log_freq 1 --metrics.peak_gflops 100 --job.dump_folder "$dump" "$@"
}
steps() { "$CTITAN_PYTHON" -c '
import json, sys
print(" ".join("%d:%r" % (r["step"], r["loss"]) for r in map(json.loads, open(sys.argv[1])) if "loss" in r))' "$1/metrics.jsonl"; }

run "$tmp/a" --optimizer.lr 0.002 --training.seq_len 8 >"$tmp/a.log" 2>&1 && ok || bad "straight run: $(tail -3 "$tmp/a.log")"
# The log lists the keys that differ from the defaults, not all of them.
sed -n '/^config: differences from the defaults/,/^model:/p' "$tmp/a.log" >"$tmp/diff.txt"
grep -q '^steps = 6$' "$tmp/diff.txt" && grep -q '^lr = 0.002$' "$tmp/diff.txt" &&
  ! grep -q '^beta1 = ' "$tmp/diff.txt" && ok || bad "config differences: $(cat "$tmp/diff.txt")"
grep -q '^beta1 = 0.9$' "$tmp/a/config.toml" && ok || bad "config.toml lacks the default keys"

# A refused resume: both changed keys named with their values; nothing in the folder changes.
cp -r "$tmp/a" "$tmp/a.before"
out=$(run "$tmp/a" --optimizer.lr 0.001 --training.seq_len 4 2>&1 >/dev/null); rc=$?
[ $rc -eq 1 ] && [ "$(grep -c '^ctitan: error:' <<<"$out")" -eq 1 ] &&
  grep -q 'written by a run with a different config: training.seq_len 8 -> 4, optimizer.lr 0.002 -> 0.001; to resume, restore those keys, or train into a new job.dump_folder' <<<"$out" &&
  ok || bad "refused resume (rc $rc): $out"
diff -r "$tmp/a.before" "$tmp/a" >/dev/null && ok || bad "the refused start changed the dump folder: $(diff -r "$tmp/a.before" "$tmp/a" | head -5)"
# A start that fails after its config is accepted (a plugin that is not there; override.imports
# is not hashed, so the resume check passes) leaves the folder as it was too, config.toml
# included, and a failed start in a new folder creates none.
out=$(run "$tmp/a" --optimizer.lr 0.002 --training.seq_len 8 --override.imports "$tmp/nope.so" 2>&1 >/dev/null); rc=$?
[ $rc -eq 1 ] && grep -q "^ctitan: error: plugin $tmp/nope.so" <<<"$out" &&
  diff -r "$tmp/a.before" "$tmp/a" >/dev/null && ok ||
  bad "a failed start (rc $rc: $out) changed the dump folder: $(diff -r "$tmp/a.before" "$tmp/a" | head -5)"
run "$tmp/fresh" --override.imports "$tmp/nope.so" >/dev/null 2>&1
[ ! -e "$tmp/fresh" ] && ok || bad "a failed start created its dump folder: $(ls -A "$tmp/fresh")"

# Resume from an older checkpoint than the last logged step (as after a kill): steps 5 and 6 are
# logged again, and each step appears once with the straight run's loss.
cp -r "$tmp/a.before" "$tmp/b"; rm -rf "$tmp/b/checkpoint/step-6"
printf '{"step":7,"loss":' >>"$tmp/b/metrics.jsonl"   # a line cut short by the kill
run "$tmp/b" --optimizer.lr 0.002 --training.seq_len 8 >"$tmp/b.log" 2>&1 && ok || bad "resume: $(tail -3 "$tmp/b.log")"
grep -q "resumed from .*step-4 at step 4" "$tmp/b.log" && ok || bad "did not resume from step 4"
[ "$(steps "$tmp/b")" = "$(steps "$tmp/a.before")" ] && ok ||
  bad "metrics after resume: $(steps "$tmp/b") vs $(steps "$tmp/a.before")"
finish
