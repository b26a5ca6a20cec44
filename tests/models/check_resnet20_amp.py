"""resnet20 under bfloat16 autocast: ddplab's errors are PyTorch's CPU autocast's.

Runs parity_resnet20 --amp (ddplab: forward and loss under amp::AutocastGuard(kCPU, kBFloat16),
backward), then the same network and batch in PyTorch twice: in float64 (the oracle) and in
float32 under torch.autocast("cpu", torch.bfloat16) (the yardstick: what bfloat16 autocast costs
when PyTorch does it). Both round activations to bfloat16 at different places, so their errors
are of one size, not equal. Each of the logits, the loss and the parameter gradients passes when

    rel_err(ddplab, torch64) <= max(3 * rel_err(torch_autocast, torch64), 1e-3),
    rel_err(a, b) = max|a - b| / max|b|,

and over all the gradients the median of rel_err(ddplab) / rel_err(torch_autocast) must be at
most 1.5. The logits must also differ from float64 by more than float32 would (1e-5): bfloat16
really ran.

    python3 check_resnet20_amp.py PARITY_RESNET20_EXE WORK_DIR

Exits 1 on any failure; 77 (skipped) without torch or without AVX-512 (no oneDNN bfloat16).
"""
import os
import statistics
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, ".."))
try:
    import st_io  # noqa: E402  (tests/st_io.py: needs numpy)
    import torch
    import torch.nn.functional as F
except ImportError as e:
    print("skipped: %s is not importable by %s" % (e.name, sys.executable))
    sys.exit(77)
import torch_models  # noqa: E402


def rel_err(a, b):
    a = torch.as_tensor(a).double()
    b = torch.as_tensor(b).double()
    return ((a - b).abs().max() / b.abs().max()).item()


def run(T, dtype, autocast):
    model, x, y = torch_models.resnet20_step_inputs(T, dtype)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits = model(x)
        loss = F.cross_entropy(logits, y)
    loss.backward()
    out = {"logits": logits.detach(), "loss": loss.detach()}
    for n, p in model.named_parameters():
        out["grad." + n] = p.grad.detach().clone()
    return out


def main():
    if "avx512bw" not in open("/proc/cpuinfo").read():
        print("skipped: no AVX-512, so no oneDNN bfloat16 kernels")
        return 77
    exe, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    path = os.path.join(work, "resnet20_amp_step.safetensors")
    subprocess.run([exe, path, "--amp"], check=True)
    T = st_io.read(path)
    r64 = run(T, torch.float64, False)
    ram = run(T, torch.float32, True)
    failed = 0
    ratios = []
    print("%-36s %12s %12s %12s  %s" % ("tensor", "ddplab err", "torch bf16", "bound", "ok"))
    for name in r64:
        e_ddp = rel_err(T[name], r64[name])
        e_torch = rel_err(ram[name], r64[name])
        bound = max(3 * e_torch, 1e-3)
        ok = e_ddp <= bound
        failed += not ok
        if name.startswith("grad."):
            ratios.append(e_ddp / max(e_torch, 1e-12))
        if not ok or name in ("logits", "loss") or name.startswith("grad.conv1") \
                or name.startswith("grad.fc") or name.startswith("grad.layer3.2.conv2"):
            print("%-36s %12.3e %12.3e %12.3e  %s" % (name, e_ddp, e_torch, bound,
                                                       "ok" if ok else "FAIL"))
    median = statistics.median(ratios)
    print("gradients: ddplab error / PyTorch autocast error, median %.2f (bound 1.5), max %.2f"
          % (median, max(ratios)))
    if median > 1.5:
        failed += 1
        print("FAIL: ddplab's bfloat16 gradients are typically further from float64 than PyTorch's")
    if rel_err(T["logits"], r64["logits"]) <= 1e-5:
        failed += 1
        print("FAIL: the logits are float32-exact: did autocast run?")
    print("%d tensors compared, %d failed" % (len(r64), failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
