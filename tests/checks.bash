# The tally of the shell tests, sourced (not a test itself): ok and bad count the checks, and
# finish prints "N passed, N failed" and is the test's exit status. A test that ran no check at
# all fails too: it has shown nothing, whatever made it stop early.
passed=0 failed=0
ok() { passed=$((passed + 1)); }
bad() { failed=$((failed + 1)); echo "FAIL: $*" >&2; }
finish() {
  echo "$passed passed, $failed failed"
  if [ $((passed + failed)) -eq 0 ]; then
    echo "FAIL: $(basename "$0"): no check ran" >&2
    return 1
  fi
  [ "$failed" -eq 0 ]
}
