#!/usr/bin/env bash
# Chat fine-tuning end to end (issue 20), on the real Qwen3 tokenizer and chat template and
# conversations made of real text (nlp-corpus): `ctitan tokenize` on conversations (ids, mask,
# --render), the errors (a .npy output, a file mixing kinds, no template, no assistant turn),
# the assistant-only loss as the token-weighted mean over the trained tokens across
# micro-batches and ranks (mpirun), pre-tokenized lines training exactly as the conversations,
# train_on = "all", and block-causal packing across ranks and through a resume.
set -u
source "$(dirname "$0")/mpi_test.bash"
text_run_setup
expect_err() { # NAME PATTERN CMD...: exit 1 with one 'ctitan: error:' line matching PATTERN
  local name=$1 pattern=$2; shift 2
  local out; out=$("$@" 2>&1 >/dev/null); local rc=$?
  if [ $rc -eq 1 ] && [ "$(grep -c '^ctitan: error:' <<<"$out")" -eq 1 ] &&
     grep -qE -- "$pattern" <<<"$out"; then ok; else bad "$name (rc $rc): $out"; fi
}

# Conversations of real text: a user line and the assistant's answer (the next line); every
# other one has a system prompt and a second turn, some an assistant turn that thinks.
chat=$tmp/chat.jsonl
"$CTITAN_PYTHON" - "$text" "$chat" <<'PY'
import json, sys
lines = [l.strip() for l in open(sys.argv[1], encoding="utf-8") if l.strip()]
with open(sys.argv[2], "w", encoding="utf-8") as f:
    for k, i in enumerate(range(0, len(lines) - 3, 3)):
        m = [{"role": "user", "content": lines[i]}, {"role": "assistant", "content": lines[i + 1]}]
        if k % 2:
            m = [{"role": "system", "content": "Answer in one line."}] + m + [
                {"role": "user", "content": "And then?"},
                {"role": "assistant", "content": "<think>\nRecall.\n</think>\n\n" + lines[i + 2]}]
        f.write(json.dumps({"messages": m}, ensure_ascii=False) + "\n")
PY

# --- tokenize: one {"ids", "mask", "text"} line per conversation; mask 1 exactly on the
# assistant turns (each trained run decodes to a span after "<|im_start|>assistant\n" through
# "<|im_end|>" of the rendered text)
check "tokenize chat" "$ct" tokenize --tokenizer "$tokdir" --input "$chat" --output "$tmp/ids.jsonl" \
  --render >"$tmp/tokenize.log" 2>&1
grep -q "conversations, .* of their tokens in assistant turns" "$tmp/tokenize.log" && ok ||
  bad "tokenize log: $(cat "$tmp/tokenize.log")"
"$CTITAN_PYTHON" - "$tmp/ids.jsonl" "$chat" "$CTITAN_ASSETS_DIR/npm/node_modules" <<'PY' && ok || bad "tokenize's masks"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1], encoding="utf-8")]
convs = [json.loads(l) for l in open(sys.argv[2], encoding="utf-8")]
assert len(rows) == len(convs), (len(rows), len(convs))
for r, c in zip(rows, convs):
    ids, mask, text = r["ids"], r["mask"], r["text"]
    assert len(ids) == len(mask) and set(mask) <= {0, 1}
    n_assistant = sum(m["role"] == "assistant" for m in c["messages"])
    runs = sum(1 for i, x in enumerate(mask) if x and (i == 0 or not mask[i - 1]))
    assert runs == n_assistant, (runs, n_assistant)
    assert text.count("<|im_start|>assistant\n") == n_assistant
    assert ids.count(151645) == text.count("<|im_end|>")
    # every trained run ends with <|im_end|> and follows the assistant header
    for i, x in enumerate(mask):
        if x and (i + 1 == len(mask) or not mask[i + 1]):
            assert ids[i] == 151645, ids[i]
PY

# --- errors: one line each, naming the file and line
expect_err "chat to .npy" "chat.jsonl:1: a conversation: its mask needs a .jsonl --output" \
  "$ct" tokenize --tokenizer "$tokdir" --input "$chat" --output "$tmp/x.npy"
{ head -2 "$chat"; echo '{"text": "plain"}'; } >"$tmp/mixed.jsonl"
expect_err "mixed kinds (tokenize)" 'mixed.jsonl:3: a "text" line among "messages" lines' \
  "$ct" tokenize --tokenizer "$tokdir" --input "$tmp/mixed.jsonl" --output "$tmp/x.jsonl"
expect_err "mixed kinds (train)" 'mixed.jsonl:3: a "text" line in a file of "messages" lines \(line 1\)' \
  "$ct" train --model.flavor debugmodel --model.tokenizer_path "$tokdir" \
  --training.dataset_path "$tmp/mixed.jsonl" --job.dump_folder "$tmp/mixed" --training.steps 1
mkdir -p "$tmp/notemplate"
cp "$tokdir/tokenizer.json" "$tmp/notemplate/"
"$CTITAN_PYTHON" -c '
import json, sys
c = json.load(open(sys.argv[1])); c.pop("chat_template", None)
json.dump(c, open(sys.argv[2], "w"))' "$tokdir/tokenizer_config.json" "$tmp/notemplate/tokenizer_config.json"
expect_err "no chat template" "chat.jsonl:1: a conversation .*no chat template.*notemplate" \
  "$ct" train --model.flavor debugmodel --model.tokenizer_path "$tmp/notemplate" \
  --training.dataset_path "$chat" --job.dump_folder "$tmp/nt" --training.steps 1
echo '{"messages": [{"role": "user", "content": "hello"}]}' >"$tmp/noassistant.jsonl"
expect_err "no assistant turn" "no token is trained.*train_on = \"all\"" \
  "$ct" train --model.flavor debugmodel --model.tokenizer_path "$tokdir" \
  --training.dataset_path "$tmp/noassistant.jsonl" --job.dump_folder "$tmp/na" --training.steps 1
echo '{"messages": [{"role": "robot", "content": "hi"}]}' >"$tmp/badrole.jsonl"
expect_err "bad role" "badrole.jsonl:1: .*robot" \
  "$ct" train --model.flavor debugmodel --model.tokenizer_path "$tokdir" \
  --training.dataset_path "$tmp/badrole.jsonl" --job.dump_folder "$tmp/br" --training.steps 1

# --- the loss over assistant tokens is the token-weighted mean over the global batch: one
# process, accumulation, 2 ranks (FSDP), 2 ranks with accumulation, on the same global batch of
# 4 windows whose micro-batches hold different counts of trained tokens
# run NP DUMP [--key value ...]: text_train on the conversations, seq 64, 4 steps of 4 windows;
# the last checkpoint exported to DUMP/hf for `same`.
run() {
  local np=$1 dump=$2; shift 2
  text_train "$np" "$dump" training.dataset_path="$chat" training.seq_len=64 \
    training.global_batch_size=4 checkpoint.interval=2 -- "$@" || return
  local last
  last=$(ls -d "$dump"/checkpoint/step-* 2>/dev/null | sort -t- -k2 -n | tail -1)
  rm -rf "$dump/hf"
  [ -z "$last" ] || "$ct" export --checkpoint "$last" --output "$dump/hf" >/dev/null
}
export -f run
losses() { grep -o '"loss":[^,}]*' "$1/metrics.jsonl" | cut -d: -f2 | tr '\n' ' '; }
# Measured (Release, 2 cores): losses rel up to 3e-9, norms 3e-8, weights 3e-8.
tol=(4e-8 4e-7 4e-7)
check "np1" run 1 "$tmp/np1" --training.local_batch_size 4
check "np1 accum 2" run 1 "$tmp/np1a" --training.local_batch_size 2
check "np2" run 2 "$tmp/np2" --training.local_batch_size 2
check "np2 accum 2" run 2 "$tmp/np2a" --training.local_batch_size 1
check "accum = np1" same "$tmp/np1a" "$tmp/np1" "${tol[@]}"
check "np2 = np1" same "$tmp/np2" "$tmp/np1" "${tol[@]}"
check "np2 accum = np1" same "$tmp/np2a" "$tmp/np1" "${tol[@]}"
grep -q 'conversations rendered with .* of their tokens trained (training.train_on = "assistant")' \
  "$tmp/np1.log" && ok || bad "np1 log lacks the conversations line"
# pre-tokenized lines train exactly as the conversations they came from
check "pre-tokenized" run 1 "$tmp/pre" --training.local_batch_size 4 \
  --training.dataset_path "$tmp/ids.jsonl"
check "pre-tokenized = conversations" same "$tmp/pre" "$tmp/np1" 0 0 0
# train_on = "all" trains more tokens, so another loss
check "train_on all" run 1 "$tmp/all" --training.local_batch_size 4 --training.train_on all
[ "$(losses "$tmp/all")" != "$(losses "$tmp/np1")" ] && ok ||
  bad "train_on all gave the assistant-only losses"

# --- block-causal packing: np2 = np1, and a resume continues bit for bit
check "block np1" run 1 "$tmp/b1" --training.local_batch_size 4 --model.attn_mask_type block_causal --lr_scheduler.decay_ratio 0
check "block np2" run 2 "$tmp/b2" --training.local_batch_size 2 --model.attn_mask_type block_causal --lr_scheduler.decay_ratio 0
check "block np2 = np1" same "$tmp/b2" "$tmp/b1" "${tol[@]}"
grep -q "^attention: block_causal" "$tmp/b1.log" && ok || bad "b1 log lacks the block_causal line"
[ "$(losses "$tmp/b1")" != "$(losses "$tmp/np1")" ] && ok || bad "block_causal changed nothing"
check "block resume, first half" run 1 "$tmp/br" --training.local_batch_size 4 \
  --model.attn_mask_type block_causal --lr_scheduler.decay_ratio 0 --training.steps 2
check "block resume, second half" run 1 "$tmp/br" --training.local_batch_size 4 \
  --model.attn_mask_type block_causal --lr_scheduler.decay_ratio 0
grep -q "resumed from .*step-2" "$tmp/br.log" && ok || bad "no resume: $(grep resum "$tmp/br.log")"
check "block resume = straight" same "$tmp/br" "$tmp/b1" 0 0 0
finish
