"""Optimizers and LR schedules against PyTorch.

Runs optim_trace (ddplab), then feeds the same initial parameters and gradients to
torch.optim.{SGD, Adam, AdamW} and compares every step (float32: max relative error <= 1e-5 of
the parameter's scale), and steps torch.optim.lr_scheduler.{StepLR, MultiStepLR,
CosineAnnealingLR, LinearLR, OneCycleLR} to compare the lr (and OneCycle's momentum) sequence
(<= 1e-9 relative).

    python3 check_optim.py OPTIM_TRACE_EXE WORK_DIR

Prints a table and `N passed, N failed`; exits 77 (skipped) without torch.
"""
import os
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, ".."))
try:
    import st_io  # noqa: E402  (tests/st_io.py: needs numpy)
    import torch
except ImportError as e:
    # Exit status 77: meson counts the check as skipped, not passed, since nothing was compared.
    print("skipped: %s is not importable by %s (Debian: python3-torch python3-numpy)"
          % (e.name, sys.executable))
    sys.exit(77)

OPTS = {
    "sgd": lambda p: torch.optim.SGD([p], lr=0.1),
    "sgd_momentum_wd": lambda p: torch.optim.SGD([p], lr=0.1, momentum=0.9, weight_decay=5e-4),
    "sgd_dampening": lambda p: torch.optim.SGD([p], lr=0.05, momentum=0.8, dampening=0.3),
    "sgd_nesterov": lambda p: torch.optim.SGD([p], lr=0.1, momentum=0.9, weight_decay=1e-3,
                                              nesterov=True),
    "adam": lambda p: torch.optim.Adam([p]),
    "adam_wd": lambda p: torch.optim.Adam([p], lr=0.01, betas=(0.8, 0.99), eps=1e-6,
                                          weight_decay=0.1),
    "adam_amsgrad": lambda p: torch.optim.Adam([p], lr=0.01, amsgrad=True),
    "adamw": lambda p: torch.optim.AdamW([p], lr=0.01),
}
S = torch.optim.lr_scheduler
SCHEDS = {
    "step": lambda o: S.StepLR(o, 3, 0.5),
    "multistep": lambda o: S.MultiStepLR(o, [2, 5, 9], 0.1),
    "cosine": lambda o: S.CosineAnnealingLR(o, 10, 0.001),
    "linear": lambda o: S.LinearLR(o, 0.1, 1.0, 4),
    "onecycle": lambda o: S.OneCycleLR(o, 0.5, total_steps=13),
}


def rel(a, b):
    a = torch.as_tensor(a).double()
    b = torch.as_tensor(b).double()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def main():
    exe, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    path = os.path.join(work, "optim_trace.safetensors")
    subprocess.run([exe, path], check=True)
    T = st_io.read(path)
    passed = failed = 0
    print("%-18s %s" % ("optimizer", "max rel err per step"))
    for name, make in OPTS.items():
        p = torch.tensor(T[name + ".p0"], requires_grad=True)
        opt = make(p)
        errs = []
        for k in range(6):
            p.grad = torch.tensor(T["%s.g%d" % (name, k)])
            opt.step()
            errs.append(rel(T["%s.p%d" % (name, k + 1)], p.detach()))
        ok = max(errs) <= 1e-5
        passed += ok
        failed += not ok
        print("%-18s %s  %s" % (name, " ".join("%.1e" % e for e in errs), "ok" if ok else "FAIL"))
    print("%-18s %s" % ("schedule", "max rel err over 13 lrs"))
    warnings_off = __import__("warnings")
    warnings_off.filterwarnings("ignore")
    for name, make in SCHEDS.items():
        p = torch.zeros(1, requires_grad=True)
        opt = torch.optim.SGD([p], lr=0.1, momentum=0.9)
        s = make(opt)
        lrs = [opt.param_groups[0]["lr"]]
        moms = [opt.param_groups[0]["momentum"]]
        for _ in range(12):
            opt.step()
            s.step()
            lrs.append(opt.param_groups[0]["lr"])
            moms.append(opt.param_groups[0]["momentum"])
        e = rel(T["sched.%s.lr" % name], torch.tensor(lrs, dtype=torch.float64))
        if name == "onecycle":
            e = max(e, rel(T["sched.onecycle.momentum"], torch.tensor(moms, dtype=torch.float64)))
        ok = e <= 1e-9
        passed += ok
        failed += not ok
        print("%-18s %.1e  %s" % (name, e, "ok" if ok else "FAIL"))
        if not ok:
            print("   ddplab", list(T["sched.%s.lr" % name]))
            print("   torch ", lrs)
    print("%d passed, %d failed" % (passed, failed))
    sys.exit(1 if failed else 0)


main()
