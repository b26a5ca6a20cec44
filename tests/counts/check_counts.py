"""Proves that the suite's counts are honest, so that a regression in the counting fails here.

1. guard_cases (three doctest cases linked with tests/doctest_main.cpp): the case that checks
   nothing fails the run and is named; the one that skips itself is counted as skipped.
2. scripts/summarize_tests.py on a fabricated meson test log: skips (DDP_SKIP_IF, exit status 77),
   cases that checked nothing, crashes and --test-case filtered runs land in the right column.

    python3 check_counts.py GUARD_CASES_EXE SUMMARIZE_TESTS_PY

Prints `N passed, N failed`; exit status 1 on any failure.
"""
import json
import os
import subprocess
import sys
import tempfile

guard, summarize_py = sys.argv[1], sys.argv[2]
passed = failed = 0


def check(cond, what, output=""):
    global passed, failed
    if cond:
        passed += 1
        return
    failed += 1
    print("FAIL:", what)
    # Shown indented and with "test cases:" reworded, so that the summary of this log counts
    # only this script's own closing line, not the lines of the program it ran.
    for line in output.splitlines():
        print("    |", line.replace("test cases:", "test-cases:"))


def run(*args):
    proc = subprocess.run([guard, *args], capture_output=True, text=True)
    return proc.returncode, proc.stdout + proc.stderr


# 1. The guard in tests/doctest_main.cpp.
code, out = run()
check(code == 1, f"a case without assertions must fail the run (exit status {code})", out)
check("[ddplab] FAILED: test case 'guard: checks nothing' passed without running a single "
      "assertion" in out, "the case without assertions is named", out)
check("[ddplab] skipped: guard: skips itself: nothing to check on this machine" in out,
      "the skipped case is named with its reason", out)
check("[ddplab] test cases: 3 | 1 passed | 1 failed | 1 skipped" in out,
      "closing line of the whole run", out)

code, out = run("--test-case=guard: checks something,guard: skips itself")
check(code == 0, f"checking and skipping cases pass the run (exit status {code})", out)
check("[ddplab] test cases: 2 | 1 passed | 0 failed | 1 skipped" in out,
      "a filtered run counts only the cases it ran", out)


# 2. scripts/summarize_tests.py.
def summarize(entries):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "testlog.json")
        with open(path, "w") as f:
            for e in entries:
                f.write(json.dumps(e) + "\n")
        proc = subprocess.run([sys.executable, summarize_py, path], capture_output=True, text=True)
    lines = proc.stdout.strip().splitlines()
    return proc.returncode, lines[-1] if lines else "", proc.stdout


def doctest_line(cases, p, f, s):
    return f"[doctest] test cases: {cases} | {p} passed | {f} failed | {s} skipped\n"


def ddplab_line(cases, p, f, s):
    return f"[ddplab] test cases: {cases} | {p} passed | {f} failed | {s} skipped\n"


log = [
    # doctest counts a self-skipped case as passed; the [ddplab] line corrects it.
    {"name": "tensor", "result": "OK", "command": ["test_tensor"],
     "stdout": "[ddplab] skipped: pinned memory: no GPU\n" + doctest_line(5, 5, 0, 0)
     + ddplab_line(5, 4, 0, 1)},
    # A case without assertions: doctest says passed, the [ddplab] line says failed; the failed
    # exit status must not count it a second time.
    {"name": "data", "result": "FAIL", "command": ["test_data"],
     "stdout": doctest_line(2, 2, 0, 0) + ddplab_line(2, 1, 1, 0)},
    # A --test-case run: doctest's "skipped" are the cases left out, not skips.
    {"name": "ddp_a", "result": "OK", "command": ["test_ddp", "--test-case=*a*"],
     "stdout": doctest_line(1, 1, 0, 7)},
    {"name": "ddp_b", "result": "OK", "command": ["test_ddp", "--test-case=*b*"],
     "stdout": "[ddplab] skipped: b: no GPU\n" + doctest_line(1, 1, 0, 7)
     + ddplab_line(1, 0, 0, 1)},
    # Exit status 77, even after printing a passed/failed line.
    {"name": "fmnist", "result": "SKIP", "command": ["test_fmnist"],
     "stdout": "skipped: no Fashion-MNIST\n"},
    {"name": "parity", "result": "SKIP", "command": ["python3"], "stdout": "0 passed, 1 failed\n"},
    # A script's own count; a crash without output.
    {"name": "optim_vs_pytorch", "result": "OK", "command": ["python3"],
     "stdout": "3 passed, 0 failed\n"},
    {"name": "crash", "result": "FAIL", "command": ["x"], "stdout": ""},
]
code, last, out = summarize(log)
check(last == "9 passed, 2 failed, 4 skipped", f"summary of the fabricated log: '{last}'", out)
check(code == 1, f"summarize_tests.py exits 1 when a case failed (exit status {code})", out)
check("skipped: tensor: pinned memory: no GPU" in out and "skipped: fmnist: skipped: no Fashion"
      "-MNIST" in out, "each skip is listed with its reason", out)

code, last, out = summarize([e for e in log if e["result"] != "FAIL"])
check(last == "8 passed, 0 failed, 4 skipped", f"summary without the failures: '{last}'", out)
check(code == 0, f"summarize_tests.py exits 0 when nothing failed (exit status {code})", out)

print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
