#!/usr/bin/env bash
# bench/pytorch_bench.py (flodl's DistributedOptimizer, dense and top-k, beside PyTorch DDP with
# gloo) on an emulated 1 Gbit/s Ethernet: network namespaces ("hosts") on a bridge whose every
# port tc tbf shapes in both directions (netns-lib.sh); flodl-ps in the switch namespace. By
# default N namespaces of one rank each; with --hosts H --nproc-per-host N, H namespaces of N
# ranks each (ranks h*N..h*N+N-1 in host h, all with FLODL_HOST the host's address, so flodl's
# two-level exchange sees H hosts and the ranks of one host talk inside its namespace, as gloo's
# do: GLOO_SOCKET_IFNAME=eth0 gives them the host's address, which the kernel routes over the
# namespace's loopback). The script counts each row's bytes on eth0 (--host-if eth0). Both sides
# in plain text (netns-lib.sh's default: the links are private to this machine). Needs root and
# iproute2; every process is bounded by --timeout and stopped, by PID, with the namespaces, on
# exit or failure.
#
#   scripts/netns-pytorch.sh [--ranks N | --hosts H --nproc-per-host N] [--rate RATE]
#                            [--timeout S] [--build DIR] [-- pytorch_bench.py flags]
#
#   --ranks N     rank namespaces, one rank each (default 4)
#   --hosts H --nproc-per-host N   H host namespaces of N ranks each (H*N ranks)
#   --rate RATE   link rate in tc units (1gbit)   --timeout S   seconds for each rank (800)
#   --build DIR   a build with server/flodl-ps and libflodl.so (default: build.sh into build/)
#   after --      flags for the script, e.g. -- --steps 10 --warmup 3 --rounds 3; for 2 hosts of
#                 2: --hosts 2 --nproc-per-host 2 -- --hierarchy hybrid --flat-dense
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
me=netns-pytorch.sh

ranks=4
ranks_given=0
hosts=0
nproc=0
secs=800
rate=1gbit
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
    --ranks) need_val "$@"; ranks=$2; ranks_given=1; shift 2 ;;
    --hosts) need_val "$@"; hosts=$2; shift 2 ;;
    --nproc-per-host) need_val "$@"; nproc=$2; shift 2 ;;
    --timeout) need_val "$@"; secs=$2; shift 2 ;;
    --rate) need_val "$@"; rate=$2; shift 2 ;;
    --build) need_val "$@"; build=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[ "$(id -u)" -eq 0 ] || die "needs root (network namespaces and tc); run it with sudo"
num() { case "$2" in ''|*[!0-9]*) die "$1: $3" ;; esac; }
num --ranks "$ranks" "2..250"
num --hosts "$hosts" "2..250"
num --nproc-per-host "$nproc" "1..16"
num --timeout "$secs" "seconds, 10..3600"
[ "$secs" -ge 10 ] && [ "$secs" -le 3600 ] || die "--timeout: seconds, 10..3600"
if [ "$hosts" -gt 0 ] || [ "$nproc" -gt 0 ]; then
  [ "$ranks_given" -eq 0 ] || die "--ranks or --hosts/--nproc-per-host: choose one"
  [ "$hosts" -ge 2 ] && [ "$hosts" -le 250 ] || die "--hosts: 2..250, with --nproc-per-host"
  [ "$nproc" -ge 1 ] && [ "$nproc" -le 16 ] || die "--nproc-per-host: 1..16, with --hosts"
  ranks=$((hosts * nproc))
else
  hosts=$ranks
  nproc=1
fi
[ "$ranks" -ge 2 ] && [ "$ranks" -le 250 ] || die "--ranks: 2..250 (ranks in all)"
for t in ip tc timeout sed mktemp; do command -v "$t" >/dev/null || die "'$t' not found"; done
/usr/bin/python3 -c 'import torch' 2>/dev/null || die "/usr/bin/python3 cannot import torch"

if [ -z "$build" ]; then
  build=$("$root/scripts/build.sh" "$root/build")
fi
ps_bin="$build/server/flodl-ps"
[ -x "$ps_bin" ] && [ -f "$build/libflodl.so" ] || die "--build $build: no server/flodl-ps or libflodl.so"

pfx="netnsp$$"
tmp=$(mktemp -d)
# shellcheck source=netns-lib.sh
. "$root/scripts/netns-lib.sh"
trap netns_cleanup EXIT
trap 'echo "$me: interrupted" >&2; exit 130' INT TERM

netns_setup "$hosts"
if [ "$nproc" -eq 1 ]; then
  echo "network: $ranks ranks on a bridge, tbf $rate both ways on every port"
else
  echo "network: $hosts hosts of $nproc ranks on a bridge, tbf $rate both ways on every port"
fi
netns_start_ps "$ps_bin" "$ranks" $((secs + 100))
status=0
wpids=()
for ((r = 0; r < ranks; r++)); do
  h=$((r / nproc))
  ip netns exec "$(ns_of "$h")" env FLODL_RANK="$r" FLODL_WORLD_SIZE="$ranks" \
    FLODL_COORDINATOR="$ps_ep" FLODL_HOST="$(addr "$h")" FLODL_INSECURE=1 \
    LOCAL_RANK=$((r % nproc)) LOCAL_WORLD_SIZE="$nproc" \
    FLODL_LIBRARY="$build/libflodl.so" PYTHONPATH="$root/python" GLOO_SOCKET_IFNAME=eth0 \
    timeout "$secs" /usr/bin/python3 "$root/bench/pytorch_bench.py" --host-if eth0 \
    "${extra[@]}" > >(sed -u "s/^/[rank $r] /") 2>&1 &
  wpids+=($!)
  pids+=($!)
done
# The first rank to fail stops the others (by PID) rather than leaving them to their timeout.
left=${#wpids[@]}
done_r=()
while [ "$left" -gt 0 ]; do
  for r in "${!wpids[@]}"; do
    if [ -n "${done_r[r]:-}" ] || kill -0 "${wpids[$r]}" 2>/dev/null; then continue; fi
    rc=0
    wait "${wpids[$r]}" || rc=$?
    done_r[r]=1
    left=$((left - 1))
    if [ $rc -ne 0 ]; then
      echo "$me: rank $r exited with status $rc" >&2
      [ $status -ne 0 ] || for p in "${wpids[@]}"; do kill "$p" 2>/dev/null || true; done
      status=1
    fi
  done
  [ "$left" -eq 0 ] || sleep 0.5
done
[ $status -eq 0 ] || kill "$ps_pid" 2>/dev/null || true
wait "$ps_pid" 2>/dev/null || true
exit $status
