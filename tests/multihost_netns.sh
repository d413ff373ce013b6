#!/usr/bin/env bash
# Two "hosts" on one machine: two Linux network namespaces joined by a veth pair (10.77.0.1 and
# 10.77.0.2), each with its own hostname (h1, h2) and /etc/hosts. mpirun runs in h1 and starts
# h2's daemon through a launch agent that enters h2's namespaces, as ssh would reach another
# node; the ranks then talk over Open MPI's TCP transport only (btl tcp,self; oob and btl
# restricted to 10.77.0.0/24). It trains a 2-layer debugmodel with one rank per host and
# compares every step's loss with the same run as `mpirun -np 2` on one host.
#
# Needs root with CAP_SYS_ADMIN and CAP_NET_ADMIN (ip netns, veth, unshare --uts); without them
# it says why in one line and exits 77, which `make check` counts as skipped, except under CI
# (.ci/run sets CI), where it is a failure (tests/CMakeLists.txt, CTITAN_MAY_SKIP).
#
#   tests/multihost_netns.sh                    # the default data-parallel mode: FSDP
#   CTITAN_NETNS_SHARD_MODE=zero1 tests/multihost_netns.sh
#                                               # adds --parallelism.data_parallel_shard_mode zero1
#   tests/multihost_netns.sh --training.steps 8 # further options go to both runs
#
# Environment: CTITAN_BIN (default build/ctitan), CTITAN_ASSETS_DIR (default assets),
# CTITAN_NETNS_SHARD_MODE (empty: the default mode), CTITAN_NETNS_TIMEOUT (seconds per run, 300),
# CTITAN_NETNS_KEEP (non-empty: keep the run folders, logs and agent).
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
ct=${CTITAN_BIN:-$root/build/ctitan}
assets=${CTITAN_ASSETS_DIR:-$root/assets}
mode=${CTITAN_NETNS_SHARD_MODE:-}
limit=${CTITAN_NETNS_TIMEOUT:-300}
# Under ASan, Open MPI's own start-up allocations would fail every run at exit (as in
# mpi_test.bash): leak checking stays on for the single-process tests.
[ -n "${ASAN_OPTIONS:-}" ] && export ASAN_OPTIONS="$ASAN_OPTIONS:detect_leaks=0"
skip() { echo "SKIP: multihost_netns: $*"; exit 77; }
die() { echo "FAIL: multihost_netns: $*" >&2; exit 1; }

# What the machine must allow, checked in order; the first missing piece is the skip reason.
[ "$(id -u)" = 0 ] || skip "not root (uid $(id -u)): network namespaces need CAP_SYS_ADMIN and CAP_NET_ADMIN"
command -v ip >/dev/null || skip "the ip command is missing (apt-get install iproute2)"
command -v unshare >/dev/null || skip "unshare is missing (apt-get install util-linux)"
command -v mpirun >/dev/null || skip "mpirun is missing (apt-get install openmpi-bin)"
python=$(command -v python3) || skip "python3 is missing (it compares the losses)"
[ -x "$ct" ] || die "no ctitan binary at $ct (build first, or set CTITAN_BIN)"
[ -f "$assets/corpus/small.txt" ] || die "no $assets/corpus/small.txt (scripts/fetch-assets)"

tag=$$
ns1=ctitan-h1-$tag ns2=ctitan-h2-$tag
veth1=ctv1-$tag veth2=ctv2-$tag # at most 15 characters
tmp=$(mktemp -d /tmp/ctitan-netns.XXXXXX)
made_etc_netns=
cleanup() {
  local ns pid
  for ns in "$ns1" "$ns2"; do
    # Only the processes of this test live in its namespaces.
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
    ip netns del "$ns" 2>/dev/null # takes the veth pair with it
    rm -rf "/etc/netns/$ns"
  done
  [ -n "$made_etc_netns" ] && rmdir /etc/netns 2>/dev/null
  if [ -n "${CTITAN_NETNS_KEEP:-}" ]; then echo "kept $tmp"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

t0=$(date +%s.%N)
err=$(ip netns add "$ns1" 2>&1) || skip "cannot create a network namespace (ip netns add: $err)"
ip netns add "$ns2" 2>/dev/null || skip "cannot create a second network namespace"
err=$(ip link add "$veth1" netns "$ns1" type veth peer name "$veth2" netns "$ns2" 2>&1) ||
  skip "cannot create a veth pair (ip link add ... type veth: $err)"
if ! { ip -n "$ns1" addr add 10.77.0.1/24 dev "$veth1" && ip -n "$ns2" addr add 10.77.0.2/24 dev "$veth2" &&
  ip -n "$ns1" link set lo up && ip -n "$ns2" link set lo up &&
  ip -n "$ns1" link set "$veth1" up && ip -n "$ns2" link set "$veth2" up; }; then
  skip "cannot configure the veth pair's addresses"
fi
err=$(ip netns exec "$ns1" unshare --uts true 2>&1) ||
  skip "cannot enter a namespace with its own hostname (unshare --uts: $err)"
# `ip netns exec NS` bind-mounts /etc/netns/NS/* over /etc: each host resolves h1 and h2.
[ -d /etc/netns ] || made_etc_netns=1
for ns in "$ns1" "$ns2"; do
  mkdir -p "/etc/netns/$ns"
  printf '127.0.0.1 localhost\n10.77.0.1 h1\n10.77.0.2 h2\n' >"/etc/netns/$ns/hosts"
done
# h1 reaches h2 when a connection to a closed port is refused (nothing listens there).
reach=$(timeout 5 ip netns exec "$ns1" bash -c 'exec 3<>/dev/tcp/h2/9' 2>&1)
case "$reach" in *refused*) ;; *) die "h1 cannot reach h2 over the veth pair: ${reach:-timed out}" ;; esac

# The launch agent: Open MPI calls it as `agent HOST COMMAND...`, like ssh, and the command is
# shell text. HOST's namespaces stand in for the other machine; each call is logged.
{
  echo '#!/bin/sh'
  echo "ns1=$ns1 ns2=$ns2 log=$tmp/agent.log"
  cat <<'EOF'
host=$1; shift
case "$host" in
  h1 | 10.77.0.1) ns=$ns1 ;;
  h2 | 10.77.0.2) ns=$ns2 ;;
  *) echo "netns agent: unknown host $host" >&2; exit 255 ;;
esac
echo "$host" >>"$log"
exec ip netns exec "$ns" unshare --uts sh -c 'hostname "$1" && shift && exec sh -c "$*"' sh "$host" "$@"
EOF
} >"$tmp/agent"
chmod +x "$tmp/agent"
printf 'h1 slots=1\nh2 slots=1\n' >"$tmp/hosts"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
unset OMPI_MCA_btl OMP_NUM_THREADS
train_args=(
  train --model.flavor debugmodel --model.n_layers 2
  --model.tokenizer_path "$assets/qwen3-tokenizer" --training.dataset_path "$assets/corpus/small.txt"
  --training.seq_len 32 --training.local_batch_size 1 --training.global_batch_size 2
  --training.steps 4 --training.shuffle false --optimizer.lr 3e-4 --lr_scheduler.warmup_steps 2
  --metrics.log_freq 1 --metrics.peak_gflops 100 --checkpoint.enable false --debug.seed 11
  --parallelism.threads_per_rank 1)
[ -n "$mode" ] && train_args+=(--parallelism.data_parallel_shard_mode "$mode")
train_args+=("$@")

# One host: both ranks here, shared memory.
t1=$(date +%s.%N)
timeout "$limit" mpirun --oversubscribe --bind-to none -np 2 --mca btl self,vader \
  "$ct" "${train_args[@]}" --job.dump_folder "$tmp/one" >"$tmp/one.log" 2>&1 ||
  { rc=$?; tail -20 "$tmp/one.log" >&2; die "the one-host run failed (rc $rc)"; }
t2=$(date +%s.%N)
# Two hosts: mpirun in h1, one rank per host, TCP over the veth pair only.
timeout "$limit" ip netns exec "$ns1" unshare --uts sh -c 'hostname h1 && exec "$@"' sh \
  mpirun -np 2 --hostfile "$tmp/hosts" --map-by node --bind-to none \
  --mca plm_rsh_agent "$tmp/agent" --mca plm_rsh_no_tree_spawn 1 \
  --mca btl tcp,self --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24 \
  -x OMPI_ALLOW_RUN_AS_ROOT -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM \
  "$ct" "${train_args[@]}" --job.dump_folder "$tmp/two" >"$tmp/two.log" 2>&1 ||
  { rc=$?; tail -30 "$tmp/two.log" >&2; die "the two-host run failed (rc $rc)"; }
t3=$(date +%s.%N)

# Rank 1 must have been started on h2 through the agent, ctitan must have seen one rank per
# node (MPI_Comm_split_type SHARED), and the losses must agree.
[ "$(cat "$tmp/agent.log" 2>/dev/null)" = h2 ] ||
  die "mpirun did not start h2's daemon through the agent (calls: $(cat "$tmp/agent.log" 2>/dev/null))"
grep -q "; 1 rank(s) on this node" "$tmp/two.log" ||
  die "ctitan did not see the two ranks on different nodes: $(grep -o '[0-9]* rank(s) on this node' "$tmp/two.log")"
"$python" - "$tmp/one/metrics.jsonl" "$tmp/two/metrics.jsonl" <<'PY' || exit 1
import json, sys
def losses(p):
    return [json.loads(l)["loss"] for l in open(p) if '"loss"' in l]
a, b = losses(sys.argv[1]), losses(sys.argv[2])
if not a or len(a) != len(b):
    sys.exit(f"FAIL: multihost_netns: {len(a)} steps on one host, {len(b)} on two")
rel = max(abs(x - y) / max(abs(x), 1e-30) for x, y in zip(a, b))
same = "bit-identical" if a == b else f"max rel diff {rel:.3g}"
print(f"losses, one host : {a}\nlosses, two hosts: {b}\n{same}")
if rel > 1e-6:
    sys.exit("FAIL: multihost_netns: the two-host losses differ from the one-host run's")
PY
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
echo "setup $(secs "$t0" "$t1") s, one host $(secs "$t1" "$t2") s, two hosts $(secs "$t2" "$t3") s${mode:+ (shard mode $mode)}"
echo "PASS: multihost_netns"
