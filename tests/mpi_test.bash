# Sourced by the shell tests that launch ranks with mpirun (tok_mpi.sh, guard.sh, dp_bf16.sh);
# not a test itself. Gives ok/bad with their counts, Open MPI's settings for running here as
# root on one machine, and stops at once when mpirun is missing.
passed=0 failed=0
ok() { passed=$((passed + 1)); }
bad() { failed=$((failed + 1)); echo "FAIL: $*" >&2; }
# finish: the count line and the test's exit status
finish() {
  echo "$passed passed, $failed failed"
  [ "$failed" -eq 0 ]
}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Quiet Open MPI's own warnings (no InfiniBand here).
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
# Under ASan, Open MPI's own start-up allocations (in plugins it unloads at exit, so they cannot
# be suppressed by name) would fail every run at exit: leak checking stays on for ctitan's code
# in the single-process tests, and ASan/UBSan errors still stop these runs.
[ -n "${ASAN_OPTIONS:-}" ] && export ASAN_OPTIONS="$ASAN_OPTIONS:detect_leaks=0"
if ! command -v mpirun >/dev/null; then echo "mpirun not found (apt-get install openmpi-bin)" >&2; exit 1; fi
