#!/usr/bin/env python3
"""meson install step: copies every header of the library's folders to
<prefix>/include/ddplab/<folder>/..., so that an installed program includes them with the same
paths as the library's own sources (`#include "distributed/ddp.h"`, with -I<prefix>/include/ddplab
from pkg-config).

    install_headers.py SOURCE_ROOT FOLDER...   (run by meson, which sets MESON_INSTALL_DESTDIR_PREFIX)
"""
import os
import shutil
import sys


def main():
    root, folders = sys.argv[1], sys.argv[2:]
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
    if not os.environ.get("MESON_INSTALL_QUIET"):
        print(f"Installing {count} ddplab headers to {dest}")


if __name__ == "__main__":
    main()
