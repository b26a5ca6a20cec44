"""Layer parity against PyTorch: runs ddplab's parity_layers, recomputes every case in PyTorch
in float64 (the oracle) and float32 (the yardstick), and checks per tensor that

    rel_err(ddplab, torch64) <= max(10 * rel_err(torch32, torch64), 1e-4),
    rel_err(a, b) = max|a - b| / max|b|.

That is: ddplab in float32 may be at most ten times less accurate than PyTorch in float32.

    python3 check_layers.py PARITY_LAYERS_EXE WORK_DIR

Prints a table and ends with `N passed, N failed`; exits 1 on any failure, 77 (skipped) without
torch.
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
try:
    import st_io  # noqa: E402  (tests/st_io.py: needs numpy)
    import torch
    import torch.nn.functional as F
except ImportError as e:
    # Exit status 77: meson counts the check as skipped, not passed, since nothing was compared.
    print("skipped: %s is not importable by %s; install it (Debian: apt-get install "
          "python3-torch python3-numpy, or run scripts/setup) or point the meson option "
          "torch_python at a Python that has it" % (e.name, sys.executable))
    sys.exit(77)


def rel_err(a, b):
    a = a.detach().double()
    b = b.detach().double()
    scale = b.abs().max().item() if b.numel() else 0.0
    diff = (a - b).abs().max().item() if b.numel() else 0.0
    return diff / scale if scale > 0 else diff


def run_torch(meta, T, dtype):
    """Runs one case in PyTorch at `dtype`; returns {tensor name: value} like ddplab's names."""
    leaves = {}

    def leaf(name):
        t = torch.tensor(T[name], dtype=dtype, requires_grad=True)
        leaves[name] = t
        return t

    def const(name):
        return torch.tensor(T[name], dtype=dtype)

    op = meta["op"]
    out = {}
    if op == "conv2d":
        b = leaf("b") if "b" in T else None
        y = F.conv2d(leaf("x"), leaf("w"), b, tuple(meta["stride"]), tuple(meta["padding"]),
                     tuple(meta["dilation"]), meta["groups"])
    elif op == "batch_norm":
        rm, rv = const("running_mean_before"), const("running_var_before")
        y = F.batch_norm(leaf("x"), rm, rv, leaf("w"), leaf("b"), training=True,
                         momentum=meta["momentum"], eps=meta["eps"])
        out["running_mean"], out["running_var"] = rm, rv
    elif op == "linear":
        y = F.linear(leaf("x"), leaf("w"), leaf("b"))
    elif op == "max_pool2d":
        y = F.max_pool2d(leaf("x"), meta["kernel"], meta["stride"], meta["padding"])
    elif op == "avg_pool2d":
        y = F.avg_pool2d(leaf("x"), meta["kernel"], meta["stride"], meta["padding"])
    elif op == "adaptive_avg_pool2d":
        y = F.adaptive_avg_pool2d(leaf("x"), tuple(meta["output_size"]))
    elif op == "cross_entropy":
        target = torch.tensor(T["target"], dtype=torch.int64)
        y = F.cross_entropy(leaf("logits"), target, reduction=meta["reduction"],
                            label_smoothing=meta["label_smoothing"])
    else:
        raise ValueError("unknown op " + op)
    y.backward(const("gy"))
    out["y"] = y
    for name, t in leaves.items():
        out["grad_" + name] = t.grad
    return out


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    exe, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    path = os.path.join(work, "parity_layers.safetensors")
    proc = subprocess.run([exe, path], capture_output=True, text=True)
    if proc.returncode != 0:
        print(proc.stdout + proc.stderr)
        print("check_layers: %s failed with exit code %d" % (exe, proc.returncode))
        print("0 passed, 1 failed")
        return 1
    print(proc.stdout.strip())
    torch.set_num_threads(1)
    tensors, metadata = st_io.read(path), st_io.read_metadata(path)

    rows, passed, failed = [], 0, 0
    for case in sorted(metadata):
        meta = json.loads(metadata[case])
        T = {k.split("/", 1)[1]: v for k, v in tensors.items() if k.startswith(case + "/")}
        ref64 = run_torch(meta, T, torch.float64)
        ref32 = run_torch(meta, T, torch.float32)
        for name in sorted(ref64):
            if name not in T:
                rows.append((case, name, float("nan"), float("nan"), 0.0, "MISSING"))
                failed += 1
                continue
            ours = torch.from_numpy(T[name])
            if tuple(ours.shape) != tuple(ref64[name].shape):
                rows.append((case, name, float("nan"), float("nan"), 0.0, "SHAPE"))
                failed += 1
                continue
            e_ours = rel_err(ours, ref64[name])
            e_t32 = rel_err(ref32[name], ref64[name])
            bound = max(10 * e_t32, 1e-4)
            ok = e_ours <= bound
            passed += ok
            failed += not ok
            rows.append((case, name, e_ours, e_t32, bound, "ok" if ok else "FAIL"))

    print("%-30s %-20s %12s %12s %10s  %s" % ("case", "tensor", "ddplab err", "torch32 err",
                                              "bound", "status"))
    for r in rows:
        print("%-30s %-20s %12.3e %12.3e %10.1e  %s" % r)
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
