# Sourced by the shell tests that launch ranks with mpirun (tok_mpi.sh, fsdp.sh, guard.sh,
# dp_bf16.sh); not a test itself. Gives ok/bad with their counts, Open MPI's settings for running here as
# root on one machine, and stops at once when mpirun is missing.
source "$(dirname "${BASH_SOURCE[0]}")/checks.bash" # ok, bad, finish
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Quiet Open MPI's own warnings (no InfiniBand here).
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
# Under ASan, Open MPI's own start-up allocations (in plugins it unloads at exit, so they cannot
# be suppressed by name) would fail every run at exit: leak checking stays on for ctitan's code
# in the single-process tests, and ASan/UBSan errors still stop these runs.
[ -n "${ASAN_OPTIONS:-}" ] && export ASAN_OPTIONS="$ASAN_OPTIONS:detect_leaks=0"
# The sanitizer build (make check's second pass: Debug, about 10x slower), where the long
# parallel matrices run one case of each kind and leave the rest to the optimised pass.
sanitized_build() { grep -qs '^CTITAN_SANITIZE:BOOL=ON' "${CTITAN_BUILD_DIR:-}/CMakeCache.txt"; }
# full: the whole matrix runs (the optimised pass); under the sanitizers one case of each kind.
full() { ! sanitized_build; }
if ! command -v mpirun >/dev/null; then echo "mpirun not found (apt-get install openmpi-bin)" >&2; exit 1; fi

# mpi_train NP DUMP KEY=VALUE... -- [--key value ...]: `ctitan train` ($ct) under mpirun -np NP
# with the options KEY=VALUE, each replaced by a --key value after the "--"; the output in
# DUMP.log. per_rank_rc=1: each rank prints its own exit code ("rank R exit C") and mpirun sees
# 0, so that mpirun kills no rank before it has ended by itself.
mpi_train() {
  local np=$1 dump=$2; shift 2
  declare -A opt=()
  while [ "$1" != -- ]; do opt[${1%%=*}]=${1#*=}; shift; done; shift
  while [ $# -ge 2 ]; do opt[${1#--}]=$2; shift 2; done
  local args=() k
  for k in "${!opt[@]}"; do args+=("--$k" "${opt[$k]}"); done
  local launch=("$ct")
  [ -n "${per_rank_rc:-}" ] &&
    launch=(bash -c '"$@"; echo "rank $OMPI_COMM_WORLD_RANK exit $?"' _ "$ct")
  mpirun --oversubscribe --bind-to none -np "$np" "${launch[@]}" train "${args[@]}" >"$dump.log" 2>&1
}
export -f mpi_train
check() { # NAME CMD...: the command succeeds
  local name=$1; shift
  if "$@"; then ok; else bad "$name"; fi
}
# same A B LOSS NORM WEIGHTS [STEPS]: runs A and B agree (compare_runs.py says how).
same() { "$CTITAN_PYTHON" "$(dirname "${BASH_SOURCE[0]}")/compare_runs.py" "$@"; }
# text_docs OUT: the text's first 400 lines as .jsonl documents (~20 tokens each), for
# block_causal runs.
text_docs() {
  "$CTITAN_PYTHON" -c '
import json, sys
for line in open(sys.argv[1]).read().splitlines()[:400]: print(json.dumps({"text": line}))
' "${text0:-$text}" >"$1"
}
# same_val A B TOL: the runs' validation losses (metrics.jsonl's val_loss rows), as many and each
# within rel TOL.
same_val() {
  "$CTITAN_PYTHON" - "$@" <<'PY'
import json, os, sys
v = [[r["val_loss"] for r in map(json.loads, open(d + "/metrics.jsonl")) if "val_loss" in r]
     for d in sys.argv[1:3]]
worst = max(abs(a - b) / abs(b) for a, b in zip(*v)) if v[0] and len(v[0]) == len(v[1]) else 1
print(f"{os.path.basename(sys.argv[1])} vs {os.path.basename(sys.argv[2])} validation: "
      f"{len(v[0])} losses, rel {worst:.2e}")
sys.exit(0 if worst <= float(sys.argv[3]) else 1)
PY
}
# fails NAME PATTERN NP [--key value ...]: `run NP $tmp/NAME ...` (the test's run, exported)
# fails on every rank, non-zero, within 60 s, its log matching PATTERN.
fails() {
  local name=$1 pattern=$2 np=$3; shift 3
  local t0=$SECONDS
  timeout 90 bash -c 'run "$@"' _ "$np" "$tmp/$name" "$@"
  local rc=$? took=$((SECONDS - t0))
  if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $took -le 60 ] && grep -qE -- "$pattern" "$tmp/$name.log"; then
    ok
  else
    bad "$name: rc $rc after ${took}s: $(grep -v '^step\|^ *$' "$tmp/$name.log" | tail -5)"
  fi
}
# refused NAME PATTERN NP [--key value ...]: `run NP $tmp/NAME ...` (the test's run) is refused:
# non-zero, with exactly one error line, matching PATTERN.
refused() {
  local name=$1 pattern=$2 np=$3; shift 3
  if run "$np" "$tmp/$name" "$@"; then bad "$name: the run was not refused"; return; fi
  local n
  n=$(grep -c "^ctitan: error" "$tmp/$name.log")
  if [ "$n" = 1 ] && grep -qE -- "$pattern" "$tmp/$name.log"; then ok; else
    bad "$name: $n error line(s): $(grep '^ctitan: error' "$tmp/$name.log" | head -2)"; fi
}
# sigusr1 DUMP FILE: SIGUSR1 to mpirun (which forwards it) while `run 2 DUMP` trains reaches every
# rank: they agree on the step, save it (its folder holds FILE) and exit 138 (128 + SIGUSR1),
# and so does mpirun; the next run resumes there.
sigusr1() {
  local dump=$1 file=$2 bg rows rc stopped mpirun_pid
  mpi_run_bg() { run 2 "$dump" --training.steps 400 --checkpoint.interval 1000; }
  mpi_run_bg & bg=$!
  for _ in $(seq 600); do
    rows=$(grep -c '"loss"' "$dump/metrics.jsonl" 2>/dev/null)
    [ "${rows:-0}" -ge 3 ] && break; sleep 0.1
  done
  mpirun_pid=$(pgrep -P "$bg" mpirun)
  kill -USR1 "${mpirun_pid:-$bg}"; wait "$bg"; rc=$?
  stopped=$(sed -n 's/^stopped by signal 10 at step \([0-9]*\);.*/\1/p' "$dump.log")
  if [ $rc -eq 138 ] && [ -n "$stopped" ] && [ -f "$dump/checkpoint/step-$stopped/$file" ]; then
    ok
  else
    bad "SIGUSR1: rc $rc, stopped at '$stopped': $(tail -3 "$dump.log")"
  fi
  if [ -n "$stopped" ] && run 2 "$dump" --training.steps $((stopped + 1)) --checkpoint.interval 1000; then
    grep -q "resumed from .*step-$stopped " "$dump.log" && ok || bad "no resume after SIGUSR1"
  else
    bad "the run after SIGUSR1 failed: $(tail -3 "$dump.log")"
  fi
}
# text_run_setup: what the runs on the real tokenizer and text use: ct, a fresh tmp, tokdir, text;
# threads are set per rank by parallelism.threads_per_rank, not by the environment.
text_run_setup() {
  : "${CTITAN_BIN:?run through ctest}" "${CTITAN_ASSETS_DIR:?}" "${CTITAN_TMP:?}" "${CTITAN_PYTHON:?}"
  unset OMP_NUM_THREADS OMP_WAIT_POLICY OMP_DISPLAY_ENV
  ct=$CTITAN_BIN
  tmp=$CTITAN_TMP; rm -rf "$tmp"; mkdir -p "$tmp"
  tokdir=$CTITAN_ASSETS_DIR/qwen3-tokenizer
  text=$CTITAN_ASSETS_DIR/corpus/small.txt
  export ct tokdir text
}
# text_train NP DUMP KEY=VALUE... -- [--key value ...]: mpi_train of the 2-layer debugmodel on the
# real text (shuffle off, 4 steps, 1 thread per rank, seed 11, lr 3e-4 after 2 warm-up steps),
# with the test's own KEY=VALUEs and then the caller's options on top.
text_train() {
  local np=$1 dump=$2; shift 2
  mpi_train "$np" "$dump" model.flavor=debugmodel model.n_layers=2 model.tokenizer_path="$tokdir" \
    training.dataset_path="$text" training.seq_len=32 training.local_batch_size=1 \
    training.steps=4 training.shuffle=false optimizer.lr=3e-4 lr_scheduler.warmup_steps=2 \
    metrics.log_freq=1 metrics.peak_gflops=100 debug.seed=11 parallelism.threads_per_rank=1 \
    model.vocab_size="${vocab:-0}" job.dump_folder="$dump" "$@"
}
export -f text_train
# ids_setup V: the parallel matrices' data. The text's ids from the real tokenizer, each taken
# mod V, in $tmp/ids.npy; text_train then trains on them with a vocabulary of V and no tokenizer.
# An embedding and a head of 151936 rows were most of each launch's work (1.8 s of a 4-step
# np 1 run; 0.14 s at V = 2048), and the parallel plans cut them as they cut any vocabulary.
# The text, its tokenizer and the full vocabulary stay for the cases that need them (documents,
# conversations): real=(...) gives them back.
ids_setup() {
  "$ct" tokenize --tokenizer "$tokdir" --input "$text" --output "$tmp/ids_full.npy" \
    --threads 1 >/dev/null &&
    "$CTITAN_PYTHON" -c 'import numpy as n, sys; a = n.load(sys.argv[1]); n.save(sys.argv[2], (a % int(sys.argv[3])).astype(n.uint32))' \
      "$tmp/ids_full.npy" "$tmp/ids.npy" "$1" || { echo "ids_setup: no ids" >&2; exit 1; }
  real=(--model.tokenizer_path "$tokdir" --model.vocab_size 0)
  text0=$text tokdir0=$tokdir
  text=$tmp/ids.npy tokdir="" vocab=$1
  export text tokdir vocab text0 tokdir0
}
