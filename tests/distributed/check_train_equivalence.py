"""examples/train under ddprun equals one process with the whole batch.

    check_train_equivalence.py DDPRUN TRAIN CASE     CASE: syncbn | accumulation | flags

syncbn:       2 ranks x batch 4 with --sync-bn reach, after 3 SGD steps, the parameters and BN
              running statistics of one process with batch 8 (relative 1e-4 with direct
              convolutions, 2e-3 with the default Winograd; see case_syncbn and compare()).
accumulation: 2 ranks x 4 micro-batches of 2 (--accumulation-steps 4) equal one process with
              batch 16 (relative 1e-5), with exactly one round of bucket all-reduces per optimizer
              step (the metrics' grad_sync_rounds, counted by the Reducer, equals the step count).
flags:        wrong values of the new flags end with a clear error; the norm warning and the
              one-process --sync-bn note are printed; --grad-scaler without overflow changes
              nothing (bit for bit) and reports its scale.

Why the batches match: with --no-shuffle the DistributedSampler gives rank r the indices r, r+2,
r+4, ... so at step k rank 0 holds the even and rank 1 the odd indices of [8k, 8k+8): together the
single process's batch k, in another order (which neither BN statistics nor a mean gradient see).
The dataset is a folder of 32x32 PPM images written here (pure Python: no numpy needed).
"""
import json
import os
import struct
import subprocess
import sys
import tempfile
from array import array


def write_dataset(root, per_class_train, per_class_test, classes=3):
    seed = 12345

    def next_byte():
        nonlocal seed
        seed = (seed * 1103515245 + 12345) % (1 << 31)
        return (seed >> 16) & 0xFF

    for split, count in (("train", per_class_train), ("test", per_class_test)):
        for c in range(classes):
            d = os.path.join(root, split, "class%d" % c)
            os.makedirs(d)
            for i in range(count):
                # A per-class brightness offset, so the classes are learnable at all.
                pixels = bytes((next_byte() // 2 + 40 * c) % 256 for _ in range(32 * 32 * 3))
                with open(os.path.join(d, "%03d.ppm" % i), "wb") as f:
                    f.write(b"P6\n32 32\n255\n" + pixels)


def read_safetensors(path):
    """{name: (dtype, array of numbers)}: tests/st_io.py without numpy, so this test runs everywhere."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    body = raw[8 + n:]
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        begin, end = e["data_offsets"]
        codes = {"F32": "f", "F64": "d", "I64": "q", "I32": "i"}
        if e["dtype"] not in codes:
            raise SystemExit("unexpected dtype %s of %s" % (e["dtype"], name))
        values = array(codes[e["dtype"]])
        values.frombytes(body[begin:end])
        if sys.byteorder != "little":
            values.byteswap()
        out[name] = (e["dtype"], values)
    return out


def compare(got_path, want_path, tol):
    """Prints the worst tensors; returns the number of tensors off by more than tol.

    The error of a tensor is max|got - want| / max(max|want|, 0.01). The floor matters for BN
    biases only: they start at zero and after three small steps are ~1e-4, while their gradients,
    sums of dy over the batch, cancel heavily; float32 rounding then leaves absolute differences
    of ~5e-8 (measured), which is 1e-4 of nothing. Weights and running statistics are O(0.01-1)
    and are compared truly relatively."""
    got, want = read_safetensors(got_path), read_safetensors(want_path)
    if sorted(got) != sorted(want):
        print("different tensor names:", sorted(set(got) ^ set(want)))
        return 1
    bad, worst = 0, []
    for name in sorted(want):
        g, w = got[name][1], want[name][1]
        scale = max(max((abs(x) for x in w), default=0.0), 0.01)
        err = max((abs(a - b) for a, b in zip(g, w)), default=0.0) / scale
        worst.append((err, name))
        if len(g) != len(w) or err > tol:
            bad += 1
            print("MISMATCH %s: relative error %.3g (tolerance %g)" % (name, err, tol))
    worst.sort(reverse=True)
    print("%d tensors compared; largest relative errors: %s" %
          (len(want), ", ".join("%s %.2g" % (n, e) for e, n in worst[:3])))
    return bad


def run(cmd, expect_rc=0, env=None):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       env=None if env is None else dict(os.environ, **env))
    print("$", " ".join(cmd), "-> exit", p.returncode)
    print(p.stdout)
    if expect_rc is not None and p.returncode != expect_rc:
        raise SystemExit("FAILED: exit status %d, expected %d" % (p.returncode, expect_rc))
    return p.stdout


def common(data):
    return ["--dataset", "folder", "--data-dir", data, "--no-shuffle", "--no-augment",
            "--num-workers", "0", "--threads", "1", "--epochs", "1", "--seed", "3"]


def case_syncbn(ddprun, train, tmp):
    """Twice: with direct convolutions to 1e-4, then with the default algorithm (Winograd on the
    32- and 64-channel layers, Note [Winograd] in nn/onednn.cpp) to 2e-3. Winograd's weight
    gradients are sums over the batch taken in its transformed domain and transformed back, so
    splitting the batch over two ranks changes their rounding more than a direct convolution's:
    measured, the BN biases (the cancelling sums described in compare()) then differ by up to
    5.4e-6 absolute, 5.4e-4 on compare()'s scale, where direct convolutions give 5e-8. The first
    run checks SyncBatchNorm's arithmetic; the second, that the default stays close."""
    data = os.path.join(tmp, "data")
    write_dataset(data, per_class_train=8, per_class_test=1)  # 24 images: 3 steps of 8
    args = common(data) + ["--model", "resnet20", "--lr", "0.01", "--max-steps", "3"]
    bad = 0
    for algo, tol in (("direct", 1e-4), ("auto", 2e-3)):
        env = {"DDPLAB_CONV_ALGO": algo}
        ddp_st, one_st = (os.path.join(tmp, "%s_%s.st" % (k, algo)) for k in ("ddp", "one"))
        out = run([ddprun, "--standalone", "--nproc-per-node", "2", train] + args +
                  ["--sync-bn", "--batch-size", "4", "--save", ddp_st], env=env)
        assert "SyncBatchNorm" in out, "the DDP run did not report SyncBatchNorm"
        run([train] + args + ["--batch-size", "8", "--save", one_st], env=env)
        print("convolution algorithm %s:" % algo)
        bad += compare(ddp_st, one_st, tol)
    return bad


def case_accumulation(ddprun, train, tmp):
    data = os.path.join(tmp, "data")
    write_dataset(data, per_class_train=16, per_class_test=1)  # 48 images: 3 steps of 16
    args = common(data) + ["--model", "mlp", "--lr", "0.05"]
    metrics = os.path.join(tmp, "m.jsonl")
    run([ddprun, "--standalone", "--nproc-per-node", "2", train] + args +
        ["--accumulation-steps", "4", "--batch-size", "2", "--save", os.path.join(tmp, "ddp.st"),
         "--metrics", metrics])
    run([train] + args + ["--batch-size", "16", "--save", os.path.join(tmp, "one.st")])
    # One process accumulating 4 x 4 equals it too.
    run([train] + args + ["--accumulation-steps", "4", "--batch-size", "4",
                          "--save", os.path.join(tmp, "acc.st")])
    with open(metrics) as f:
        m = json.loads(f.readline())
    print("metrics:", m)
    bad = 0
    if m["step"] != 3 or m["grad_sync_rounds"] != m["step"]:
        print("MISMATCH: %d optimizer steps, %d rounds of all-reduces (want 3 and 3)" %
              (m["step"], m["grad_sync_rounds"]))
        bad += 1
    bad += compare(os.path.join(tmp, "ddp.st"), os.path.join(tmp, "one.st"), 1e-5)
    bad += compare(os.path.join(tmp, "acc.st"), os.path.join(tmp, "one.st"), 1e-5)
    return bad


def case_flags(ddprun, train, tmp):
    data = os.path.join(tmp, "data")
    write_dataset(data, per_class_train=4, per_class_test=1)
    args = common(data) + ["--model", "mlp", "--batch-size", "4"]
    bad = 0
    for flags, message in [
            (["--accumulation-steps", "0"], "--accumulation-steps must be at least 1 (got 0)"),
            (["--accumulation-steps", "-2"], "--accumulation-steps must be at least 1 (got -2)"),
            (["--clip-grad-norm", "-1"], "--clip-grad-norm must be a finite number >= 0"),
            (["--clip-grad-norm", "nan"], "--clip-grad-norm must be a finite number >= 0"),
            (["--grad-norm-warn", "-0.5"], "--grad-norm-warn must be >= 0")]:
        out = run([train] + args + flags, expect_rc=2)
        if "error: " + message not in out:
            print("MISSING: %r for %s" % (message, flags))
            bad += 1
    # A tiny threshold: every step warns, with its number; clipping is mentioned.
    out = run([train] + args + ["--max-steps", "2", "--grad-norm-warn", "1e-9",
                                "--clip-grad-norm", "1", "--sync-bn", "--accumulation-steps", "9"])
    for message in ["warning: step 1: gradient norm", "exceeds --grad-norm-warn 1e-09 (clipped)",
                    "note: --sync-bn with one process: BatchNorm2d kept",
                    "note: --accumulation-steps 9 exceeds the 3 batches of an epoch"]:
        if message not in out:
            print("MISSING:", message)
            bad += 1
    # --grad-scaler without overflow: the scale is a power of two, so scaling and unscaling are
    # exact and the run equals the plain one bit for bit; the metrics report the scale.
    metrics = os.path.join(tmp, "m.jsonl")
    run([train] + args + ["--save", os.path.join(tmp, "plain.st")])
    run([train] + args + ["--grad-scaler", "--save", os.path.join(tmp, "scaled.st"),
                          "--metrics", metrics])
    with open(metrics) as f:
        m = json.loads(f.readline())
    if m.get("loss_scale") != 65536 or m.get("skipped_steps") != 0:
        print("MISMATCH: metrics", m, "want loss_scale 65536, skipped_steps 0")
        bad += 1
    bad += compare(os.path.join(tmp, "scaled.st"), os.path.join(tmp, "plain.st"), 0.0)
    return bad


def main():
    ddprun, train, case = sys.argv[1:4]
    with tempfile.TemporaryDirectory() as tmp:
        bad = {"syncbn": case_syncbn, "accumulation": case_accumulation,
               "flags": case_flags}[case](ddprun, train, tmp)
    print("FAILED" if bad else "OK")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
