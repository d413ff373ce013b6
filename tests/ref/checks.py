"""The tally of the Python tests: check() records a result (printing a failure at once) and
summary() ends the test with the "N passed, N failed" line and the exit code."""
import sys

counts = {"passed": 0, "failed": 0}


def check(ok, msg):
    if ok:
        counts["passed"] += 1
    else:
        counts["failed"] += 1
        print("FAIL:", msg, file=sys.stderr)


def summary():
    print("%d passed, %d failed" % (counts["passed"], counts["failed"]))
    sys.exit(1 if counts["failed"] else 0)
