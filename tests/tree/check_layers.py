#!/usr/bin/env python3
"""No arrow runs back up: every #include of the library's folders points down or sideways.

The library is built in layers (docs/architecture.md, "The layers"). From the bottom:

    tensor  autograd  data  comm  nn  optim  ddp  models  monitor

and the programs on top (tools, examples, labs, bench, tests) may use any of them. A file may
include its own folder and the folders below it, never one above: nn/ may talk to the process
group (comm/), but comm/ knows nothing of modules, and nothing below ddp/ knows of DDP. Inside
tensor/, the memory (storage, allocators, devices, dtypes) lies below tensors and their ops.

    check_layers.py SOURCE_ROOT             checks the tree; exit 1 with every upward include
    check_layers.py SOURCE_ROOT --selftest  shows the check fails on a deliberate back include
"""
import os
import re
import sys

LAYERS = ["tensor", "autograd", "data", "comm", "nn", "optim", "ddp", "models", "monitor"]
# tensor/'s own bottom: what a Storage needs. They may not include a tensor or its ops.
TENSOR_MEMORY = {"allocator", "block_pool", "device", "dtype", "env_switch", "error", "half",
                 "macros", "storage"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([a-z_]+)/([A-Za-z0-9_/]+)\.(?:h|cuh)"', re.M)
SOURCE = (".h", ".cpp", ".cu", ".cuh")


def rank(folder, stem):
    """Height of a header or source: folders by LAYERS, tensor/'s memory half a step lower."""
    r = float(LAYERS.index(folder))
    if folder == "tensor" and stem.split("/")[0] not in TENSOR_MEMORY:
        r += 0.5
    return r


def upward_includes(path, text):
    """(included header, why) for each include in `path` (relative) that points up."""
    parts = path.split("/")
    if parts[0] not in LAYERS:
        return []
    stem = os.path.splitext("/".join(parts[1:]))[0]
    here = rank(parts[0], stem)
    out = []
    for folder, name in INCLUDE.findall(text):
        if folder not in LAYERS:
            out.append((f"{folder}/{name}.h", f"{folder}/ is not a layer of the library"))
        elif rank(folder, name) > here:
            out.append((f"{folder}/{name}.h", f"{parts[0]}/ lies below {folder}/"
                        if folder != parts[0] else "tensor/'s memory lies below tensors"))
    return out


def check(root, extra=None):
    problems = []
    for folder in LAYERS:
        for here, _, names in os.walk(os.path.join(root, folder)):
            for name in sorted(names):
                if not name.endswith(SOURCE):
                    continue
                rel = os.path.relpath(os.path.join(here, name), root).replace(os.sep, "/")
                with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
                    text = f.read()
                if extra and rel == extra[0]:
                    text += f'\n#include "{extra[1]}"\n'
                for header, why in upward_includes(rel, text):
                    problems.append(f"{rel} includes {header}: {why}")
    return problems


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    if "--selftest" in sys.argv:
        # A deliberate back include: the module base class reaching up into DDP.
        problems = check(root, extra=("nn/module.h", "ddp/ddp.h"))
        if not any(p.startswith("nn/module.h includes ddp/ddp.h") for p in problems):
            print("check_layers: the injected include nn/module.h -> ddp/ddp.h went unnoticed")
            return 1
        print("check_layers: selftest ok: " + next(p for p in problems if "nn/module.h" in p))
        return 0
    problems = check(root)
    for p in problems:
        print(f"check_layers: {p}")
    if problems:
        print(f"check_layers: {len(problems)} include(s) point up the layers "
              f"({' < '.join(LAYERS)}); see docs/architecture.md")
        return 1
    print(f"check_layers: ok: every include of {', '.join(LAYERS)} points down or sideways")
    return 0


if __name__ == "__main__":
    sys.exit(main())
