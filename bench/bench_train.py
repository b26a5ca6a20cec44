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
        [--rounds 3] [--threads-list 1,2] [--models resnet20,cnn] [--batch 128]
        [--variants ddplab,torch+malloc,torch2+malloc] [--load 0,2]
        [--env-set default --env-set passive:OMP_WAIT_POLICY=passive]

runs the programs interleaved (ddplab, torch, torch2, torch2, torch, ddplab, ...: the order
reverses every round, so that a drift of the shared machine hits all alike), each in a fresh
process, `--rounds` times per cell (model, thread count, load, env set), and prints a table of
medians with the ratio of each ddplab variant to the FASTER PyTorch of the same precision.
"torch" is Debian's PyTorch 1.13 (/usr/bin/python3), "torch2" a current one from PyPI, run with
the venv's python that scripts/pyvenv makes ($DDPLAB_VENV, default ~/.cache/ddplab/venv).
A "+bf16" suffix runs with --amp bf16. "@DIR" after a ddplab variant runs the bench_train of
the build folder DIR instead of --bin: `--variants ddplab@build-a,ddplab@build-b` puts two builds
side by side (say, two oneDNN versions), and the driver then also prints each build's step time
over the first's. "+malloc" runs with glibc told to keep freed memory
(MALLOC_MMAP_MAX_=0, a large MALLOC_TRIM_THRESHOLD_ and MALLOC_TOP_PAD_): without it glibc hands
large freed blocks back to the OS and PyTorch faults fresh pages in every step
(/work/shared/toolchain.md), which ddplab's caching allocator avoids by design.

Every variant gets the same environment: this one, OMP_NUM_THREADS = the thread count, every
`--env KEY=VALUE`, and the cell's env set. `--load N` starts N spinning processes for each
measurement and stops them after it (a list, 0,2, measures quiet and loaded in the same run);
with several loads or env sets the driver also prints each program's step-time ratio between
them: an A/B of the same binary, taken in one interleaved run. The output starts with the CPU
(lscpu model name and its AVX2 / AVX-512 / AVX512-BF16 / AMX flags).
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

from machine import (TUNED_MALLOC, CompetingLoad, cpu_info, load_average, omp_wait_default,
                     torch_python, venv_python)


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
    print(f"RESULT impl={impl} version={torch.__version__} model={args.model} "
          f"device={args.device} batch={args.batch} threads={args.threads} precision={precision} "
          f"step_ms={med[0]:.3f} fwd_ms={med[1]:.3f} bwd_ms={med[2]:.3f} opt_ms={med[3]:.3f} "
          f"ips={ips:.1f} omp_wait_policy={os.environ.get('OMP_WAIT_POLICY') or '-'} "
          f"gomp_spincount={os.environ.get('GOMP_SPINCOUNT') or '-'}")
    if args.profile:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(args.steps):
                step(None)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))


# --- driver ----------------------------------------------------------------------------------

PROGRAMS = ("ddplab", "torch", "torch2")  # torch: Debian's 1.13; torch2: PyPI's, in the venv
MODIFIERS = ("malloc", "bf16")


def parse_variant(name):
    """"torch2+malloc+bf16" -> ("torch2", {"malloc", "bf16"}), checked. A ddplab variant may name
    its build folder after "@" (variant_build)."""
    program, *mods = name.partition("@")[0].split("+")
    if program not in PROGRAMS or any(m not in MODIFIERS for m in mods):
        raise SystemExit(f"bench_train.py: unknown variant '{name}': a program of "
                         f"{'/'.join(PROGRAMS)} with optional +malloc and +bf16 (ddplab also "
                         f"@BUILD_DIR)")
    if "@" in name and program != "ddplab":
        raise SystemExit(f"bench_train.py: variant '{name}': only ddplab takes @BUILD_DIR")
    return program, set(mods)


def variant_build(name):
    """"ddplab+bf16@build-dnnl3" -> "build-dnnl3"; "" where the variant names no build."""
    return name.partition("@")[2]


def parse_env_set(spec):
    """"passive:OMP_WAIT_POLICY=passive,GOMP_SPINCOUNT=0" -> ("passive", {...}); "default" ->
    ("default", {}): the environment as it is."""
    name, _, assignments = spec.partition(":")
    env = {}
    for kv in filter(None, assignments.split(",")):
        key, eq, value = kv.partition("=")
        if not eq or not key:
            raise SystemExit(f"bench_train.py: --env-set '{spec}': expected NAME[:KEY=VALUE,...]")
        env[key] = value
    return name, env


def parse_result(out):
    for line in out.splitlines():
        if line.startswith("RESULT "):
            return {k: v for k, v in (kv.split("=", 1) for kv in line.split()[1:])}
    return None


def run_one(variant, args, model, threads, env_set):
    """One fresh process of `variant`; returns its RESULT line as a dict."""
    program, mods = parse_variant(variant)
    common = ["--model", model, "--batch", str(args.batch), "--threads", str(threads),
              "--warmup", str(args.warmup), "--steps", str(args.steps)]
    if "bf16" in mods:
        common += ["--amp", "bf16"]
    if program == "ddplab":
        build = variant_build(variant)
        cmd = [os.path.join(build, "bench", "bench_train") if build else args.bin] + common
    else:
        cmd = [torch_python(program), os.path.abspath(__file__)] + common
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(threads)
    env.update(kv.split("=", 1) for kv in args.env)
    env.update(env_set)
    if "malloc" in mods:
        env.update(TUNED_MALLOC)
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    r = parse_result(p.stdout)
    if p.returncode != 0 or r is None:
        raise SystemExit(f"{variant} failed ({' '.join(cmd)}):\n{p.stdout}\n{p.stderr}")
    return r


def faster_torch(variant, variants, meds):
    """The fastest PyTorch variant of the same precision as `variant`, or None."""
    bf16 = "bf16" in parse_variant(variant)[1]
    refs = [v for v in variants
            if parse_variant(v)[0] != "ddplab" and ("bf16" in parse_variant(v)[1]) == bf16]
    return min(refs, key=lambda v: meds[v][0]) if refs else None


def driver(args):
    variants = args.variants.split(",")
    for v in variants:
        parse_variant(v)
    # Without --env-set: the wait policy ddprun gives its workers, for every program alike.
    env_sets = [parse_env_set(s) for s in args.env_set] or [
        ("", omp_wait_default({**os.environ, **dict(kv.split("=", 1) for kv in args.env)}))]
    try:
        loads = [int(n) for n in args.load.split(",")]
    except ValueError:
        raise SystemExit(f"bench_train.py: --load '{args.load}': expected counts such as 2 or 0,2")
    if any(n < 0 for n in loads):
        raise SystemExit(f"bench_train.py: --load '{args.load}': counts cannot be negative")
    models = args.models.split(",")
    thread_counts = [int(s) for s in args.threads_list.split(",")]
    # Every cell of the table: (model, threads, load, env set name).
    cells = [(m, t, n, e) for m in models for t in thread_counts for n in loads
             for e, _ in env_sets]
    print(cpu_info())
    print(f"load average at start: {load_average()}")
    res = {}  # (cell, variant) -> list of (step, fwd, bwd, opt)
    versions = {}
    started = time.time()
    for r in range(args.rounds):
        for cell in cells:
            model, threads, load, env_name = cell
            # Interleaved: every variant once per round and cell, in reverse order every other
            # round (A B, B A, ...).
            for v in (variants if r % 2 == 0 else variants[::-1]):
                with CompetingLoad(load):
                    out = run_one(v, args, model, threads, dict(env_sets)[env_name])
                versions[parse_variant(v)[0]] = out.get("version", "")
                t = tuple(float(out[k]) for k in ("step_ms", "fwd_ms", "bwd_ms", "opt_ms"))
                res.setdefault((cell, v), []).append(t)
                print(f"  round {r + 1}/{args.rounds} {model} threads={threads} load={load} "
                      f"{env_name or ''} {v}: {t[0]:.1f} ms/step", file=sys.stderr, flush=True)
    meds = {key: [statistics.median(x[i] for x in runs) for i in range(4)]
            for key, runs in res.items()}

    print(f"\nbatch {args.batch}; each cell: median over {args.rounds} processes of the "
          f"per-process median of {args.steps} steps (after {args.warmup} warm-up); load: N "
          f"competing spinning processes started by the benchmark; ran "
          f"{time.time() - started:.0f} s; load average at end {load_average()}; "
          f"{time.strftime('%Y-%m-%d %H:%M')}")
    print("versions: " + ", ".join(f"{k} {v}" for k, v in sorted(versions.items()) if v))
    for name, env in env_sets:
        settings = " ".join(f"{k}={v}" for k, v in env.items()) or "(the environment as it is)"
        print((f"env set {name}: " if name else "env of every program: ") + settings)
    ours = [v for v in variants if parse_variant(v)[0] == "ddplab"]
    head = "| model | threads | load | env | " + " | ".join(
        f"{v} ms/step (fwd/bwd/opt)" for v in variants)
    head += "".join(f" | {v} / faster torch" for v in ours) + " |"
    print(head)
    print("|" + "---|" * (4 + len(variants) + len(ours)))
    for cell in cells:
        m = {v: meds[(cell, v)] for v in variants}
        row = [f"{x[0]:.1f} ({x[1]:.0f}/{x[2]:.0f}/{x[3]:.1f})" for x in m.values()]
        for v in ours:
            ref = faster_torch(v, variants, m)
            row.append(f"{m[v][0] / m[ref][0]:.2f} ({ref})" if ref else "-")
        model, threads, load, env_name = cell
        print(f"| {model} | {threads} | {load} | {env_name or '-'} | " + " | ".join(row) + " |")

    # Builds side by side (ddplab@DIR variants of one precision): each over the first.
    builds = [v for v in ours if variant_build(v)]
    for bf16 in (False, True):
        same = [v for v in builds if ("bf16" in parse_variant(v)[1]) == bf16]
        if len(same) < 2:
            continue
        print(f"\nstep time ratio, build X / {same[0]} (same run):")
        print("| model | threads | load | env | " + " | ".join(same[1:]) + " |")
        print("|" + "---|" * (4 + len(same) - 1))
        for cell in cells:
            ratios = [f"{meds[(cell, v)][0] / meds[(cell, same[0])][0]:.2f}" for v in same[1:]]
            print(f"| {cell[0]} | {cell[1]} | {cell[2]} | {cell[3] or '-'} | "
                  + " | ".join(ratios) + " |")

    # The A/B ratios of the same program: each env set against the first, at the same load; and
    # each load against the first, in the same env set.
    for title, axis, values in (("env set", 3, [e for e, _ in env_sets]), ("load", 2, loads)):
        if len(values) < 2:
            continue
        print(f"\nstep time ratio, {title} X / {title} {values[0]} (same program, same run):")
        print("| model | threads | " + ("load" if axis == 3 else "env") + " | " + title + " | "
              + " | ".join(variants) + " |")
        print("|" + "---|" * (4 + len(variants)))
        for cell in cells:
            if cell[axis] == values[0]:
                continue
            base = cell[:axis] + (values[0],) + cell[axis + 1:]
            ratios = [f"{meds[(cell, v)][0] / meds[(base, v)][0]:.2f}" for v in variants]
            other = cell[2] if axis == 3 else (cell[3] or "-")
            print(f"| {cell[0]} | {cell[1]} | {other} | {cell[axis]} | " + " | ".join(ratios)
                  + " |")


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
    ap.add_argument("--env-set", action="append", default=[], metavar="NAME[:KEY=VALUE,...]",
                    help="(repeatable) run every variant under each set, interleaved, and print "
                         "the ratios of each set to the first; e.g. --env-set default "
                         "--env-set passive:OMP_WAIT_POLICY=passive")
    ap.add_argument("--load", default="0", metavar="N[,N...]",
                    help="competing spinning processes during each measurement; a list "
                         "(0,2) measures quiet and loaded interleaved")
    ap.add_argument("--variants", default=None,
                    help="comma-separated; programs ddplab, torch (Debian's 1.13), torch2 (PyPI's, "
                         "in $DDPLAB_VENV); suffixes +malloc, +bf16 (default: ddplab,torch+malloc,"
                         "torch2+malloc; without the venv ddplab,torch+malloc)")
    args = ap.parse_args()
    if args.variants is None:
        args.variants = "ddplab,torch+malloc" + (",torch2+malloc" if venv_python() else "")
    if args.driver:
        driver(args)
    else:
        run_torch(args)


if __name__ == "__main__":
    main()
