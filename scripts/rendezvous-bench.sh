#!/usr/bin/env bash
# The rendezvous of many ranks on one host: flodl-ps and N drill workers (4 KiB, 2 steps) on
# 127.0.0.1, in plain text and under CurveZMQ; for each, the time from the start of the last
# worker to the coordinator's "job running" line (the last WELCOME sent), the workers' largest
# anonymous memory (their summary line) and whether every rank verified its steps. A Markdown
# table on stdout, progress on stderr; exits 1 when a job did not run.
#
#   scripts/rendezvous-bench.sh [--ranks 64,256,512,1024] [--security insecure,curve]
#                               [--flood N] [--build-dir DIR] [--keep]
#
# --flood N: N idle connections from 127.0.0.1, the ranks' own address (scripts/fault_tool.py
# flood, each opened again a second after flodl-ps closes it), from before the workers start.
# flodl-ps runs with --heartbeat-timeout 20000: a 2-core host starting 1024 processes leaves
# some of them without the CPU for seconds. Every process runs under `timeout -s KILL` and is
# stopped by its PID. --keep leaves the logs.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/scripts/fault-lib.sh"

ranks=64,256,512,1024
security=insecure,curve
flood=0
keep=0
FM_BUILD=${FLODL_BUILD_DIR:-$root/build}
while [ $# -gt 0 ]; do
  case "$1" in
    --ranks) ranks=$2; shift ;;
    --security) security=$2; shift ;;
    --flood) flood=$2; shift ;;
    --build-dir) FM_BUILD=$2; shift ;;
    --keep) keep=1 ;;
    -h | --help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "rendezvous-bench.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
FM_BUILD=$(cd "$FM_BUILD" 2> /dev/null && pwd) ||
  { echo "rendezvous-bench.sh: no build directory (--build-dir DIR)" >&2; exit 2; }
fm_init
FM_KEEP=$keep
FM_RUN=$FM_TMP
WPIDS=()
# The workers' `timeout` passes TERM on to them; KILL would leave them running.
stop_workers() {
  [ ${#WPIDS[@]} = 0 ] && return
  kill -TERM "${WPIDS[@]}" 2> /dev/null
  sleep 1
  kill -KILL "${WPIDS[@]}" 2> /dev/null
  WPIDS=()
}
trap 'stop_workers; fm_cleanup' EXIT

# spawn N SEC...: N drill workers against $FM_EP, each under `timeout -s KILL 300`, output in
# $FM_RUN/w.K.{out,err}; their PIDs in WPIDS; LAST_MS when the last one started.
spawn() {
  local n=$1 r
  shift
  WPIDS=()
  for ((r = 0; r < n; r++)); do
    timeout -s KILL 300 "$WK_BIN" --rank $r --world-size "$n" --coordinator "$FM_EP" \
      --host 127.0.0.1 --mode drill --size 4K --steps 2 --rendezvous-timeout 120000 \
      --timeout 120000 "$@" > "$FM_RUN/w.$r.out" 2> "$FM_RUN/w.$r.err" < /dev/null &
    WPIDS+=($!)
  done
  LAST_MS=$(fm_now_ms)
}

# one N MODE: a job; prints its table row; false when it did not run.
one() {
  local n=$1 mode=$2 sec=(--insecure) ok=0 welcome secs anon p ps
  ps=ps-$n-$mode
  if [ "$mode" = curve ]; then
    [ -d "$FM_TMP/keys" ] || "$KEYGEN_BIN" "$FM_TMP/keys" > /dev/null || return 1
    sec=(--curve-dir "$FM_TMP/keys")
  fi
  FM_RUN=$FM_TMP/$n-$mode
  mkdir -p "$FM_RUN"
  fm_start_ep "$ps" 400 "$FM_RUN/$ps.ep" "$PS_BIN" --bind tcp://127.0.0.1:0 \
    --endpoint-file "$FM_RUN/$ps.ep" --world-size "$n" --heartbeat-timeout 20000 \
    --log-level info "${sec[@]}" || { echo "| $n | $mode | flodl-ps did not start | - | - |"; return 1; }
  if [ "$flood" -gt 0 ]; then
    fm_start flood 400 python3 "$root/scripts/fault_tool.py" flood 127.0.0.1 "${FM_EP##*:}" \
      "$flood" 127.0.0.1
    fm_wait_log 15 flood out "opened $flood"
  fi
  echo "rendezvous-bench: $n ranks, $mode ..." >&2
  spawn "$n" "${sec[@]}"
  for p in "${WPIDS[@]}"; do wait "$p" || ok=1; done
  WPIDS=() # reaped: their PIDs are no longer theirs
  fm_stop_all
  welcome=$(fm_log_ms "$ps" "job 'flodl' running")
  secs=$([ -n "$welcome" ] && awk -v d=$((welcome - LAST_MS)) 'BEGIN { printf "%.2f", d / 1000 }')
  anon=$(cat "$FM_RUN"/w.*.out | sed -n 's/.*summary: 2 steps.*; anonymous memory \([0-9.]*\) MiB.*/\1/p' |
    sort -n | tail -1)
  local done
  done=$(cat "$FM_RUN"/w.*.out | grep -c "summary: 2 steps of 4 KiB verified")
  echo "| $n | $mode$([ "$flood" -gt 0 ] && echo ", $flood idle connections") | ${secs:-none} | $done of $n | ${anon:--} MiB |"
  [ $ok = 0 ] && [ "$done" = "$n" ] && [ -n "$secs" ] || {
    echo "rendezvous-bench: $n ranks, $mode: $done of $n verified; $(grep -h -m1 -i "error\|refused" "$FM_RUN"/w.*.err | head -1 | cut -c 1-200)" >&2
    return 1
  }
}

failed=0
echo "| ranks | security | last start to last WELCOME (s) | verified | largest anonymous memory |"
echo "|---|---|---|---|---|"
IFS=, read -r -a rank_list <<< "$ranks"
IFS=, read -r -a mode_list <<< "$security"
for n in "${rank_list[@]}"; do
  for m in "${mode_list[@]}"; do one "$n" "$m" || failed=1; done
done
exit $failed
