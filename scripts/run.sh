#!/usr/bin/env bash
# The main job on this machine: installs dependencies, builds, then runs flodl-ps and N
# flodl-worker processes on 127.0.0.1 (default 4) and prints their figures. Until training
# lands, the workers' job is the gradient-exchange drill: every step allreduces a 64 MiB
# gradient and checks every element against the exact expected result.
#   scripts/run.sh [--workers N] [flodl-worker flags, e.g. --size 16M --steps 50 --dtype bf16]
# Output lines are prefixed with [ps] or [rank K]. If one process fails, the others are stopped
# and the script exits non-zero naming it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
workers=4
if [ "${1:-}" = "--workers" ]; then workers="$2"; shift 2; fi
case "$workers" in ''|*[!0-9]*) echo "run.sh: --workers needs a positive integer" >&2; exit 2 ;; esac
[ "$workers" -ge 1 ] || { echo "run.sh: --workers needs a positive integer" >&2; exit 2; }

build=$("$root/scripts/build.sh" "$root/build")
tmp=$(mktemp -d)
pids=()
names=()
# shellcheck disable=SC2317  # called through the EXIT trap
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'echo "run.sh: interrupted" >&2; exit 130' INT TERM

"$build/server/flodl-ps" --bind tcp://127.0.0.1:0 --world-size "$workers" \
  --endpoint-file "$tmp/ep" > >(sed -u 's/^/[ps] /') 2>&1 &
ps_pid=$!
for _ in $(seq 100); do [ -s "$tmp/ep" ] && break; sleep 0.1; done
[ -s "$tmp/ep" ] || { echo "run.sh: flodl-ps did not start" >&2; exit 1; }
ep=$(cat "$tmp/ep")

# With more ranks than CPUs, rank r stays on CPU r mod ncpus: the ranks of a ring then take
# turns on each core instead of migrating (measured ~10-15% faster on 2 cores, 4 ranks).
ncpu=$(nproc)
pin() { if [ "$workers" -gt "$ncpu" ] && command -v taskset >/dev/null; then taskset -c "$(( $1 % ncpu ))"; fi; }
for ((r = 0; r < workers; r++)); do
  $(pin "$r") "$build/worker/flodl-worker" --rank "$r" --world-size "$workers" --coordinator "$ep" "$@" \
    > >(sed -u "s/^/[rank $r] /") 2>&1 &
  pids+=($!)
  names+=("rank $r")
done

status=0
for i in "${!pids[@]}"; do
  rc=0
  wait "${pids[$i]}" || rc=$?
  if [ $rc -ne 0 ] && [ $status -eq 0 ]; then
    echo "run.sh: ${names[$i]} exited with status $rc; stopping the others" >&2
    status=1
    for p in "${pids[@]}" "$ps_pid"; do kill "$p" 2>/dev/null || true; done
  fi
done
rc=0
wait "$ps_pid" || rc=$?
[ $status -eq 0 ] && [ $rc -ne 0 ] && { echo "run.sh: flodl-ps exited with status $rc" >&2; status=1; }
pids=()
exit $status
