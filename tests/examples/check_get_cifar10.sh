#!/usr/bin/env bash
# scripts/get-cifar10 without network: an archive that is not CIFAR-10's is refused by its
# checksum and nothing is unpacked; an existing complete copy is kept without downloading.
set -uo pipefail
script="$1"
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
mkdir -p "$d/src/cifar-10-batches-bin"
echo fake >"$d/src/cifar-10-batches-bin/data_batch_1.bin"
tar -czf "$d/fake.tar.gz" -C "$d/src" cifar-10-batches-bin
out=$("$script" --dir "$d/data" --archive "$d/fake.tar.gz" 2>&1)
rc=$?
echo "$out"
[[ $rc -eq 1 ]] || { echo "FAIL: a wrong archive must fail (exit $rc)"; exit 1; }
grep -q "is not the CIFAR-10 binary archive" <<<"$out" || { echo "FAIL: no checksum message"; exit 1; }
[[ ! -e "$d/data/cifar-10-batches-bin" ]] || { echo "FAIL: unpacked despite the checksum"; exit 1; }
# A complete copy (right names and sizes) is kept: no download is attempted.
c="$d/data/cifar-10-batches-bin"
mkdir -p "$c"
for f in data_batch_1 data_batch_2 data_batch_3 data_batch_4 data_batch_5 test_batch; do
  truncate -s 30730000 "$c/$f.bin"
done
touch "$c/batches.meta.txt"
out=$("$script" --dir "$d/data" 2>&1) || { echo "FAIL: $out"; exit 1; }
grep -q "already complete" <<<"$out" || { echo "FAIL: expected 'already complete': $out"; exit 1; }
echo "ok"
