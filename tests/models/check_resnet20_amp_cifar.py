#!/usr/bin/env python3
"""examples/train --model resnet20 --amp bf16 on CIFAR-10-format data: the loss must fall.

The data are made here in CIFAR-10's binary format (5 training files and a test file of
1 label byte + 3072 pixel bytes per record), small and learnable: each class is a colour and a
stripe direction, under noise. Three epochs of resnet20 in bfloat16 autocast must bring the
training loss well below its first epoch's (a model that learns nothing stays near ln 10 = 2.3).
Exit 77 (skipped) on a CPU without oneDNN's bfloat16 kernels (AVX-512).

  check_resnet20_amp_cifar.py TRAIN_BINARY
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np


def make_split(rng, n):
    labels = rng.integers(0, 10, size=n)
    records = np.empty((n, 3073), dtype=np.uint8)
    yy, xx = np.mgrid[0:32, 0:32]
    for i, k in enumerate(labels):
        img = rng.normal(110, 30, size=(3, 32, 32))
        img[k % 3] += 60  # a colour per class group
        stripes = (xx if k < 5 else yy) // (2 + k % 5) % 2  # a stripe direction and width
        img += 50 * stripes
        records[i, 0] = k
        records[i, 1:] = np.clip(img, 0, 255).astype(np.uint8).reshape(-1)
    return records


def main():
    train = sys.argv[1]
    flags = open("/proc/cpuinfo").read()
    if "avx512bw" not in flags:
        print("skipped: no AVX-512, so no oneDNN bfloat16 kernels")
        return 77
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as d:
        root = os.path.join(d, "cifar-10-batches-bin")
        os.makedirs(root)
        for k in range(1, 6):
            make_split(rng, 48).tofile(os.path.join(root, f"data_batch_{k}.bin"))
        make_split(rng, 64).tofile(os.path.join(root, "test_batch.bin"))
        metrics = os.path.join(d, "m.jsonl")
        cmd = [train, "--model", "resnet20", "--dataset", "cifar10", "--data-dir", d,
               "--any-record-count", "--amp", "bf16", "--epochs", "3", "--batch-size", "32",
               "--lr", "0.05", "--schedule", "constant", "--no-augment", "--num-workers", "1",
               "--threads", "2", "--seed", "1", "--metrics", metrics]
        print(" ".join(cmd), flush=True)
        # Without --any-record-count the small files are refused, naming the count.
        refused = subprocess.run(cmd[:cmd.index("--any-record-count")], capture_output=True,
                                 text=True)
        if refused.returncode == 0 or "record count mismatch" not in refused.stderr:
            print("expected the official-count check to refuse 48-record files:", refused.stderr)
            return 1
        subprocess.run(cmd, check=True)
        losses = [json.loads(line)["train_loss"] for line in open(metrics)]
    print("train loss per epoch:", " ".join(f"{v:.4f}" for v in losses))
    if len(losses) != 3 or not losses[-1] < 0.6 * losses[0]:
        print("the loss did not fall enough (last epoch must be below 60% of the first)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
