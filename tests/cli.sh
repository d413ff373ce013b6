#!/usr/bin/env bash
# The ctitan binary end to end: help and version, option errors with suggestions, `verify` and
# `inspect` on the PyTorch reference models, and one clear error (non-zero exit, a message naming
# the file/key/tensor) for each kind of bad input.
set -u
: "${CTITAN_BIN:?run through ctest}" "${CTITAN_REF_DIR:?}" "${CTITAN_TMP:?}" "${CTITAN_PYTHON:?}"
source "$(dirname "$0")/checks.bash" # ok, bad, finish

# expect_ok NAME PATTERN CMD...: exit 0 and stdout matches PATTERN (grep -E)
expect_ok() {
  local name=$1 pattern=$2; shift 2
  local out; out=$("$@" 2>&1); local rc=$?
  if [ $rc -eq 0 ] && grep -qE -- "$pattern" <<<"$out"; then ok; else bad "$name (rc $rc): $out"; fi
}
# expect_err NAME PATTERN CMD...: non-zero exit, one 'ctitan: error:' line matching PATTERN,
# and no crash (exit code 1, not a signal).
expect_err() {
  local name=$1 pattern=$2; shift 2
  local out; out=$("$@" 2>&1 >/dev/null); local rc=$?
  if [ $rc -eq 1 ] && [ "$(grep -c '^ctitan: error:' <<<"$out")" -eq 1 ] &&
     grep -qE -- "$pattern" <<<"$out"; then ok; else bad "$name (rc $rc): $out"; fi
}
meta() { "$CTITAN_PYTHON" -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$1" "$2"; }

ct=$CTITAN_BIN
tmp=$CTITAN_TMP; rm -rf "$tmp"; mkdir -p "$tmp"

# --- help, version, suggestions
expect_ok help 'verify' "$ct" --help
expect_ok version '^ctitan [0-9]+\.[0-9]+\.[0-9]+' "$ct" --version
expect_ok verify_help 'training.seq_len VALUE.*default: 2048' "$ct" verify --help
expect_ok inspect_help 'json' "$ct" inspect --help
expect_err unknown_sub "unknown subcommand 'verfy' \(did you mean 'verify'\?\)" "$ct" verfy
expect_err unknown_opt 'unknown option --training.seqlen \(did you mean --training.seq_len\?\)' \
  "$ct" verify --training.seqlen=4
expect_err missing_value 'needs a value' "$ct" verify --model.hf_path
expect_err bad_int "training.seq_len: expected an integer, found 'abc'" \
  "$ct" verify --model.hf_path x --training.dataset_path y --training.seq_len abc
expect_err missing_required 'verify needs --model.hf_path' "$ct" verify

# --- verify matches PyTorch on every reference model (loss 1e-5 rel, grad norm 1e-4 rel). An
# empty or unreadable reference folder must not pass: dense and MoE models must both be checked.
verified_dense=0 verified_moe=0
for dir in "$CTITAN_REF_DIR"/*/; do
  [ -f "$dir/meta.json" ] || continue
  name=$(basename "$dir")
  B=$(meta "$dir/meta.json" B); T=$(meta "$dir/meta.json" T)
  ignored=$(meta "$dir/meta.json" ignore_positions)
  [ "$ignored" = "[]" ] || continue # verify has no ignore mask; test_parity covers those
  case $name in moe*) verified_moe=$((verified_moe + 1)) ;; *) verified_dense=$((verified_dense + 1)) ;; esac
  want_loss=$(meta "$dir/meta.json" loss); want_norm=$(meta "$dir/meta.json" grad_norm)
  out=$("$ct" verify --model.hf_path "$dir/hf" --training.dataset_path "$dir/tokens.npy" \
        --training.seq_len "$T" --training.local_batch_size "$B" --json 2>&1)
  # MoE folders: HF's loss (ce + coef * aux when output_router_logits), and ce and aux apart.
  if "$CTITAN_PYTHON" - "$want_loss" "$want_norm" "$(tail -n 1 <<<"$out")" "$dir/meta.json" \
     "$out" <<'PY'
import json, sys
r, meta = json.loads(sys.argv[3]), json.load(open(sys.argv[4]))
loss, norm = float(sys.argv[1]), float(sys.argv[2])
ok = abs(r["loss"] - loss) <= 1e-5 * abs(loss) and abs(r["grad_norm"] - norm) <= 1e-4 * norm
ok = ok and r["missing"] == [] and r["unexpected"] == [] and r["num_params"] > 0
if meta.get("moe"):
    ok = ok and abs(r["ce"] - meta["ce"]) <= 1e-5 * meta["ce"]
    ok = ok and abs(r["aux"] - meta["aux"]) <= 1e-5 * meta["aux"]
    ok = ok and "\nce: " in sys.argv[5] and "\naux: " in sys.argv[5]
else:
    ok = ok and "ce" not in r and "aux" not in r
sys.exit(0 if ok else 1)
PY
  then ok; else bad "verify $name: want loss $want_loss grad_norm $want_norm, got: $out"; fi
done
echo "verify: $verified_dense dense and $verified_moe MoE reference models"
[ "$verified_dense" -gt 0 ] && [ "$verified_moe" -gt 0 ] && ok ||
  bad "verify checked $verified_dense dense and $verified_moe MoE models in $CTITAN_REF_DIR"

# The reference expert kernel gives the same loss through verify; a bad kernel name is refused.
moe=$CTITAN_REF_DIR/moe_ties_zero_router_k2 # no ignored targets: verify has no mask
out=$("$ct" verify --model.hf_path "$moe/hf" --training.dataset_path "$moe/tokens.npy" \
  --training.seq_len "$(meta "$moe/meta.json" T)" --training.local_batch_size \
  "$(meta "$moe/meta.json" B)" --model.moe_impl loop --json 2>&1)
"$CTITAN_PYTHON" -c 'import json, sys; r = json.loads(sys.argv[1]); m = json.load(open(sys.argv[2]))
sys.exit(0 if abs(r["loss"] - m["loss"]) <= 1e-5 * m["loss"] else 1)' "$(tail -n 1 <<<"$out")" \
  "$moe/meta.json" && grep -q "expert kernel loop" <<<"$out" && ok || bad "verify_moe_loop: $out"
expect_err verify_bad_moe_impl 'model.moe_impl: expected one of "grouped", "loop", found "fast"' \
  "$ct" verify --model.hf_path "$moe/hf" --training.dataset_path "$moe/tokens.npy" \
  --model.moe_impl fast

# verify runs the attention kernel train runs (model.attn_backend, auto = flash) and says which;
# sdpa stays available.
expect_ok verify_attn_default 'kernels: attention flash, experts grouped' "$ct" verify \
  --model.hf_path "$moe/hf" --training.dataset_path "$moe/tokens.npy" --training.seq_len 5 \
  --training.local_batch_size 2
expect_ok verify_attn_sdpa '"attn_backend":"sdpa"' "$ct" verify --model.hf_path "$moe/hf" \
  --training.dataset_path "$moe/tokens.npy" --training.seq_len 5 --training.local_batch_size 2 \
  --model.attn_backend sdpa --json
# verify takes its keys from train's table: a key it does not take is unknown to it, and a typo
# is answered with a key it takes
expect_err verify_not_its_key 'unknown option --optimizer.lr \(see ctitan verify --help\)' \
  "$ct" verify --model.hf_path "$moe/hf" --training.dataset_path "$moe/tokens.npy" --optimizer.lr 1
expect_err verify_typo 'unknown option --model.attn_mask_typ \(did you mean --model.attn_mask_type\?\)' \
  "$ct" verify --model.hf_path "$moe/hf" --training.dataset_path "$moe/tokens.npy" \
  --model.attn_mask_typ block_causal
expect_err verify_bad_attn 'model.attn_backend: expected one of "auto", "sdpa", "flash", found "fast"' \
  "$ct" verify --model.hf_path "$moe/hf" --training.dataset_path "$moe/tokens.npy" \
  --model.attn_backend fast

# --- inspect
v=$CTITAN_REF_DIR/gqa2_hd16_tied_bias_bf16_sharded/hf
expect_ok inspect_sharded 'model\.embed_tokens\.weight +BF16' "$ct" inspect "$v"
expect_ok inspect_totals 'valid: yes' "$ct" inspect "$v"
expect_ok inspect_json '"num_tensors":' "$ct" inspect "$v" --json
# Names from a file are echoed with their control characters escaped, in listings and errors.
"$CTITAN_PYTHON" - "$tmp/ctl.safetensors" "$tmp/ctl_dtype.safetensors" <<'PY'
import json, struct, sys
def write(path, header, data):
    h = json.dumps(header).encode()
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + data)
write(sys.argv[1], {"a\nb\x1b[31m": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4)
write(sys.argv[2], {"w": {"dtype": "F\n32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4)
PY
out=$("$ct" inspect "$tmp/ctl.safetensors" 2>&1)
if [ "$(grep -c . <<<"$out")" -eq 3 ] && grep -qF 'a\nb\x1b[31m ' <<<"$out" &&
   ! grep -q $'\x1b' <<<"$out"; then ok; else bad "inspect_control_chars: $out"; fi
expect_err inspect_control_dtype 'unknown dtype "F\\n32"' "$ct" inspect "$tmp/ctl_dtype.safetensors"

# --- bad inputs: one clear error each
good=$CTITAN_REF_DIR/mha_untied_f32
run_verify() { "$ct" verify --model.hf_path "$1" --training.dataset_path "${2:-$good/tokens.npy}" \
  --training.seq_len "${3:-8}" --training.local_batch_size 2; }
copy_model() { rm -rf "$tmp/$1"; cp -r "$good/hf" "$tmp/$1"; echo "$tmp/$1"; }

d=$(copy_model truncated); st=$d/model.safetensors
head -c $(( $(stat -c %s "$st") - 10 )) "$st" >"$st.x" && mv "$st.x" "$st"
expect_err truncated_file "truncated/model.safetensors" run_verify "$d"
expect_err truncated_inspect "truncated/model.safetensors" "$ct" inspect "$st"

d=$(copy_model header_past_eof); st=$d/model.safetensors
"$CTITAN_PYTHON" -c "import struct,sys; f=open(sys.argv[1],'r+b'); f.write(struct.pack('<Q', 1<<40))" "$st"
expect_err header_past_eof "header_past_eof/model.safetensors" run_verify "$d"

d=$(copy_model lying_dtype); st=$d/model.safetensors
"$CTITAN_PYTHON" - "$st" <<'PY'
import sys
p = sys.argv[1]; b = bytearray(open(p, "rb").read())
i = b.index(b'"F32"', 8); b[i:i + 5] = b'"F3X"'
open(p, "wb").write(b)
PY
expect_err unknown_dtype 'lying_dtype/model.safetensors.*F3X' run_verify "$d"

d=$(copy_model missing_tensor)
"$CTITAN_PYTHON" - "$d" <<'PY'
import sys
sys.path.insert(0, __import__("os").environ["CTITAN_SOURCE_DIR"] + "/tests/ref")
import safetensors_ref as s
d = sys.argv[1]; t = s.load_folder(d)
del t["model.layers.1.mlp.up_proj.weight"]
s.write_folder(d, list(t.items()), "F32", 0)
PY
expect_err missing_tensor 'model.layers.1.mlp.up_proj.weight' run_verify "$d"

d=$(copy_model wrong_shape)
"$CTITAN_PYTHON" - "$d" <<'PY'
import sys
sys.path.insert(0, __import__("os").environ["CTITAN_SOURCE_DIR"] + "/tests/ref")
import safetensors_ref as s
d = sys.argv[1]; t = s.load_folder(d)
t["model.norm.weight"] = t["model.norm.weight"][:-1].clone()
s.write_folder(d, list(t.items()), "F32", 0)
PY
expect_err wrong_shape 'model.norm.weight.*expected.*found' run_verify "$d"

# A MoE folder without one expert's tensor, or with top-k above the expert count.
d=$tmp/moe_missing; rm -rf "$d"; cp -r "$moe/hf" "$d"
"$CTITAN_PYTHON" - "$d" <<'PY'
import sys
sys.path.insert(0, __import__("os").environ["CTITAN_SOURCE_DIR"] + "/tests/ref")
import safetensors_ref as s
d = sys.argv[1]; t = s.load_folder(d)
del t["model.layers.1.mlp.experts.3.down_proj.weight"]
s.write_folder(d, list(t.items()), "F32", 0)
PY
expect_err moe_missing_expert 'missing: model.layers.1.mlp.experts.3.down_proj.weight' \
  run_verify "$d" "$moe/tokens.npy" 4
d=$tmp/moe_topk; rm -rf "$d"; cp -r "$moe/hf" "$d"
sed -i 's/"num_experts_per_tok": [0-9]*/"num_experts_per_tok": 9/' "$d/config.json"
expect_err moe_topk_over_experts 'moe_topk/config.json: key "num_experts_per_tok"' \
  run_verify "$d" "$moe/tokens.npy" 4

d=$(copy_model bad_config); echo '{"vocab_size": 128,' >"$d/config.json"
expect_err malformed_config 'bad_config/config.json' run_verify "$d"

d=$(copy_model too_big)
"$CTITAN_PYTHON" - "$d/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c.update(hidden_size=65536, intermediate_size=262144, num_hidden_layers=512)
json.dump(c, open(sys.argv[1], "w"))
PY
expect_err memory_will_not_fit 'needs about [0-9.]+ GiB per node .*available' run_verify "$d"
# The full Qwen3-30B-A3B is refused before any work, with the estimate; MoE overrides need a MoE
# flavor.
expect_err moe_full_model 'needs about [0-9.]+ GiB per node .*params [0-9.]+, grads' \
  "$ct" train --config "$CTITAN_SOURCE_DIR/configs/qwen3_30b_a3b_4layer.toml" \
  --model.n_layers 48 --model.num_experts 128 --job.dump_folder "$tmp/moe_full"
expect_err moe_override_dense 'override a MoE flavor; "debugmodel" is dense' \
  "$ct" train --model.flavor debugmodel --model.num_experts 4 --job.dump_folder "$tmp/moe_dense" \
  --training.dataset_path "$tmp/none.npy"

expect_err seq_over_max_pos 'training.seq_len 100 exceeds max_position_embeddings 64' \
  run_verify "$good/hf" "$good/tokens.npy" 100
expect_err too_few_tokens 'tokens.npy: has [1-9][0-9]* tokens, but batch 2 x \(seq_len 60 \+ 1\) needs 122' \
  run_verify "$good/hf" "$good/tokens.npy" 60
"$CTITAN_PYTHON" -c "import numpy as np, sys; np.save(sys.argv[1], np.zeros(100, np.float32))" "$tmp/float.npy"
expect_err npy_float 'float.npy.*<f4' run_verify "$good/hf" "$tmp/float.npy"
"$CTITAN_PYTHON" -c "import numpy as np, sys; np.save(sys.argv[1], np.full(100, 5000, np.int32))" "$tmp/oov.npy"
expect_err token_out_of_range 'oov.npy.*5000' run_verify "$good/hf" "$tmp/oov.npy"
expect_err no_model_folder 'no_such_folder' run_verify "$tmp/no_such_folder"

finish
