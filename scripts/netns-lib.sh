# Network namespaces for the emulated-Ethernet benchmarks (sourced by netns-bench.sh and
# netns-train.sh; not run on its own). N "hosts" in namespaces <pfx>-r0.. plugged into bridge
# br0 of a switch namespace <pfx>-sw (10.77.0.254/24; host K at 10.77.0.<K+1>), every port
# shaped by tc tbf in both directions (this kernel has no netem). Nothing is created in the root
# namespace. The caller sets: pfx, rate, burst, latency, overhead, offload, tmp; and calls
# netns_cleanup on exit (it stops the processes in pids, deletes the namespaces and tmp).

nss=()
pids=()
# Plain text unless the caller sets security=(--curve-dir DIR): the benchmarks compare
# exchanges, and the emulated links are private to this machine.
if [ -z "${security+x}" ]; then security=(--insecure); fi

netns_cleanup() {
  local p ns
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  for ns in "${nss[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
  rm -rf "$tmp"
}

addr() { echo "10.77.0.$(($1 + 1))"; }
ns_of() { echo "$pfx-r$1"; }
sw_ns() { echo "$pfx-sw"; }

shape() {  # shape NS DEV: tbf on DEV's egress, offloads off first when asked
  if [ "$offload" = off ]; then
    ip netns exec "$1" ethtool -K "$2" gso off tso off gro off >/dev/null
  fi
  ip netns exec "$1" tc qdisc add dev "$2" root tbf rate "$rate" burst "$burst" \
    latency "$latency" overhead "$overhead"
}

netns_setup() {  # netns_setup N: the switch and N hosts
  local n=$1 r ns sw
  sw=$(sw_ns)
  ip netns add "$sw"
  nss+=("$sw")
  ip -n "$sw" link set lo up
  ip -n "$sw" link add br0 type bridge
  ip -n "$sw" addr add 10.77.0.254/24 dev br0
  ip -n "$sw" link set br0 up
  for ((r = 0; r < n; r++)); do
    ns=$(ns_of "$r")
    ip netns add "$ns"
    nss+=("$ns")
    ip -n "$ns" link set lo up
    ip -n "$sw" link add "p$r" type veth peer name eth0 netns "$ns"
    ip -n "$sw" link set "p$r" master br0
    ip -n "$sw" link set "p$r" up
    ip -n "$ns" addr add "$(addr "$r")/24" dev eth0
    ip -n "$ns" link set eth0 up
    shape "$ns" eth0
    shape "$sw" "p$r"
  done
}

# Starts flodl-ps for a world of N in the switch namespace (its output prefixed [ps]) and sets
# ps_pid and ps_ep. netns_start_ps PS_BIN N TIMEOUT_S [flodl-ps flags]
netns_start_ps() {
  local bin=$1 n=$2 secs=$3
  shift 3
  rm -f "$tmp/ep"
  ip netns exec "$(sw_ns)" timeout "$secs" "$bin" --bind tcp://10.77.0.254:0 \
    --world-size "$n" --endpoint-file "$tmp/ep" --log-level warn "${security[@]}" "$@" \
    > >(sed -u 's/^/[ps] /') 2>&1 &
  ps_pid=$!
  pids+=("$ps_pid")
  for _ in $(seq 100); do [ -s "$tmp/ep" ] && break; sleep 0.1; done
  [ -s "$tmp/ep" ] || { echo "flodl-ps did not start" >&2; return 1; }
  ps_ep=$(cat "$tmp/ep")
}
