#!/usr/bin/env python3
"""One training step of examples/train against PyTorch in float64, tensor by tensor.

The step is the one a user runs: `train --init-from W --max-steps 1 --save OUT` on data files
written here in the dataset's own format. PyTorch takes the same step from the same weights and
batch in float64 (the oracle) and in float32 (the yardstick): forward in train mode,
cross-entropy, backward, SGD with lr 0.1, momentum 0.9 and weight decay 5e-4, which moves the
weights and the BatchNorm running statistics. Each float tensor of the saved state_dict passes
when, both for its value after the step and for the step itself (after - before),

    rel_err(ddplab, torch64) <= max(10 * rel_err(torch32, torch64), 1e-6),
    rel_err(a, b) = max|a - b| / max|b|,

and every num_batches_tracked must be equal. The step matters: with lr 0.1 a weight moves by a
small part of itself, so the state alone hides gradient errors; an off-by-one in batch norm's
backward (proj divided by M - 1 instead of M, 1/2048 of one term) passed the states at 0.80 of
their bounds and failed the steps at 2.35. The log starts with the machine
(tests/models/cpu_info.cpp).

The starting point is moved off the ReLU and max-pool kinks first (Note [A starting point away
from the kinks] in tests/models/kinks.py).

    check_train_step.py TRAIN CPU_INFO [--model resnet20|cnn] [--runs RUNS] [--batch B]
                        [--ranks 2 --ddprun DDPRUN] [--sync-bn] [--wrapper "CMD ..."]
                        [--check-save] [--at-init [--data-seed S]] [--sanitized]

--at-init: from PyTorch's initial state as it is, not moved off the kinks, with the data of
--data-seed (default 1): the comparison as a user would first try it, which float32 results,
PyTorch's own included, fail by chance (see the Note).

--check-save: the file --save wrote is also checked: a CRC32 per tensor in its metadata, it opens
with the safetensors package (PyTorch's reader; skipped where no Python here has it), and
--init-from refuses it with one data byte flipped, naming the tensor and the checksum.

RUNS: comma-separated runs against the one oracle, each `fast:T` (train with every fast path as
it picks them, T threads), `plain:T` (train with fused batch norm, blocked activations, Winograd
and adaptive threads off: PLAIN_ENV) or `torch-cl:T` (PyTorch's float32 step in channels-last,
another summation order than its yardstick's: the allowance's own check). --ranks 2: ddprun starts 2 ranks of batch B each
(--no-shuffle: rank r reads records r, r + 2, ...); the oracle is one process with the batch of
2B (mean loss; with --sync-bn, BatchNorm's statistics over all 2B). --wrapper runs train and
cpu_info under a command, e.g. "qemu-x86_64 -cpu EPYC-Milan" for an AVX2-only CPU; --sanitized
(meson passes it in an ASan/UBSan build) skips a run under a wrapper.
Exit 1 on any failure, 77 (skipped) without torch and numpy or without the wrapper's program.
"""
import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, ".."))
# The oracle must not run under a cap meant for ddplab (it would loosen the yardstick).
for var in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):
    os.environ.pop(var, None)
try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as e:
    print("skipped: %s is not importable by %s (Debian: python3-torch python3-numpy)"
          % (e.name, sys.executable))
    sys.exit(77)
import st_io  # noqa: E402
from dataset_files import (CIFAR_STATS, FMNIST_STATS, normalized, write_cifar,  # noqa: E402
                           write_fmnist)
import torch_models  # noqa: E402
from kinks import KINK_FACTOR, away_from_kinks, make_model  # noqa: E402  (tests/models/kinks.py)

# The switches of train's fast paths (docs/layers.md, docs/training.md).
PLAIN_ENV = {"DDPLAB_FUSED": "0", "DDPLAB_BLOCKED": "0", "DDPLAB_CONV_ALGO": "direct",
             "DDPLAB_ADAPTIVE_THREADS": "0"}
LR, MOMENTUM, WEIGHT_DECAY = 0.1, 0.9, 5e-4
FLOOR = 1e-6      # the bound where PyTorch's float32 error is about 0 (see the docstring)


def rel_err(a, b):
    a = torch.as_tensor(np.asarray(a)).double()
    b = torch.as_tensor(np.asarray(b)).double()
    if b.numel() == 0:
        return 0.0
    scale = b.abs().max().item()
    diff = (a - b).abs().max().item()
    return diff / scale if scale > 0 else diff


# --- the PyTorch side ------------------------------------------------------------------------

def initial_state(model, as_is=False):
    """PyTorch's initial weights, with BatchNorm's affine and running statistics moved off their
    defaults (weight 1, bias 0, mean 0, var 1) so that a wrong term cannot hide behind them
    (unless as_is)."""
    if as_is:
        return {k: v.detach().clone() for k, v in model.state_dict().items()}
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.weight.copy_(0.75 + 0.5 * torch.rand(m.weight.shape, generator=g))
                m.bias.copy_(0.2 * torch.randn(m.bias.shape, generator=g))
                m.running_mean.copy_(0.1 * torch.randn(m.running_mean.shape, generator=g))
                m.running_var.copy_(0.5 + torch.rand(m.running_var.shape, generator=g))
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def torch_step(name, state, x, y, dtype, channels_last=False):
    model = make_model(name, state, dtype)
    xt = torch.from_numpy(x).to(dtype)
    if channels_last:  # the same step in another summation order (oneDNN's NHWC kernels)
        model = model.to(memory_format=torch.channels_last)
        xt = xt.contiguous(memory_format=torch.channels_last)
    loss = F.cross_entropy(model(xt), torch.from_numpy(y))
    loss.backward()
    torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY).step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# --- one ddplab run against the oracle -------------------------------------------------------

def compare(got, r64, r32, start):
    """Prints the worst tensors and returns (passed, failed). Each float tensor is compared twice:
    its value after the step (the state), and the step itself, after - start: with lr 0.1 a
    weight moves by a small part of itself, so an error in its gradient shows in the step long
    before it shows in the state (a BatchNorm bias that starts at 0, as in PyTorch's initial
    state, is the exception: its state is its step)."""
    passed = failed = 0
    if sorted(got) != sorted(r64):
        failed += 1
        print("FAIL saved keys differ: only ddplab %s; only torch %s"
              % (sorted(set(got) - set(r64)), sorted(set(r64) - set(got))))
    rows = []
    for name in r64:
        if name not in got:
            continue
        if name.endswith("num_batches_tracked"):
            ok = int(got[name]) == int(r64[name].item())
            passed += ok
            failed += not ok
            if not ok:
                print("FAIL %s: %s, PyTorch %s" % (name, got[name], r64[name].item()))
            continue
        s0 = np.asarray(start[name], dtype=np.float64)
        for what, a, b, c in (
                ("", got[name], r64[name], r32[name]),
                (" (step)", np.asarray(got[name], dtype=np.float64) - s0,
                 r64[name].double().numpy() - s0, r32[name].double().numpy() - s0)):
            e_ddp, e_32 = rel_err(a, b), rel_err(c, b)
            bound = max(KINK_FACTOR * e_32, FLOOR)
            ok = e_ddp <= bound
            passed += ok
            failed += not ok
            rows.append((e_ddp / bound, name + what, e_ddp, e_32, bound, ok))
    rows.sort(reverse=True)
    print("  %-40s %11s %11s %11s %7s" % ("tensor (worst first)", "ddplab err", "torch32 err",
                                           "bound", "ratio"))
    for ratio, name, e_ddp, e_32, bound, ok in rows[:5] + [r for r in rows[5:] if not r[5]]:
        print("  %-40s %11.3e %11.3e %11.3e %7.3f %s" % (name, e_ddp, e_32, bound, ratio,
                                                         "ok" if ok else "FAIL"))
    states = [r for r in rows if not r[1].endswith(" (step)")]
    print("  worst: %s at %.3f of its bound; of the states alone: %s at %.3f (%d tensors)"
          % (rows[0][1], rows[0][0], states[0][1], states[0][0], len(states)))
    return passed, failed


def check_save_verifiable(cmd, saved, d, env):
    """The file --save wrote records a CRC32 per tensor, still opens with PyTorch's safetensors
    package (where installed), and --init-from refuses it with one data byte flipped, naming the
    tensor and the checksum; returns (passed, failed)."""
    results = []
    header = st_io.read_header(saved)
    names = [k for k in header if k != "__metadata__"]
    crcs = json.loads(header.get("__metadata__", {}).get("crc32", "{}"))
    results.append(("a CRC32 per tensor in the metadata", sorted(crcs) == sorted(names)))
    # PyTorch's own reader: the safetensors package, here or in scripts/pyvenv's environment.
    opener = [sys.executable]
    if subprocess.run(opener + ["-c", "import safetensors.torch"],
                      stderr=subprocess.DEVNULL).returncode != 0:
        venv = os.environ.get("DDPLAB_VENV") or os.path.expanduser("~/.cache/ddplab/venv")
        opener = [os.path.join(venv, "bin", "python3")]
    try:
        p = subprocess.run(opener + ["-c", "import sys; from safetensors.torch import load_file; "
                                     "print(' '.join(sorted(load_file(sys.argv[1]))))", saved],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    except OSError:
        p = None
    if p is not None and p.returncode == 0:
        results.append(("opens with safetensors.torch.load_file", p.stdout.split() == sorted(names)))
    else:
        print("  (no Python here has the safetensors package, scripts/pyvenv installs it: the file "
              "was read with tests/st_io.py only)")
    victim = next(n for n in names if n.endswith("conv1.weight"))
    with open(saved, "rb") as f:
        raw = bytearray(f.read())
    hlen = int.from_bytes(raw[:8], "little")
    raw[8 + hlen + header[victim]["data_offsets"][0] + 2] ^= 0x01
    flipped = os.path.join(d, "flipped.safetensors")
    with open(flipped, "wb") as f:
        f.write(raw)
    i = cmd.index("--init-from")
    rerun = cmd[:i + 1] + [flipped] + cmd[i + 2:]
    rerun[rerun.index("--save") + 1] = os.path.join(d, "unused.safetensors")
    p = subprocess.run(rerun, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    said = [line for line in p.stdout.splitlines() if "checksum" in line]
    print("  --init-from with a flipped byte in %s: exit %d, %s" % (victim, p.returncode,
                                                                   said[0] if said else p.stdout[-500:]))
    results.append(("--init-from refuses a flipped data byte, naming the tensor and the checksum",
                    p.returncode != 0 and any("'%s'" % victim in line for line in said)))
    for what, ok in results:
        print("  %s %s" % ("ok  " if ok else "FAIL", what))
    return sum(ok for _, ok in results), sum(not ok for _, ok in results)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("train")
    ap.add_argument("cpu_info")
    ap.add_argument("--model", default="resnet20", choices=["resnet20", "cnn"])
    ap.add_argument("--runs", default="fast:2")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--ddprun")
    ap.add_argument("--sync-bn", action="store_true")
    ap.add_argument("--wrapper", default="")
    ap.add_argument("--check-save", action="store_true")
    ap.add_argument("--at-init", action="store_true")
    ap.add_argument("--data-seed", type=int, default=1)
    ap.add_argument("--sanitized", action="store_true")
    a = ap.parse_args()
    wrapper = shlex.split(a.wrapper)
    if wrapper and shutil.which(wrapper[0]) is None:
        print("skipped: %s is not installed (Debian: qemu-user)" % wrapper[0])
        return 77
    if wrapper and a.sanitized:
        print("skipped: a sanitizer build does not run under %s (it cannot map ASan's shadow "
              "memory)" % wrapper[0])
        return 77
    print(subprocess.run(wrapper + [a.cpu_info], stdout=subprocess.PIPE, text=True,
                         stderr=subprocess.DEVNULL, check=True).stdout.strip()
          + ("  [under %s]" % a.wrapper if wrapper else ""), flush=True)

    per_step = a.batch * a.ranks
    torch.manual_seed(0)
    model, _ = torch_models.build_model(a.model)
    state0 = initial_state(model, a.at_init)
    for data_seed in range(a.data_seed, a.data_seed + 50):
        rng = np.random.default_rng(data_seed)
        d = tempfile.mkdtemp()
        data_dir = os.path.join(d, "data")
        os.makedirs(data_dir)
        if a.model == "resnet20":
            pixels, labels = write_cifar(data_dir, rng, per_step)
            dataset, stats = ["--dataset", "cifar10", "--any-record-count"], CIFAR_STATS
        else:
            pixels, labels = write_fmnist(data_dir, rng, per_step)
            dataset, stats = ["--dataset", "fmnist"], FMNIST_STATS
        x, y = normalized(pixels, stats), labels
        if a.at_init:
            found = ({k: v.clone() for k, v in state0.items()}, 0)
            break
        found = away_from_kinks(a.model, {k: v.clone() for k, v in state0.items()}, x)
        if found is not None:
            break
        shutil.rmtree(d)
    else:
        raise SystemExit("check_train_step: 50 batches all had a near tie in a max-pool window")
    state, moved = found
    if a.at_init:
        print("starting point: PyTorch's initial state as it is, data seed %d, NOT moved off the "
              "kinks (--at-init: a float32 result may fail by chance, PyTorch's own too: Note [A "
              "starting point away from the kinks])" % data_seed)
    else:
        print("starting point: data seed %d; %d channels' biases moved off the ReLU kinks (Note "
              "[A starting point away from the kinks])" % (data_seed, moved))
    r64 = torch_step(a.model, state, x, y, torch.float64)
    r32 = torch_step(a.model, state, x, y, torch.float32)

    passed = failed = 0
    try:
        init = os.path.join(d, "init.safetensors")
        start = {k: v.numpy() for k, v in state.items()}
        st_io.write(init, start)
        for run in a.runs.split(","):
            kind, threads = run.split(":")
            env = dict(os.environ)
            if kind == "torch-cl":
                # PyTorch float32 channels-last against the same allowance: a float32 run in
                # another summation order, which the allowance must let pass too.
                print("run %s: PyTorch %s float32, channels-last" % (run, torch.__version__))
                torch.set_num_threads(int(threads))
                ok, bad = compare(torch_step(a.model, state, x, y, torch.float32, True), r64, r32,
                                  start)
                passed += ok
                failed += bad
                continue
            if kind == "plain":
                env.update(PLAIN_ENV)
            out = os.path.join(d, "out_%s_%s.safetensors" % (kind, threads))
            cmd = wrapper + [a.train, "--model", a.model] + dataset + [
                "--data-dir", data_dir, "--init-from", init, "--save", out,
                "--batch-size", str(a.batch), "--max-steps", "1", "--epochs", "1",
                "--no-augment", "--no-shuffle", "--lr", str(LR), "--momentum", str(MOMENTUM),
                "--weight-decay", str(WEIGHT_DECAY), "--schedule", "constant",
                "--threads", threads, "--num-workers", "1", "--test-subset", str(a.batch)]
            if a.sync_bn:
                cmd.append("--sync-bn")
            if a.ranks > 1:
                cmd = [a.ddprun, "--standalone", "--nproc-per-node", str(a.ranks)] + cmd
            shown = " ".join("%s=%s" % kv for kv in PLAIN_ENV.items()) + " " if kind == "plain" \
                else ""
            print("run %s: %s%s" % (run, shown, " ".join(cmd)), flush=True)
            p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
            if p.returncode != 0:
                print(p.stdout[-4000:])
                print("FAIL train exited %d" % p.returncode)
                failed += 1
                continue
            ok, bad = compare(st_io.read(out), r64, r32, start)
            passed += ok
            failed += bad
            if a.check_save:
                ok, bad = check_save_verifiable(cmd, out, d, env)
                passed += ok
                failed += bad
    finally:
        shutil.rmtree(d)
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
