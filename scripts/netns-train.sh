#!/usr/bin/env bash
# Training across emulated hosts: 2 hosts (network namespaces, links shaped by tc tbf to 1
# Gbit/s in both directions, see netns-lib.sh) x 2 CPU replicas each, on the built-in dataset,
# with three exchanges: flat dense (every device a ring member), hybrid dense (reduce-scatter
# inside the host, each device's shard across hosts on its own connection, all-gather inside),
# and hybrid top-k 1% with error feedback. Reports rank 0's step time, samples/s and bytes sent
# to the other host per step, and the ratios the issue asks for. Needs root and iproute2.
#
#   scripts/netns-train.sh [--hosts N] [--replicas L] [--rate RATE] [--layers SIZES]
#                          [--batch B] [--epochs E] [--density D] [--build DIR]
#                          [-- flodl-worker flags]
#
#   --hosts N      host namespaces (default 2)        --replicas L  CPU replicas per host (2)
#   --rate RATE    link rate in tc units (1gbit)      --layers      model (64,1024,1024,10)
#   --batch B      per device (64)                    --epochs E    (1)
#   --density D    top-k density of the third run (0.01)
#   --build DIR    a build with server/flodl-ps and worker/flodl-worker (default: build.sh)
#
# Targets: hybrid sends at most 1/L of the flat bytes across hosts, and hybrid top-k
# at least 20x fewer than flat dense. A flat ring ordered by host crosses hosts on one link per
# host (2(NL-1)/(NL) of the model per step); hybrid's L columns carry 2(N-1)/N of it together.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
me=netns-train.sh

hosts=2
replicas=2
rate=1gbit
layers=64,1024,1024,10
batch=64
epochs=1
density=0.01
build=""
burst=128kb
latency=20ms
overhead=0
offload=on
extra=()

die() { echo "$me: $*" >&2; exit 2; }
need_val() { [ $# -ge 2 ] || die "$1 needs a value"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --hosts) need_val "$@"; hosts=$2; shift 2 ;;
    --replicas) need_val "$@"; replicas=$2; shift 2 ;;
    --rate) need_val "$@"; rate=$2; shift 2 ;;
    --layers) need_val "$@"; layers=$2; shift 2 ;;
    --batch) need_val "$@"; batch=$2; shift 2 ;;
    --epochs) need_val "$@"; epochs=$2; shift 2 ;;
    --density) need_val "$@"; density=$2; shift 2 ;;
    --build) need_val "$@"; build=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[ "$(id -u)" -eq 0 ] || die "needs root (network namespaces and tc); run it with sudo"
is_uint() { case "$1" in ''|*[!0-9]*) return 1 ;; esac; }
if ! is_uint "$hosts" || [ "$hosts" -lt 2 ] || [ "$hosts" -gt 250 ]; then die "--hosts: 2..250"; fi
if ! is_uint "$replicas" || [ "$replicas" -lt 1 ] || [ "$replicas" -gt 64 ]; then
  die "--replicas: 1..64"
fi
for t in ip tc timeout awk sed tee mktemp; do command -v "$t" >/dev/null || die "'$t' not found"; done

if [ -z "$build" ]; then
  build=$("$root/scripts/build.sh" "$root/build")
fi
ps_bin="$build/server/flodl-ps"
wk_bin="$build/worker/flodl-worker"
[ -x "$ps_bin" ] && [ -x "$wk_bin" ] || die "--build $build: no server/flodl-ps or worker/flodl-worker"

pfx="netnst$$"
tmp=$(mktemp -d)
# shellcheck source=netns-lib.sh
. "$root/scripts/netns-lib.sh"
trap netns_cleanup EXIT
trap 'echo "$me: interrupted" >&2; exit 130' INT TERM

netns_setup "$hosts"
echo "network: $hosts hosts on a bridge, tbf $rate both ways on every port; $replicas CPU" \
  "replicas per host; model $layers, batch $batch per device, $epochs epoch(s)"

# shellcheck source=summary-lib.sh
. "$root/scripts/summary-lib.sh"

# One training run: prints figures' fields. flodl-ps's output goes to its own log.
run() {  # run NAME [worker flags]
  local name=$1 r rc status=0 wpids=()
  shift
  netns_start_ps "$ps_bin" "$hosts" 900 >"$tmp/$name.ps.log" || return 1
  for ((r = 0; r < hosts; r++)); do
    ip netns exec "$(ns_of "$r")" timeout 800 "$wk_bin" --rank "$r" --world-size "$hosts" \
      --coordinator "$ps_ep" --host "$(addr "$r")" "${security[@]}" --mode ring --cpu-replicas "$replicas" \
      --layers "$layers" --batch-size "$batch" --epochs "$epochs" --progress 1000 \
      "$@" "${extra[@]}" >"$tmp/$name.rank$r.log" 2>&1 &
    wpids+=($!)
    pids+=($!)
  done
  for r in "${!wpids[@]}"; do
    rc=0
    wait "${wpids[$r]}" || rc=$?
    if [ $rc -ne 0 ]; then
      echo "$me: $name: rank $r exited with status $rc:" >&2
      sed 's/^/  /' "$tmp/$name.rank$r.log" | tail -5 >&2
      status=1
      for p in "${wpids[@]}" "$ps_pid"; do kill "$p" 2>/dev/null || true; done
    fi
  done
  wait "$ps_pid" 2>/dev/null || true
  pids=()
  [ $status -eq 0 ] || return 1
  figures "$tmp/$name.rank0.log"
}

printf '%-22s %6s %7s %10s %8s %9s %9s %9s %7s %15s %8s\n' run steps "acc %" "samples/s" \
  "step ms" "compute" "exch ms" "exposed" "hidden" "to host MiB/st" "vs flat"
flat_b=""
for cfg in "flat dense|--hierarchy flat" "hybrid dense|--hierarchy hybrid" \
           "hybrid top-k $density|--hierarchy hybrid --topk $density"; do
  name=${cfg%%|*}
  read -r -a flags <<<"${cfg#*|}"
  out=$(run "${name// /-}" "${flags[@]}") || { echo "$me: $name failed" >&2; exit 1; }
  read -r steps acc secs sps comp xch exposed hidden remote <<<"$out"
  if [ "${steps:-0}" -eq 0 ]; then echo "$me: $name: rank 0 ran no steps" >&2; exit 1; fi
  per=$(awk -v m="$remote" -v s="$steps" 'BEGIN { printf "%.4f", m / s }')
  [ -z "$flat_b" ] && flat_b=$per
  awk -v n="$name" -v st="$steps" -v a="$acc" -v sp="$sps" -v se="$secs" -v x="$xch" \
    -v e="$exposed" -v h="$hidden" -v p="$per" -v f="$flat_b" -v c="$comp" 'BEGIN {
      printf "%-22s %6d %7.2f %10.0f %8.2f %9.2f %9.2f %9.2f %6d%% %15.4f %7.1fx\n", n, st, a,
        sp, 1e3 * se / st, c, x, e, h, p, (p > 0 ? f / p : 0) }'
done
echo "to host MiB/st: MiB rank 0 sent to the other hosts per step (its $replicas devices" \
  "together); vs flat: how many times fewer than flat dense. step ms: training seconds / steps;" \
  "compute: the devices' passes per step; exch ms: exchange time per step, exposed: of it what" \
  "the step waited for after the passes, hidden: the rest."
