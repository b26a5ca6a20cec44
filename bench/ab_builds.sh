#!/usr/bin/env bash
# Two builds of ddplab side by side (e.g. oneDNN 2.6.3 against 3.2: docs/benchmarks.md,
# "Libraries"): bench_train's resnet20 step, float32 and bfloat16 autocast, each build in turn,
# the order alternating every round (A B, B A, ...) so that a drift of the shared machine hits both
# alike.
#
#   bench/ab_builds.sh BUILD_A BUILD_B [ROUNDS] [THREADS]
#
# Prints one line per run and, at the end, the median step of each build and precision and B / A.
set -euo pipefail
a=${1:?usage: bench/ab_builds.sh BUILD_A BUILD_B [ROUNDS] [THREADS]}
b=${2:?usage: bench/ab_builds.sh BUILD_A BUILD_B [ROUNDS] [THREADS]}
rounds=${3:-5}
threads=${4:-2}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
lscpu | grep -m1 'Model name' || true
for ((r = 1; r <= rounds; r++)); do
  order=("$a" "$b")
  ((r % 2)) || order=("$b" "$a")
  for precision in fp32 bf16; do
    amp=()
    [[ $precision == bf16 ]] && amp=(--amp bf16)
    for build in "${order[@]}"; do
      ms=$(GOMP_SPINCOUNT=1000 OMP_NUM_THREADS=$threads "$build/bench/bench_train" \
             --model resnet20 --batch 128 --threads "$threads" --warmup 2 --steps 5 \
             "${amp[@]}" 2>&1 |
           sed -n 's/.*step \([0-9.]*\) ms.*/\1/p' | head -1)
      echo "round $r $build $precision $ms ms" | tee -a "$log"
    done
  done
done
python3 - "$log" "$a" "$b" <<'PY'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
a, b = sys.argv[2], sys.argv[3]
for precision in ("fp32", "bf16"):
    med = {x: statistics.median(float(r[4]) for r in rows if r[2] == x and r[3] == precision)
           for x in (a, b)}
    print(f"{precision}: {a} {med[a]:.1f} ms, {b} {med[b]:.1f} ms, {b} / {a} {med[b] / med[a]:.2f}")
PY
