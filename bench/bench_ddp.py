"""ddplab DDP vs PyTorch DDP (gloo) on this machine's CPUs.

Runs the same measurements with ddplab and with each PyTorch it finds, and prints them side by
side with the ratio of ddplab to the FASTER PyTorch:
  1. resnet20 training step, one process, batch 64, 1 thread;
  2. "local": 2 ranks in lock step (a barrier between steps), batch 32 each, 1 thread each, every
     rank training its own replica without communicating: the floor for 3 (same work, every
     core busy, the same wait for the slowest rank);
  3. the same with DDP (same global batch as 1);
  4. (ddplab only) the same with the naive after-backward all-reduce loop, and with every
     BatchNorm2d converted to SyncBatchNorm (PyTorch's SyncBatchNorm runs on CUDA only);
  5. all-reduce of 1M and 16M float32 through the Gloo group, 2 ranks.
For 2 and 3 it also gives the CPU time per step of the main thread and of all other threads
(process groups' helpers): steadier than wall time on a shared machine.

    python3 bench/bench_ddp.py [--build build] [--steps 8] [--rounds R] [--env KEY=VALUE ...]

--rounds R repeats 2 and 3 R times, ddplab and PyTorch interleaved, and prints medians, ranges
and the ratio ddplab / faster PyTorch of each round (1, 4 and 5 run in the first round only).
ddplab runs through its own launcher (BUILD/tools/ddprun + BUILD/bench/bench_ddp). PyTorch runs
in a child process of its own interpreter (this script with --torch-only, which prints one JSON
line): Debian's 1.13 with /usr/bin/python3 and a current one from PyPI with the venv's python
(scripts/pyvenv, $DDPLAB_VENV); a missing one is left out. Both frameworks get the same
environment: this one plus every --env. See bench/README.md.
"""
import argparse
import json
import os
import subprocess
import sys
import time

from machine import (SYSTEM_PYTHON, cpu_info, free_port, load_average, omp_wait_default,
                     venv_python)


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
    """Median seconds per step, and the medians of the main thread's and the other threads' CPU
    seconds per step. With a barrier (ranks in lock step) a step runs from one barrier to the
    next, as in bench_ddp.cpp."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(1 + rank)
    x = torch.randn(batch, 3, 32, 32)
    y = torch.randint(0, 10, (batch,))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    times, main_cpu, other_cpu = [], [], []
    if barrier:
        barrier()
    for s in range(2 + steps):
        t, main0, process0 = time.perf_counter(), time.thread_time(), time.process_time()
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        if barrier:
            barrier()
        if s >= 2:
            times.append(time.perf_counter() - t)
            main_cpu.append(time.thread_time() - main0)
            other_cpu.append(time.process_time() - process0 - main_cpu[-1])
    return median(times), median(main_cpu), median(other_cpu)


def median(values):
    return sorted(values)[len(values) // 2]


def torch_worker(rank, world, port, steps, allreduce, queue):
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                            world_size=world)
    result = {}
    # "local": every rank its own replica, no communication but the barrier (the floor of ddp).
    for mode in ("local", "ddp"):
        torch.manual_seed(0)
        model = resnet20()
        if mode == "ddp":
            model = nn.parallel.DistributedDataParallel(model)
        step, main_cpu, other_cpu = torch_steps(model, 32, steps, rank, barrier=dist.barrier)
        result.update({mode + "_step_ms": 1e3 * step, mode + "_images_per_sec": 32 * world / step,
                       mode + "_cpu_main_thread_ms": 1e3 * main_cpu,
                       mode + "_cpu_other_threads_ms": 1e3 * other_cpu})
    if not allreduce:
        dist.barrier()
        if rank == 0:
            queue.put(result)
        dist.destroy_process_group()
        return
    def seconds_per_all_reduce(n, reps):  # one warm-up, a barrier, then reps back to back
        t = torch.ones(n)
        dist.all_reduce(t)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(reps):
            dist.all_reduce(t)
        return (time.perf_counter() - start) / reps

    # One small collective: what each of a SyncBatchNorm layer's costs at least.
    result["allreduce_1KiB_us"] = 1e6 * seconds_per_all_reduce(256, 1000)
    for n in (1 << 20, 16 << 20):
        per = seconds_per_all_reduce(n, 20 if n == 1 << 20 else 5)
        result["allreduce_%dM_ms" % (n >> 20)] = 1e3 * per
        result["allreduce_%dM_busbw_GBps" % (n >> 20)] = 2 * (world - 1) / world * n * 4 / per / 1e9
    dist.barrier()
    if rank == 0:
        queue.put(result)
    dist.destroy_process_group()


def run_torch(steps, full):
    """full: also the single-process step and the all-reduces; else only local and ddp."""
    import torch
    import torch.multiprocessing as mp

    torch.set_num_threads(1)
    torch.manual_seed(0)
    result = {}
    if full:
        single = torch_steps(resnet20(), 64, steps)[0]
        result = {"single_step_ms": 1e3 * single, "single_images_per_sec": 64 / single}
    port = free_port()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=torch_worker, args=(r, 2, port, steps, full, queue))
             for r in range(2)]
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


def run_torch_in(python, steps, env, full):
    """This script's PyTorch part under `python`; None when that PyTorch is missing or fails."""
    cmd = [python, os.path.abspath(__file__), "--torch-only", "--steps", str(steps)]
    if not full:
        cmd.append("--lockstep-only")
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
    ap.add_argument("--rounds", type=int, default=1,
                    help="repeat the 2-rank steps (local and ddp, ddplab and PyTorch "
                         "interleaved) this often; medians and ranges over the rounds")
    ap.add_argument("--torch-only", action="store_true",
                    help="(internal) run the PyTorch part with this interpreter, print JSON")
    ap.add_argument("--lockstep-only", action="store_true",
                    help="(internal, with --torch-only) only the 2-rank local and ddp steps")
    args = ap.parse_args()
    if args.torch_only:
        print(json.dumps(run_torch(args.steps, full=not args.lockstep_only)))
        return

    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.update(kv.split("=", 1) for kv in args.env)
    # ddprun would give its workers this wait policy anyway; PyTorch's get the same.
    env.update(omp_wait_default(env))
    print(cpu_info())
    chosen = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
    print("load average at start: %s; env for both: %s" % (
        load_average(), " ".join(args.env + ["%s=%s" % (k, env[k]) for k in chosen if k in env])))
    rounds = {"ddplab": []}  # label -> one dict of results per round
    ddp = {}
    for r in range(max(args.rounds, 1)):
        full = r == 0  # the one-off measurements run in the first round only
        ours = {}
        modes = ["single", "local", "ddp", "naive", "syncbn", "allreduce"] if full else [
            "local", "ddp"]
        for mode in modes:
            out = run_ddplab(args.build, mode, args.steps, env, nproc=1 if mode == "single" else 2)
            ours.update({k: v[0] for k, v in out.items() if len(v) == 1})
            if mode == "ddp" and full:
                ddp = out
        rounds["ddplab"].append(ours)
        for label, python in torch_pythons():
            theirs = run_torch_in(python, args.steps, env, full)
            if theirs is not None:
                rounds.setdefault(label, []).append(theirs)
        print("round %d done, load average %s" % (r + 1, load_average()), flush=True)
    labels = [label for label in rounds if label != "ddplab"]
    if not labels:
        sys.exit("bench_ddp.py: no PyTorch ran (Debian's python3-torch, or scripts/pyvenv)")
    print("versions: " + ", ".join("%s %s" % (l, rounds[l][0]["version"]) for l in labels))

    def med(label, key):
        return median([r[key] for r in rounds[label] if key in r])

    def spread(label, key):
        values = [r[key] for r in rounds[label] if key in r]
        return "" if len(values) < 2 else "%.0f-%.0f" % (min(values), max(values))

    print(("%-36s %12s" + " %12s" * len(labels) + " %14s") %
          (("measurement (medians)", "ddplab") + tuple(labels) + ("ddplab/faster",)))
    rows = [("single_step_ms", "lower"), ("local_step_ms", "lower"), ("ddp_step_ms", "lower"),
            ("local_cpu_main_thread_ms", "lower"), ("ddp_cpu_main_thread_ms", "lower"),
            ("local_cpu_other_threads_ms", "lower"), ("ddp_cpu_other_threads_ms", "lower"),
            ("allreduce_1KiB_us", "lower"), ("allreduce_1M_ms", "lower"),
            ("allreduce_16M_ms", "lower"),
            ("allreduce_1M_busbw_GBps", "higher"), ("allreduce_16M_busbw_GBps", "higher")]
    for key, better in rows:
        a = med("ddplab", key)
        values = [med(l, key) for l in labels]
        best = min(values) if better == "lower" else max(values)
        print(("%-36s %12.2f" + " %12.2f" * len(labels) + " %14.2f   (%s is better)") %
              ((key, a) + tuple(values) + (a / best, better)))
    if args.rounds > 1:
        for key in ("local_step_ms", "ddp_step_ms"):
            print(("%-36s %12s" + " %12s" * len(labels)) %
                  ((key + " range",) + tuple(spread(l, key) for l in ["ddplab"] + labels)))
        # Same-round ratios, steadier than the ratio of medians when the load drifts.
        per_round = [r["ddp_step_ms"] / min(rounds[l][i]["ddp_step_ms"] for l in labels)
                     for i, r in enumerate(rounds["ddplab"])
                     if all(len(rounds[l]) > i for l in labels)]
        print("ddplab / faster PyTorch, ddp step, per round: %s (median %.2f)" % (
            " ".join("%.2f" % x for x in per_round), median(per_round)))
    ours = rounds["ddplab"][0]
    print("%-36s %12.2f" % ("naive_step_ms (no buckets/overlap)", ours["naive_step_ms"]))
    print("%-36s %12.2f" % ("syncbn_step_ms (DDP + SyncBatchNorm)", ours["syncbn_step_ms"]))
    print("%-36s %12.2f" % ("ddp_exposed_comm_ms (after backward)", med("ddplab",
                                                                        "ddp_exposed_comm_ms")))
    print("%-36s %12d" % ("ddp_buckets", ours["ddp_buckets"]))
    for name in ["ddplab"] + labels:
        print("%s: DDP step / the same 2 ranks without communication (local): %.2fx; "
              "DDP speed-up over one process at batch 64: %.2fx" % (
                  name, median([r["ddp_step_ms"] / r["local_step_ms"] for r in rounds[name]]),
                  med(name, "single_step_ms") / med(name, "ddp_step_ms")))
    print("ddplab DDP step vs naive loop: %.2fx" % (ours["naive_step_ms"] / ours["ddp_step_ms"]))
    print("ddplab SyncBatchNorm cost: DDP step with SyncBatchNorm / with BatchNorm2d = %.2fx"
          % (ours["syncbn_step_ms"] / ours["ddp_step_ms"]))
    print("ddplab bucket timeline of the first round's last step (ms since backward reached the "
          "output):")
    buckets = [k for k in ddp if k.endswith("ready_launched_finished_ms")]
    for key in sorted(buckets, key=lambda k: int(k.split("_")[1][len("bucket"):])):
        print("  %s ready %.1f launched %.1f finished %.1f" % ((key.split("_")[1],) + tuple(ddp[key])))


if __name__ == "__main__":
    main()
