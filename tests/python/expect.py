"""The Python tests' checks: a failed expectation is printed and counted,
and the test goes on; finish() exits 1 if any failed."""
import sys

failures = []


def expect(cond, what):
    if not cond:
        failures.append(what)
        print("FAILED:", what, flush=True)


def finish(name):
    print("%s: %d failure(s)" % (name, len(failures)))
    sys.exit(1 if failures else 0)
