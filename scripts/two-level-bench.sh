#!/usr/bin/env bash
# The two-level exchange on one machine, as flodl-bench train's GPU figures ask: 2 ranks
# (flodl-worker processes) that declare two host addresses, 127.0.0.1 and 127.0.0.2 (both this
# machine's loopback, so the bytes between them count as bytes to another host), each with
# several devices, trained on the built-in dataset six ways: flat and hybrid, dense and top-k,
# and hybrid with --overlap. Prints rank 0's steps, accuracy, samples/s, step time, compute,
# exchange, exposed and hidden time per step, MiB sent to the other host per step, and the
# first leg each run took. Loopback is not a network: scripts/netns-train.sh shapes real links
# between network namespaces (root). scripts/gpu-check.sh runs this on the machine's GPUs; the
# test command runs it on sim devices (the figures of sim say nothing about a GPU).
#   scripts/two-level-bench.sh [--device cpu|sim|cuda] [--gpus LIST | --replicas L]
#                              [--layers SIZES] [--batch B] [--epochs E] [--density D]
#                              [--build DIR] [--seconds S] [--first-leg auto|devices|host]
#                              [-- flodl-worker flags]
# Defaults: --device cpu --replicas 2 --layers 64,1024,1024,10 --batch 64 --epochs 1
# --density 0.01 --seconds 600 (each run's bound). --first-leg goes to the hybrid runs only (a
# flat job has no first leg, and the worker refuses the flag there). Exit 0 when every run finished and every
# figure was read, 1 when one was not, 2 for bad arguments.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
me=two-level-bench.sh
device=cpu
gpus=""
replicas=2
layers=64,1024,1024,10
batch=64
epochs=1
density=0.01
build=""
secs=600
first_leg=""
extra=()
die() { echo "$me: $*" >&2; exit 2; }
need_val() { [ $# -ge 2 ] || die "$1 needs a value"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --device) need_val "$@"; device=$2; shift 2 ;;
    --gpus) need_val "$@"; gpus=$2; shift 2 ;;
    --replicas) need_val "$@"; replicas=$2; shift 2 ;;
    --layers) need_val "$@"; layers=$2; shift 2 ;;
    --batch) need_val "$@"; batch=$2; shift 2 ;;
    --epochs) need_val "$@"; epochs=$2; shift 2 ;;
    --density) need_val "$@"; density=$2; shift 2 ;;
    --build) need_val "$@"; build=$2; shift 2 ;;
    --seconds) need_val "$@"; secs=$2; shift 2 ;;
    --first-leg) need_val "$@"; first_leg=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,/^set -uo/{/^set -uo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
is_uint() { case "$1" in ''|*[!0-9]*) return 1 ;; esac; }
case "$device" in cpu|sim|cuda) ;; *) die "--device: '$device' is not one of cpu|sim|cuda" ;; esac
is_uint "$secs" && [ "$secs" -gt 0 ] || die "--seconds: a positive number of seconds"
case "$first_leg" in ''|auto|devices|host) ;; *) die "--first-leg: '$first_leg' is not one of auto|devices|host" ;; esac
if [ "$device" = cpu ]; then
  [ -z "$gpus" ] || die "--gpus: CPU replicas take --replicas"
  is_uint "$replicas" && [ "$replicas" -ge 2 ] && [ "$replicas" -le 64 ] || die "--replicas: 2..64"
  devs=(--cpu-replicas "$replicas")
  ndev=$replicas
else
  [ -n "$gpus" ] || gpus=0,1
  [[ "$gpus" =~ ^[0-9]+(,[0-9]+)+$ ]] || die "--gpus: '$gpus' is not a list of two or more ids"
  devs=(--device "$device" --gpus "$gpus")
  ndev=$(tr ',' '\n' <<<"$gpus" | grep -c .)
fi
if [ -z "$build" ]; then
  build=$("$root/scripts/build.sh" "$root/build") || exit 1
fi
ps_bin=$build/server/flodl-ps
wk_bin=$build/worker/flodl-worker
[ -x "$ps_bin" ] && [ -x "$wk_bin" ] || die "--build $build: no server/flodl-ps or worker/flodl-worker"
tmp=$(mktemp -d /tmp/flodl-two-level-XXXXXX)
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'echo "$me: interrupted" >&2; exit 130' INT TERM
# shellcheck source=summary-lib.sh
. "$root/scripts/summary-lib.sh"

# One job: flodl-ps on a free port, rank r on host 127.0.0.(r + 1); writes figures' fields and
# the first leg to $tmp/NAME.out. Everything is bounded by --seconds. Runs in this shell (not a
# subshell), so that cleanup knows its processes.
run() {  # run NAME [worker flags]
  local name=$1 r rc status=0 wpids=() ps_pid ep=""
  shift
  rm -f "$tmp/ep"
  timeout "$secs" "$ps_bin" --bind tcp://127.0.0.1:0 --world-size 2 --endpoint-file "$tmp/ep" \
    --log-level warn --insecure >"$tmp/$name.ps.log" 2>&1 &
  ps_pid=$!
  pids+=("$ps_pid")
  for _ in $(seq 100); do
    [ -s "$tmp/ep" ] && { ep=$(cat "$tmp/ep"); break; }
    sleep 0.1
  done
  [ -n "$ep" ] || { echo "$me: $name: flodl-ps wrote no endpoint: $(tail -n 3 "$tmp/$name.ps.log")" >&2; return 1; }
  for r in 0 1; do
    timeout "$secs" "$wk_bin" --rank "$r" --world-size 2 --coordinator "$ep" \
      --host "127.0.0.$((r + 1))" --insecure --mode ring "${devs[@]}" --layers "$layers" \
      --batch-size "$batch" --epochs "$epochs" --progress 1000 "$@" "${extra[@]}" \
      >"$tmp/$name.rank$r.log" 2>&1 &
    wpids+=($!)
    pids+=($!)
  done
  for r in 0 1; do
    rc=0
    wait "${wpids[$r]}" || rc=$?
    if [ $rc -ne 0 ]; then
      echo "$me: $name: rank $r exited with status $rc:" >&2
      tail -n 5 "$tmp/$name.rank$r.log" | sed 's/^/  /' >&2
      status=1
    fi
  done
  wait "$ps_pid" 2>/dev/null || true
  pids=()
  [ $status -eq 0 ] || return 1
  local f
  f=$(figures "$tmp/$name.rank0.log") || return 1
  echo "$f $(first_leg "$tmp/$name.rank0.log")" >"$tmp/$name.out"
}

echo "$me: 2 ranks on 127.0.0.1 and 127.0.0.2 (loopback), ${devs[*]}; model $layers, batch" \
  "$batch per device, $epochs epoch(s)"
printf '%-24s %6s %7s %10s %8s %8s %8s %8s %6s %12s  %s\n' run steps "acc %" "samples/s" \
  "step ms" compute "exch ms" exposed hidden "host MiB/st" "first leg"
failed=0
for cfg in "flat dense|--hierarchy flat" "flat top-k $density|--hierarchy flat --topk $density" \
           "hybrid dense|--hierarchy hybrid" "hybrid dense overlap|--hierarchy hybrid --overlap" \
           "hybrid top-k $density|--hierarchy hybrid --topk $density" \
           "hybrid top-k overlap|--hierarchy hybrid --topk $density --overlap"; do
  name=${cfg%%|*}
  read -r -a flags <<<"${cfg#*|}"
  case "$name" in hybrid*) [ -n "$first_leg" ] && flags+=(--first-leg "$first_leg") ;; esac
  if ! run "${name// /-}" "${flags[@]}"; then
    echo "$me: $name failed" >&2
    failed=1
    continue
  fi
  out=$(cat "$tmp/${name// /-}.out")
  read -r steps acc _ sps comp xch exposed hidden remote leg <<<"$out"
  if [ "${steps:-0}" -eq 0 ]; then echo "$me: $name: rank 0 ran no steps" >&2; failed=1; continue; fi
  # The step's time from the job's samples per second: 2 ranks x ndev devices x batch each.
  awk -v n="$name" -v st="$steps" -v a="$acc" -v sp="$sps" -v g="$((2 * ndev * batch))" \
    -v x="$xch" -v e="$exposed" -v h="$hidden" -v m="$remote" -v c="$comp" -v l="$leg" 'BEGIN {
      printf "%-24s %6d %7.2f %10.0f %8.3f %8.3f %8.3f %8.3f %5d%% %12.4f  %s\n", n, st, a, sp,
        (sp > 0 ? 1e3 * g / sp : 0), c, x, e, h, m / st, l }'
done
echo "host MiB/st: MiB rank 0 sent to the other rank's host per step (its devices together);" \
  "step ms: the job's samples per step over its samples/s; compute: the devices' passes per step; exch ms: exchange" \
  "time per step, exposed: of it what the step waited for after the passes, hidden: the rest."
exit $failed
