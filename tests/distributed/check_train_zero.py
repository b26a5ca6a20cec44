"""examples/train --zero under ddprun trains exactly like plain DDP (ZeRO-1).

    check_train_zero.py DDPRUN TRAIN

2 ranks x batch 4 of the mlp, SGD with momentum, 3 steps: with --zero each rank keeps the momentum
of its shard only and broadcasts its updated parameters, so the saved model must equal plain
DDP's bit for bit (the same arithmetic on the same averaged gradients). The run says it sharded;
--zero alone (one process) says there is nothing to shard. The dataset and the comparison are
check_train_equivalence.py's.
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_train_equivalence import common, compare, run, write_dataset  # noqa: E402


def main():
    ddprun, train = sys.argv[1:3]
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "data")
        write_dataset(data, per_class_train=8, per_class_test=1)  # 24 images: 3 steps of 2 x 4
        args = common(data) + ["--model", "mlp", "--lr", "0.05", "--momentum", "0.9",
                               "--batch-size", "4"]
        ddp = [ddprun, "--standalone", "--nproc-per-node", "2", train] + args
        out = run(ddp + ["--zero", "--save", os.path.join(tmp, "zero.st")])
        bad = 0
        if "ZeRO-1: optimizer state sharded over 2 ranks" not in out:
            print("MISSING: the --zero run did not report its sharding")
            bad += 1
        run(ddp + ["--save", os.path.join(tmp, "ddp.st")])
        bad += compare(os.path.join(tmp, "zero.st"), os.path.join(tmp, "ddp.st"), 0.0)
        out = run([train] + args + ["--zero", "--max-steps", "1"])
        if "note: --zero with one process: nothing to shard, plain SGD" not in out:
            print("MISSING: the one-process --zero note")
            bad += 1
    print("FAILED" if bad else "OK")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
