#!/usr/bin/python3
"""`train` as a user runs it, a whole process, against the same loop in PyTorch.

bench_train.py times the step inside one process; this driver times what a user waits for:
`build/examples/train` from its first instruction to its exit, data loading, model set-up,
progress bar, loss read-back and the thread governor included. It runs each program twice, for a
short and a long number of steps, and takes

    per-step time = (wall(long) - wall(short)) / (long - short)

so that start-up, loading the files and the end-of-run evaluation, the same in both runs, cancel.
The runs are interleaved (ddplab short, ddplab long, torch short, ...) for `--rounds` rounds; the
table gives medians and the ratio of ddplab to the FASTER PyTorch, per round and overall.

    /usr/bin/python3 bench/bench_train_process.py [--build build] [--rounds 3] [--steps 5,25]
        [--threads-list 2] [--load 0] [--batch 128] [--ddp] [--data-dir DIR]
        [--variants ddplab,torch,torch2]

Single process: `train --model resnet20 --dataset cifar10 --batch-size B --no-augment
--threads T --device cpu --max-steps N` (its defaults otherwise: two loader threads, SGD with
momentum, the progress bar). PyTorch runs this file with --torch-only: the same files read into
one normalized tensor, resnet20 from tests/torch_models.py, SGD (momentum 0.9, weight decay 5e-4),
a new shuffle per epoch, cross_entropy, backward, step, zero_grad, the loss read back every step,
then the same evaluation on --test-subset images; glibc keeps freed memory (machine.py's
TUNED_MALLOC: without it PyTorch faults fresh pages in every step).

--ddp: 2 ranks, --batch B each, 1 thread each, and runs of 5 and 65 steps by default (torchrun's
start-up and rendezvous vary by a second or more from run to run). ddplab through
`BUILD/tools/ddprun --standalone --nproc-per-node 2 train ...` (Gloo); PyPI's PyTorch through its
`torchrun --standalone --nproc_per_node 2`, DistributedDataParallel over a gloo group, each rank
its sampler's share; Debian's PyTorch 1.13, whose torchrun fails on Python 3.11, through this file
starting the two ranks itself with the environment torchrun sets (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT).

No CIFAR-10 is needed: without --data-dir the driver writes CIFAR-10-format files of random
images (--records per file; train reads them with --any-record-count). Every program gets the
same environment: this one, OMP_NUM_THREADS = the thread count and GOMP_SPINCOUNT=1000 (unless
the environment chooses the wait policy). See bench/README.md.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

from machine import (SYSTEM_PYTHON, TUNED_MALLOC, CompetingLoad, cpu_info, free_port,
                     load_average, omp_wait_default, venv_python)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
from dataset_files import CIFAR_STATS, write_cifar  # noqa: E402


# --- the data: CIFAR-10's binary format, random images (tests/dataset_files.py) -----------------

def read_cifar(root, train):
    import numpy as np
    import torch
    d = os.path.join(root, "cifar-10-batches-bin")
    names = [f"data_batch_{k}.bin" for k in range(1, 6)] if train else ["test_batch.bin"]
    raw = np.concatenate([np.fromfile(os.path.join(d, n), dtype=np.uint8).reshape(-1, 3073)
                          for n in names])
    x = torch.from_numpy(raw[:, 1:].reshape(-1, 3, 32, 32).astype(np.float32) / 255.0)
    mean, std = (torch.tensor(v).view(1, 3, 1, 1) for v in CIFAR_STATS)
    x = (x - mean) / std
    return x.contiguous(), torch.from_numpy(raw[:, 0].astype(np.int64))


# --- PyTorch: the same loop --------------------------------------------------------------------

def torch_train(args):
    import torch
    import torch.nn.functional as F
    import torch_models

    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    x, y = read_cifar(args.data_dir, True)
    xt, yt = read_cifar(args.data_dir, False)
    model, _ = torch_models.build_model("resnet20")
    model.train()
    net = model
    if args.ddp:
        import torch.distributed as dist
        dist.init_process_group("gloo", rank=rank, world_size=world)
        net = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    step, epoch = 0, 0
    while step < args.steps:
        g = torch.Generator().manual_seed(epoch)
        order = torch.randperm(len(x), generator=g)[rank::world]  # DistributedSampler's share
        for i in range(0, len(order) - args.batch + 1, args.batch):
            idx = order[i:i + args.batch]
            loss = F.cross_entropy(net(x[idx]), y[idx])
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            loss.item()  # train reads the loss back every step for its progress line
            step += 1
            if step == args.steps:
                break
        epoch += 1
    model.eval()
    with torch.no_grad():
        correct = (model(xt[:args.test_subset]).argmax(1) == yt[:args.test_subset]).sum()
    if args.ddp:
        torch.distributed.barrier()
    if rank == 0:
        print(f"torch {torch.__version__}: {step} steps, test correct {int(correct)}")


# --- the driver --------------------------------------------------------------------------------

def command(variant, args, threads, steps):
    """The argv lists of the processes to start together for one run (ddplab: one; PyTorch: one,
    or two ranks without torchrun)."""
    batch = args.batch
    if variant == "ddplab":
        train = os.path.join(args.build, "examples", "train")
        argv = [train, "--model", "resnet20", "--dataset", "cifar10", "--data-dir", args.data_dir,
                "--any-record-count", "--batch-size", str(batch), "--no-augment", "--threads",
                str(threads), "--device", "cpu", "--max-steps", str(steps), "--epochs", "1000",
                "--test-subset", str(args.test_subset)]
        if args.ddp:
            argv = [os.path.join(args.build, "tools", "ddprun"), "--standalone", "--nproc-per-node",
                    "2"] + argv
        return [argv]
    python = SYSTEM_PYTHON if variant == "torch" else venv_python()
    me = [os.path.abspath(__file__), "--torch-only", "--data-dir", args.data_dir, "--batch",
          str(batch), "--threads", str(threads), "--steps", str(steps), "--test-subset",
          str(args.test_subset)]
    if not args.ddp:
        return [[python] + me]
    me.append("--ddp")
    if variant == "torch2":
        torchrun = os.path.join(os.path.dirname(python), "torchrun")
        return [[torchrun, "--standalone", "--nproc_per_node", "2"] + me]
    port = str(free_port())  # Debian's torchrun fails on Python 3.11: start the ranks here
    return [[python] + me + [f"--env-rank={r}", f"--env-port={port}"] for r in range(2)]


def wall(variant, args, threads, steps, env):
    cmds = command(variant, args, threads, steps)
    full = env if variant == "ddplab" else dict(env, **TUNED_MALLOC)
    t0 = time.perf_counter()
    procs = [subprocess.Popen(c, env=full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for c in cmds]
    outs = [p.communicate()[0] for p in procs]
    t = time.perf_counter() - t0
    for p, out, c in zip(procs, outs, cmds):
        if p.returncode != 0:
            raise SystemExit(f"{variant} failed (exit {p.returncode}): {' '.join(c)}\n"
                             f"{out[-3000:]}")
    return t


def driver(args):
    variants = args.variants.split(",")
    if "torch2" in variants and venv_python() is None:
        print("no PyPI PyTorch venv (scripts/pyvenv): torch2 left out")
        variants.remove("torch2")
    pair = args.steps_pair or ("5,65" if args.ddp else "5,25")
    short, long_ = (int(s) for s in pair.split(","))
    if long_ <= short:
        raise SystemExit("--steps SHORT,LONG needs LONG > SHORT")
    tmp = None
    if not args.data_dir:
        tmp = tempfile.TemporaryDirectory(prefix="ddplab-bench-cifar-")
        import numpy as np
        write_cifar(tmp.name, np.random.default_rng(0), args.records)
        args.data_dir = tmp.name
    base = dict(os.environ)
    base.update(omp_wait_default(base))
    print(cpu_info())
    mode = "DDP 2 ranks x batch %d, 1 thread each" % args.batch if args.ddp else \
        "one process, batch %d" % args.batch
    print(f"resnet20, {mode}; per step = (wall({long_} steps) - wall({short} steps)) / "
          f"{long_ - short}; {args.rounds} rounds; load average {load_average()}")
    threads_list = [1] if args.ddp else [int(t) for t in args.threads_list.split(",")]
    for load in (int(n) for n in args.load.split(",")):
        for threads in threads_list:
            env = dict(base, OMP_NUM_THREADS=str(threads))
            per = {v: [] for v in variants}
            with CompetingLoad(load):
                for _ in range(args.rounds):
                    for v in variants:
                        a = wall(v, args, threads, short, env)
                        b = wall(v, args, threads, long_, env)
                        per[v].append((b - a) / (long_ - short) * 1e3)
            torch_vs = [v for v in variants if v != "ddplab"]
            head = f"load {load}, {threads} thread(s):"
            cells = ", ".join(f"{v} {statistics.median(per[v]):.1f} ms "
                              f"({' '.join('%.0f' % t for t in per[v])})" for v in variants)
            print(f"{head} {cells}")
            if "ddplab" in variants and torch_vs:
                fast = min(torch_vs, key=lambda v: statistics.median(per[v]))
                rounds = [per["ddplab"][r] / min(per[v][r] for v in torch_vs)
                          for r in range(args.rounds)]
                ratio = statistics.median(per["ddplab"]) / statistics.median(per[fast])
                print(f"  ratio ddplab / faster PyTorch ({fast}): {ratio:.2f} "
                      f"(per round {' '.join('%.2f' % r for r in rounds)})")
    if tmp:
        tmp.cleanup()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", dest="steps_pair", default=None, metavar="SHORT,LONG",
                    help="run lengths (default 5,25; with --ddp 5,65: torchrun's start-up varies "
                         "by a second or more)")
    ap.add_argument("--threads-list", default="2")
    ap.add_argument("--load", default="0", metavar="N[,N...]",
                    help="spinning processes beside each measurement (bench_train.py's --load)")
    ap.add_argument("--batch", type=int, default=128, help="per process (per rank with --ddp)")
    ap.add_argument("--ddp", action="store_true")
    ap.add_argument("--data-dir", default="", help="CIFAR-10 binary files (default: random)")
    ap.add_argument("--records", type=int, default=2000, help="records per random file")
    ap.add_argument("--test-subset", type=int, default=256)
    ap.add_argument("--variants", default="ddplab,torch,torch2")
    # --torch-only: one PyTorch run, started by the driver.
    ap.add_argument("--torch-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--env-rank", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--env-port", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.torch_only:
        args.steps = int(args.steps_pair)  # the driver passes one length
        if args.env_rank is not None:
            os.environ.update(RANK=args.env_rank, LOCAL_RANK=args.env_rank, WORLD_SIZE="2",
                              MASTER_ADDR="127.0.0.1", MASTER_PORT=args.env_port)
        torch_train(args)
    else:
        driver(args)


if __name__ == "__main__":
    main()
