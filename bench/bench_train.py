#!/usr/bin/python3
"""Training-step benchmark, PyTorch side, and the driver that compares it with ddplab.

Single mode (the PyTorch counterpart of build/bench/bench_train):

    /usr/bin/python3 bench/bench_train.py --model resnet20 --batch 128 --threads 1 [--profile]

builds the same model as models/ (CIFAR ResNet-20 with 1x1-conv projection shortcuts, or the
small CNN for 28x28x1 images), SGD (lr 0.01, momentum 0.9, weight decay 5e-4), random inputs and
labels, and times warm-up + N steps of forward + cross_entropy + backward + step + zero_grad.
It prints the same `RESULT key=value ...` line as the C++ program. --amp bf16 runs the forward
and the loss under torch.autocast("cpu", dtype=torch.bfloat16), as bench_train --amp bf16 does
under ddplab's AutocastGuard.

Driver mode (what docs/benchmarks.md quotes):

    /usr/bin/python3 bench/bench_train.py --driver [--bin build-bench/bench/bench_train]
        [--rounds 3] [--threads 1,2] [--models resnet20,cnn] [--batch 128]

runs the programs interleaved (ddplab, torch, torch with tuned malloc, ddplab, torch, ...), each
in a fresh process (with the environment plus any `--env KEY=VALUE`, the same for every variant),
`--rounds` times per configuration, and prints a table of medians and the ratios ddplab time /
torch time. A variant ending in "+bf16" (ddplab+bf16, torch+bf16,
torch+malloc+bf16) runs with --amp bf16. "torch+malloc" is PyTorch with glibc told to keep freed memory
(MALLOC_MMAP_MAX_=0, a large MALLOC_TRIM_THRESHOLD_ and MALLOC_TOP_PAD_): without it glibc hands
large freed blocks back to the OS and PyTorch faults fresh pages in every step
(/work/shared/toolchain.md), which ddplab's caching allocator avoids by design.
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

TUNED_MALLOC = {
    "MALLOC_MMAP_MAX_": "0",
    "MALLOC_TRIM_THRESHOLD_": str(1 << 40),
    "MALLOC_TOP_PAD_": str(256 << 20),
}


# --- the models, layer by layer as models/resnet.cpp and models/simple.cpp ---------------------


def build_model(name):
    # The models live in tests/torch_models.py, shared with the parity tests.
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    import torch_models

    return torch_models.build_model(name)


def run_torch(args):
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model, shape = build_model(args.model)
    device = torch.device(args.device)
    model.to(device).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    x = torch.randn(args.batch, *shape).to(device)
    y = torch.randint(0, 10, (args.batch,)).to(device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # float32 means float32, as in ddplab
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cudnn.benchmark = True
    forward = torch.compile(model) if args.compile else model
    # On a GPU each timed part ends with a synchronize, as in bench_train.cpp.
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    amp = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.amp == "bf16")

    def step(times):
        t0 = time.perf_counter()
        with amp:
            loss = F.cross_entropy(forward(x), y)
        sync()
        t1 = time.perf_counter()
        loss.backward()
        sync()
        t2 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)  # ddplab's zero_grad drops the gradients too
        sync()
        t3 = time.perf_counter()
        if times is not None:
            times.append((t3 - t0, t1 - t0, t2 - t1, t3 - t2))

    for _ in range(args.warmup):
        step(None)
    times = []
    for _ in range(args.steps):
        step(times)
    med = [statistics.median(t[i] for t in times) * 1e3 for i in range(4)]
    ips = args.batch / (med[0] / 1e3)
    impl = "torch" + ("+compile" if args.compile else "") + ("+amp" if args.amp else "")
    precision = args.amp or "fp32"
    print(f"{impl} {torch.__version__} {args.model} {args.device} batch {args.batch} threads "
          f"{args.threads} {precision}: step "
          f"{med[0]:.1f} ms (median of {args.steps}; forward {med[1]:.1f}, backward {med[2]:.1f}, "
          f"optimizer {med[3]:.1f}), {ips:.0f} images/s")
    print(f"RESULT impl={impl} model={args.model} device={args.device} batch={args.batch} "
          f"threads={args.threads} precision={precision} "
          f"step_ms={med[0]:.3f} fwd_ms={med[1]:.3f} bwd_ms={med[2]:.3f} opt_ms={med[3]:.3f} "
          f"ips={ips:.1f}")
    if args.profile:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(args.steps):
                step(None)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))


# --- driver ----------------------------------------------------------------------------------


def parse_result(out):
    for line in out.splitlines():
        if line.startswith("RESULT "):
            return {k: v for k, v in (kv.split("=", 1) for kv in line.split()[1:])}
    return None


def run_one(variant, bin_path, model, batch, threads, warmup, steps, extra_env=()):
    common = ["--model", model, "--batch", str(batch), "--threads", str(threads),
              "--warmup", str(warmup), "--steps", str(steps)]
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(threads)
    env.update(kv.split("=", 1) for kv in extra_env)
    if variant.endswith("+bf16"):
        common += ["--amp", "bf16"]
        variant = variant[: -len("+bf16")]
    if variant.startswith("ddplab"):
        cmd = [bin_path] + common
    else:
        cmd = [sys.executable, os.path.abspath(__file__)] + common
    if variant.endswith("+malloc"):
        env.update(TUNED_MALLOC)
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    r = parse_result(p.stdout)
    if p.returncode != 0 or r is None:
        raise SystemExit(f"{variant} failed ({' '.join(cmd)}):\n{p.stdout}\n{p.stderr}")
    return float(r["step_ms"]), float(r["fwd_ms"]), float(r["bwd_ms"]), float(r["opt_ms"])


def driver(args):
    variants = args.variants.split(",")
    configs = [(m, t) for m in args.models.split(",") for t in [int(s) for s in args.threads_list.split(",")]]
    res = {}  # (model, threads, variant) -> list of (step, fwd, bwd, opt)
    started = time.time()
    for r in range(args.rounds):
        for model, threads in configs:
            for v in variants:  # interleaved: every variant once per round and configuration
                t = run_one(v, args.bin, model, args.batch, threads, args.warmup, args.steps,
                            args.env)
                res.setdefault((model, threads, v), []).append(t)
                print(f"  round {r + 1}/{args.rounds} {model} threads={threads} {v}: "
                      f"{t[0]:.1f} ms/step", file=sys.stderr, flush=True)
    base = variants[0]
    refs = variants[1:]
    print(f"\nbatch {args.batch}; each cell: median over {args.rounds} processes of the per-process "
          f"median of {args.steps} steps (after {args.warmup} warm-up); "
          f"ran {time.time() - started:.0f} s; {time.strftime('%Y-%m-%d %H:%M')}")
    head = "| model | threads | " + " | ".join(f"{v} ms/step (fwd/bwd/opt)" for v in variants)
    head += " | " + " | ".join(f"{base} / {v}" for v in refs) + " |"
    print(head)
    print("|" + "---|" * (2 + len(variants) + len(refs)))
    for model, threads in configs:
        meds = {}
        cells = []
        for v in variants:
            runs = res[(model, threads, v)]
            meds[v] = [statistics.median(x[i] for x in runs) for i in range(4)]
            m = meds[v]
            cells.append(f"{m[0]:.1f} ({m[1]:.0f}/{m[2]:.0f}/{m[3]:.1f})")
        ratios = [f"{meds[base][0] / meds[v][0]:.2f}" for v in refs]
        print(f"| {model} | {threads} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="resnet20")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--amp", default="", choices=["", "bf16"],
                    help="bf16: forward and loss under torch.autocast (bfloat16)")
    ap.add_argument("--profile", action="store_true", help="torch.profiler table after timing")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (scripts/gpu-check)")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    ap.add_argument("--driver", action="store_true", help="run ddplab and torch interleaved")
    ap.add_argument("--bin", default="build-bench/bench/bench_train", help="the ddplab program")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--models", default="resnet20,cnn")
    ap.add_argument("--threads-list", default="1,2")
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                    help="set for every variant (repeatable), e.g. OMP_WAIT_POLICY=passive")
    ap.add_argument("--variants", default="ddplab,torch,torch+malloc",
                    help="first is the numerator of the ratios; ddplab+malloc also exists; "
                         "a +bf16 suffix adds --amp bf16")
    args = ap.parse_args()
    if args.driver:
        driver(args)
    else:
        run_torch(args)


if __name__ == "__main__":
    main()
