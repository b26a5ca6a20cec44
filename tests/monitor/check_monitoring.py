#!/usr/bin/env python3
"""Monitoring end to end; one case per first argument (exit 77: skipped, with the reason).

  tensorboard WRITE_EVENTS   TensorBoard's own reader (EventAccumulator, from the venv of
                             scripts/pyvenv at $DDPLAB_VENV) reads what write_events wrote.
  train DDPRUN TRAIN REPO    2 ranks of train on a Fashion-MNIST subset with --trace-dir, --logdir
                             and CSV metrics: every rank's trace parses, each bucket's events are in
                             order ready <= launch <= done, tools/merge-traces holds both ranks,
                             and (with matplotlib) scripts/plot draws valid PNGs of the right size.
  plot REPO                  scripts/plot on a small fabricated run: valid PNGs of the right size.
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

SKIP = 77


def check(cond, msg):
    if not cond:
        sys.exit("FAIL: " + msg)


def png_size(path):
    """(width, height) from the PNG signature and IHDR chunk; fails on anything else."""
    with open(path, "rb") as f:
        head = f.read(24)
    check(head[:8] == b"\x89PNG\r\n\x1a\n", f"{path}: not a PNG signature")
    check(head[12:16] == b"IHDR", f"{path}: no IHDR chunk first")
    return struct.unpack(">II", head[16:24])


def debian_matplotlib():
    return subprocess.run(["/usr/bin/python3", "-c", "import matplotlib"],
                          capture_output=True).returncode == 0


def check_plots(repo, metrics, trace, out):
    r = subprocess.run([os.path.join(repo, "scripts", "plot"), metrics, "--trace", trace,
                        "--out", out], capture_output=True, text=True)
    check(r.returncode == 0, "scripts/plot failed:\n" + r.stdout + r.stderr)
    check(png_size(os.path.join(out, "curves.png")) == (800, 350), "curves.png size")
    check(png_size(os.path.join(out, "overlap.png")) == (800, 450), "overlap.png size")


def case_tensorboard(write_events):
    venv = os.environ.get("DDPLAB_VENV", os.path.expanduser("~/.cache/ddplab/venv"))
    py = os.path.join(venv, "bin", "python3")
    if not os.path.exists(py) or subprocess.run(
            [py, "-c", "import tensorboard"], capture_output=True).returncode != 0:
        print(f"skip: no tensorboard in the venv {venv} (scripts/pyvenv makes it)")
        return SKIP
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([write_events, d], check=True)
        reader = r"""
import sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0, "tensors": 0})
acc.Reload()
tags = acc.Tags()
loss = [(e.step, e.value) for e in acc.Scalars("train/loss")]
val = [(e.step, e.value) for e in acc.Scalars("val/accuracy")]
assert [s for s, _ in loss] == [0, 1, 2, 3, 4], loss
assert all(abs(v - 2.0 / (s + 1)) < 1e-6 for s, v in loss), loss
assert all(abs(v - (0.5 + 0.1 * s)) < 1e-6 for s, v in val), val
texts = acc.Tensors("backend")
assert texts[0].tensor_proto.string_val[0] == b"gloo", texts
print("tensorboard read", len(loss), "+", len(val), "scalars and the text", tags["tensors"])
"""
        r = subprocess.run([py, "-c", reader, d], capture_output=True, text=True)
        print(r.stdout + r.stderr)
        check(r.returncode == 0, "TensorBoard's reader disagrees with what was written")
    return 0


def case_train(ddprun, train, repo):
    if not os.path.isdir("/usr/share/datasets/fashion-mnist"):
        print("skip: no /usr/share/datasets/fashion-mnist (Debian's dataset-fashion-mnist)")
        return SKIP
    d = tempfile.mkdtemp()
    try:
        cmd = [ddprun, "--standalone", "--nproc-per-node", "2", train, "--model", "cnn",
               "--dataset", "fmnist", "--subset", "256", "--batch-size", "32", "--max-steps", "4",
               "--num-workers", "1", "--metrics", f"{d}/m.csv", "--logdir", f"{d}/tb",
               "--trace-dir", f"{d}/trace"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        print(r.stdout + r.stderr)
        check(r.returncode == 0, "train failed")
        check("waiting on communication" in r.stdout, "no epoch summary on the console")
        for rank in (0, 1):
            with open(f"{d}/trace/rank{rank}.json") as f:
                events = json.load(f)["traceEvents"]
            names = {e["name"] for e in events}
            for phase in ("data wait", "forward", "backward", "optimizer step"):
                check(phase in names, f"rank {rank}: no '{phase}' event")
            spans = [e for e in events if e["name"].startswith("all-reduce bucket")]
            readies = {(e["args"]["iteration"], e["args"]["bucket"]): e["ts"]
                       for e in events if e["name"].endswith(" ready")}
            check(spans, f"rank {rank}: no bucket events")
            check(len({e["args"]["iteration"] for e in spans}) == 4, f"rank {rank}: not 4 steps")
            for e in spans:
                a = e["args"]
                ready = readies[(a["iteration"], a["bucket"])]
                check(ready == a["ready_us"] <= a["launched_us"] == e["ts"] <= a["done_us"],
                      f"rank {rank}: bucket events out of order: {e}")
                check(abs(e["ts"] + e["dur"] - a["done_us"]) < 1e-3, f"duration: {e}")
        merge = subprocess.run([os.path.join(repo, "tools", "merge-traces"), f"{d}/trace"],
                               capture_output=True, text=True)
        check(merge.returncode == 0, "merge-traces failed: " + merge.stderr)
        with open(f"{d}/trace/merged.json") as f:
            merged = json.load(f)["traceEvents"]
        check({e["pid"] for e in merged} == {0, 1}, "the merged trace lacks a rank")
        check(sum(e["name"] == "backward" for e in merged) == 8, "not 4 backwards per rank")
        check(len(os.listdir(f"{d}/tb")) == 1, "not one event file (rank 0 alone writes)")
        with open(f"{d}/m.csv") as f:
            header = f.readline()
        check(header.startswith("epoch,step,train_loss"), "CSV header: " + header)
        if debian_matplotlib():
            check_plots(repo, f"{d}/m.csv", f"{d}/trace/merged.json", f"{d}/png")
            print("plots: valid PNGs")
        print("trace, merge and metrics: ok")
    finally:
        shutil.rmtree(d)
    return 0


def case_plot(repo):
    if not debian_matplotlib():
        print("skip: no matplotlib for /usr/bin/python3 (python3-matplotlib)")
        return SKIP
    with tempfile.TemporaryDirectory() as d:
        with open(f"{d}/m.jsonl", "w") as f:
            for e in range(3):
                f.write(json.dumps({"epoch": e, "train_loss": 1.0 / (e + 1), "train_acc": 0.5,
                                    "test_acc": 0.6}) + "\n")
        events = []
        for rank in (0, 1):
            events.append({"name": "backward", "ph": "X", "pid": rank, "tid": 0, "ts": 1000.0,
                           "dur": 500.0})
            for k in range(3):
                a = {"bucket": k, "iteration": 0, "ready_us": 1100.0 + 100 * k,
                     "launched_us": 1100.0 + 100 * k, "done_us": 1250.0 + 120 * k}
                events.append({"name": f"all-reduce bucket {k}", "ph": "X", "pid": rank,
                               "tid": 1, "ts": a["launched_us"],
                               "dur": a["done_us"] - a["launched_us"], "args": a})
        with open(f"{d}/trace.json", "w") as f:
            json.dump({"traceEvents": events}, f)
        check_plots(repo, f"{d}/m.jsonl", f"{d}/trace.json", f"{d}/png")
    print("plots: valid PNGs of 800x350 and 800x450")
    return 0


if __name__ == "__main__":
    case = sys.argv[1]
    if case == "tensorboard":
        sys.exit(case_tensorboard(sys.argv[2]))
    if case == "train":
        sys.exit(case_train(*sys.argv[2:5]))
    if case == "plot":
        sys.exit(case_plot(sys.argv[2]))
    sys.exit(f"unknown case {case}")
