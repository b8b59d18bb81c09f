#!/usr/bin/env bash
# The test command: builds flodl with -Werror (the CUDA parts forced on when nvcc is on PATH, so
# a .cu that no longer compiles fails here instead of being skipped) and runs every suite with
# CTest; then builds again with AddressSanitizer + UndefinedBehaviorSanitizer (CUDA off) and
# runs the suites there; then ThreadSanitizer over the device suites (label device: the
# conformance suite and the worker suites on simulated GPUs); then, as root, the deployment in
# a container engine (scripts/deploy-test.sh). Prints CTest's summary of each pass; fails if any
# fails.
#   scripts/test.sh            all four passes
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

cuda=()
if command -v nvcc >/dev/null 2>&1; then
  cuda=(-DFLODL_CUDA=on)
fi

status=0
run_pass "tests" "$root/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo "${cuda[@]}" || status=1
if [ $quick -eq 0 ]; then
  # Leak checking is on; ASan's allocator would make ZeroMQ's many threads slow to start, so
  # keep the default options otherwise.
  export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
  run_pass "tests under ASan+UBSan" "$root/build-asan" -DCMAKE_BUILD_TYPE=Debug \
    -DFLODL_SANITIZE=address,undefined -DFLODL_CUDA=off -DFLODL_BUILD_BENCH=OFF || status=1
  # ThreadSanitizer over the device suites: sim runs each stream on a thread of its own, so a
  # missing event between streams, or a host read before a copy ran, is a reported race.
  # Only libzmq's and protobuf-c's uninstrumented hand-offs are suppressed (tests/tsan.supp).
  unset ASAN_OPTIONS UBSAN_OPTIONS
  export TSAN_OPTIONS="suppressions=$root/tests/tsan.supp:halt_on_error=1:second_deadlock_stack=1"
  echo "== device suites under ThreadSanitizer: configure and build ($root/build-tsan)"
  if ! "$root/scripts/build.sh" "$root/build-tsan" -DCMAKE_BUILD_TYPE=Debug \
      -DFLODL_SANITIZE=thread -DFLODL_CUDA=off -DFLODL_BUILD_BENCH=OFF >/dev/null; then
    echo "== device suites under ThreadSanitizer: BUILD FAILED"; status=1
  else
    echo "== device suites under ThreadSanitizer: ctest -L device"
    (cd "$root/build-tsan" && ctest -L device --output-on-failure --timeout 900 -j 2) || status=1
  fi
  # The deployment in a real container engine: the image built, the Compose job run, a worker
  # killed, the job resumed (scripts/deploy-test.sh; it starts and stops an engine if none runs).
  unset TSAN_OPTIONS
  if [ "$(id -u)" -eq 0 ]; then
    echo "== deployment in a container engine: scripts/deploy-test.sh"
    "$root/scripts/deploy-test.sh" || status=1
  else
    echo "== deployment in a container engine: SKIPPED (scripts/deploy-test.sh needs root)"
  fi
fi
exit $status
