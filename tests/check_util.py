"""Shared by the Python interop checks: numpy (and st_io) or skip, and the pass/fail count.

A check that cannot run here (numpy missing) exits 77, which meson counts as skipped rather than
passed, since nothing was compared.
"""
import sys


def numpy_or_skip():
    """numpy, or exit 77 naming what is missing."""
    try:
        import numpy
    except ImportError as e:
        print("skipped: %s is not importable by %s (Debian: python3-numpy)"
              % (e.name, sys.executable))
        sys.exit(77)
    return numpy


def start():
    """(numpy, st_io, Checks()) for a check script, or exit 77 without numpy."""
    np = numpy_or_skip()
    import st_io
    return np, st_io, Checks()


class Checks:
    """check(cond, what) counts; finish() prints `N passed, N failed` and exits 1 on a failure."""

    def __init__(self):
        self.passed = self.failed = 0

    def check(self, cond, what):
        if cond:
            self.passed += 1
        else:
            self.failed += 1
            print("FAIL:", what)

    def finish(self):
        print(f"{self.passed} passed, {self.failed} failed")
        sys.exit(1 if self.failed else 0)
