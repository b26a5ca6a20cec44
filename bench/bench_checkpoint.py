"""Checkpoint write time next to torch.save, and the time from a worker's death to training again.

    bench/bench_checkpoint.py write BENCH_CHECKPOINT [--rounds 3]   (needs torch: scripts/pyvenv)
    bench/bench_checkpoint.py recovery DDPRUN TRAIN [--rounds 3]    (needs Fashion-MNIST)

write: for resnet20 and resnet18, alternately runs build/bench/bench_checkpoint (nn::save_checkpoint
of the model's state_dict plus an SGD momentum buffer per parameter: CRC32s, temporary file,
fsync, rename, fsync of the folder) and torch.save of the same tensors (names and shapes read from
the file bench_checkpoint left), plain and followed by the same fsync + rename; prints medians.

recovery: a 2-rank train job under `ddprun --max-restarts 1` whose rank 1 is SIGKILLed after step
5 (DDPLAB_TEST_KILL_AT_STEP); from the time-stamped output lines: death -> ddprun's restart line
(detection and stopping the group), -> "resumed from step" (new workers, rendezvous, the
checkpoint chosen and read), -> the first progress line after it (data loaded, model built and
restored, the first step trained again).
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def safetensors_shapes(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    return {k: v["shape"] for k, v in header.items() if k != "__metadata__"}


def torch_save_ms(torch, state, path, durable):
    t0 = time.perf_counter()
    if durable:  # what nn::save_checkpoint does: temporary file, fsync, rename, fsync the folder
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fd = os.open(os.path.dirname(path), os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    else:
        torch.save(state, path)
    return 1000 * (time.perf_counter() - t0)


def write(bench, rounds):
    import torch
    torch.set_num_threads(1)
    print("| state | size (MB) | ddplab save_checkpoint (ms) | torch.save (ms) | torch.save + fsync + rename (ms) | ddplab / torch durable |")
    print("|---|---|---|---|---|---|")
    for model in ("resnet20", "resnet18"):
        ours, plain, durable = [], [], []
        with tempfile.TemporaryDirectory(dir="/tmp") as d:
            for _ in range(rounds):
                out = subprocess.run([bench, "--model", model, "--dir", d, "--reps", "3"],
                                     check=True, capture_output=True, text=True).stdout
                r = dict(kv.split("=") for kv in out.split("RESULT ")[1].split())
                ours.append(float(r["save_ms"]))
                shapes = safetensors_shapes(os.path.join(d, "ckpt.safetensors"))
                model_sd = {k: torch.randn(s) for k, s in shapes.items()
                            if not k.startswith("optimizer.")}
                state = {"model": model_sd, "optimizer": {"state": {
                    k: torch.randn(s) for k, s in shapes.items() if k.startswith("optimizer.")}},
                    "step": 1000}
                path = os.path.join(d, "torch.pt")
                for _ in range(3):
                    plain.append(torch_save_ms(torch, state, path, False))
                    durable.append(torch_save_ms(torch, state, path, True))
            mb = os.path.getsize(os.path.join(d, "ckpt.safetensors")) / 1e6
        m_ours, m_plain, m_dur = (statistics.median(x) for x in (ours, plain, durable))
        print("| %s (model + momentum) | %.1f | %.1f | %.1f | %.1f | %.2f |"
              % (model, mb, m_ours, m_plain, m_dur, m_ours / m_dur))


def recovery(ddprun, train, rounds):
    rows = []
    for _ in range(rounds):
        with tempfile.TemporaryDirectory() as d:
            cmd = [ddprun, "--standalone", "--nproc-per-node", "2", "--max-restarts", "1", train,
                   "--model", "cnn", "--dataset", "fmnist", "--subset", "256", "--test-subset",
                   "100", "--batch-size", "16", "--epochs", "1", "--num-workers", "1",
                   "--checkpoint-dir", d, "--checkpoint-every-steps", "2"]
            env = dict(os.environ, DDPLAB_TEST_KILL_AT_STEP="5:1")
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 env=env)
            marks = {}
            for line in p.stdout:
                t = time.monotonic()
                if "test hook: SIGKILL" in line:
                    marks["death"] = t
                elif "restarting all workers" in line:
                    marks["restart"] = t
                elif "resumed from step" in line:
                    marks["resumed"] = t
                elif "resumed" in marks and "training" not in marks and "] loss" in line:
                    marks["training"] = t
            p.wait()
            if len(marks) == 4:
                rows.append(marks)
    for name, a, b in (("detection (death -> ddprun restarts)", "death", "restart"),
                       ("new workers, rendezvous, checkpoint chosen", "restart", "resumed"),
                       ("data loaded, checkpoint restored, first step", "resumed", "training"),
                       ("total: death -> training again", "death", "training")):
        print("| %s | %.2f s |" % (name, statistics.median(r[b] - r[a] for r in rows)))


def main():
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 3
    if sys.argv[1] == "write":
        write(sys.argv[2], rounds)
    else:
        recovery(sys.argv[2], sys.argv[3], rounds)


if __name__ == "__main__":
    main()
