"""Sums the results of every runner in a meson test log into one closing line.

doctest executables report their own case counts: the `[ddplab] test cases:` line of
tests/doctest_main.cpp, which counts a case that skipped itself (DDP_SKIP_IF) as skipped and a
case that checked nothing as failed, or else doctest's own summary line. Any other test (a Python
parity script, a launcher scenario) counts as one case that passed or failed by its exit code, or
was skipped when it exited 77 (nothing to check on this machine), unless it prints its own
`N passed, N failed` line. Each skipped case is listed with its reason before the closing line."""
import json
import re
import sys

DDPLAB = re.compile(
    r"^\[ddplab\] test cases:\s*(\d+)\s*\|\s*(\d+) passed\s*\|\s*(\d+) failed\s*\|\s*(\d+) skipped",
    re.M)
DDPLAB_SKIP = re.compile(r"^\[ddplab\] skipped: (.*)$", re.M)
DOCTEST = re.compile(
    r"\[doctest\] test cases:\s*(\d+)\s*\|\s*(\d+) passed\s*\|\s*(\d+) failed\s*\|\s*(\d+) skipped")
PLAIN = re.compile(r"^(\d+) passed, (\d+) failed(?:, (\d+) skipped)?\s*$", re.M)


def last_line(text):
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1].strip() if lines else "exit status 77"


def main(path):
    passed = failed = skipped = 0
    reasons = []
    try:
        lines = open(path).read().splitlines()
    except OSError as e:
        print(f"summary: cannot read {path}: {e}")
        print("0 passed, 1 failed")
        return 1
    for line in lines:
        t = json.loads(line)
        out = t.get("stdout", "") or ""
        ok = t.get("result") in ("OK", "EXPECTEDFAIL")
        d = DDPLAB.findall(out)
        m = DOCTEST.findall(out)
        p = PLAIN.findall(out)
        if t.get("result") == "SKIP":  # exit status 77
            skipped += 1
            reasons.append(f"{t.get('name')}: {last_line(out)}")
            continue
        if d:
            _, a, b, c = (int(x) for x in d[-1])
            reasons += [f"{t.get('name')}: {r}" for r in DDPLAB_SKIP.findall(out)]
        elif m:
            _, a, b, c = (int(x) for x in m[-1])
            # A run filtered with --test-case reports the cases it filtered out as "skipped";
            # they run in another meson test, so they are not skips.
            if any(str(arg).startswith("--test-case") for arg in t.get("command", [])):
                c = 0
        elif p:
            a, b, c = (int(x or 0) for x in p[-1])
        else:
            a, b, c = (1, 0, 0) if ok else (0, 1, 0)
        passed, failed, skipped = passed + a, failed + b, skipped + c
        if not ok and b == 0:  # crashed after the summary, or a sanitizer report
            failed += 1
    for r in reasons:
        print(f"skipped: {r}")
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
