#!/usr/bin/env bash
# The test command: builds flodl (CUDA parts when a toolkit is found) with -Werror and runs every
# suite with CTest, then builds again with AddressSanitizer + UndefinedBehaviorSanitizer (CUDA
# off) and runs the suites there. Prints CTest's summary of each pass; fails if either fails.
#   scripts/test.sh            both passes
#   scripts/test.sh --quick    the plain pass only
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
quick=0
[ "${1:-}" = "--quick" ] && quick=1

run_pass() {
  local name="$1" dir="$2"; shift 2
  echo "== $name: configure and build ($dir)"
  if ! "$root/scripts/build.sh" "$dir" "$@" >/dev/null; then  # build.sh prints the log tail on failure
    echo "== $name: BUILD FAILED"; return 1
  fi
  echo "== $name: ctest"
  (cd "$dir" && ctest --output-on-failure --timeout 600 -j 2)
}

status=0
run_pass "tests" "$root/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo || status=1
if [ $quick -eq 0 ]; then
  # Leak checking is on; ASan's allocator would make ZeroMQ's many threads slow to start, so
  # keep the default options otherwise.
  export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
  run_pass "tests under ASan+UBSan" "$root/build-asan" -DCMAKE_BUILD_TYPE=Debug \
    -DFLODL_SANITIZE=address,undefined -DFLODL_CUDA=off -DFLODL_BUILD_BENCH=OFF || status=1
fi
exit $status
