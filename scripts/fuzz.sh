#!/usr/bin/env bash
# Builds the sparse block decoder's libFuzzer target (clang, -fsanitize=fuzzer,address,undefined;
# tests/fuzz/) and runs it for RUNS inputs (default 10^6) over a copy of the seed corpus,
# printing libFuzzer's progress and final stats. Crash inputs are kept in the build directory.
#   scripts/fuzz.sh [RUNS] [libFuzzer flags...]     build dir: $FLODL_FUZZ_BUILD (build-fuzz)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
runs=${1:-1000000}
[ $# -gt 0 ] && shift
build=${FLODL_FUZZ_BUILD:-$root/build-fuzz}

cmake -S "$root" -B "$build" -DFLODL_CUDA=off -DFLODL_BUILD_BENCH=OFF >/dev/null
cmake --build "$build" --target fuzz_sparse_decode -j "$(nproc)"
bin=$build/tests/fuzz/fuzz_sparse_decode
if [ ! -x "$bin" ]; then
  echo "fuzz.sh: no fuzzer in $build: clang or libclang-rt missing (scripts/install-deps.sh)" >&2
  exit 1
fi

corpus=$(mktemp -d "${TMPDIR:-/tmp}/flodl-fuzz-sparse.XXXXXX")
trap 'rm -rf "$corpus"' EXIT
cp "$root"/tests/fuzz/corpus/sparse/* "$corpus"/
mkdir -p "$build/fuzz-artifacts"

echo "fuzz.sh: $bin, $runs inputs, corpus copied to $corpus" >&2
"$bin" -runs="$runs" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=256 -print_final_stats=1 \
  -artifact_prefix="$build/fuzz-artifacts/" "$@" "$corpus"
