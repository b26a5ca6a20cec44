"""Sums the results of every runner in a meson test log into one closing line.

doctest executables report their own case counts; any other test (a Python parity script, a
launcher scenario) counts as one case that passed or failed by its exit code."""
import json
import re
import sys

DOCTEST = re.compile(
    r"\[doctest\] test cases:\s*(\d+)\s*\|\s*(\d+) passed\s*\|\s*(\d+) failed\s*\|\s*(\d+) skipped")
PLAIN = re.compile(r"^(\d+) passed, (\d+) failed(?:, (\d+) skipped)?\s*$", re.M)


def main(path):
    passed = failed = skipped = 0
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
        skip = t.get("result") == "SKIP"
        m = DOCTEST.findall(out)
        p = PLAIN.findall(out)
        if m:
            _, a, b, c = (int(x) for x in m[-1])
            # A run filtered with --test-case reports the cases it filtered out as "skipped";
            # they run in another meson test, so they are not skips.
            if any(str(arg).startswith("--test-case") for arg in t.get("command", [])):
                c = 0
            passed, failed, skipped = passed + a, failed + b, skipped + c
            if not ok and b == 0:  # crashed after the summary, or a sanitizer report
                failed += 1
        elif p:
            a, b, c = p[-1]
            passed, failed, skipped = passed + int(a), failed + int(b), skipped + int(c or 0)
            if not ok and int(b) == 0:
                failed += 1
        elif skip:
            skipped += 1
        elif ok:
            passed += 1
        else:
            failed += 1
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
