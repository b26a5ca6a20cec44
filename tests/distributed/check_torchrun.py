"""examples/train under PyTorch's torchrun (the venv's, from scripts/pyvenv).

    check_torchrun.py DDPRUN TRAIN CASE        CASE: equivalence | error_file | restart

equivalence: `torchrun --standalone --nproc_per_node 2 --no-python TRAIN ...` trains 2 ranks to
             the same weights, bit for bit, as `ddprun --standalone --nproc-per-node 2 TRAIN ...`
             with the same flags. Under torchrun the agent already holds MASTER_PORT, so this
             only works when every rank joins the agent's store (TORCHELASTIC_USE_AGENT_STORE).
error_file:  a worker that fails (--init-from a missing file) leaves TORCHELASTIC_ERROR_FILE,
             so torchrun's "Root Cause" block shows ddplab's message.
restart:     with --max-restarts 1, round 0 fails after joining the group and round 1 trains:
             the second round must not read the first one's keys in the agent's store.

Exit 77 (skipped) without the venv's torchrun or Debian's Fashion-MNIST. The data is a small
slice of the real Fashion-MNIST (256 training and 256 test images, written here as IDX files),
so that the evaluation after the epoch takes no time.
"""
import gzip
import os
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_train_equivalence import read_safetensors  # noqa: E402

FMNIST = "/usr/share/datasets/fashion-mnist"
VENV = os.environ.get("DDPLAB_VENV") or os.path.expanduser("~/.cache/ddplab/venv")
TORCHRUN = os.path.join(VENV, "bin", "torchrun")
TIMEOUT = 120  # seconds per launch; each takes 10-25 s on a loaded 2-core machine


def write_slice(out_dir, n_train=256, n_test=256):
    """The first n images and labels of each split, as uncompressed IDX files."""
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        for kind, header_bytes, item_bytes in (("images-idx3", 16, 28 * 28), ("labels-idx1", 8, 1)):
            name = "%s-%s-ubyte" % (prefix, kind)
            with gzip.open(os.path.join(FMNIST, name + ".gz"), "rb") as f:
                header = bytearray(f.read(header_bytes))
                body = f.read(n * item_bytes)
            struct.pack_into(">I", header, 4, n)  # the count follows the 4-byte magic
            with open(os.path.join(out_dir, name), "wb") as f:
                f.write(bytes(header) + body)


def run(argv, env, what):
    """Runs a launcher; returns (exit code, its output)."""
    try:
        p = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=TIMEOUT)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace")
        raise SystemExit("%s did not finish in %d s; output:\n%s" % (what, TIMEOUT, out))
    return p.returncode, p.stdout.decode(errors="replace")


def torchrun(args, env):
    return [TORCHRUN, "--standalone", "--nproc_per_node", "2"] + args


def main():
    ddprun, train, case = sys.argv[1:4]
    if not os.access(TORCHRUN, os.X_OK):
        print("skipped: no torchrun at %s (scripts/pyvenv makes it)" % TORCHRUN)
        return 77
    if not os.path.isdir(FMNIST):
        print("skipped: no Fashion-MNIST at %s (Debian: dataset-fashion-mnist)" % FMNIST)
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "fmnist")
        os.mkdir(data)
        write_slice(data)
        env = dict(os.environ)
        # The same threads under both launchers (ddprun would split the cores, torchrun sets 1),
        # and a bound on any hang: a rank that cannot join fails within 30 s.
        env.update(OMP_NUM_THREADS="1", DDPLAB_COLLECTIVE_TIMEOUT="30")
        flags = ["--model", "cnn", "--dataset", "fmnist", "--data-dir", data, "--subset", "256",
                 "--epochs", "1", "--batch-size", "32", "--num-workers", "1"]
        if case == "equivalence":
            return equivalence(ddprun, train, flags, env, tmp)
        if case == "error_file":
            return error_file(train, flags, env, tmp)
        if case == "restart":
            return restart(train, flags, env, tmp)
        raise SystemExit("unknown case " + case)


def equivalence(ddprun, train, flags, env, tmp):
    a, b = os.path.join(tmp, "torchrun.safetensors"), os.path.join(tmp, "ddprun.safetensors")
    rc, out = run(torchrun(["--no-python", train] + flags + ["--save", a], env), env, "torchrun")
    print(out)
    if rc != 0 or "DDP: 2 ranks" not in out:
        print("FAIL: torchrun exited %d, or did not form a group of 2 ranks" % rc)
        return 1
    rc, out = run([ddprun, "--standalone", "--nproc-per-node", "2", train] + flags + ["--save", b],
                  env, "ddprun")
    print(out)
    if rc != 0:
        print("FAIL: ddprun exited %d" % rc)
        return 1
    got, want = read_safetensors(a), read_safetensors(b)
    if sorted(got) != sorted(want):
        print("FAIL: different tensor names:", sorted(set(got) ^ set(want)))
        return 1
    differ = [name for name in want if got[name] != want[name]]
    for name in differ:
        print("FAIL: %s differs (first values %s vs %s)" % (name, list(got[name][1][:3]),
                                                           list(want[name][1][:3])))
    print("%d tensors, %d differ" % (len(want), len(differ)))
    return 1 if differ else 0


def error_file(train, flags, env, tmp):
    missing = os.path.join(tmp, "missing.safetensors")
    rc, out = run(torchrun(["--no-python", train] + flags + ["--init-from", missing], env), env,
                  "torchrun")
    print(out)
    root = out.partition("Root Cause (first observed failure):")[2]
    if rc == 0 or not root:
        print("FAIL: torchrun exited %d without a Root Cause block" % rc)
        return 1
    # torchrun shows "error_file: <N/A>" and a link to its docs when the worker wrote nothing.
    if "cannot open '%s'" % missing not in root or "error.json" not in root:
        print("FAIL: the Root Cause block does not show ddplab's message from the error file")
        return 1
    return 0


def restart(train, flags, env, tmp):
    saved = os.path.join(tmp, "round1.safetensors")
    missing = os.path.join(tmp, "missing.safetensors")
    # Round 0 joins the group (its keys are now in the agent's store), then fails loading a
    # missing file; round 1 (TORCHELASTIC_RESTART_COUNT=1) trains.
    script = ('if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then exec "$0" "$@" --init-from "%s"; '
              'fi; exec "$0" "$@" --save "%s"' % (missing, saved))
    rc, out = run(torchrun(["--max-restarts", "1", "--no-python", "/bin/sh", "-c", script,
                            train] + flags, env), env, "torchrun")
    print(out)
    if "cannot open '%s'" % missing not in out:
        print("FAIL: round 0 did not fail as planned")
        return 1
    if rc != 0 or "DDP: 2 ranks" not in out or not os.path.exists(saved):
        print("FAIL: torchrun exited %d; round 1 did not train 2 ranks and save" % rc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
