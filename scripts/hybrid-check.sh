#!/usr/bin/env bash
# Two hosts (two flodl-worker processes, started by flodl-launch) x several devices each, trained
# three times from the same seed: the first leg inside the host in host memory, on the devices
# after the backward pass, and on the devices bucket by bucket during it (--overlap). Checks that
# each run's summary names the leg it took, and that both runs on the devices train the
# host-memory run's parameters (every entry within --bound, relative: scripts/params_diff.py).
# scripts/gpu-check.sh runs it on cuda (NCCL between distinct GPUs, device copies for one GPU
# listed twice); tests/gpu_scripts.sh on sim (device copies, where the bits are equal).
#   scripts/hybrid-check.sh --build DIR --device sim|cuda --gpus LIST [--leg copy|nccl]
#                           [--work DIR] [--bound B] [--seconds S] [-- WORKER FLAGS...]
# Prints a PASS or FAIL line per check; exit 0 when every check passed, 1 when one failed, 2
# for bad arguments. Each run is bounded by --seconds (default 300).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
me=hybrid-check.sh
build=""
device=""
gpus=""
leg=""
work=""
bound=1e-4
secs=300
usage() { sed -n '2,/^set /{/^set /d;s/^# \{0,1\}//;p}' "$0"; }
die() { echo "$me: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=${2:-}; shift ;;
    --device) device=${2:-}; shift ;;
    --gpus) gpus=${2:-}; shift ;;
    --leg) leg=${2:-}; shift ;;
    --work) work=${2:-}; shift ;;
    --bound) bound=${2:-}; shift ;;
    --seconds) secs=${2:-}; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) usage >&2; die "unknown argument '$1'" ;;
  esac
  shift
done
[ -n "$build" ] || die "--build DIR is needed"
launch=$build/launch/flodl-launch
[ -x "$launch" ] || die "no $launch (build first)"
case "$device" in sim|cuda) ;; *) die "--device: '$device' is not one of sim|cuda" ;; esac
[[ "$gpus" =~ ^[0-9]+(,[0-9]+)+$ ]] || die "--gpus: '$gpus' is not a list of two or more ids"
[[ "$secs" =~ ^[0-9]+$ ]] || die "--seconds: '$secs' is not a number"
# The leg the devices take: copies on sim and for a GPU listed twice, NCCL between distinct GPUs.
if [ -z "$leg" ]; then
  leg=nccl
  if [ "$device" = sim ] || [ -n "$(tr ',' '\n' <<<"$gpus" | sort | uniq -d)" ]; then leg=copy; fi
fi
case "$leg" in copy|nccl) ;; *) die "--leg: '$leg' is not one of copy|nccl" ;; esac
if [ -z "$work" ]; then
  work=$(mktemp -d /tmp/flodl-hybrid-check-XXXXXX)
  trap 'rm -rf "$work"' EXIT
fi
mkdir -p "$work" || die "cannot make $work"
py=/usr/bin/python3
[ -x "$py" ] || py=python3

fails=0
result() { printf '%-4s  %s\n' "$1" "$2"; [ "$1" = PASS ] || fails=$((fails + 1)); }

# NAME LEG-EXPECTED WORKER-FLAGS...: one job; its summary must name the leg.
job() {
  local name=$1 want=$2; shift 2
  local out=$work/$name.out
  rm -f "$work/$name.safetensors"
  echo "\$ flodl-launch --workers 2 -- --device $device --gpus $gpus $* --save $work/$name.safetensors"
  timeout --kill-after=10 "$secs" "$launch" --workers 2 -- --device "$device" --gpus "$gpus" \
    --epochs 1 --seed 1 "$@" --save "$work/$name.safetensors" >"$out" 2>&1
  local rc=$?
  grep -E "rank 0 (summary|first leg)" "$out"
  if [ $rc -ne 0 ]; then
    tail -n 20 "$out"
    result FAIL "$name: exit $rc"
    return 1
  fi
  if ! grep -q "rank 0 first leg inside the host: $want" "$out"; then
    result FAIL "$name: the summary does not say 'first leg inside the host: $want'"
    return 1
  fi
  result PASS "$name: 2 hosts x $gpus, first leg $want"
}

# REF NAME: NAME's parameters against REF's.
same() {
  local out rc
  out=$("$py" "$root/scripts/params_diff.py" "$work/$1.safetensors" "$work/$2.safetensors" \
        --bound "$bound" 2>&1)
  rc=$?
  echo "$out"
  if [ $rc -eq 0 ]; then result PASS "$2 = $1 (${out#params_diff: })"
  else result FAIL "$2 differs from $1 (${out#params_diff: })"; fi
}

ok_host=0
ok_dev=0
ok_ovl=0
job host "host, after" --first-leg host "$@" && ok_host=1
job devices "$leg, after" --first-leg devices "$@" && ok_dev=1
job devices-overlap "$leg, bucket by bucket" --first-leg devices --overlap "$@" && ok_ovl=1
[ $ok_host -eq 1 ] && [ $ok_dev -eq 1 ] && same host devices
[ $ok_host -eq 1 ] && [ $ok_ovl -eq 1 ] && same host devices-overlap
echo "$me: $fails failed"
[ $fails -eq 0 ]
