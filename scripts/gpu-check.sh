#!/usr/bin/env bash
# One command on a GPU machine (CUDA, nvcc, cmake, compute-sanitizer, python3 with PyTorch; no
# network, none of flodl's Debian libraries: those come unpacked from .deps/debs, see
# scripts/gpu-deps.sh): builds flodl with CUDA, runs the GPU suites, the sanitizers, the worker
# on cuda against cpu, a 2-worker top-k job, 2 hosts x the GPUs with the first leg on the
# devices (NCCL) against host memory (scripts/hybrid-check.sh) and the GPU benchmarks
# (flodl-bench train, and scripts/two-level-bench.sh: flat and hybrid, dense and top-k). Prints PASS, FAIL or SKIP per
# check and a summary; everything also goes to a log (build-gpu/gpu-check.log, or
# $OUT/gpu-check.log when $OUT is set).
#   scripts/gpu-check.sh [--steps build,ctest,memcheck,racecheck,parity,ring,hybrid,bench]
#                        [--build-dir DIR] [--log FILE] [--cuda-arch ARCH] [--cpu-seconds S]
#                        [--bench-flags "FLAGS"] [--dry-run] [--allow-no-gpu]
# Without a usable GPU (nvidia-smi, then the worker itself, say why), or with --dry-run, every
# check is SKIP with the reason and the command it would run; the exit status is then 0 only
# with --allow-no-gpu (2 without). Otherwise: 0 when no check failed, 1 when one did.
# Each step is bounded by `timeout` (GPU_CHECK_T_<STEP> seconds overrides the default); a run
# limited to 10 minutes can do the build and the suites first, then the rest (--steps), the
# build directory being kept in between.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

all_steps="build,ctest,memcheck,racecheck,parity,ring,hybrid,bench"
steps=$all_steps
build=$root/build-gpu
log=""
arch=""
cpu_s=60
bench_flags=""
dry=0
allow=0
usage() { sed -n '2,/^set /{/^set /d;s/^# \{0,1\}//;p}' "$0"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps=$2; shift ;;
    --steps=*) steps=${1#*=} ;;
    --build-dir) build=$2; shift ;;
    --build-dir=*) build=${1#*=} ;;
    --log) log=$2; shift ;;
    --log=*) log=${1#*=} ;;
    --cuda-arch) arch=$2; shift ;;
    --cuda-arch=*) arch=${1#*=} ;;
    --cpu-seconds) cpu_s=$2; shift ;;
    --cpu-seconds=*) cpu_s=${1#*=} ;;
    --bench-flags) bench_flags=$2; shift ;;
    --bench-flags=*) bench_flags=${1#*=} ;;
    --dry-run) dry=1 ;;
    --allow-no-gpu) allow=1 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu-check.sh: unknown flag '$1'" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
for s in ${steps//,/ }; do
  case ",$all_steps," in *",$s,"*) ;; *) echo "gpu-check.sh: unknown step '$s' ($all_steps)" >&2; exit 2 ;; esac
done
mkdir -p "$build"
build=$(cd "$build" && pwd)
if [ -z "$log" ]; then
  if [ -n "${OUT:-}" ]; then log=$OUT/gpu-check.log; else log=$build/gpu-check.log; fi
fi
mkdir -p "$(dirname "$log")"
logdir=$(cd "$(dirname "$log")" && pwd)
work=$build/gpu-check
mkdir -p "$work"

# Seconds per step.
t_build=${GPU_CHECK_T_BUILD:-540}
t_ctest=${GPU_CHECK_T_CTEST:-400}
t_memcheck=${GPU_CHECK_T_MEMCHECK:-400}
t_racecheck=${GPU_CHECK_T_RACECHECK:-500}
t_parity=${GPU_CHECK_T_PARITY:-180}
t_ring=${GPU_CHECK_T_RING:-300}
t_hybrid=${GPU_CHECK_T_HYBRID:-400}
t_bench=${GPU_CHECK_T_BENCH:-560}

results=()
nofgpu=""   # why no GPU is usable; empty while one may be

say() { printf '%s\n' "$*"; }
result() { # STATUS NAME DETAIL
  printf '%-4s  %-34s %s\n' "$1" "$2" "$3"
  results+=("$1|$2|$3")
}
selected() { case ",$steps," in *",$1,"*) return 0 ;; esac; return 1; }

# Runs a command bounded by T seconds, its output to the terminal and the log. Returns its
# status (124 when the time ran out).
bounded() {
  local t=$1; shift
  say "\$ $*"
  timeout --kill-after=15 "$t" "$@"
  local rc=$?
  [ $rc -eq 124 ] || [ $rc -eq 137 ] && say "(stopped after ${t} s)"
  return $rc
}

# bounded, with the output also kept in FILE (for the verdict) as it streams.
capture() {
  local file=$1; shift
  bounded "$@" 2>&1 | tee "$file"
  return "${PIPESTATUS[0]}"
}

# --- the environment ---------------------------------------------------------------------
gpu_probe() {
  local out rc
  if command -v nvidia-smi >/dev/null; then
    out=$(timeout 60 nvidia-smi -L 2>&1); rc=$?
    if [ $rc -eq 0 ] && grep -q '^GPU ' <<<"$out"; then
      say "$out"
      timeout 30 nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total \
        --format=csv 2>/dev/null
    else
      nofgpu="${nofgpu:+$nofgpu; }nvidia-smi: $(head -n 1 <<<"$out") (exit $rc)"
    fi
  elif ls /dev/nvidiactl >/dev/null 2>&1; then
    say "nvidia-smi: not found, but /dev/nvidiactl exists: the worker will tell"
  else
    nofgpu="${nofgpu:+$nofgpu; }nvidia-smi: not found, no /dev/nvidia*"
  fi
  # The worker's own word, where a build is already there (it loads the CUDA driver).
  if [ -n "$nofgpu" ] && [ -x "$build/worker/flodl-worker" ]; then
    if ! out=$(timeout 60 "$build/worker/flodl-worker" --mode local --device cuda --epochs 0 \
                 --quiet 2>&1); then
      nofgpu="$nofgpu; $(tail -n 1 <<<"$out")"
    fi
  fi
}

# flodl's libraries from .deps/debs when the machine lacks them (no apt, no network there).
deps_setup() {
  local m missing=()
  for m in libzmq libprotobuf-c liblz4 libcjson zlib libmicrohttpd openblas check; do
    pkg-config --exists "$m" 2>/dev/null || missing+=("$m")
  done
  command -v protoc-c >/dev/null || missing+=(protoc-c)
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ ! -d "$root/.deps/debs" ]; then
    say "missing ${missing[*]}, and no $root/.deps/debs to unpack (scripts/gpu-deps.sh download, then carry .deps/debs)"
    return 1
  fi
  say "missing ${missing[*]}: unpacking $root/.deps/debs into /tmp/flodl-prefix"
  local env
  env=$("$root/scripts/gpu-deps.sh" unpack "$root/.deps/debs" /tmp/flodl-prefix) || return 1
  say "$env"
  eval "$env"
  for m in "${missing[@]}"; do
    if [ "$m" = protoc-c ]; then command -v protoc-c >/dev/null || { say "protoc-c still missing"; return 1; }
    else pkg-config --exists "$m" || { say "pkg-config $m still fails"; return 1; }
    fi
  done
}

cuda_arch() {
  [ -n "$arch" ] && { echo "$arch"; return; }
  local v
  v=$(cmake --version 2>/dev/null | awk 'NR == 1 { print $3 }')
  # "native" needs CMake 3.24; before that, the GPU's compute capability from nvidia-smi.
  if [ -n "$v" ] && printf '3.24\n%s\n' "$v" | sort -V -C; then
    echo native
  else
    nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d '. '
  fi
}

# NCCL for the build: CMake finds it in the toolkit; a machine whose toolkit lacks it (NCCL is
# packaged apart) may have PyTorch's wheel (nvidia-nccl-cu*), whose library is libnccl.so.2
# only: then its header and library are named to CMake. Prints the cmake flags (none when the
# toolkit has it or nothing was found, CMake then building without NCCL and saying so).
nccl_flags() {
  local d nvcc_dir
  nvcc_dir=$(dirname "$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")
  for d in "$nvcc_dir/../include" "$nvcc_dir"/../targets/*/include /usr/include /usr/local/include; do
    [ -f "$d/nccl.h" ] && return 0
  done
  d=$(python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null) || return 0
  [ -f "$d/lib/libnccl.so.2" ] || return 0
  # The wheel's own header, else the one carried beside the .deb files (.deps/nccl/include).
  if [ -f "$d/include/nccl.h" ]; then
    echo "-DFLODL_NCCL_INCLUDE=$d/include -DFLODL_NCCL_LIB=$d/lib/libnccl.so.2"
  elif [ -f "$root/.deps/nccl/include/nccl.h" ]; then
    echo "-DFLODL_NCCL_INCLUDE=$root/.deps/nccl/include -DFLODL_NCCL_LIB=$d/lib/libnccl.so.2"
  fi
}

W() { echo "$build/worker/flodl-worker"; }

# --- the checks ------------------------------------------------------------------------------
step_build() {
  if ! deps_setup; then
    result FAIL "build" "flodl's libraries are missing (see above)"
    return
  fi
  local a blog=$logdir/gpu-build.log rc
  local nf=()
  a=$(cuda_arch)
  read -r -a nf <<<"$(nccl_flags)"
  say "building in $build (CUDA architectures: ${a:-the CMake default}; NCCL: ${nf[*]:-from the toolkit}; output in $blog)"
  # shellcheck disable=SC2016 # the script's own arguments, expanded by the inner shell
  bounded "$t_build" bash -c '
      b=$1 s=$2 a=$3; shift 3
      cmake -S "$s" -B "$b" -DFLODL_CUDA=on -DFLODL_WERROR=ON ${a:+-DCMAKE_CUDA_ARCHITECTURES=$a} \
        "$@" -DCMAKE_BUILD_TYPE=RelWithDebInfo && cmake --build "$b" -j"$(nproc)"' _ \
      "$build" "$root" "$a" "${nf[@]}" >"$blog" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then
    grep -E "flodl: CUDA parts|flodl: NCCL|CUDA compiler identification" "$blog"
    result PASS "build" "cmake -DFLODL_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=${a:-default}"
    return
  fi
  grep -E "error|warning" "$blog" | head -n 30
  tail -n 20 "$blog"
  result FAIL "build" "with -Werror: see $blog"
  # A compiler newer than CI's may warn where CI's does not: then the checks still run on a
  # build without -Werror, so that one lease shows both. Not after a timeout or another error.
  if [ $rc -eq 124 ] || [ $rc -eq 137 ] || ! grep -qE -- "-Werror|treated as errors" "$blog"; then
    return
  fi
  say "building again without -Werror, for the checks"
  # shellcheck disable=SC2016
  if bounded "$t_build" bash -c 'cmake -S "$1" -B "$2" -DFLODL_WERROR=OFF &&
      cmake --build "$2" -j"$(nproc)"' _ "$root" "$build" >>"$blog" 2>&1; then
    grep -E "flodl: CUDA parts|flodl: NCCL" "$blog" | tail -n 2
    result PASS "build without -Werror" "for the checks after it"
  else
    tail -n 40 "$blog"
    result FAIL "build without -Werror" "see $blog"
  fi
}

# nvidia-smi sees a GPU; can flodl use it (driver against the CUDA runtime, say)? The checks
# after this one fail, not skip, when it cannot: the machine has a GPU.
step_probe() {
  local out
  if [ ! -x "$(W)" ]; then
    result FAIL "flodl-worker --device cuda" "no $(W) (build first: --steps build)"
  elif out=$(timeout 120 "$(W)" --mode local --device cuda --epochs 0 --quiet 2>&1); then
    result PASS "flodl-worker --device cuda" "the worker takes the GPU"
  else
    say "$out"
    result FAIL "flodl-worker --device cuda" "$(tail -n 1 <<<"$out")"
  fi
}

step_ctest() {
  local f=$work/ctest.out rc tally
  (cd "$build" && capture "$f" "$t_ctest" env FLODL_REQUIRE_GPU=1 ctest -L '^gpu$' --output-on-failure)
  rc=$?
  tally=$(grep -E "tests passed|tests failed" "$f" | tail -n 1)
  if [ $rc -eq 0 ] && ! grep -q "No tests were found" "$f"; then
    result PASS "ctest -L gpu" "$tally"
  else
    result FAIL "ctest -L gpu" "${tally:-exit $rc}"
  fi
}

sanitizer() {
  local s
  s=$(command -v compute-sanitizer) && { echo "$s"; return; }
  for s in /usr/local/cuda/bin/compute-sanitizer "$(dirname "$(command -v nvcc 2>/dev/null || echo /x/x)")/compute-sanitizer" \
           /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
    [ -x "$s" ] && { echo "$s"; return; }
  done
  return 1
}

step_sanitize() { # TOOL
  local tool=$1 t cs rc f=$work/$1.out
  [ "$tool" = memcheck ] && t=$t_memcheck || t=$t_racecheck
  if ! cs=$(sanitizer); then
    result FAIL "compute-sanitizer $tool" "compute-sanitizer not found"
    return
  fi
  # The conformance suites' cuda builds (tests/test_dev_*.c), each bounded by T.
  local b brc sum="" suites="test_dev_kernels_gpu test_dev_topk_gpu test_dev_streams_gpu"
  for b in $suites; do
    [ -x "$build/tests/$b" ] || { result FAIL "compute-sanitizer $tool" "no $build/tests/$b"; return; }
  done
  rc=0
  for b in $suites; do
    # No fork (Check would run each case in a child) so that the tool sees the kernels.
    (cd "$build/tests" && capture "$f.$b" "$t" env CK_FORK=no FLODL_REQUIRE_GPU=1 "$cs" \
       --tool "$tool" --error-exitcode 99 "./$b")
    brc=$?
    [ $rc -eq 0 ] && rc=$brc
    sum+="$b: $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Checks:" "$f.$b" | tr '\n' ' ')"
  done
  if [ $rc -eq 0 ]; then
    result PASS "compute-sanitizer $tool" "$sum"
  else
    result FAIL "compute-sanitizer $tool" "exit $rc: $sum"
  fi
}

# The same training on cuda and on cpu (same data, seed and init), two ways:
# - over STEPS steps (a CSV of STEPS x 64 samples, batch 64) every parameter agrees within
#   BOUND, relative (tests/wkdata.c fl_test_params_diff's criterion, scripts/params_diff.py);
# - over the built-in dataset's epoch (937 steps) cuBLAS's sums and OpenBLAS's part by a few
#   ulps per step, and training amplifies that (a ReLU that switches, Adam's step on a gradient
#   near zero): on an H200, SGD's worst entry was 5e-6 after 100 steps and 6e-6 after 300, but
#   31 after 937. So there the outcome is compared: test accuracy within 1 point, test loss
#   within 5%, the parameters' worst difference printed for the record.
parity_csv() { # ROWS FILE: deterministic samples, 64 features, labels 0..9
  awk -v n="$1" 'BEGIN { s = 12345; for (i = 0; i < n; i++) { printf "%d", i % 10
      for (j = 0; j < 64; j++) { s = (s * 1103515245 + 12345) % 2147483648; printf ",%.5f", s / 2147483648.0 }
      printf "\n" } }' >"$2"
}

step_parity() { # NAME STEPS BOUND FLAGS...
  local name=$1 steps=$2 bound=$3; shift 3
  local ok=1 d out rc csv=$work/parity-$steps.csv
  parity_csv $((steps * 64)) "$csv"
  for d in cpu cuda; do
    rm -f "$work/$name-$steps-$d.safetensors" "$work/$name-$d.safetensors"
    bounded "$t_parity" "$(W)" --mode local --device "$d" --epochs 1 --seed 1 --train-csv "$csv" \
      --quiet "$@" --save "$work/$name-$steps-$d.safetensors" || ok=0
    capture "$work/$name-$d.out" "$t_parity" "$(W)" --mode local --device "$d" --epochs 1 \
      --seed 1 "$@" --save "$work/$name-$d.safetensors" || ok=0
  done
  if [ $ok -eq 0 ]; then
    result FAIL "cuda = cpu, $name" "a worker failed (above)"
    return
  fi
  out=$(python3 "$root/scripts/params_diff.py" --bound "$bound" "$work/$name-$steps-cpu.safetensors" \
        "$work/$name-$steps-cuda.safetensors" 2>&1)
  rc=$?
  say "$out"
  if [ $rc -eq 0 ]; then
    result PASS "cuda = cpu, $name, $steps steps" "${out#params_diff: }"
  else
    result FAIL "cuda = cpu, $name, $steps steps" "${out#params_diff: }"
  fi
  # The epoch: accuracy and loss from each summary ("test accuracy A% (loss L)").
  local fig=() f
  for d in cpu cuda; do
    f=$(sed -n 's/.*summary: .*test accuracy \([0-9.]*\)% (loss \([0-9.]*\)).*/\1 \2/p' \
        "$work/$name-$d.out" | tail -n 1)
    fig+=("${f:-none}")
  done
  out=$(python3 "$root/scripts/params_diff.py" "$work/$name-cpu.safetensors" \
        "$work/$name-cuda.safetensors" 2>&1)
  say "$out (for the record)"
  local verdict
  verdict=$(awk -v c="${fig[0]}" -v g="${fig[1]}" 'BEGIN {
      split(c, a, " "); split(g, b, " ")
      if (a[2] == "" || b[2] == "") { print "FAIL no figure"; exit }
      da = a[1] - b[1]; if (da < 0) da = -da
      dl = a[2] + 0 == 0 ? (b[2] + 0 == 0 ? 0 : 1) : (a[2] - b[2]) / a[2]; if (dl < 0) dl = -dl
      printf "%s test accuracy %.2f%% against %.2f%%, loss %.4f against %.4f (%.1f%%)\n",
        (da <= 1.0 && dl <= 0.05) ? "PASS" : "FAIL", b[1], a[1], b[2], a[2], 100 * dl }')
  result "${verdict%% *}" "cuda ~ cpu, $name, 1 epoch" "${verdict#* }"
}

step_ring() {
  local f=$work/ring.out rc acc
  capture "$f" "$t_ring" "$build/launch/flodl-launch" --workers 2 -- --device cuda --topk 0.01 \
    --epochs 2
  rc=$?
  acc=$(grep -E "rank 0 summary: " "$f" | sed -n 's/.*test accuracy \([0-9.]*\)%.*/\1/p' | tail -n 1)
  if [ $rc -eq 0 ] && [ -n "$acc" ] && awk -v a="$acc" 'BEGIN { exit !(a > 85) }'; then
    result PASS "2-worker ring, top-k 0.01, cuda" "test accuracy $acc% (> 85%)"
  else
    result FAIL "2-worker ring, top-k 0.01, cuda" "exit $rc, test accuracy ${acc:-none}% (need > 85%)"
  fi
}

# The GPUs of one host as two logical devices at least: distinct GPUs (NCCL), or GPU 0 listed
# twice (device copies) on a machine with one.
hybrid_gpus() {
  local n
  n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
  if [ "${n:-0}" -ge 2 ]; then seq -s, 0 $((n - 1)); else echo 0,0; fi
}

# 2 hosts (2 processes) x the GPUs: the first leg on the devices, after the backward pass and
# overlapped with it, trains the host-memory leg's parameters (1e-4 relative) and says so.
step_hybrid() {
  local f=$work/hybrid.out rc gpus
  gpus=$(hybrid_gpus)
  capture "$f" "$t_hybrid" "$root/scripts/hybrid-check.sh" --build "$build" --device cuda \
    --gpus "$gpus" --work "$work/hybrid" --seconds 120
  rc=$?
  if [ $rc -eq 0 ]; then
    result PASS "2 hosts x --gpus $gpus, first leg" "$(grep -E '^PASS' "$f" | grep -c .) checks: $(grep -o 'first leg [a-z]*' "$f" | sort -u | tr '\n' ' ')"
  else
    result FAIL "2 hosts x --gpus $gpus, first leg" "exit $rc: $(grep -E '^FAIL' "$f" | head -n 2 | tr '\n' ' ')"
  fi
}

step_bench() {
  local f=$work/bench.out rc
  local extra
  read -r -a extra <<<"$bench_flags"
  capture "$f" "$t_bench" "$build/bench/flodl-bench" train --device cuda --cpu-seconds "$cpu_s" \
    "${extra[@]}"
  rc=$?
  if [ $rc -eq 0 ]; then
    result PASS "flodl-bench train --device cuda" "$(grep -E "^flodl cuda / torch cuda" "$f" | tr -s ' ')"
  else
    result FAIL "flodl-bench train --device cuda" "exit $rc"
  fi
  # The two-level exchange on the machine's GPUs: flat and hybrid, dense and top-k, overlapped,
  # the first leg on the devices (scripts/two-level-bench.sh, 2 ranks on 2 loopback addresses).
  local tl=$work/two-level.out gpus
  gpus=$(hybrid_gpus)
  capture "$tl" "$t_bench" "$root/scripts/two-level-bench.sh" --device cuda --gpus "$gpus" \
    --build "$build" --seconds 120 --first-leg devices
  rc=$?
  if [ $rc -eq 0 ]; then
    result PASS "two-level bench, --gpus $gpus" "$(grep -E '^hybrid dense overlap' "$tl" | tr -s ' ')"
  else
    result FAIL "two-level bench, --gpus $gpus" "exit $rc"
  fi
  if grep -q "target met" "$f"; then
    result PASS "throughput: flodl >= torch / 1.2" "$(grep -E "target flodl" "$f" | tr -s ' ')"
  elif grep -q "NOT met" "$f"; then
    result FAIL "throughput: flodl >= torch / 1.2" "$(grep -E "target flodl" "$f" | tr -s ' ')"
  else
    result SKIP "throughput: flodl >= torch / 1.2" "no PyTorch figure (see the bench's torch row)"
  fi
}

# What each check runs, for the SKIP lines.
plan() {
  local w="$build/worker/flodl-worker"
  case "$1" in
    build) echo "build|cmake -S . -B $build -DFLODL_CUDA=on -DFLODL_WERROR=ON -DCMAKE_CUDA_ARCHITECTURES=native && cmake --build" ;;
    ctest) echo "ctest -L gpu|FLODL_REQUIRE_GPU=1 ctest -L '^gpu\$' --output-on-failure (gpu, gpu_topk, dev_*_gpu)" ;;
    memcheck) echo "compute-sanitizer memcheck|CK_FORK=no compute-sanitizer --tool memcheck tests/test_dev_*_gpu" ;;
    racecheck) echo "compute-sanitizer racecheck|CK_FORK=no compute-sanitizer --tool racecheck tests/test_dev_*_gpu" ;;
    parity) echo "cuda = cpu, sgd, 100 steps|$w --device cuda|cpu --train-csv (100 x 64 samples) --optimizer sgd --save, params_diff.py --bound 1e-4"
            echo "cuda ~ cpu, sgd, 1 epoch|the same on the built-in dataset: test accuracy within 1 point, loss within 5%"
            echo "cuda = cpu, adam, 10 steps|$w --device cuda|cpu --train-csv (10 x 64 samples) --optimizer adam --lr 0.001, params_diff.py --bound 1e-3"
            echo "cuda ~ cpu, adam, 1 epoch|the same on the built-in dataset: test accuracy within 1 point, loss within 5%" ;;
    ring) echo "2-worker ring, top-k 0.01, cuda|flodl-launch --workers 2 -- --device cuda --topk 0.01 --epochs 2: > 85%" ;;
    hybrid) echo "2 hosts x GPUs, first leg|scripts/hybrid-check.sh --build $build --device cuda --gpus 0,1,.. (or 0,0): --first-leg devices (NCCL), and with --overlap, = --first-leg host" ;;
    bench) echo "flodl-bench train --device cuda|flodl-bench train --device cuda --cpu-seconds $cpu_s $bench_flags"
           echo "two-level bench|scripts/two-level-bench.sh --device cuda --gpus 0,1,.. (or 0,0) --first-leg devices"
           echo "throughput: flodl >= torch / 1.2|the bench's target line" ;;
  esac
}

main() {
  # The toolkit's home, for nvcc and compute-sanitizer, where PATH lacks it.
  if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH=$PATH:/usr/local/cuda/bin
  fi
  say "gpu-check.sh: $(date -u '+%Y-%m-%d %H:%M:%S UTC') on $(hostname); steps $steps; build $build; log $log"
  gpu_probe
  local s why=""
  [ -n "$nofgpu" ] && why="no GPU: $nofgpu"
  [ $dry -eq 1 ] && why="dry run${why:+; $why}"
  if [ -n "$why" ]; then
    say "$why"
    for s in ${all_steps//,/ }; do
      selected "$s" || continue
      while IFS='|' read -r name cmd; do
        result SKIP "$name" "$why; would run: $cmd"
      done < <(plan "$s")
    done
  else
    # A build from an earlier call (--steps) still needs the libraries' environment.
    selected build || deps_setup >/dev/null || true
    selected build || step_probe
    for s in ${all_steps//,/ }; do
      selected "$s" || continue
      say ""
      say "==== $s"
      case "$s" in
        build) step_build; step_probe ;;
        ctest) step_ctest ;;
        memcheck) step_sanitize memcheck ;;
        racecheck) step_sanitize racecheck ;;
        parity)
          step_parity sgd 100 1e-4 --optimizer sgd
          # Adam divides by the root of the squared gradients: on entries near zero it
          # magnifies the GEMMs' ulps at once (1.2e-4 after 10 steps on an H200).
          step_parity adam 10 1e-3 --optimizer adam --lr 0.001 ;;
        ring) step_ring ;;
        hybrid) step_hybrid ;;
        bench) step_bench ;;
      esac
    done
  fi
  local pass=0 fail=0 skip=0 r
  say ""
  say "==== summary"
  for r in "${results[@]}"; do
    IFS='|' read -r st name detail <<<"$r"
    printf '%-4s  %-34s %s\n' "$st" "$name" "$detail"
    case "$st" in PASS) pass=$((pass + 1)) ;; FAIL) fail=$((fail + 1)) ;; *) skip=$((skip + 1)) ;; esac
  done
  say "gpu-check.sh: $pass passed, $fail failed, $skip skipped"
  if [ $fail -gt 0 ]; then return 1; fi
  if [ -n "$why" ]; then
    if [ $allow -eq 1 ]; then say "(every check skipped, accepted by --allow-no-gpu)"; return 0; fi
    say "gpu-check.sh: $why: every check skipped; --allow-no-gpu accepts that"
    return 2
  fi
  return 0
}

main 2>&1 | tee "$log"
exit "${PIPESTATUS[0]}"
