"""ddplab DDP vs PyTorch DDP (gloo) on this machine's CPUs.

Runs the same four measurements with ddplab and with each PyTorch it finds, and prints them side
by side with the ratio of ddplab to the FASTER PyTorch:
  1. resnet20 training step, one process, batch 64, 1 thread;
  2. the same with DDP on 2 ranks, batch 32 each, 1 thread each (same global batch);
  3. (ddplab only) the same with the naive after-backward all-reduce loop, and with every
     BatchNorm2d converted to SyncBatchNorm (PyTorch's SyncBatchNorm runs on CUDA only);
  4. all-reduce of 1M and 16M float32 through the Gloo group, 2 ranks.

    python3 bench/bench_ddp.py [--build build] [--steps 8] [--env KEY=VALUE ...]

ddplab runs through its own launcher (BUILD/tools/ddprun + BUILD/bench/bench_ddp). PyTorch runs
in a child process of its own interpreter (this script with --torch-only, which prints one JSON
line): Debian's 1.13 with /usr/bin/python3 and a current one from PyPI with the venv's python
(scripts/pyvenv, $DDPLAB_VENV); a missing one is left out. Both frameworks get the same
environment: this one plus every --env. See bench/README.md.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import time

from machine import SYSTEM_PYTHON, cpu_info, load_average, omp_wait_default, venv_python


# --- ddplab ---------------------------------------------------------------------------------------

def run_ddplab(build, mode, steps, env, nproc=1):
    exe = os.path.join(build, "bench", "bench_ddp")
    cmd = [exe, mode, "--steps", str(steps)]
    if nproc > 1:
        cmd = [os.path.join(build, "tools", "ddprun"), "--standalone", "--nproc-per-node",
               str(nproc)] + cmd
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        sys.exit("ddplab %s failed:\n%s\n%s" % (mode, out.stdout, out.stderr))
    result = {}
    for line in out.stdout.splitlines():
        i = line.find("BENCH ")
        if i >= 0:
            parts = line[i + 6:].split()
            result[parts[0]] = [float(v) for v in parts[1:]]
    return result


# --- PyTorch --------------------------------------------------------------------------------------

# Imported inside the functions: the driver runs without PyTorch, and each PyTorch in its own
# interpreter.


def resnet20():
    # The PyTorch twin of ddplab's resnet20, shared with the parity tests.
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    import torch_models

    return torch_models.CifarResNet(20)


def torch_steps(model, batch, steps, rank=0, barrier=None):
    import torch
    import torch.nn.functional as F

    torch.manual_seed(1 + rank)
    x = torch.randn(batch, 3, 32, 32)
    y = torch.randint(0, 10, (batch,))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    times = []
    for s in range(2 + steps):
        if barrier:
            barrier()
        t = time.perf_counter()
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        if s >= 2:
            times.append(time.perf_counter() - t)
    times.sort()
    return times[len(times) // 2]


def torch_worker(rank, world, port, steps, queue):
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                            world_size=world)
    torch.manual_seed(0)
    ddp = nn.parallel.DistributedDataParallel(resnet20())
    step = torch_steps(ddp, 32, steps, rank, barrier=dist.barrier)
    result = {"ddp_step_ms": 1e3 * step, "ddp_images_per_sec": 32 * world / step}
    for n in (1 << 20, 16 << 20):
        t = torch.ones(n)
        reps = 20 if n == 1 << 20 else 5
        dist.all_reduce(t)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(reps):
            dist.all_reduce(t)
        per = (time.perf_counter() - start) / reps
        result["allreduce_%dM_ms" % (n >> 20)] = 1e3 * per
        result["allreduce_%dM_busbw_GBps" % (n >> 20)] = 2 * (world - 1) / world * n * 4 / per / 1e9
    dist.barrier()
    if rank == 0:
        queue.put(result)
    dist.destroy_process_group()


def run_torch(steps):
    import torch
    import torch.multiprocessing as mp

    torch.set_num_threads(1)
    torch.manual_seed(0)
    single = torch_steps(resnet20(), 64, steps)
    result = {"single_step_ms": 1e3 * single, "single_images_per_sec": 64 / single}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=torch_worker, args=(r, 2, port, steps, queue)) for r in range(2)]
    for p in procs:
        p.start()
    result.update(queue.get(timeout=600))
    for p in procs:
        p.join()
    result["version"] = torch.__version__
    return result


# --- report ---------------------------------------------------------------------------------------


def torch_pythons():
    """(label, interpreter) of each PyTorch on this machine: Debian's, then the venv's."""
    found = []
    if os.access(SYSTEM_PYTHON, os.X_OK):
        found.append(("torch", SYSTEM_PYTHON))
    if venv_python():
        found.append(("torch2", venv_python()))
    return found


def run_torch_in(python, steps, env):
    """This script's PyTorch part under `python`; None when that PyTorch is missing or fails."""
    cmd = [python, os.path.abspath(__file__), "--torch-only", "--steps", str(steps)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
    if out.returncode != 0 or not lines:
        print("%s: PyTorch part failed, left out:\n%s" % (python, out.stderr[-2000:]),
              file=sys.stderr)
        return None
    return json.loads(lines[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                    help="set for ddplab and PyTorch alike (repeatable)")
    ap.add_argument("--torch-only", action="store_true",
                    help="(internal) run the PyTorch part with this interpreter, print JSON")
    args = ap.parse_args()
    if args.torch_only:
        print(json.dumps(run_torch(args.steps)))
        return

    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.update(kv.split("=", 1) for kv in args.env)
    # ddprun would give its workers this wait policy anyway; PyTorch's get the same.
    env.update(omp_wait_default(env))
    print(cpu_info())
    chosen = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
    print("load average at start: %s; env for both: %s" % (
        load_average(), " ".join(args.env + ["%s=%s" % (k, env[k]) for k in chosen if k in env])))
    ours = {}
    ours.update({k: v[0] for k, v in run_ddplab(args.build, "single", args.steps, env).items()})
    ddp = run_ddplab(args.build, "ddp", args.steps, env, nproc=2)
    ours.update({k: v[0] for k, v in ddp.items() if len(v) == 1})
    for mode in ("naive", "syncbn", "allreduce"):
        ours.update({k: v[0] for k, v in run_ddplab(args.build, mode, args.steps, env,
                                                     nproc=2).items()})
    theirs = {}  # label -> results
    for label, python in torch_pythons():
        r = run_torch_in(python, args.steps, env)
        if r is not None:
            theirs[label] = r
    if not theirs:
        sys.exit("bench_ddp.py: no PyTorch ran (Debian's python3-torch, or scripts/pyvenv)")
    print("load average at end: %s" % load_average())
    print("versions: " + ", ".join("%s %s" % (k, r["version"]) for k, r in theirs.items()))

    labels = list(theirs)
    print(("%-36s %12s" + " %12s" * len(labels) + " %14s") %
          (("measurement", "ddplab") + tuple(labels) + ("ddplab/faster",)))
    rows = [("single_step_ms", "lower"), ("ddp_step_ms", "lower"),
            ("allreduce_1M_ms", "lower"), ("allreduce_16M_ms", "lower"),
            ("allreduce_1M_busbw_GBps", "higher"), ("allreduce_16M_busbw_GBps", "higher")]
    for key, better in rows:
        a = ours[key]
        values = [theirs[l][key] for l in labels]
        best = min(values) if better == "lower" else max(values)
        print(("%-36s %12.2f" + " %12.2f" * len(labels) + " %14.2f   (%s is better)") %
              ((key, a) + tuple(values) + (a / best, better)))
    print("%-36s %12.2f" % ("naive_step_ms (no buckets/overlap)", ours["naive_step_ms"]))
    print("%-36s %12.2f" % ("syncbn_step_ms (DDP + SyncBatchNorm)", ours["syncbn_step_ms"]))
    print("%-36s %12.2f" % ("ddp_exposed_comm_ms (after backward)", ours["ddp_exposed_comm_ms"]))
    print("%-36s %12d" % ("ddp_buckets", ours["ddp_buckets"]))
    for name, r in [("ddplab", ours)] + list(theirs.items()):
        print("%s: DDP speed-up over one process (2 ranks, same global batch): %.2fx"
              % (name, r["single_step_ms"] / r["ddp_step_ms"]))
    print("ddplab DDP step vs naive loop: %.2fx" % (ours["naive_step_ms"] / ours["ddp_step_ms"]))
    print("ddplab SyncBatchNorm cost: DDP step with SyncBatchNorm / with BatchNorm2d = %.2fx"
          % (ours["syncbn_step_ms"] / ours["ddp_step_ms"]))
    print("ddplab bucket timeline of the last step (ms since backward reached the output):")
    buckets = [k for k in ddp if k.endswith("ready_launched_finished_ms")]
    for key in sorted(buckets, key=lambda k: int(k.split("_")[1][len("bucket"):])):
        print("  %s ready %.1f launched %.1f finished %.1f" % ((key.split("_")[1],) + tuple(ddp[key])))


if __name__ == "__main__":
    main()
