"""The tally of the Python tests: check() records a result (printing a failure at once) and
summary() ends the test with the "N passed, N failed" line and the exit code, which is 1 too when
no check ran: such a test has shown nothing."""
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
    if counts["passed"] + counts["failed"] == 0:
        print("FAIL: no check ran", file=sys.stderr)
        sys.exit(1)
    sys.exit(1 if counts["failed"] else 0)
