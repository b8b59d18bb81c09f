#!/usr/bin/env bash
# bench/pytorch_bench.py (flodl's DistributedOptimizer, dense and top-k, beside PyTorch DDP with
# gloo) on an emulated 1 Gbit/s Ethernet: N network namespaces, one rank each, on a bridge whose
# every port tc tbf shapes in both directions (netns-lib.sh); flodl-ps in the switch namespace.
# Both sides in plain text (netns-lib.sh's default: the links are private to this machine).
# Needs root and iproute2.
#
#   scripts/netns-pytorch.sh [--ranks N] [--rate RATE] [--build DIR] [-- pytorch_bench.py flags]
#
#   --ranks N     rank namespaces (default 4)         --rate RATE   link rate in tc units (1gbit)
#   --build DIR   a build with server/flodl-ps and libflodl.so (default: build.sh into build/)
#   after --      flags for the script, e.g. -- --steps 10 --warmup 3 --rounds 3
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
me=netns-pytorch.sh

ranks=4
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
    --ranks) need_val "$@"; ranks=$2; shift 2 ;;
    --rate) need_val "$@"; rate=$2; shift 2 ;;
    --build) need_val "$@"; build=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[ "$(id -u)" -eq 0 ] || die "needs root (network namespaces and tc); run it with sudo"
case "$ranks" in ''|*[!0-9]*) die "--ranks: 2..250" ;; esac
[ "$ranks" -ge 2 ] && [ "$ranks" -le 250 ] || die "--ranks: 2..250"
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

netns_setup "$ranks"
echo "network: $ranks ranks on a bridge, tbf $rate both ways on every port"
netns_start_ps "$ps_bin" "$ranks" 900
status=0
wpids=()
for ((r = 0; r < ranks; r++)); do
  ip netns exec "$(ns_of "$r")" env FLODL_RANK="$r" FLODL_WORLD_SIZE="$ranks" \
    FLODL_COORDINATOR="$ps_ep" FLODL_HOST="$(addr "$r")" FLODL_INSECURE=1 \
    FLODL_LIBRARY="$build/libflodl.so" PYTHONPATH="$root/python" GLOO_SOCKET_IFNAME=eth0 \
    timeout 800 /usr/bin/python3 "$root/bench/pytorch_bench.py" "${extra[@]}" \
    > >(sed -u "s/^/[rank $r] /") 2>&1 &
  wpids+=($!)
  pids+=($!)
done
for r in "${!wpids[@]}"; do
  rc=0
  wait "${wpids[$r]}" || rc=$?
  if [ $rc -ne 0 ]; then
    echo "$me: rank $r exited with status $rc" >&2
    status=1
  fi
done
wait "$ps_pid" 2>/dev/null || true
exit $status
