#!/usr/bin/env bash
# README's "Fine-tuning Qwen3-4B on one machine" runs as written: its command block, taken from
# README.md, on a tiny model instead of Qwen3-4B (a debugmodel run's hf export with the real
# tokenizer as M, 1 step instead of 200, the README's own conversations as chat.jsonl, one line
# typed to --chat). Each command must exit 0, the run must leave a PEFT adapter folder and the
# merge a full HF folder.
set -u
: "${CTITAN_BIN:?run through ctest}" "${CTITAN_TMP:?}" "${CTITAN_SOURCE_DIR:?}" "${CTITAN_ASSETS_DIR:?}"
source "$(dirname "$0")/checks.bash" # ok, bad, finish
tmp=$CTITAN_TMP; rm -rf "$tmp"; mkdir -p "$tmp"; cd "$tmp" || exit 1
readme=$CTITAN_SOURCE_DIR/README.md

# The section's first sh block, and the chat section's example conversations (20 copies: a
# 1024-token window needs that many).
awk '/^## Fine-tuning Qwen3-4B on one machine/{s=1} s&&/^```sh/{b=1; next} b&&/^```/{exit} b' \
  "$readme" >block.sh
grep -A3 '^```json' "$readme" | grep '^{"messages"' >one.jsonl
for _ in $(seq 20); do cat one.jsonl; done >chat.jsonl
[ "$(grep -c 'build/ctitan' block.sh)" -eq 3 ] && [ "$(wc -l <one.jsonl)" -ge 1 ] && ok ||
  bad "README: the section's block ($(wc -l <block.sh) lines) or the example conversations not found"

OMP_NUM_THREADS=2 "$CTITAN_BIN" train --model.flavor debugmodel \
  --model.tokenizer_path "$CTITAN_ASSETS_DIR/qwen3-tokenizer" --training.dataset_path chat.jsonl \
  --training.steps 1 --training.seq_len 64 --checkpoint.last_save_in_hf true \
  --metrics.peak_gflops 100 --job.dump_folder base >base.log 2>&1 && ok ||
  bad "the tiny base: $(tail -3 base.log)"

# The block with M the tiny base, 1 step, the binary under test, and a fixed MFU peak.
sed -e "s|^M=.*|M=$tmp/base/hf|" -e 's|--training.steps 200|--training.steps 1 --metrics.peak_gflops 100|' \
  -e "s|build/ctitan|\"$CTITAN_BIN\"|g" block.sh >run.sh
grep -q -- "--training.steps 1 " run.sh && ok || bad "README: no --training.steps 200 to shorten"
printf 'Hello\n' | bash -e run.sh >run.log 2>&1 && ok || bad "README's commands: $(tail -5 run.log)"
[ -s runs/lora/hf/adapter_config.json ] && [ -s runs/lora/hf/adapter_model.safetensors ] &&
  grep -q '"peft_type": "LORA"' runs/lora/hf/adapter_config.json && ok ||
  bad "no PEFT adapter folder in runs/lora/hf"
[ -s runs/merged/config.json ] && [ -s runs/merged/model.safetensors ] && ok ||
  bad "no merged HF folder in runs/merged"
finish
