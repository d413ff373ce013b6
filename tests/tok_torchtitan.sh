#!/usr/bin/env bash
# A torchtitan user's TOML files (tests/torchtitan/: every section and key of torchtitan's
# qwen3_0.6b.toml, qwen3_moe_debug.toml and the Transformers-backend debug_model.toml) train to
# the end with only the data path and size overrides added, dense and MoE, on the real tokenizer
# and text; the inert keys are named in one summary line.
set -u
: "${CTITAN_BIN:?run through ctest}" "${CTITAN_ASSETS_DIR:?}" "${CTITAN_TMP:?}" "${CTITAN_REF_DIR:?}"
source "$(dirname "$0")/checks.bash" # ok, bad, finish
ct=$CTITAN_BIN
tt=$CTITAN_SOURCE_DIR/tests/torchtitan
tmp=$CTITAN_TMP; rm -rf "$tmp"; mkdir -p "$tmp"
tokdir=$CTITAN_ASSETS_DIR/qwen3-tokenizer
text=$CTITAN_ASSETS_DIR/corpus/small.txt
size=(--training.steps 3 --training.seq_len 32 --training.local_batch_size 2
      --metrics.peak_gflops 100)
rows() { grep -c '"loss"' "$1/metrics.jsonl" 2>/dev/null || echo 0; }

# qwen3_0.6b.toml: the 0.6B flavor cut to debugmodel; hf_assets_path gives the tokenizer.
for f in qwen3_0.6b qwen3_moe_debug; do
  flavor=debugmodel inert=11 # qwen3_moe_debug: 12 (its expert degrees are ctitan keys now)
  [ $f = qwen3_moe_debug ] && flavor=debugmodel_moe inert=12
  "$ct" train --config "$tt/$f.toml" --model.flavor $flavor --model.hf_assets_path "$tokdir" \
    --training.dataset_path "$text" "${size[@]}" --job.dump_folder "$tmp/$f" >"$tmp/$f.log" 2>&1 \
    && ok || bad "$f: $(tail -3 "$tmp/$f.log")"
  [ "$(rows "$tmp/$f")" = 3 ] && ok || bad "$f: $(rows "$tmp/$f") loss rows, expected 3"
  grep -q "^config: $inert torchtitan keys with no effect in ctitan" "$tmp/$f.log" && ok ||
    bad "$f: no summary of the inert keys: $(grep '^config:' "$tmp/$f.log")"
  grep -q "activation checkpointing: selective" "$tmp/$f.log" && ok ||
    bad "$f: activation checkpointing not reported: $(grep -i activation "$tmp/$f.log")"
done
# decay_ratio is not set in the file: the decay runs over every step after the warmup, and the
# schedule line says so (2 warmup steps of 3, then 1 of decay).
grep -q "^lr: peak 0.0003, warmup 2 steps, stable 0, linear decay 1 (decay_ratio unset: all after warmup)" \
  "$tmp/qwen3_0.6b.log" && ok ||
  bad "the lr schedule line does not say decay_ratio is unset: $(grep '^lr:' "$tmp/qwen3_0.6b.log")"

# The Transformers backend: the hub id is refused with what to do, then a folder trains.
tf=$tt/transformers_debug_model.toml
out=$("$ct" train --config "$tf" 2>&1 >/dev/null); rc=$?
[ $rc -eq 1 ] && [ "$(grep -c '^ctitan: error:' <<<"$out")" -eq 1 ] &&
  grep -q 'is a hub id.*download it first' <<<"$out" && ok || bad "hub id (rc $rc): $out"
hf=$CTITAN_REF_DIR/train/const_clip_tied_bias
"$ct" train --config "$tf" --hf_transformers.model "$hf/hf" --training.dataset_path "$hf/tokens.npy" \
  --training.steps 3 --training.seq_len 8 --metrics.peak_gflops 100 --job.dump_folder "$tmp/tf" \
  >"$tmp/tf.log" 2>&1 && ok || bad "transformers backend: $(tail -3 "$tmp/tf.log")"
[ "$(rows "$tmp/tf")" = 3 ] && ok || bad "transformers backend: $(rows "$tmp/tf") loss rows"
grep -q "^model: $hf/hf" "$tmp/tf.log" && ok || bad "not trained on the folder: $(grep '^model:' "$tmp/tf.log")"

# Several problems in one file: all reported, one line each, before anything runs.
printf '[training]\nstpes = 3\nseq_len = "x"\n[parallelism]\nenable_async_tensor_parallel = true\n' >"$tmp/bad.toml"
out=$("$ct" train --config "$tmp/bad.toml" --training.dataset_path "$text" 2>&1 >/dev/null); rc=$?
[ $rc -eq 1 ] && [ "$(grep -c '^ctitan: error:' <<<"$out")" -eq 3 ] && ok ||
  bad "three problems, three lines (rc $rc): $out"

finish
