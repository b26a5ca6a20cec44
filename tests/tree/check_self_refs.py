#!/usr/bin/env python3
"""The project speaks of itself alone: no work session and no issue number of this project in
the tree. A measurement is tied to a date, a machine and a command; a design to the code and its
Notes; neither to who did the work or which ticket asked for it. A reference to another project's
tracker ("PyTorch issue 136009") is fine: a reader can follow it.

    check_self_refs.py SOURCE_ROOT             every tracked text file; exit 1 with each hit
    check_self_refs.py SOURCE_ROOT --selftest  shows the patterns catch what they should
"""
import os
import re
import subprocess
import sys

# The word for a work session or for an issue, then a number (with or without "#"), any case.
PATTERNS = [re.compile(r"\bsessions?\s+#?\d+", re.I), re.compile(r"\bissues?\s+#?\d+", re.I)]
# An upstream tracker named just before the number makes it someone else's issue.
UPSTREAM = re.compile(r"\b(pytorch|torch|nccl|gloo|onednn|dnnl|cudnn|cuda|meson|gcc|clang|"
                      r"llvm|glibc|linux|python|cpython|numpy|tensorboard|github)\b[^.\n]{0,24}$",
                      re.I)
TEXT = (".h", ".cpp", ".cu", ".cuh", ".py", ".sh", ".md", ".txt", ".build", ".json", ".cfg",
        ".toml", ".yml", ".yaml", "")


def hits_in(text):
    """(line number, line) of every self-reference in `text`."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        for pattern in PATTERNS:
            for m in pattern.finditer(line):
                if not UPSTREAM.search(line[:m.start()]):
                    out.append((n, line.strip()))
                    break
    return out


def tracked_files(root):
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "-z"], capture_output=True,
                             check=True).stdout.decode()
        return [f for f in out.split("\0") if f]
    except (OSError, subprocess.CalledProcessError):  # a source tarball: walk it instead
        return [os.path.relpath(os.path.join(d, n), root) for d, _, ns in os.walk(root)
                for n in ns]


def selftest():
    session, issue = "ses" + "sion", "is" + "sue"  # so that this file does not match itself
    must_hit = [f"measured in {session} 22", f"see {issue} 24", f"{issue.title()}s 14 and 15",
                f"({issue} #7)"]
    must_pass = [f"PyTorch {issue} 136009", f"a {session} is a rendezvous", f"the {issue} list",
                 f"NCCL's GitHub {issue} 1026"]
    wrong = [t for t in must_hit if not hits_in(t)] + [t for t in must_pass if hits_in(t)]
    for t in wrong:
        print(f"check_self_refs: selftest: misjudged {t!r}")
    if not wrong:
        print(f"check_self_refs: selftest ok: {len(must_hit)} caught, {len(must_pass)} let through")
    return 1 if wrong else 0


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    if "--selftest" in sys.argv:
        return selftest()
    count = 0
    for rel in tracked_files(root):
        if not rel.endswith(TEXT) or not os.path.isfile(os.path.join(root, rel)):
            continue
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
            for n, line in hits_in(f.read()):
                print(f"{rel}:{n}: {line}")
                count += 1
    if count:
        print(f"check_self_refs: {count} line(s) speak of a work session or of this project's "
              "issue numbers; tie a measurement to its date, CPU and command instead")
        return 1
    print("check_self_refs: ok: no session and no issue number of this project in the tree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
