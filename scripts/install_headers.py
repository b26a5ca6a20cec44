#!/usr/bin/env python3
"""meson install step: copies every header of the library's folders to
<prefix>/include/ddplab/<folder>/..., so that an installed program includes them with the same
paths as the library's own sources (`#include "ddp/ddp.h"`, with -I<prefix>/include/ddplab
from pkg-config).

    install_headers.py SOURCE_ROOT FOLDER... [--moved OLD=NEW...]
    (run by meson, which sets MESON_INSTALL_DESTDIR_PREFIX)

--moved writes, for each header that moved, a header at its old path that includes the new
one (or several, NEW being a comma-separated list), so a program written against an older layout still compiles.
"""
import os
import shutil
import sys


def main():
    root, args = sys.argv[1], sys.argv[2:]
    moved = []
    if "--moved" in args:
        at = args.index("--moved")
        args, moved = args[:at], args[at + 1:]
    folders = args
    dest = os.path.join(os.environ["MESON_INSTALL_DESTDIR_PREFIX"], "include", "ddplab")
    count = 0
    for folder in folders:
        for here, _, names in os.walk(os.path.join(root, folder)):
            for name in sorted(names):
                if not name.endswith((".h", ".cuh")):
                    continue
                rel = os.path.relpath(os.path.join(here, name), root)
                os.makedirs(os.path.join(dest, os.path.dirname(rel)), exist_ok=True)
                shutil.copy2(os.path.join(root, rel), os.path.join(dest, rel))
                count += 1
    for pair in moved:
        old, new = pair.split("=")
        includes = "".join(f'#include "{h}"\n' for h in new.split(","))
        os.makedirs(os.path.join(dest, os.path.dirname(old)), exist_ok=True)
        with open(os.path.join(dest, old), "w") as f:
            f.write(f"// {old} moved to {new.replace(',', ' and ')}; this header forwards there.\n"
                    f"#pragma once\n{includes}")
    if not os.environ.get("MESON_INSTALL_QUIET"):
        print(f"Installing {count} ddplab headers (and {len(moved)} forwarding ones) to {dest}")


if __name__ == "__main__":
    main()
