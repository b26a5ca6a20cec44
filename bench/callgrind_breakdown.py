#!/usr/bin/python3
"""Instruction counts of one training step by kind, from callgrind dumps of bench_train.

Wall-clock profiles on a shared 2-core machine move by 2x from one minute to the next;
instruction counts do not. So the step is run under callgrind, dumped at every optimizer step,
and the instructions of one whole step (optimizer step + zero_grad + forward + backward) are
split by what ran them:

    valgrind --tool=callgrind --callgrind-out-file=cg.out \\
        --dump-before='ddplab::optim::SGD::step()' \\
        build/bench/bench_train --model resnet20 --batch 16 --threads 1 --warmup 1 --steps 2
    bench/callgrind_breakdown.py cg.out.3

(cg.out.1 holds start-up and the warm-up step, which JIT-compiles oneDNN's kernels; cg.out.2
the first optimizer step, which also creates the momentum buffers, and the next forward and
backward; cg.out.3 one steady step.) A kind is the inclusive count of the calls into functions
whose name matches its pattern (oneDNN's JIT code and internals have no symbols, so they count
under the ddplab function that calls them). Caveat: valgrind hides AVX-512 from the program, so
oneDNN runs its AVX2 kernels here.
"""

import re
import sys
from collections import defaultdict

# (kind, regex over the demangled function name). A call counts, with everything below it, for
# the kind its callee matches (the first in the list) when its caller matches none: the outermost
# matched call, so nothing is counted twice.
KINDS = [
    ("conv forward (oneDNN, with its reorders)", r"^ddplab::nn::onednn::conv2d_forward\("),
    ("conv backward data + weights (with reorders)", r"^ddplab::nn::onednn::conv2d_backward"),
    # batch_norm and batch_norm_relu both run batch_norm_impl (ReLU fused into the normalise).
    ("batch norm (+relu) backward",
     r"^ddplab::nn::functional::(\(anonymous namespace\)::batch_norm_impl|batch_norm)\(.*lambda"),
    ("batch norm (+relu) forward",
     r"^ddplab::nn::functional::(\(anonymous namespace\)::batch_norm_impl|batch_norm)\("),
    ("relu forward", r"^ddplab::ops::relu\("),
    ("relu backward (+ add_relu backward)", r"^ddplab::ops::relu_backward\("),
    ("add_relu forward", r"^ddplab::nn::functional::add_relu\("),
    ("add (residual, gradient accumulation)", r"^ddplab::ops::add\("),
    ("pooling", r"pool"),
    ("linear + cross_entropy", r"^ddplab::nn::functional::(linear|cross_entropy)\("),
    ("optimizer (SGD step, zero_grad)", r"^ddplab::optim::"),
]


def parse(path):
    """Self and per-callee inclusive instruction counts per function."""
    names = {}
    self_cost = defaultdict(int)
    calls = defaultdict(lambda: defaultdict(int))  # caller -> callee -> inclusive cost
    fn = None
    pending_callee = None
    total = None
    with open(path, errors="replace") as f:
        for line in f:
            if line.startswith("fn="):
                fn = resolve(names, line[3:].strip())
                pending_callee = None
            elif line.startswith("cfn="):
                callee = resolve(names, line[4:].strip())
            elif line.startswith("calls="):
                pending_callee = callee
            elif line.startswith("summary:") or line.startswith("totals:"):
                total = int(line.split()[1])
            elif line and (line[0].isdigit() or line[0] in "+-*"):
                parts = line.split()
                cost = int(parts[1]) if len(parts) > 1 else 0
                if pending_callee is not None:
                    calls[fn][pending_callee] += cost
                    pending_callee = None
                elif fn is not None:
                    self_cost[fn] += cost
    return self_cost, calls, total


def resolve(names, token):
    m = re.match(r"\((\d+)\)(?:\s+(.*))?", token)
    if not m:
        return token
    if m.group(2):
        names[m.group(1)] = m.group(2)
    return names.get(m.group(1), token)


def kind_of(name):
    for kind, pattern in KINDS:
        if re.search(pattern, name):
            return kind
    return None


def breakdown(calls):
    by_kind = defaultdict(int)
    for caller, callees in calls.items():
        if kind_of(caller) is not None:
            continue
        for callee, cost in callees.items():
            k = kind_of(callee)
            if k is not None:
                by_kind[k] += cost
    return by_kind


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    agg = defaultdict(int)
    grand = 0
    for path in sys.argv[1:]:
        self_cost, calls, total = parse(path)
        for k, v in breakdown(calls).items():
            agg[k] += v
        grand += total if total is not None else sum(self_cost.values())
    print(f"| kind | instructions (M) | share |\n|---|---|---|")
    for kind, _ in KINDS:
        print(f"| {kind} | {agg[kind] / 1e6:.1f} | {100 * agg[kind] / grand:.1f}% |")
    rest = grand - sum(agg.values())
    print(f"| everything else | {rest / 1e6:.1f} | {100 * rest / grand:.1f}% |")
    print(f"| **step** | {grand / 1e6:.1f} | 100% |")


if __name__ == "__main__":
    main()
