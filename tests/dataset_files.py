"""Data files in the datasets' own formats, of random records, for checks and benchmarks that run
examples/train without downloading anything: CIFAR-10's binary batches and Fashion-MNIST's idx
files, and the normalization data::Transform applies to them (data/transforms.cpp). Needs numpy.
"""
import os

import numpy as np

CIFAR_STATS = ([0.4914, 0.4822, 0.4465], [0.2470, 0.2435, 0.2616])  # data/transforms.cpp
FMNIST_STATS = ([0.2860], [0.3530])


def write_cifar(root, rng, records):
    """CIFAR-10's binary files: 5 training files and a test file, label byte + 3072 pixels."""
    d = os.path.join(root, "cifar-10-batches-bin")
    os.makedirs(d)
    train = []
    for k in range(1, 7):
        rec = np.empty((records, 3073), dtype=np.uint8)
        rec[:, 0] = rng.integers(0, 10, size=records)
        rec[:, 1:] = rng.integers(0, 256, size=(records, 3072))
        rec.tofile(os.path.join(d, "data_batch_%d.bin" % k if k < 6 else "test_batch.bin"))
        train.append(rec)
    first = train[0]  # the step's batch: the first records of data_batch_1
    return first[:, 1:].reshape(-1, 3, 32, 32), first[:, 0].astype(np.int64)


def write_idx(path, array):
    with open(path, "wb") as f:
        f.write(bytes([0, 0, 8, array.ndim]))
        for n in array.shape:
            f.write(int(n).to_bytes(4, "big"))
        f.write(array.astype(np.uint8).tobytes())


def write_fmnist(root, rng, records):
    """Fashion-MNIST's four idx files (uncompressed)."""
    out = {}
    for prefix in ("train", "t10k"):
        images = rng.integers(0, 256, size=(records, 28, 28))
        labels = rng.integers(0, 10, size=records)
        write_idx(os.path.join(root, prefix + "-images-idx3-ubyte"), images)
        write_idx(os.path.join(root, prefix + "-labels-idx1-ubyte"), labels)
        out[prefix] = (images, labels)
    images, labels = out["train"]
    return images.reshape(-1, 1, 28, 28), labels.astype(np.int64)


def normalized(pixels, stats):
    """data::Transform's table in float32: (v / 255 - mean) / std, operation by operation."""
    mean = np.asarray(stats[0], dtype=np.float32).reshape(1, -1, 1, 1)
    std = np.asarray(stats[1], dtype=np.float32).reshape(1, -1, 1, 1)
    x = pixels.astype(np.float32) / np.float32(255)
    return ((x - mean) / std).astype(np.float32)
