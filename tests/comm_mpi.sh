#!/usr/bin/env bash
# The backend's collectives under mpirun (tests/test_comm.c at 2 and 4 ranks): all-reduce (fp32
# and bf16), reduce-scatter, all-gather, send/recv and all-to-all on the plain and the guarded
# CPU backends, the guard held open exactly while a collective is in flight, and a missed
# deadline as a named error. ctest's `comm` runs the same program as a world of one.
set -u
: "${CTITAN_BUILD_DIR:?run through ctest}" "${CTITAN_TMP:?}"
source "$(dirname "$0")/mpi_test.bash"
bin=$CTITAN_BUILD_DIR/tests/test_comm
tmp=$CTITAN_TMP; rm -rf "$tmp"; mkdir -p "$tmp"
for np in 2 4; do
  if mpirun --oversubscribe --bind-to none -np $np "$bin" >"$tmp/np$np.log" 2>&1; then
    ok
  else
    bad "np$np: $(grep -v '^ *$' "$tmp/np$np.log" | tail -5)"
  fi
done
finish
