#!/usr/bin/env bash
# A folder of .npy token shards written by `ctitan tokenize` (issue 20): the same samples as the
# text they came from (same windows, same shuffle), bit for bit; an exact resume; and a corpus
# larger than the memory limit of the training process, whose peak resident memory equals that
# of a small corpus.
set -u
source "$(dirname "$0")/mpi_test.bash"
text_run_setup
export OMP_NUM_THREADS=1

# --- tokenize into shards of 5000 tokens; a folder already holding shards is refused
check "tokenize to shards" "$ct" tokenize --tokenizer "$tokdir" --input "$text" \
  --output "$tmp/shards/" --shard_tokens 5000 >"$tmp/tok.log" 2>&1
n=$(ls "$tmp/shards" | wc -l)
[ "$n" -ge 3 ] && grep -q "$n shard(s) of at most 5000 tokens" "$tmp/tok.log" && ok ||
  bad "shards: $n files; $(cat "$tmp/tok.log")"
out=$("$ct" tokenize --tokenizer "$tokdir" --input "$text" --output "$tmp/shards/" 2>&1)
[ $? -eq 1 ] && grep -q "already holds .npy files (tokens-00000.npy)" <<<"$out" && ok ||
  bad "a second tokenize into the folder: $out"

# train DUMP STEPS [--key value ...]: 2-layer debugmodel, shuffle on, checkpoints every 2 steps
train() {
  local dump=$1 steps=$2; shift 2
  "$ct" train --model.flavor debugmodel --model.n_layers 2 --model.tokenizer_path "$tokdir" \
    --training.seq_len 64 --training.local_batch_size 2 --training.steps "$steps" \
    --training.shuffle true --debug.seed 5 --metrics.log_freq 1 --metrics.peak_gflops 100 \
    --lr_scheduler.warmup_steps 2 --lr_scheduler.decay_ratio 0 \
    --checkpoint.interval 2 --job.dump_folder "$dump" "$@" >"$dump.log" 2>&1
}
losses() { grep -o '"loss":[^,}]*' "$1/metrics.jsonl" | cut -d: -f2 | tr '\n' ' '; }

# --- the shards give the text's samples: the same windows in the same shuffled order
check "train on text" train "$tmp/text" 4 --training.dataset_path "$text"
check "train on shards" train "$tmp/sh" 4 --training.dataset_path "$tmp/shards"
[ -n "$(losses "$tmp/sh")" ] && [ "$(losses "$tmp/sh")" = "$(losses "$tmp/text")" ] && ok ||
  bad "shards $(losses "$tmp/sh") vs text $(losses "$tmp/text")"
grep -q "(.npy files read as used)" "$tmp/sh.log" && ok || bad "log lacks the .npy line"
# --- an exact resume
check "first half" train "$tmp/re" 2 --training.dataset_path "$tmp/shards"
check "second half" train "$tmp/re" 4 --training.dataset_path "$tmp/shards"
grep -q "resumed from .*step-2" "$tmp/re.log" && [ "$(losses "$tmp/re")" = "$(losses "$tmp/sh")" ] &&
  ok || bad "resume: $(losses "$tmp/re") vs $(losses "$tmp/sh")"

# --- larger than memory: four links to one 400 MB shard make a 1.6 GB corpus; training runs
# under an address-space limit of 1.25 GB (which reading the corpus into memory would exceed),
# and its peak RSS is that of the 5000-token shards plus the shuffle's 8 bytes a window.
# ASan reserves terabytes of address space for its shadow, so there only the RSS is compared.
"$CTITAN_PYTHON" - "$tmp/big" <<'PY' || bad "writing the big shard"
import os, sys, numpy as np
os.makedirs(sys.argv[1])
ids = np.tile(np.arange(1000, 1000 + 4093, dtype="<u4"), 24_500)  # 100M ids, 401 MB
np.save(sys.argv[1] + "/tokens-00000.npy", ids)
for k in range(1, 4):
    os.link(sys.argv[1] + "/tokens-00000.npy", f"{sys.argv[1]}/tokens-{k:05d}.npy")
PY
limit=$((1250 << 20))
# an ASan build (its runtime linked in), however the test is started
asan=$(ldd "$ct" 2>/dev/null | grep -q libasan && echo asan)
# peak DUMP DATA: peak RSS in MiB of a 3-step run on DATA under the limit (empty on failure)
peak() {
  "$CTITAN_PYTHON" - "$limit" "$asan" "$ct" train --model.flavor debugmodel \
    --model.n_layers 2 --model.tokenizer_path "$tokdir" --training.seq_len 512 \
    --training.local_batch_size 1 --training.steps 3 --training.dataset_path "$2" \
    --checkpoint.enable false --metrics.peak_gflops 100 --job.dump_folder "$1" <<'PY' 2>"$1.log"
import resource, subprocess, sys
limit, asan, cmd = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
def cap(): resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
p = subprocess.run(cmd, preexec_fn=None if asan else cap, stdout=sys.stderr, stderr=sys.stderr)
if p.returncode == 0: print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)
PY
}
big_bytes=$(find "$tmp/big" -name '*.npy' -printf '%s\n' | awk '{s += $1} END {print s}')
[ "$big_bytes" -gt "$limit" ] && ok || bad "the corpus ($big_bytes bytes) is not larger than the limit"
"$CTITAN_PYTHON" -c '
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[1]),) * 2)
bufs = [open(f"{sys.argv[2]}/tokens-{k:05d}.npy", "rb").read() for k in range(4)]' \
  "$limit" "$tmp/big" 2>/dev/null && bad "the corpus fits in memory under the limit" || ok
small_rss=$(peak "$tmp/small" "$tmp/shards")
big_rss=$(peak "$tmp/bigrun" "$tmp/big")
[ -n "$small_rss" ] && ok || bad "small corpus run: $(tail -3 "$tmp/small.log")"
[ -n "$big_rss" ] && ok || bad "1.6 GB corpus run under the limit: $(tail -3 "$tmp/bigrun.log")"
# 1.6 GB of uint32 ids at seq 512: 781k windows, 6 MiB of permutation.
echo "peak RSS: $small_rss MiB (small corpus), $big_rss MiB (1.6 GB corpus)"
[ -n "$small_rss" ] && [ -n "$big_rss" ] && [ $((big_rss - small_rss)) -le 16 ] && ok ||
  bad "peak RSS grew with the corpus: $small_rss -> $big_rss MiB"
rm -rf "$tmp/big"
finish
