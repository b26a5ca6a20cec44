#!/usr/bin/env python3
"""Compiles every ```cpp block of README.md and docs/*.md against the built tree.

A snippet in the documentation is a promise that the code reads like that; this test keeps the
promise. Each block is compiled with -fsyntax-only, using the compiler and flags the build uses
for examples/train.cpp (read from compile_commands.json), so include paths and the C++ standard
are exactly those of the build.

How a block becomes a translation unit:
- its #include lines move to the top of the file;
- the rest becomes the body of a function, so fragments (statements) compile as they stand.

A block that needs names it does not define (a `loss`, a `pg` made earlier on the page) gets
them from an HTML comment right above the fence, invisible on the rendered page:

    <!-- snippet-context
    #include "tensor/tensor.h"
    ddplab::Tensor images, labels;
    -->

The comment's #include lines move to the top too; its other lines come first in the function
body. A block that defines functions or types (not statements) puts the line SNIPPET where the
block goes: the comment's other lines are then the whole file (minus the includes) and are not
wrapped in a function. A block that is not C++ on purpose is marked `<!-- no-compile -->` above
its fence.

Usage: compile_snippets.py SOURCE_ROOT BUILD_ROOT [FILE.md ...] (default: README.md docs/*.md)
"""
import concurrent.futures
import glob
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile

FENCE = re.compile(r"^```(\S*)[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
CPP_LANGS = {"cpp", "c++", "cxx", "cc"}
FLAGS_FROM = "examples/train.cpp"  # a program that links all of ddplab: its flags see it all


class Snippet:
    def __init__(self, path, line, code, context):
        self.path, self.line, self.code, self.context = path, line, code, context

    def where(self):
        return f"{self.path}:{self.line}"

    def translation_unit(self):
        code = self.code.splitlines()
        ctx = (self.context or "").splitlines()
        out = [l for l in ctx + code if is_include(l)]
        ctx = [l for l in ctx if not is_include(l)]
        # The #line directive makes the compiler's messages point into the markdown file; the
        # moved includes leave empty lines so that the numbers stay right.
        snippet = [f'#line {self.line + 1} "{self.path}"']
        snippet += ["" if is_include(l) else l for l in code]
        if any(l.strip() == "SNIPPET" for l in ctx):
            for l in ctx:
                out += snippet if l.strip() == "SNIPPET" else [l]
        else:
            out += ["void ddplab_doc_snippet() {"] + ctx + snippet + ["}"]
        return "\n".join(out) + "\n"


def is_include(line):
    return line.lstrip().startswith("#include")


def comment_above(before):
    """The text of the HTML comment that ends right above a fence, or None."""
    tail = before.rstrip()
    if not tail.endswith("-->"):
        return None
    start = tail.rfind("<!--")
    return tail[start + 4 : -3].strip() if start >= 0 else None


def extract(path, text):
    snippets = []
    for m in FENCE.finditer(text):
        if m.group(1).lower() not in CPP_LANGS:
            continue
        before = text[: m.start()]
        comment = comment_above(before)
        if comment == "no-compile":
            continue
        context = None
        if comment is not None and comment.startswith("snippet-context"):
            context = comment[len("snippet-context") :]
        line = before.count("\n") + 1  # the fence's line; the code starts on the next
        snippets.append(Snippet(path, line, m.group(2), context))
    return snippets


def compile_command(build_root):
    """The compiler and flags the build uses for FLAGS_FROM, for a -fsyntax-only run."""
    with open(os.path.join(build_root, "compile_commands.json")) as f:
        entries = json.load(f)
    for e in entries:
        if e["file"].replace("\\", "/").endswith(FLAGS_FROM):
            args = e.get("arguments") or shlex.split(e["command"])
            break
    else:
        sys.exit(f"compile_snippets: no entry for {FLAGS_FROM} in compile_commands.json")
    if os.path.basename(args[0]) == "ccache":
        args = args[1:]  # nothing to cache: -fsyntax-only writes no object
    cmd, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a in ("-o", "-MQ", "-MF", "-MT"):
            skip = True
        elif a in ("-c", "-MD", "-MMD") or a.startswith("-Werror") or a.endswith(FLAGS_FROM):
            pass
        else:
            cmd.append(a)
    # -pedantic-errors: standard C++17 as the build's -std says; GCC would otherwise accept
    # C++20's designated initializers with a warning. Names a page declares for the reader but
    # the fragment never uses are not errors.
    cmd += ["-fsyntax-only", "-fdiagnostics-color=never", "-pedantic-errors"]
    return cmd + ["-Wno-unused-variable", "-Wno-unused-but-set-variable"], e["directory"]


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    source_root, build_root = sys.argv[1], sys.argv[2]
    files = sys.argv[3:]
    if not files:
        docs = glob.glob(os.path.join(source_root, "docs", "*.md"))
        files = ["README.md"] + sorted(os.path.relpath(p, source_root) for p in docs)
    snippets = []
    for rel in files:
        with open(os.path.join(source_root, rel)) as f:
            snippets += extract(rel, f.read())
    if not snippets:
        sys.exit("compile_snippets: no ```cpp blocks found (wrong source root?)")
    cmd, workdir = compile_command(build_root)

    with tempfile.TemporaryDirectory() as tmp:

        def check(i, s):
            src = os.path.join(tmp, f"snippet{i}.cpp")
            with open(src, "w") as f:
                f.write(s.translation_unit())
            r = subprocess.run(cmd + [src], cwd=workdir, capture_output=True, text=True)
            return s, r

        failed = 0
        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
            for s, r in pool.map(lambda a: check(*a), enumerate(snippets)):
                if r.returncode == 0:
                    print(f"ok      {s.where()}")
                else:
                    failed += 1
                    print(f"FAILED  {s.where()}\n{r.stdout}{r.stderr}")
    print(f"{len(snippets) - failed} of {len(snippets)} snippets compile")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
