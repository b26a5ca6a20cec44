#!/usr/bin/env bash
# ddplab as an installed library (docs/getting-started.md), end to end:
#   1. `meson install --destdir` this build into a temporary folder;
#   2. copy examples/minimal_ddp.cpp (which includes <ddplab/ddplab.h> alone) out of the
#      repository and compile it with pkg-config alone,
#      exactly as the page says (the .pc is relocatable: its prefix follows the file);
#   3. check that the program and libddplab.so need no CUDA library, even in a CUDA build;
#   4. train it on 2 ranks under the installed ddprun: the loss must fall, the test accuracy
#      must be printed and high, the checkpoint written, and both ranks exit 0.
#
#   check_install.sh SOURCE_ROOT BUILD_DIR
set -uo pipefail
src=$1
build=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "check_install: $*" >&2; exit 1; }

meson install -C "$build" --destdir "$work/dest" --no-rebuild --quiet > "$work/install.log" 2>&1 \
  || { cat "$work/install.log"; fail "meson install failed"; }
pc=$(find "$work/dest" -name ddplab.pc | head -n 1)
[ -n "$pc" ] || fail "no ddplab.pc installed"
export PKG_CONFIG_PATH=$(dirname "$pc")
# A .pc written by an older configuration of this build folder names a fixed prefix: point it
# into the destdir (a fresh `meson setup` writes a relocatable one, see meson.build).
define=()
grep -q pcfiledir "$pc" || define=(--define-variable=prefix="$work/dest$(sed -n 's/^prefix=//p' "$pc")")
includedir=$(pkg-config "${define[@]}" --variable=includedir ddplab)
[ -f "$includedir/ddplab/ddp/ddp.h" ] \
  || fail "ddp/ddp.h is not installed under pkg-config's includedir"
[ -f "$includedir/ddplab/ddplab.h" ] || fail "the umbrella header ddplab/ddplab.h is not installed"
# The program includes nothing of ddplab but the umbrella header.
grep -q '^#include <ddplab/ddplab.h>' "$src/examples/minimal_ddp.cpp" \
  && ! grep -q '^#include "' "$src/examples/minimal_ddp.cpp" \
  || fail "examples/minimal_ddp.cpp should include <ddplab/ddplab.h> alone"

mkdir "$work/my_lab" && cp "$src/examples/minimal_ddp.cpp" "$work/my_lab/my_lab.cpp"
cd "$work/my_lab" || exit 1
libdir=$(pkg-config "${define[@]}" --variable=libdir ddplab)
# -O1: this test is about building and linking; -rpath because the destdir is not on the
# loader's path (an installed /usr/local needs `ldconfig` instead).
# A library built with the sanitizers (scripts/setup --sanitize) needs its runtime linked first.
sanitize=$(meson introspect "$build" --buildoptions 2>/dev/null |
  python3 -c 'import json,sys; print(next(o["value"] for o in json.load(sys.stdin) if o["name"] == "b_sanitize"))' 2>/dev/null)
extra=()
[ -n "$sanitize" ] && [ "$sanitize" != none ] && extra=(-fsanitize="$sanitize")
c++ -std=c++17 -O1 "${extra[@]}" my_lab.cpp $(pkg-config "${define[@]}" --cflags --libs ddplab) \
  -Wl,-rpath,"$libdir" -o my_lab || fail "my_lab.cpp does not compile against the installed ddplab"

# A program written against the layout before distributed/ was split into comm/ and ddp/ (the
# first README included distributed/ddp.h alone) still compiles through the forwarding headers.
cat > old_layout.cpp <<'CPP'
#include "distributed/ddp.h"
#include "distributed/sampler.h"
using namespace ddplab;
int main() {
  auto pg = distributed::init_process_group();
  distributed::DistributedSampler sampler(10, pg->size(), pg->rank());
  return sampler.size() > 0 ? 0 : 1;
}
CPP
c++ -std=c++17 -fsyntax-only old_layout.cpp $(pkg-config "${define[@]}" --cflags ddplab) \
  || fail "a program that includes distributed/ddp.h (the earlier layout) no longer compiles"

for f in my_lab "$libdir/libddplab.so"; do
  if readelf -d "$f" | grep NEEDED | grep -Eq 'lib(cuda|cudart|cublas|cudnn|nccl)'; then
    readelf -d "$f" | grep NEEDED
    fail "$f needs a CUDA library: a CPU-only program must not"
  fi
done

ddprun=$(find "$work/dest" -path '*/bin/ddprun' | head -n 1)
[ -x "$ddprun" ] || fail "ddprun is not installed"
"$ddprun" --standalone --nproc-per-node 2 ./my_lab ckpt.safetensors > out.txt 2>&1
rc=$?
cat out.txt
[ $rc -eq 0 ] || fail "the 2-rank run exited $rc"
[ -s ckpt.safetensors ] || fail "no checkpoint written"
python3 - out.txt <<'PY' || exit 1
import re, sys
text = open(sys.argv[1]).read()
losses = [float(v) for v in re.findall(r"\[rank0\]: epoch \d+: loss ([0-9.]+)", text)]
acc = re.search(r"\[rank0\]: test accuracy: ([0-9.]+)", text)
assert len(losses) == 3, f"expected 3 epoch lines from rank 0, got {losses}"
assert losses[-1] < 0.7 * losses[0], f"the loss did not fall: {losses}"
assert acc and float(acc.group(1)) > 0.9, "test accuracy missing or below 0.9"
assert "[rank1]: epoch" not in text, "rank 1 printed too"
print(f"check_install: ok: losses {losses}, test accuracy {acc.group(1)}")
PY
