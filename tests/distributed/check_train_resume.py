"""examples/train's fault tolerance end to end, on a Fashion-MNIST subset.

    check_train_resume.py DDPRUN TRAIN CASE

kill:          2 ranks, --deterministic, one rank SIGKILLed after a random step under
               `ddprun --max-restarts 1`: the job resumes from the newest checkpoint and ends with
               --save weights byte for byte those of a 2-rank run never killed.
kill_in_write: rank 0 dies between writing a checkpoint's temporary file (half of it) and the
               rename: the restart removes the .tmp, resumes from the one before, ends the same.
corrupt:       a flipped data byte, a flipped header byte, a truncation of the newest checkpoint:
               --resume auto says which file and why, and resumes from the previous one; after
               a restart the folder's newest valid checkpoint wins over --resume FILE.
unwritable:    the checkpoint folder replaced by a file mid-run: errors, the run goes on (exit 0);
               with --stop-on-save-error (2 ranks) the job stops (exit 1); the earlier
               checkpoints load.
rollback:      2 ranks, an accuracy drop planted at epoch 1: rollback to best.safetensors, whose
               model tensors the final --save equals.
paths:         a missing folder for --save, --metrics or --checkpoint-dir: exit 2 at once,
               naming the flag, before any data is loaded.
slurm:         2 ranks started with a 2-task Slurm job's environment train to ddprun's weights;
               after rank 1 is killed, a requeue (SLURM_RESTART_COUNT=1) resumes by itself and
               ends with the same weights.
mpirun:        `mpirun -np 2` (Open MPI) of the train binary trains to ddprun's weights; skipped
               (77) without mpirun.

The test hooks (DDPLAB_TEST_*) are documented in docs/checkpoints.md. Exit 77 (skipped) without
the dataset in Debian's location.
"""
import os
import random
import socket
import subprocess
import sys
import tempfile
import time

DATA = "/usr/share/datasets/fashion-mnist"


def common(tmp, name, epochs=2):
    """2 epochs of 4 steps per rank (2 ranks x 64 examples / 16), a checkpoint every 2 steps."""
    return ["--model", "cnn", "--dataset", "fmnist", "--subset", "128", "--test-subset", "100",
            "--batch-size", "16", "--epochs", str(epochs), "--num-workers", "1", "--threads", "1",
            "--deterministic", "--checkpoint-every-steps", "2",
            "--checkpoint-dir", os.path.join(tmp, name), "--save", os.path.join(tmp, name + ".st")]


def run(cmd, expect_rc=0, env=None):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       env=dict(os.environ, **(env or {})), timeout=120)
    if expect_rc is not None and p.returncode != expect_rc:
        print(p.stdout)
        raise SystemExit("%s: exit %d, expected %d" % (" ".join(cmd), p.returncode, expect_rc))
    return p.stdout


def expect(out, *needles):
    for n in needles:
        if n not in out:
            print(out)
            raise SystemExit("missing in the output: %r" % n)


def same_bytes(a, b):
    with open(a, "rb") as fa, open(b, "rb") as fb:
        if fa.read() != fb.read():
            raise SystemExit("%s and %s differ" % (a, b))


def ddprun_cmd(ddprun, train, args, restarts=0):
    return [ddprun, "--standalone", "--nproc-per-node", "2", "--max-restarts", str(restarts),
            train] + args


def baseline(ddprun, train, tmp):
    run(ddprun_cmd(ddprun, train, common(tmp, "ref")))
    return os.path.join(tmp, "ref.st")


def case_kill(ddprun, train, tmp):
    ref = baseline(ddprun, train, tmp)
    seed = int(os.environ.get("KILL_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    step, rank = rng.randint(1, 7), rng.randint(0, 1)
    print("seed %d: rank %d killed after step %d" % (seed, rank, step))
    out = run(ddprun_cmd(ddprun, train, common(tmp, "k"), restarts=1),
              env={"DDPLAB_TEST_KILL_AT_STEP": "%d:%d" % (step, rank)})
    expect(out, "rank %d (pid" % rank, "was killed by signal 9 (SIGKILL)", "restart 1/1")
    if step >= 2:  # a checkpoint exists: where training resumed. Rank 1 killed while rank 0
        # writes step S's checkpoint may stop that write (then S - 2 is the newest).
        # With newest 2 that earlier point is the start: no checkpoint, training begins again.
        newest = step // 2 * 2
        starts = ["resumed from step %d " % s for s in (newest, newest - 2) if s > 0]
        if newest == 2:
            starts.append("resume: no valid checkpoint in ")
        if not any(s in out for s in starts):
            print(out)
            raise SystemExit("none of %s in the output" % starts)
        if "resumed from step" in out:
            expect(out, "(restart 1)")
    same_bytes(ref, os.path.join(tmp, "k.st"))
    print(out)


def case_kill_in_write(ddprun, train, tmp):
    ref = baseline(ddprun, train, tmp)
    out = run(ddprun_cmd(ddprun, train, common(tmp, "w"), restarts=1),
              env={"DDPLAB_TEST_CRASH_IN_CHECKPOINT_WRITE": "4"})
    expect(out, "rank 0 dies while writing", "ckpt-step000004.safetensors.tmp",
           "was killed by signal 9 (SIGKILL)", "removed ", "resumed from step 2 ")
    same_bytes(ref, os.path.join(tmp, "w.st"))
    print(out)


def one_process(tmp, name, max_steps):
    return common(tmp, name)[:-2] + ["--max-steps", str(max_steps)]


def case_corrupt(ddprun, train, tmp):
    run([train] + one_process(tmp, "c", 6))
    d = os.path.join(tmp, "c")
    newest = os.path.join(d, "ckpt-step000006.safetensors")
    with open(newest, "rb") as f:
        good = f.read()
    header_len = int.from_bytes(good[:8], "little")
    damaged = {
        "data byte": good[:-100] + bytes([good[-100] ^ 0x40]) + good[-99:],
        "header byte": good[:20] + bytes([good[20] ^ 0x01]) + good[21:],
        "truncation": good[:8 + header_len + 1000],
    }
    for what, content in damaged.items():
        with open(newest, "wb") as f:
            f.write(content)
        out = run([train] + one_process(tmp, "c", 6) + ["--resume", "auto"])
        print("--- %s:\n%s" % (what, out))
        expect(out, "skipping " + newest, "resumed from step 4 ")
        if what == "data byte":
            expect(out, "CRC")
    # A launcher's restart prefers the run's own newest valid checkpoint (step 6, which the last
    # resumed run rewrote) to --resume FILE (FILE again would throw away what the run did since).
    first = os.path.join(d, "ckpt-step000002.safetensors")
    out = run([train] + one_process(tmp, "c", 6) + ["--resume", first],
              env={"RANK": "0", "WORLD_SIZE": "1", "TORCHELASTIC_RESTART_COUNT": "1"})
    print("--- restart with --resume FILE:\n" + out)
    expect(out, "resumed from step 6 ", "(restart 1)")


def swap_dir_for_file_when(d, ready_file, proc):
    """Waits for `ready_file`, then puts a plain file where the folder `d` was."""
    while not os.path.exists(ready_file):
        if proc.poll() is not None:
            print(proc.stdout.read())
            raise SystemExit("the run ended before its first checkpoint")
        time.sleep(0.02)
    os.rename(d, d + ".old")
    with open(d, "w") as f:
        f.write("not a folder\n")


def case_unwritable(ddprun, train, tmp):
    for stop in (False, True):
        name = "s" if stop else "u"
        d = os.path.join(tmp, name)
        if stop:  # 2 ranks: rank 0's failed save must stop rank 1 too, not leave it waiting
            args = ddprun_cmd(ddprun, train, one_process(tmp, name, 8) + ["--stop-on-save-error"])
        else:
            args = [train] + one_process(tmp, name, 8)
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        swap_dir_for_file_when(d, os.path.join(d, "ckpt-step000002.safetensors"), proc)
        out = proc.communicate(timeout=120)[0]
        print(out)
        expect(out, "error: checkpoint of step", "the earlier checkpoints are intact")
        if stop:
            if proc.returncode != 1 or "stopped: the checkpoint of step" not in out:
                raise SystemExit("--stop-on-save-error: exit %d, expected 1" % proc.returncode)
        elif proc.returncode != 0 or "epoch 0: train loss" not in out:
            raise SystemExit("the run did not go on after the failed save")
        first = os.path.join(d + ".old", "ckpt-step000002.safetensors")
        out = run([train] + one_process(tmp, name + "2", 2) + ["--resume", first])
        expect(out, "resumed from step 2 ")


def case_rollback(ddprun, train, tmp):
    args = common(tmp, "r", epochs=2)
    args += ["--rollback-on-drop", "0.05", "--rollback-lr-factor", "0.5"]
    out = run(ddprun_cmd(ddprun, train, args), env={"DDPLAB_TEST_PLANT_ACCURACY_DROP": "1"})
    print(out)
    expect(out, "checkpoint: best test acc", "rollback: test acc 0.00%", "lr x 0.5")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from check_train_equivalence import read_safetensors
    best = read_safetensors(os.path.join(tmp, "r", "best.safetensors"))
    final = read_safetensors(os.path.join(tmp, "r.st"))
    for name, value in final.items():
        if best[name] != value:
            raise SystemExit("after the rollback %s differs from best.safetensors" % name)
    print("final weights == best.safetensors' model (%d tensors)" % len(final))


def case_paths(ddprun, train, tmp):
    a_file = os.path.join(tmp, "a_file")
    open(a_file, "w").close()
    base = ["--model", "cnn", "--dataset", "fmnist", "--subset", "64"]
    for flag, value in (("--save", "/nonexistent/dir/w.st"),
                        ("--metrics", os.path.join(tmp, "missing", "m.jsonl")),
                        ("--checkpoint-dir", os.path.join(tmp, "missing", "deeper")),
                        ("--checkpoint-dir", a_file)):
        t = time.monotonic()
        out = run([train] + base + [flag, value], expect_rc=2)
        took = time.monotonic() - t
        print("%s %s -> exit 2 in %.2f s: %s" % (flag, value, took, out.strip()))
        expect(out, flag, value if flag == "--checkpoint-dir" else os.path.dirname(value))
        if "train / " in out:  # the data summary: data was loaded before the check
            raise SystemExit("%s was checked after loading the data" % flag)
    out = run([train] + base + ["--resume", "auto"], expect_rc=2)
    expect(out, "--resume auto needs --checkpoint-dir")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def slurm_job(train, args, restart_count=0, extra=None):
    """Two tasks as `srun -n 2` would start them: SLURM_* numbering, MASTER_* to meet."""
    port = free_port()
    procs = []
    for rank in range(2):
        env = {k: v for k, v in os.environ.items()
               if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RESTART_COUNT")}
        env.update({"SLURM_PROCID": str(rank), "SLURM_NTASKS": "2", "SLURM_LOCALID": str(rank),
                    "SLURM_NTASKS_PER_NODE": "2", "SLURM_NNODES": "1", "SLURM_JOB_ID": "4242",
                    "SLURM_RESTART_COUNT": str(restart_count), "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1",
                    "DDPLAB_COLLECTIVE_TIMEOUT": "30"})
        env.update(extra or {})
        procs.append(subprocess.Popen([train] + args, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=120)[0] for p in procs]
    return [p.returncode for p in procs], outs


def case_slurm(ddprun, train, tmp):
    ref = baseline(ddprun, train, tmp)
    rcs, outs = slurm_job(train, common(tmp, "slurm"))
    if rcs != [0, 0]:
        print("\n".join(outs))
        raise SystemExit("Slurm-style job: exit codes %s" % rcs)
    same_bytes(ref, os.path.join(tmp, "slurm.st"))
    print("Slurm environment: same weights as ddprun")
    # A job whose rank 1 dies after step 5, then its requeue: the same job again, with
    # SLURM_RESTART_COUNT=1 and no --resume flag.
    rcs, outs = slurm_job(train, common(tmp, "req"), extra={"DDPLAB_TEST_KILL_AT_STEP": "5:1"})
    if rcs[1] != -9:
        print("\n".join(outs))
        raise SystemExit("rank 1 should have died by SIGKILL: exit codes %s" % rcs)
    rcs, outs = slurm_job(train, common(tmp, "req"), restart_count=1)
    print("\n".join(outs))
    if rcs != [0, 0]:
        raise SystemExit("requeued job: exit codes %s" % rcs)
    expect(outs[0], "resumed from step 4 ", "(restart 1)")
    same_bytes(ref, os.path.join(tmp, "req.st"))
    print("requeued Slurm job: resumed by itself, same weights as ddprun")


def case_mpirun(ddprun, train, tmp):
    import shutil
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        print("skipped: no mpirun (Debian's openmpi-bin)")
        sys.exit(77)
    ref = baseline(ddprun, train, tmp)
    # Open MPI numbers the processes (OMPI_COMM_WORLD_*); MASTER_* says where they meet.
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RESTART_COUNT")}
    env.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
                "OMP_NUM_THREADS": "1", "DDPLAB_COLLECTIVE_TIMEOUT": "30"})
    cmd = [mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2",
           "-x", "MASTER_ADDR", "-x", "MASTER_PORT", "-x", "OMP_NUM_THREADS",
           "-x", "DDPLAB_COLLECTIVE_TIMEOUT", train] + common(tmp, "mpi")
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                       timeout=120)
    if p.returncode != 0:
        print(p.stdout)
        raise SystemExit("mpirun -np 2: exit %d" % p.returncode)
    expect(p.stdout, "DDP: 2 ranks")
    same_bytes(ref, os.path.join(tmp, "mpi.st"))
    print("mpirun -np 2: same weights as ddprun")


def main():
    ddprun, train, case = sys.argv[1:4]
    if not os.path.isdir(DATA):
        print("skipped: no Fashion-MNIST in " + DATA)
        sys.exit(77)
    with tempfile.TemporaryDirectory() as tmp:
        globals()["case_" + case](ddprun, train, tmp)
    print("ok")


if __name__ == "__main__":
    main()
