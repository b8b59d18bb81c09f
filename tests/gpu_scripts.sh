#!/usr/bin/env bash
# The GPU machine's scripts, as far as a machine without a GPU can run them (ctest gpu_scripts):
# scripts/gpu-deps.sh downloads flodl's Debian packages and unpacks them into a prefix whose
# pkg-config files point into it; scripts/params_diff.py tells equal parameters from different
# ones; scripts/gpu-check.sh without a GPU skips every check, saying why, and exits 0 only with
# --allow-no-gpu. On a machine with a GPU the last part is left to gpu-check.sh itself.
#   tests/gpu_scripts.sh BUILD_DIR SOURCE_DIR
set -uo pipefail
build=$1
src=$2
tmp=$(mktemp -d /tmp/flodl-gpu-scripts-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
py=/usr/bin/python3
[ -x "$py" ] || py=python3

# 1. The packages, fetched and unpacked into a prefix (not /).
timeout 300 "$src/scripts/gpu-deps.sh" download "$tmp/debs" > "$tmp/dl.log" 2>&1 ||
  { cat "$tmp/dl.log"; fail "gpu-deps.sh download"; }
n=$(ls "$tmp/debs"/*.deb | wc -l)
[ "$n" -ge 20 ] || fail "only $n packages downloaded"
size=$(du -sm "$tmp/debs" | cut -f1)
[ "$size" -le 40 ] || fail "the packages take $size MiB, over the 40 MiB the device tool may carry"
exports=$(timeout 120 "$src/scripts/gpu-deps.sh" unpack "$tmp/debs" "$tmp/pfx") ||
  fail "gpu-deps.sh unpack"
eval "$exports"
[ -x "$tmp/pfx/usr/bin/protoc-c" ] || fail "no protoc-c in the prefix"
# (pkgconf leaves out -I and -L of the directories the exports put in CPATH and LIBRARY_PATH,
# so the module's libdir is what tells where it points.)
for m in libzmq libprotobuf-c liblz4 libcjson libmicrohttpd openblas check; do
  libdir=$(pkg-config --variable=libdir "$m") || fail "pkg-config $m in the prefix"
  case "$libdir" in "$tmp/pfx"/*) ;; *) fail "pkg-config $m points outside the prefix: $libdir" ;; esac
  [ -d "$libdir" ] || fail "pkg-config $m: $libdir does not exist"
done
echo "gpu-deps.sh: $n packages, $size MiB, unpacked and found through pkg-config"

# 2. Parameters compared as gpu-check.sh compares cuda with cpu.
w="$build/worker/flodl-worker"
for dev in cpu sim; do
  timeout 120 "$w" --mode local --device "$dev" --epochs 1 --quiet --save "$tmp/$dev.safetensors" ||
    fail "flodl-worker --device $dev"
done
timeout 120 "$w" --mode local --device cpu --epochs 1 --quiet --seed 2 --save "$tmp/other.safetensors" ||
  fail "flodl-worker --seed 2"
"$py" "$src/scripts/params_diff.py" "$tmp/cpu.safetensors" "$tmp/sim.safetensors" ||
  fail "params_diff.py: cpu and sim differ"
if "$py" "$src/scripts/params_diff.py" "$tmp/cpu.safetensors" "$tmp/other.safetensors"; then
  fail "params_diff.py accepted parameters of another seed"
fi

# 3. The 2-host x devices job gpu-check.sh runs on GPUs (scripts/hybrid-check.sh), here on sim:
# the devices' leg (copies), after the pass and overlapped, trains the host leg's very bits, and
# a leg that differs is caught.
out=$(timeout 400 "$src/scripts/hybrid-check.sh" --build "$build" --device sim --gpus 0,1 \
      --bound 0 -- --layers 64,32,10 2>&1) || fail "hybrid-check.sh on sim: $out"
[ "$(grep -c '^PASS' <<< "$out")" -eq 5 ] || fail "hybrid-check.sh: not 5 checks passed: $out"
grep -q 'first leg inside the host: copy, bucket by bucket' <<< "$out" ||
  fail "hybrid-check.sh: the overlapped run did not take the devices' leg: $out"
if out=$(timeout 400 "$src/scripts/hybrid-check.sh" --build "$build" --device sim --gpus 0,1 \
         --leg nccl -- --layers 64,32,10 2>&1); then
  fail "hybrid-check.sh accepted a run whose leg was not the one asked for: $out"
fi
grep -q "FAIL  devices: the summary does not say 'first leg inside the host: nccl" <<< "$out" ||
  fail "hybrid-check.sh does not say which leg it missed: $out"
echo "hybrid-check.sh: 2 hosts x 2 sim devices, the three legs the same bits"

# 4. The two-level benchmark gpu-check.sh runs on GPUs (scripts/two-level-bench.sh), here on
# sim: six runs, each figure read, hybrid sending less to the other host than flat and top-k
# less than dense, each run's first leg named; and a bad flag refused. --first-leg devices, as
# gpu-check.sh passes it, goes to the hybrid runs only (the worker refuses it for flat ones:
# the first GPU run of this script failed both flat runs that way).
out=$(timeout 400 "$src/scripts/two-level-bench.sh" --device sim --gpus 0,1 --build "$build" \
      --layers 64,32,10 --first-leg devices 2>&1) || fail "two-level-bench.sh on sim: $out"
mib() { awk -v r="$1" 'index($0, r) == 1 { print $(NF - 1); exit }' <<< "$out"; }
rows=$(grep -cE '^(flat|hybrid) ' <<< "$out")
[ "$rows" -eq 6 ] || fail "two-level-bench.sh: $rows rows, expected 6: $out"
awk -v f="$(mib 'flat dense ')" -v h="$(mib 'hybrid dense ')" -v t="$(mib 'hybrid top-k 0.01 ')" \
  'BEGIN { exit !(f > h && h > t && t > 0) }' ||
  fail "two-level-bench.sh: MiB to the other host not flat > hybrid > hybrid top-k > 0: $out"
grep -qE '^hybrid dense overlap .* copy,overlap$' <<< "$out" ||
  fail "two-level-bench.sh: the overlapped run's first leg is not named: $out"
grep -qE '^hybrid top-k 0.01 .* copy,top-k-dev$' <<< "$out" ||
  fail "two-level-bench.sh: hybrid top-k did not compress on the devices: $out"
if out=$("$src/scripts/two-level-bench.sh" --device sim --gpus 0 --build "$build" 2>&1); then
  fail "two-level-bench.sh accepted --gpus 0 (one device)"
fi
grep -q "not a list of two or more ids" <<< "$out" || fail "two-level-bench.sh: $out"
if out=$("$src/scripts/two-level-bench.sh" --device sim --gpus 0,1 --first-leg nccl --build "$build" 2>&1); then
  fail "two-level-bench.sh accepted --first-leg nccl"
fi
grep -q "not one of auto|devices|host" <<< "$out" || fail "two-level-bench.sh: $out"
echo "two-level-bench.sh: 6 runs on 2 x 2 sim devices, every figure read"

# 4b. flodl-bench train's device section: the CPU run is capped (--cpu-seconds) and then its
# figure is the last progress line's samples/s (on the first GPU run it read none: the
# progress line had changed, and the row said 'failed').
if [ -x "$build/bench/flodl-bench" ]; then
  out=$(timeout 300 "$build/bench/flodl-bench" train --device sim --layers 64,2048,2048,10 \
        --cpu-seconds 3 2>&1) || fail "flodl-bench train --device sim --cpu-seconds 3: $out"
  grep -qE '^flodl-worker --device cpu +[0-9]+ ' <<< "$out" ||
    fail "flodl-bench train: the capped CPU run has no samples/s: $out"
  echo "flodl-bench train: the CPU run stopped after 3 s still gives its samples/s"
fi

# 5. gpu-check.sh on a machine without a GPU.
if command -v nvidia-smi > /dev/null 2>&1 && nvidia-smi > /dev/null 2>&1; then
  echo "a GPU is here: gpu-check.sh runs for real there, not in this test"
  exit 0
fi
out=$("$src/scripts/gpu-check.sh" --build-dir "$tmp/bg" 2>&1)
[ $? -eq 2 ] || fail "gpu-check.sh without a GPU must exit 2: $out"
out=$("$src/scripts/gpu-check.sh" --build-dir "$tmp/bg" --allow-no-gpu 2>&1) ||
  fail "gpu-check.sh --allow-no-gpu: $out"
skips=$(grep -c '^SKIP' <<< "$out")
[ "$skips" -ge 7 ] || fail "gpu-check.sh skipped only $skips checks: $out"
grep -q 'no GPU' <<< "$out" || fail "gpu-check.sh does not say why: $out"
echo "gpu-check.sh: $skips checks skipped, saying why"
echo PASS
