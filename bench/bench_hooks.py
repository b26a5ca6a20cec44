#!/usr/bin/env python3
"""Step time and bytes on the wire of each DDP communication hook vs the plain all-reduce.

For every model, runs `bench_ddp ddp --model M --comm-hook H` on NPROC ranks under ddprun, the
hooks interleaved (none fp16 bf16 powersgd none fp16 ...) for --rounds rounds, so that a change
of the machine's load hits every hook alike. Each run prints its median step time and the bytes
its hook all-reduced per step; the table gives, per hook, the median step time over the rounds,
the median of the per-round ratios hook / plain (taken within a round, next to each other), and
the bytes per step and their ratio to plain. The CPU (lscpu's model name and vector ISA) heads
the output, since the ratio of compute to communication depends on it.

    python3 bench/bench_hooks.py [--build build] [--models resnet20,resnet18]
        [--hooks none,fp16,bf16,powersgd] [--powersgd-rank 2] [--rounds 5] [--steps 8]
        [--batch 32] [--nproc 2]

Each rank runs with 1 thread (OMP_NUM_THREADS=1), as bench_ddp sets. See bench/README.md.
"""
import argparse
import os
import statistics
import subprocess
import sys

from machine import cpu_info


def run_once(args, model, hook):
    """One job of args.nproc ranks: {'step_ms': float, 'bytes': int}."""
    cmd = [os.path.join(args.build, "tools", "ddprun"), "--standalone", "--nproc-per-node",
           str(args.nproc), os.path.join(args.build, "bench", "bench_ddp"), "ddp",
           "--model", model, "--comm-hook", hook, "--steps", str(args.steps),
           "--batch", str(args.batch), "--powersgd-rank", str(args.powersgd_rank)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    if out.returncode != 0:
        sys.exit("bench_hooks: %s failed (exit %d):\n%s%s" %
                 (" ".join(cmd), out.returncode, out.stdout, out.stderr))
    values = {}
    for line in out.stdout.splitlines():
        i = line.find("BENCH ")
        if i >= 0:
            parts = line[i + 6:].split()
            values[parts[0]] = parts[1:]
    try:
        return {"step_ms": float(values["ddp_step_ms"][0]),
                "bytes": int(values["ddp_bytes_all_reduced_per_step"][0])}
    except (KeyError, IndexError, ValueError):
        sys.exit("bench_hooks: no step time or bytes in the output of %s:\n%s" %
                 (" ".join(cmd), out.stdout))


def hook_label(hook, rank):
    if hook == "none":
        return "none (averaging all-reduce)"
    return "powersgd, rank %d" % rank if hook == "powersgd" else hook


def table(args, model, runs):
    """runs[hook]: one result per round. Markdown rows, ratios to 'none'."""
    plain = runs["none"]
    lines = ["| `--comm-hook` | step (ms, median) | vs plain | bytes all-reduced per step | "
             "vs plain |", "|---|---|---|---|---|"]
    for hook in args.hooks:
        times = [r["step_ms"] for r in runs[hook]]
        ratios = [r["step_ms"] / p["step_ms"] for r, p in zip(runs[hook], plain)]
        nbytes = runs[hook][-1]["bytes"]
        byte_ratio = nbytes / plain[-1]["bytes"]
        lines.append("| %s | %.1f | %s | {:,} | %s |".format(nbytes) % (
            hook_label(hook, args.powersgd_rank), statistics.median(times),
            "1" if hook == "none" else "%.2f" % statistics.median(ratios),
            "1" if hook == "none" else "1/%.1f" % (1 / byte_ratio)))
    return "\n".join(["### %s, %d ranks, batch %d per rank, %d rounds x %d steps" %
                      (model, args.nproc, args.batch, args.rounds, args.steps), ""] + lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default="build")
    p.add_argument("--models", default="resnet20,resnet18")
    p.add_argument("--hooks", default="none,fp16,bf16,powersgd")
    p.add_argument("--powersgd-rank", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--timeout", type=int, default=900, help="seconds per job")
    args = p.parse_args()
    args.models = [m for m in args.models.split(",") if m]
    args.hooks = [h for h in args.hooks.split(",") if h]
    if "none" not in args.hooks:
        p.error("--hooks must include none: the ratios are to the plain all-reduce")
    args.hooks.remove("none")
    args.hooks.insert(0, "none")
    if min(args.rounds, args.steps, args.batch, args.nproc, args.powersgd_rank) < 1:
        p.error("--rounds, --steps, --batch, --nproc and --powersgd-rank must be at least 1")
    for exe in (os.path.join(args.build, "tools", "ddprun"),
                os.path.join(args.build, "bench", "bench_ddp")):
        if not os.access(exe, os.X_OK):
            p.error("%s not found: build it first (ninja -C %s)" % (exe, args.build))

    print(cpu_info())
    for model in args.models:
        runs = {h: [] for h in args.hooks}
        for r in range(args.rounds):
            for hook in args.hooks:  # interleaved: every round visits every hook once
                runs[hook].append(run_once(args, model, hook))
                print("round %d %s %s: %.1f ms, %d bytes" % (r + 1, model, hook,
                      runs[hook][-1]["step_ms"], runs[hook][-1]["bytes"]), file=sys.stderr)
        print()
        print(table(args, model, runs))


if __name__ == "__main__":
    main()
