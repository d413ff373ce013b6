#!/usr/bin/env bash
# ctitan generate (issue 21) on a tiny random model with Qwen3's vocabulary and the real
# tokenizer and chat template: --json's fields, --timing's line, greedy reruns and seeded
# sampling reproducible, the settings from generation_config.json (min_p, repetition_penalty, unsupported ones named), the stop reasons (eos from generation_config.json, else config.json; length), --input with
# text and messages lines, --chat driven through stdin with /reset (the rendered history checked
# through the prompt ids), a checkpoint as the model, and one error per class.
set -u
: "${CTITAN_BIN:?run through ctest}" "${CTITAN_ASSETS_DIR:?}" "${CTITAN_TMP:?}" "${CTITAN_PYTHON:?}"
ct=$CTITAN_BIN tmp=$CTITAN_TMP tokdir=$CTITAN_ASSETS_DIR/qwen3-tokenizer
rm -rf "$tmp" && mkdir -p "$tmp"
source "$(dirname "$0")/checks.bash" # ok, bad, finish
expect_err() { # NAME PATTERN CMD...: exit 1 with one 'ctitan: error:' line matching PATTERN
  local name=$1 pattern=$2; shift 2
  local out; out=$("$@" 2>&1 >/dev/null </dev/null); local rc=$?
  if [ $rc -eq 1 ] && [ "$(grep -c '^ctitan: error:' <<<"$out")" -eq 1 ] &&
     grep -qE -- "$pattern" <<<"$out"; then ok; else bad "$name (rc $rc): $out"; fi
}
py() { "$CTITAN_PYTHON" - "$@"; }

# The model: 2 layers, GQA, head_dim != hidden/heads, Qwen3's vocabulary, config.json's eos the
# two Qwen3 ids; the tokenizer files beside it.
# write_model DIR [nul]: that model as an HF folder with the tokenizer. nul: untied, every layer's
# output projections 0 (the residual is the embedding row, all ones) and lm_head 0 but row 188
# (the byte 0x00), so greedy says only 188; its eos is off (-1).
write_model() {
  py "$CTITAN_SOURCE_DIR/tests/ref" "$1" "${2:-}" <<'PY'
import json, os, sys
sys.path.insert(0, sys.argv[1]); sys.dont_write_bytecode = True
import torch, make_ref, qwen3_ref, safetensors_ref
nul = sys.argv[3] == "nul"
v = dict(V=151936, C=32, F=48, L=2, NH=4, NKV=2, D=16, tied=not nul, bias=False, dtype="F32",
         theta=1e6, eps=1e-6)
os.makedirs(sys.argv[2])
cfg = make_ref.model_cfg(v)
params = make_ref.make_params(cfg, torch.Generator().manual_seed(5))
if nul:
    for n in params:
        if n.endswith(("o_proj.weight", "down_proj.weight")) or n == "lm_head.weight":
            params[n].zero_()
    params["model.embed_tokens.weight"].fill_(1.0)
    params["lm_head.weight"][188].fill_(1.0)
hc = make_ref.hf_config(v)
hc.update(eos_token_id=-1 if nul else [151643, 151645], max_position_embeddings=256)
json.dump(hc, open(os.path.join(sys.argv[2], "config.json"), "w"))
safetensors_ref.write_folder(sys.argv[2], [(n, params[n]) for n, _ in qwen3_ref.param_shapes(cfg)],
                             "F32", 0)
PY
  cp "$tokdir"/tokenizer.json "$tokdir"/tokenizer_config.json "$1"/
}
hf=$tmp/hf
write_model "$hf"

field() { py "$1" "$2" <<'PY'; } # FILE KEY [line 1]: a field of a JSON line
import json, sys
print(json.dumps(json.loads(open(sys.argv[1]).readline())[sys.argv[2]]))
PY

# --- --json: the fields, greedy reproducible, length stop, text = decode(ids)
g=("$ct" generate --model.hf_path "$hf" --temperature 0 --json)
"${g[@]}" --prompt "Hello, world" --max_new_tokens 6 >"$tmp/a.json" 2>"$tmp/a.err" || bad "greedy run: $(cat "$tmp/a.err")"
"${g[@]}" --prompt "Hello, world" --max_new_tokens 6 >"$tmp/b.json" 2>/dev/null
cmp -s "$tmp/a.json" "$tmp/b.json" && ok || bad "greedy rerun differs"
py "$tmp/a.json" "$tokdir" <<'PY' && ok || bad "--json fields: $(cat "$tmp/a.json")"
import json, sys
o = json.loads(open(sys.argv[1]).read())
assert sorted(o) == ["ids", "prompt_ids", "stop", "text"], o
assert o["prompt_ids"] == [9707, 11, 1879], o["prompt_ids"]  # "Hello, world"
assert len(o["ids"]) == 6 and o["stop"] == "length", o
PY
# --timing: the same output, and one stderr line with the prefill's and the decodes' counts (6 new
# tokens: the first from the prefill's logits, then 5 decodes).
"${g[@]}" --prompt "Hello, world" --max_new_tokens 6 --timing >"$tmp/t.json" 2>"$tmp/t.err"
cmp -s "$tmp/a.json" "$tmp/t.json" && [ "$(wc -l <"$tmp/t.err")" -eq 1 ] &&
  grep -qE '^ctitan: timing: prefill 3 tokens in [0-9.]+ s \([0-9.]+ tokens/s\), decode 5 tokens in [0-9.]+ s \([0-9.]+ tokens/s\)$' "$tmp/t.err" &&
  ok || bad "--timing: $(cat "$tmp/t.err")"
# --debug.profile_ops: the same output, and a table of the 5 decode steps' ops (attention_decode
# once a layer, 2 layers, and 9 products a token: 4 a layer and the head; the prefill's would
# add theirs).
"${g[@]}" --prompt "Hello, world" --max_new_tokens 6 --debug.profile_ops >"$tmp/p.json" 2>"$tmp/p.err"
cmp -s "$tmp/a.json" "$tmp/p.json" &&
  grep -qE '^op profile: mean over 5 step\(s\) of [0-9.]+ ms$' "$tmp/p.err" &&
  grep -qE '^  attention_decode +forward +2\.0 ' "$tmp/p.err" &&
  grep -qE '^  matmul +forward +9\.0 ' "$tmp/p.err" &&
  ok || bad "--debug.profile_ops: $(cat "$tmp/p.err")"
# The streamed text is the JSON's text.
"$ct" generate --model.hf_path "$hf" --temperature 0 --prompt "Hello, world" --max_new_tokens 6 \
  >"$tmp/a.txt" 2>/dev/null
py "$tmp/a.json" "$tmp/a.txt" <<'PY' && ok || bad "streamed text differs from --json's"
import json, sys
t = json.loads(open(sys.argv[1]).read())["text"]
assert open(sys.argv[2], encoding="utf-8").read() == t + "\n"
PY
# Seeded sampling: the same seed the same ids, another seed other ids.
s=("$ct" generate --model.hf_path "$hf" --json --prompt "Once" --max_new_tokens 12 --temperature 1.5 --top_k 50 --top_p 0.9)
"${s[@]}" --seed 7 >"$tmp/s7a.json" 2>/dev/null; "${s[@]}" --seed 7 >"$tmp/s7b.json" 2>/dev/null
"${s[@]}" --seed 8 >"$tmp/s8.json" 2>/dev/null
cmp -s "$tmp/s7a.json" "$tmp/s7b.json" && ok || bad "seed 7 twice differs"
cmp -s "$tmp/s7a.json" "$tmp/s8.json" && bad "seeds 7 and 8 gave the same ids" || ok
# bf16 runs (its greedy ids may differ from fp32's by rounding; it must run and stop)
"${g[@]}" --prompt "Hello, world" --max_new_tokens 4 --training.mixed_precision_param bfloat16 \
  >"$tmp/bf16.json" 2>"$tmp/bf16.err" && [ "$(field "$tmp/bf16.json" stop)" = '"length"' ] && ok ||
  bad "bf16: $(cat "$tmp/bf16.err")"

# --- sampling settings not given come from generation_config.json, as HF's generate takes them:
# greedy without the file (the same ids as --temperature 0), its do_sample/temperature/top_k/
# top_p with it (the same ids as those options given), an option given winning
gen8() { "$ct" generate --model.hf_path "$hf" --json --prompt "Once" --max_new_tokens 12 --seed 7 "$@" 2>/dev/null; }
gen8 >"$tmp/d0.json"; gen8 --temperature 0 >"$tmp/d1.json"
cmp -s "$tmp/d0.json" "$tmp/d1.json" && ok || bad "the default without generation_config.json is not greedy"
echo '{"do_sample": true, "temperature": 1.5, "top_k": 50, "top_p": 0.9}' >"$hf/generation_config.json"
gen8 >"$tmp/d2.json"
cmp -s "$tmp/d2.json" "$tmp/s7a.json" && ok || bad "settings from generation_config.json"
gen8 --top_k 3 >"$tmp/d3.json"
rm "$hf/generation_config.json"
gen8 --temperature 1.5 --top_k 3 --top_p 0.9 >"$tmp/d4.json"
cmp -s "$tmp/d3.json" "$tmp/d4.json" && ! cmp -s "$tmp/d3.json" "$tmp/d2.json" && ok ||
  bad "an option given over generation_config.json"
# min_p and repetition_penalty from the file as from the options; the penalty applies to greedy
# (HF's processor runs without do_sample) and changes this prompt's greedy ids
echo '{"do_sample": true, "temperature": 1.5, "top_k": 0, "min_p": 0.05, "repetition_penalty": 1.3}' \
  >"$hf/generation_config.json"
gen8 >"$tmp/m1.json"
echo '{"repetition_penalty": 1.3}' >"$hf/generation_config.json"
gen8 >"$tmp/r1.json"
rm "$hf/generation_config.json"
gen8 --temperature 1.5 --top_k 0 --min_p 0.05 --repetition_penalty 1.3 >"$tmp/m2.json"
gen8 --temperature 0 --repetition_penalty 1.3 >"$tmp/r2.json"
cmp -s "$tmp/m1.json" "$tmp/m2.json" && ok || bad "min_p and repetition_penalty from generation_config.json"
cmp -s "$tmp/r1.json" "$tmp/r2.json" && ! cmp -s "$tmp/r1.json" "$tmp/d1.json" && ok ||
  bad "greedy with generation_config.json's repetition_penalty"
# a setting HF would use and ctitan does not: named on stderr, one line each, and generation runs
echo '{"num_beams": 4, "no_repeat_ngram_size": 3, "suppress_tokens": [5], "num_return_sequences": 1}' \
  >"$hf/generation_config.json"
"$ct" generate --model.hf_path "$hf" --json --prompt "Once" --max_new_tokens 4 >"$tmp/u.json" 2>"$tmp/u.err" &&
  [ "$(grep -c 'is not supported; generating without it' "$tmp/u.err")" = 3 ] &&
  grep -q 'generation_config.json: num_beams 4 is not supported' "$tmp/u.err" && ok ||
  bad "unsupported generation_config settings: $(cat "$tmp/u.err")"
rm "$hf/generation_config.json"

# --- eos: generation_config.json's eos over config.json's; config.json's when absent (on the
# seeded sampling run: the greedy one repeats one token)
first=$(py "$tmp/s7a.json" <<'PY'
import json, sys; print(json.loads(open(sys.argv[1]).read())["ids"][0])
PY
)
# the first new id unlike those before it, and the ids before it
read -r second before < <(py "$tmp/s7a.json" <<'PY'
import json, sys
ids = json.loads(open(sys.argv[1]).read())["ids"]
j = next(j for j in range(1, len(ids)) if ids[j] not in ids[:j])
print(ids[j], json.dumps(ids[:j]).replace(" ", ""))
PY
)
echo "{\"eos_token_id\": $first}" >"$hf/generation_config.json"
"${s[@]}" --seed 7 >"$tmp/e1.json" 2>/dev/null
[ "$(field "$tmp/e1.json" stop)" = '"eos"' ] && [ "$(field "$tmp/e1.json" ids)" = '[]' ] && ok ||
  bad "generation_config eos: $(cat "$tmp/e1.json")"
rm "$hf/generation_config.json"
py "$hf/config.json" "$second" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["eos_token_id"] = int(sys.argv[2]); json.dump(c, open(sys.argv[1], "w"))
PY
"${s[@]}" --seed 7 >"$tmp/e2.json" 2>/dev/null
[ "$(field "$tmp/e2.json" stop)" = '"eos"' ] &&
  [ "$(field "$tmp/e2.json" ids | tr -d ' ')" = "$before" ] && ok ||
  bad "config.json eos: $(cat "$tmp/e2.json")"
py "$hf/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["eos_token_id"] = [151643, 151645]; json.dump(c, open(sys.argv[1], "w"))
PY

# an eos id past int32 (or a fraction) is refused before it converts; -1 switches stopping off
for bad_eos in 1e20 2.5 '"x"'; do
  echo "{\"eos_token_id\": $bad_eos}" >"$hf/generation_config.json"
  out=$("${s[@]}" --seed 7 2>&1) && bad "eos_token_id $bad_eos accepted" ||
    { grep -q "generation_config.json: eos_token_id: expected" <<<"$out" && ok || bad "eos $bad_eos: $out"; }
done
echo '{"eos_token_id": -1}' >"$hf/generation_config.json"
"${s[@]}" --seed 7 >"$tmp/e3.json" 2>/dev/null && [ "$(field "$tmp/e3.json" stop)" = '"length"' ] && ok ||
  bad "eos_token_id -1: $(cat "$tmp/e3.json")"
rm "$hf/generation_config.json"

# --json keeps NUL bytes: a model that can only say id 188 (the byte 0x00)
write_model "$tmp/nulhf" nul
"$ct" generate --model.hf_path "$tmp/nulhf" --prompt "Hi" --max_new_tokens 3 --temperature 0 \
  --json >"$tmp/nul.json" 2>"$tmp/nul.err" || bad "NUL model: $(cat "$tmp/nul.err")"
[ "$(field "$tmp/nul.json" ids)" = "[188, 188, 188]" ] && [ "$(field "$tmp/nul.json" text)" = '"\u0000\u0000\u0000"' ] &&
  ok || bad "--json lost NUL bytes: $(cat "$tmp/nul.json")"

# A generated token allocates nothing: the process's allocations (tests/alloc_count.c, preloaded)
# for 256 new tokens against 8 differ only by the buffers' doublings (measured: 6). Streaming
# re-decoded every id after each token before, two allocations a token. Not under ASan, whose
# runtime owns malloc.
if ldd "$ct" 2>/dev/null | grep -q libasan; then ok; else
  for n in 8 256; do
    LD_PRELOAD=$CTITAN_ALLOC_COUNT "$ct" generate --model.hf_path "$tmp/nulhf" --prompt "Hi" \
      --max_new_tokens $n --temperature 0 >/dev/null 2>"$tmp/alloc$n.err"
  done
  a8=$(sed -n 's/^alloc_count: //p' "$tmp/alloc8.err") a256=$(sed -n 's/^alloc_count: //p' "$tmp/alloc256.err")
  [ -n "$a8" ] && [ -n "$a256" ] && [ $((a256 - a8)) -le 16 ] && ok ||
    bad "allocations: $a8 for 8 new tokens, $a256 for 256: $(tail -2 "$tmp/alloc256.err")"
fi

# --- --input: a text line and a messages line (rendered with the template, generation prompt)
printf '%s\n' '{"prompt": "Hello, world"}' '' \
  '{"messages": [{"role": "user", "content": "Hi"}]}' >"$tmp/in.jsonl"
"${g[@]}" --input "$tmp/in.jsonl" --max_new_tokens 6 >"$tmp/in.json" 2>"$tmp/in.err" || bad "--input: $(cat "$tmp/in.err")"
py "$tmp/in.json" "$tmp/a.json" "$hf" <<'PY' && ok || bad "--input output: $(cat "$tmp/in.json")"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 2, rows
assert rows[0] == json.loads(open(sys.argv[2]).read()), rows[0]
# <|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n
assert rows[1]["prompt_ids"] == [151644, 872, 198, 13048, 151645, 198, 151644, 77091, 198], rows[1]
PY

# --- --chat through stdin: two turns, /reset, one turn; each turn's prompt is the history
printf 'Hi\nHow are you?\n/reset\nHi\n' |
  "${g[@]}" --chat --max_new_tokens 5 >"$tmp/chat.json" 2>"$tmp/chat.err" || bad "--chat: $(cat "$tmp/chat.err")"
py "$tmp/chat.json" "$tokdir" <<'PY' && ok || bad "--chat turns: $(cat "$tmp/chat.json")"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 3, rows
a, b, c = rows
assert a == c, (a, c)                      # /reset: the third turn starts afresh
assert b["prompt_ids"][:len(a["prompt_ids"])] == a["prompt_ids"]  # the history first
assert len(b["prompt_ids"]) > len(a["prompt_ids"]) + len(a["ids"])
assert b["prompt_ids"][-3:] == [151644, 77091, 198]  # <|im_start|>assistant\n
PY
[ -s "$tmp/chat.err" ] && bad "--chat printed to stderr without a TTY: $(cat "$tmp/chat.err")" || ok

# --- --chat refuses a line alone: one not UTF-8 and one the cache cannot hold are each an error
# naming the line; the other turns run as in a chat without them (the history and the cache
# kept), and the exit status says lines were refused.
long=$(printf 'word %.0s' $(seq 200))
printf 'Hi\n\xff\xfe\n%s\nHow are you?\n' "$long" |
  "${g[@]}" --chat --max_new_tokens 5 --cache_len 128 >"$tmp/chat_bad.json" 2>"$tmp/chat_bad.err"
rc=$?
printf 'Hi\nHow are you?\n' | "${g[@]}" --chat --max_new_tokens 5 --cache_len 128 >"$tmp/chat_good.json" 2>&1 ||
  bad "--chat without the bad lines: $(cat "$tmp/chat_good.json")"
if [ $rc -eq 1 ] && cmp -s "$tmp/chat_bad.json" "$tmp/chat_good.json" &&
   [ "$(grep -c '^ctitan: error:' "$tmp/chat_bad.err")" -eq 3 ] &&
   grep -q '^ctitan: error: --chat: line 2 was not sent (the history is kept): invalid UTF-8 at byte 0 (0xFF)$' "$tmp/chat_bad.err" &&
   grep -q '^ctitan: error: --chat: line 3 was not sent .*the KV cache holds 128 positions' "$tmp/chat_bad.err" &&
   grep -q '^ctitan: error: --chat: 2 line(s) not sent' "$tmp/chat_bad.err"; then ok
else bad "--chat's refused lines (rc $rc): $(cat "$tmp/chat_bad.err" "$tmp/chat_bad.json" "$tmp/chat_good.json")"; fi

# --- --chat keeps the KV cache across turns: three turns, fp32 and bf16, with --timing. Each
# turn's reply (and prompt) equals a fresh run given the same history at once (--input with the
# messages, the same cache length, so the same bf16 row buckets). Each turn prefills only what
# follows the longest common prefix of its rendered ids and the cached ones (the last turn's
# prompt, then its new ids fed through decode: all but the last unless it stopped at eos), and
# turns 2 and 3 reuse at least the whole previous prompt.
for prec in float32 bfloat16; do
  c=("${g[@]}" --max_new_tokens 5 --cache_len 256 --training.mixed_precision_param "$prec")
  printf 'Hi\nHow are you?\nTell me more\n' | "${c[@]}" --chat --timing \
    >"$tmp/kv_$prec.json" 2>"$tmp/kv_$prec.err" || bad "--chat $prec: $(cat "$tmp/kv_$prec.err")"
  py "$tmp/kv_$prec.json" "$tmp/kv_in_$prec.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
history = []
with open(sys.argv[2], "w") as f:
    for user, row in zip(["Hi", "How are you?", "Tell me more"], rows):
        history.append({"role": "user", "content": user})
        f.write(json.dumps({"messages": history}) + "\n")
        history.append({"role": "assistant", "content": row["text"]})
PY
  "${c[@]}" --input "$tmp/kv_in_$prec.jsonl" >"$tmp/kv_fresh_$prec.json" 2>"$tmp/kv_fresh_$prec.err" ||
    bad "--input $prec: $(cat "$tmp/kv_fresh_$prec.err")"
  py "$tmp/kv_$prec.json" "$tmp/kv_fresh_$prec.json" "$tmp/kv_$prec.err" <<'PY' && ok ||
import json, re, sys
chat = [json.loads(l) for l in open(sys.argv[1])]
fresh = [json.loads(l) for l in open(sys.argv[2])]
assert len(chat) == len(fresh) == 3, (chat, fresh)
for k in range(3):
    assert chat[k] == fresh[k], f"turn {k + 1} differs from a fresh prefill of its history"
line = (r"ctitan: timing: prefill (\d+) tokens in [0-9.]+ s \([0-9.]+ tokens/s\), decode \d+ "
        r"tokens in [0-9.]+ s \([0-9.]+ tokens/s\), (\d+) tokens reused from the cache")
timing = [re.fullmatch(line, l) for l in open(sys.argv[3]).read().splitlines()]
assert len(timing) == 3 and all(timing), timing
cached = []
for k, (row, t) in enumerate(zip(chat, timing)):
    ids, prefilled, reused = row["prompt_ids"], int(t[1]), int(t[2])
    lcp = 0
    while lcp < min(len(cached), len(ids)) and cached[lcp] == ids[lcp]:
        lcp += 1
    assert reused == min(lcp, len(ids) - 1) and prefilled == len(ids) - reused, (k, lcp, t[0])
    assert k == 0 or reused >= len(chat[k - 1]["prompt_ids"]), (k, t[0])
    print(f"turn {k + 1}: {len(ids)} tokens, {len(cached)} cached, {reused} reused, "
          f"{prefilled} prefilled")
    cached = ids + (row["ids"] if row["stop"] == "eos" else row["ids"][:-1])
PY
    bad "--chat's cache, $prec: $(cat "$tmp/kv_$prec.json" "$tmp/kv_fresh_$prec.json" "$tmp/kv_$prec.err")"
done

# --- a checkpoint as the model: the same greedy ids as its HF folder
ck=$tmp/ckpt
"$ct" train --model.backend hf --model.hf_path "$hf" --model.tokenizer_path "$tokdir" \
  --training.dataset_path "$CTITAN_ASSETS_DIR/corpus/small.txt" --training.seq_len 16 \
  --training.local_batch_size 1 --training.steps 1 --optimizer.lr 0 --lr_scheduler.warmup_steps 0 \
  --checkpoint.enable true --checkpoint.interval 1 --job.dump_folder "$ck" >"$tmp/train.log" 2>&1 ||
  bad "train for a checkpoint: $(tail -3 "$tmp/train.log")"
"$ct" generate --temperature 0 --json --checkpoint "$ck/checkpoint" --prompt "Hello, world" --max_new_tokens 6 \
  >"$tmp/ck.json" 2>"$tmp/ck.err" && cmp -s "$tmp/ck.json" "$tmp/a.json" && ok ||
  bad "checkpoint: $(cat "$tmp/ck.json" "$tmp/ck.err")"
# ... and in bf16, where the model holds its matrices in bf16 only (the checkpoint's fp32 weights
# pass through a host copy): the same ids as the HF folder in bf16
for src in "--model.hf_path $hf" "--checkpoint $ck/checkpoint"; do
  # shellcheck disable=SC2086
  "$ct" generate --temperature 0 --json $src --prompt "Hello, world" --max_new_tokens 6 \
    --training.mixed_precision_param bfloat16 >"$tmp/ck16_${src%% *}.json" 2>"$tmp/ck16.err" ||
    bad "bf16 from $src: $(cat "$tmp/ck16.err")"
done
cmp -s "$tmp/ck16_--model.hf_path.json" "$tmp/ck16_--checkpoint.json" && ok ||
  bad "bf16 checkpoint: $(cat "$tmp/ck16_--model.hf_path.json" "$tmp/ck16_--checkpoint.json")"

# --- train's run setup: the guarded backend gives the same ids; a user plugin runs (its parity
# check first, its own call counters after) with the same ids (rope_hf_avx2 is exact), and a wrong
# one is refused before anything is generated
"${g[@]}" --prompt "Hello, world" --max_new_tokens 6 --debug.guard_device_memory \
  >"$tmp/guard.json" 2>"$tmp/guard.err" && cmp -s "$tmp/a.json" "$tmp/guard.json" && ok ||
  bad "guarded backend: $(cat "$tmp/guard.json" "$tmp/guard.err")"
kernels=$CTITAN_BUILD_DIR/examples/kernels
"${g[@]}" --prompt "Hello, world" --max_new_tokens 6 --override.imports "$kernels/librope_hf_avx2.so" \
  >"$tmp/rope.json" 2>"$tmp/rope.err" && cmp -s "$tmp/a.json" "$tmp/rope.json" &&
  grep -q "override: rope_hf" "$tmp/rope.err" &&
  grep -qE "override calls: rope_hf forward [1-9]" "$tmp/rope.err" && ok ||
  bad "rope plugin: $(cat "$tmp/rope.json" "$tmp/rope.err")"
expect_err "wrong plugin refused" "refused.*rope_hf.*max abs" "$ct" generate --model.hf_path "$hf" \
  --prompt x --override.imports "$kernels/librope_interleaved_wrong.so"
# The memory check, before any weight is read: a config.json of about 1.5 TB of weights (the
# folder holds no weights at all).
mkdir -p "$tmp/big" && py "$hf/config.json" "$tmp/big/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c.update(hidden_size=8192, intermediate_size=65536, num_hidden_layers=200, num_attention_heads=64,
         num_key_value_heads=8, head_dim=128)
json.dump(c, open(sys.argv[2], "w"))
PY
expect_err "does not fit" "KV cache of 16 positions needs about [0-9.]+ GiB \(weights [0-9.]+, KV cache.*--training.allow_overcommit" \
  "$ct" generate --model.hf_path "$tmp/big" --model.tokenizer_path "$hf" --prompt x --cache_len 16
# generate takes its keys from train's table: the same checks, messages and suggestions
expect_err "train's check" 'model.attn_backend: expected one of "auto", "sdpa", "flash", found "fast"' \
  "$ct" generate --model.hf_path "$hf" --prompt x --model.attn_backend fast
expect_err "a key generate does not take" "unknown option --optimizer.lr \(see ctitan generate --help\)" \
  "$ct" generate --model.hf_path "$hf" --prompt x --optimizer.lr 1
expect_err "suggestion" "unknown option --max_new_token \(did you mean --max_new_tokens\?\)" \
  "$ct" generate --model.hf_path "$hf" --prompt x --max_new_token 3

# --- verify takes train's model.attn_mask_type (here: this test's model has Qwen3's vocabulary,
# so <|endoftext|> can end a document): block_causal computes each document as its own sequence,
# so the window's loss is the two documents' losses alone, weighted by their targets (6 and 9;
# the target across the boundary is not trained).
py "$tmp" <<'PY'
import numpy as np, sys
d1, d2 = [9707, 11, 1879, 13, 576, 374, 151643], [791, 3974, 14198, 38835, 34208, 916, 279, 15678, 5562, 13]
np.save(sys.argv[1] + "/docs.npy", np.array(d1 + d2, np.int32))
np.save(sys.argv[1] + "/d1.npy", np.array(d1, np.int32))
np.save(sys.argv[1] + "/d2.npy", np.array(d2, np.int32))
PY
vloss() { "$ct" verify --model.hf_path "$hf" --training.local_batch_size 1 --json "$@" 2>/dev/null | tail -n 1; }
vloss --training.dataset_path "$tmp/docs.npy" --training.seq_len 16 >"$tmp/v_causal.json"
vloss --training.dataset_path "$tmp/docs.npy" --training.seq_len 16 --model.attn_mask_type block_causal >"$tmp/v_block.json"
vloss --training.dataset_path "$tmp/d1.npy" --training.seq_len 6 >"$tmp/v_d1.json"
vloss --training.dataset_path "$tmp/d2.npy" --training.seq_len 9 >"$tmp/v_d2.json"
py "$tmp" <<'PY' && ok || bad "verify block_causal: $(cat "$tmp"/v_*.json)"
import json, sys
r = {k: json.load(open("%s/v_%s.json" % (sys.argv[1], k))) for k in ("causal", "block", "d1", "d2")}
want = (6 * r["d1"]["loss"] + 9 * r["d2"]["loss"]) / 15
assert r["block"]["n_valid"] == 15 and r["causal"]["n_valid"] == 16, r
assert abs(r["block"]["loss"] - want) <= 1e-5 * want, (r["block"]["loss"], want)
assert abs(r["causal"]["loss"] - want) > 1e-3 * want, "causal equals block_causal"
PY

# --- errors: one line, the file or option named, exit 1
expect_err "missing folder" "--model.hf_path $tmp/none" "$ct" generate --model.hf_path "$tmp/none" --prompt x
expect_err "no model" "exactly one of --model.hf_path DIR, --checkpoint DIR" "$ct" generate --prompt x
expect_err "two prompt kinds" "exactly one of --prompt TEXT, --input FILE, --chat" \
  "$ct" generate --model.hf_path "$hf" --prompt x --chat
expect_err "bad temperature" "--temperature: expected a number, found 'hot'" \
  "$ct" generate --model.hf_path "$hf" --prompt x --temperature hot
expect_err "bad top_p" "--top_p 1.5: expected a number in \(0, 1\]" \
  "$ct" generate --model.hf_path "$hf" --prompt x --top_p 1.5
expect_err "bad min_p" "--min_p 1.5: expected a number in \[0, 1\]" \
  "$ct" generate --model.hf_path "$hf" --prompt x --min_p 1.5
expect_err "bad repetition_penalty" "--repetition_penalty 0: expected a finite number > 0" \
  "$ct" generate --model.hf_path "$hf" --prompt x --repetition_penalty 0
echo '{"do_sample": true, "min_p": 2}' >"$hf/generation_config.json"
expect_err "bad min_p in generation_config.json" "generation_config.json's sampling settings: --min_p 2" \
  "$ct" generate --model.hf_path "$hf" --prompt x
# a setting of the wrong type is refused (HF's would fail later, in its warpers), naming the key
echo '{"do_sample": true, "temperature": "0.7"}' >"$hf/generation_config.json"
expect_err "string temperature in generation_config.json" \
  "generation_config.json: key \"temperature\": expected a number, found a string" \
  "$ct" generate --model.hf_path "$hf" --prompt x
echo '[1]' >"$hf/generation_config.json"
expect_err "generation_config.json not an object" \
  "generation_config.json: expected a JSON object, found an array" \
  "$ct" generate --model.hf_path "$hf" --prompt x
rm "$hf/generation_config.json"
expect_err "bad max_new_tokens" "--max_new_tokens: expected an integer" \
  "$ct" generate --model.hf_path "$hf" --prompt x --max_new_tokens many
expect_err "prompt longer than the cache" "a prompt of 3 tokens does not fit the KV cache of 3 positions" \
  "$ct" generate --model.hf_path "$hf" --prompt "Hello, world" --cache_len 3
expect_err "cache past the positions" "--cache_len: 300 exceeds max_position_embeddings 256" \
  "$ct" generate --model.hf_path "$hf" --prompt x --cache_len 300
echo '{"text": "x"}' >"$tmp/bad.jsonl"
expect_err "bad input line" "--input $tmp/bad.jsonl line 1: expected" \
  "$ct" generate --model.hf_path "$hf" --input "$tmp/bad.jsonl"
# Every --input line is read and checked before the model loads, with --cache_len too: a bad or
# too long line is refused before any line runs (nothing on stdout).
printf '%s\n' '{"prompt": "Hi"}' '{"prompt": "Hello, world, and more words"}' '{"text": 1}' >"$tmp/late.jsonl"
for case in "4|line 2: a prompt of [0-9]+ tokens does not fit the KV cache of 4 positions" "64|line 3: expected"; do
  "$ct" generate --model.hf_path "$hf" --input "$tmp/late.jsonl" --cache_len "${case%%|*}" \
    >"$tmp/late.out" 2>"$tmp/late.err"
  rc=$?
  [ $rc -eq 1 ] && [ ! -s "$tmp/late.out" ] && grep -qE -- "--input $tmp/late.jsonl ${case#*|}" "$tmp/late.err" &&
    ok || bad "--input checked first, --cache_len ${case%%|*} (rc $rc): $(cat "$tmp/late.out" "$tmp/late.err")"
done

finish
