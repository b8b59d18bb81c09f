#!/usr/bin/env bash
# The fault matrix: each row drives the built binaries (flodl-ps, flodl-worker,
# flodl-keygen) through one failure on 127.0.0.1, or in network namespaces of its own, and
# gives PASS, FAIL (the reason, one line) or SKIP (why) with a measured figure: a Markdown
# table on stdout, progress on stderr. Exits 1 when a row fails.
#
#   scripts/fault-matrix.sh [--full] [--build-dir DIR] [--rows ID,ID...] [--keep]
#
# Default: the rows that take under a minute (a few minutes in all on 2 cores). --full adds
# the soak (FM_SOAK_S s, default 600), 20 own-error runs instead of 3, 10 kills during
# checkpoint writes instead of 3, the PS-resume run's accuracy against a run without the
# kill, and 512 ranks beside a flood. Build directory: --build-dir, FLODL_BUILD_DIR or build/.
# Row ids: kill stop partition psresume ckptkill mismatch ownerror duprank flood health scale
# takeover badfiles soak. --keep: the logs.
# Every process runs under a deadline and is stopped by its own PID on every path.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/scripts/fault-lib.sh"

FM_FULL=0
FM_BUILD=${FLODL_BUILD_DIR:-$root/build}
only=""
while [ $# -gt 0 ]; do
  case "$1" in
    --full) FM_FULL=1 ;;
    --build-dir) FM_BUILD=$2; shift ;;
    --rows) only=$2; shift ;;
    --keep) FM_KEEP=1 ;;
    -h | --help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "fault-matrix.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
FM_BUILD=$(cd "$FM_BUILD" 2> /dev/null && pwd) ||
  { echo "fault-matrix.sh: no build directory (--build-dir DIR)" >&2; exit 2; }
for b in server/flodl-ps worker/flodl-worker server/flodl-keygen; do
  [ -x "$FM_BUILD/$b" ] || { echo "fault-matrix.sh: $FM_BUILD/$b is not built" >&2; exit 2; }
done
TOOL=("${PYTHON:-python3}" "$root/scripts/fault_tool.py")
# need_tool: the rows with raw clients or made-up files skip without python3.
need_tool() { command -v "${TOOL[0]}" > /dev/null || { fm_skip "needs ${TOOL[0]} (scripts/fault_tool.py)"; return 1; }; }
HB=2000        # flodl-ps --heartbeat-timeout in every row
BOUND=$((HB + 2000)) # a death must be known everywhere within this
fm_init

# ---- rows: each one function, setting FM_RESULT and FM_FIGURE ----

# A rank SIGKILLed while the ring allreduces (a 1.1 M-parameter model): the others and flodl-ps
# end, naming it, within the heartbeat timeout and a margin.
row_kill() {
  need "flodl-ps did not start" fm_ps ps 60 3 --log-level info || return
  local r t0
  for r in 0 1 2; do fm_worker w$r 60 $r 3 --epochs 1000 --quiet --layers 64,1024,1024,10; done
  need "the job did not start: $(fm_tail ps)" fm_wait_log 30 ps err "job 'flodl' running" || return
  sleep 1
  t0=$(fm_now_ms)
  fm_signal KILL w1
  need "still running 20 s after rank 1 was killed" fm_wait_ended 20 ps w0 w2 || return
  local dps=$(($(fm_end_ms ps) - t0)) d0=$(($(fm_end_ms w0) - t0)) d2=$(($(fm_end_ms w2) - t0))
  fm_figure "flodl-ps out ${dps} ms after the kill, ranks 0 and 2 ${d0}/${d2} ms (heartbeat timeout $HB ms)"
  need "flodl-ps exited $(fm_code ps), want 1" [ "$(fm_code ps)" = 1 ] || return
  need "no outcome line naming rank 1 dead: $(fm_tail ps)" grep -q "outcome: .*rank 1 dead" "$FM_RUN/ps.err" || return
  for r in 0 2; do
    need "rank $r exited $(fm_code w$r), want 1: $(fm_tail w$r)" [ "$(fm_code w$r)" = 1 ] || return
    need "rank $r does not name rank 1 in an allreduce: $(fm_tail w$r)" \
      grep -q "allreduce.*rank 1" "$FM_RUN/w$r.err" || return
  done
  local worst
  worst=$(max $dps $d0 $d2)
  need "the last process ended ${worst} ms after the kill (bound $BOUND ms)" [ "$worst" -le $BOUND ] || return
  fm_pass
}

# A rank frozen (SIGSTOP) past the heartbeat timeout: declared dead, the others end; woken
# (SIGCONT), it says so and exits 1 instead of registering again.
row_stop() {
  need "flodl-ps did not start" fm_ps ps 60 2 --log-level info || return
  fm_worker w0 60 0 2 --epochs 1000 --quiet
  fm_worker w1 60 1 2 --epochs 1000 --quiet
  need "the job did not start: $(fm_tail ps)" fm_wait_log 30 ps err "job 'flodl' running" || return
  sleep 0.5
  local t0 t1
  t0=$(fm_now_ms)
  fm_signal STOP w1
  need "flodl-ps or rank 0 still running 20 s after rank 1 froze" fm_wait_ended 20 ps w0 || return
  t1=$(fm_now_ms)
  fm_signal CONT w1
  need "rank 1 still running 15 s after it woke: $(fm_tail w1)" fm_wait_ended 15 w1 || return
  local dps=$(($(fm_end_ms ps) - t0)) d0=$(($(fm_end_ms w0) - t0)) d1=$(($(fm_end_ms w1) - t1))
  fm_figure "flodl-ps out ${dps} ms after the stop, rank 0 ${d0} ms (heartbeat timeout $HB ms); rank 1 out ${d1} ms after waking"
  need "flodl-ps exited $(fm_code ps), want 1" [ "$(fm_code ps)" = 1 ] || return
  need "rank 0 exited $(fm_code w0), want 1" [ "$(fm_code w0)" = 1 ] || return
  need "rank 1 exited $(fm_code w1) on waking, want 1: $(fm_tail w1)" [ "$(fm_code w1)" = 1 ] || return
  need "rank 1 does not say it was declared dead: $(fm_tail w1)" grep -q "declared dead" "$FM_RUN/w1.err" || return
  need "rank 1 tried to register again" not grep -q "registering again" "$FM_RUN/w1.err" || return
  need "flodl-ps ended ${dps} ms after the stop (bound $BOUND ms)" [ $dps -le $BOUND ] || return
  need "rank 1 took ${d1} ms to exit after waking (bound 5000 ms)" [ $d1 -le 5000 ] || return
  fm_pass
}

# Rank 1's link pulled (ip link set down) in a network of namespaces: flodl-ps in a switch
# namespace, each of 3 ranks in its own, a bridge between them. Namespaces of its own only
# (named after this process), with addresses that exist only inside them.
row_partition() {
  [ "$(id -u)" -eq 0 ] || { fm_skip "needs root for network namespaces"; return; }
  command -v ip > /dev/null || { fm_skip "needs iproute2 (ip)"; return; }
  local pfx="flfm$$" sw="flfm$$-sw" r ns
  ip netns add "$sw" 2> /dev/null || { fm_skip "ip netns add failed: no network namespaces here"; return; }
  FM_NETNS+=("$sw")
  ip -n "$sw" link set lo up
  ip -n "$sw" link add br0 type bridge
  ip -n "$sw" addr add 10.79.0.254/24 dev br0
  ip -n "$sw" link set br0 up
  for r in 0 1 2; do
    ns="$pfx-r$r"
    need "ip netns add $ns failed" ip netns add "$ns" || return
    FM_NETNS+=("$ns")
    ip -n "$ns" link set lo up
    ip -n "$sw" link add "p$r" type veth peer name eth0 netns "$ns"
    ip -n "$sw" link set "p$r" master br0
    ip -n "$sw" link set "p$r" up
    ip -n "$ns" addr add "10.79.0.$((r + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
  done
  need "flodl-ps did not start: $(fm_tail ps)" fm_start_ep ps 60 "$FM_RUN/ps.ep" \
    ip netns exec "$sw" "$PS_BIN" --bind tcp://10.79.0.254:0 --endpoint-file "$FM_RUN/ps.ep" \
    --world-size 3 --heartbeat-timeout $HB --insecure --log-level info || return
  for r in 0 1 2; do
    fm_start w$r 60 ip netns exec "$pfx-r$r" "$WK_BIN" --rank $r --world-size 3 \
      --coordinator "$FM_EP" --host "10.79.0.$((r + 1))" --insecure --epochs 1000 --quiet
  done
  need "the job did not start: $(fm_tail ps)" fm_wait_log 30 ps err "job 'flodl' running" || return
  sleep 0.5
  local t0 w1note
  t0=$(fm_now_ms)
  ip -n "$sw" link set p1 down
  need "flodl-ps or ranks 0 and 2 still running 20 s after rank 1's link went down" \
    fm_wait_ended 20 ps w0 w2 || return
  local dps=$(($(fm_end_ms ps) - t0)) d0=$(($(fm_end_ms w0) - t0)) d2=$(($(fm_end_ms w2) - t0))
  # Rank 1, cut off, hears nobody: it must give up on its own (the coordinator silent past the
  # heartbeat timeout). Its link comes back only if it has not after 10 s.
  if fm_wait_ended 10 w1; then
    w1note="rank 1, cut off, out $(($(fm_end_ms w1) - t0)) ms after the link went down"
  else
    ip -n "$sw" link set p1 up
    need "rank 1 still running 10 s after its link came back" fm_wait_ended 10 w1 || return
    w1note="rank 1 out only after its link came back"
  fi
  fm_figure "flodl-ps out ${dps} ms after the link went down, ranks 0 and 2 ${d0}/${d2} ms (heartbeat timeout $HB ms); $w1note"
  need "flodl-ps exited $(fm_code ps), want 1" [ "$(fm_code ps)" = 1 ] || return
  need "no outcome line naming rank 1 dead: $(fm_tail ps)" grep -q "outcome: .*rank 1 dead" "$FM_RUN/ps.err" || return
  for r in 0 2; do
    need "rank $r exited $(fm_code w$r), want 1: $(fm_tail w$r)" [ "$(fm_code w$r)" = 1 ] || return
    need "rank $r does not name rank 1: $(fm_tail w$r)" grep -q "rank 1" "$FM_RUN/w$r.err" || return
  done
  need "rank 1 exited $(fm_code w1), want 1: $(fm_tail w1)" [ "$(fm_code w1)" = 1 ] || return
  need "rank 1 does not say it lost the coordinator: $(fm_tail w1)" \
    grep -q "coordinator.*silent" "$FM_RUN/w1.err" || return
  local worst
  worst=$(max $dps $d0 $d2)
  need "the last process ended ${worst} ms after the link went down (bound $BOUND ms)" [ "$worst" -le $BOUND ] || return
  fm_pass
}

# start_ps_ckpt NAME PORT DIR EVERY [FLAGS...]: flodl-ps for 2 workers, 2 shards, on PORT (0:
# any; FM_EP says which), checkpoints in DIR every EVERY steps, resuming from them.
start_ps_ckpt() {
  local name=$1 port=$2 dir=$3 every=$4
  shift 4
  fm_start_ep "$name" 120 "$FM_RUN/$name.ep" "$PS_BIN" --bind "tcp://127.0.0.1:$port" \
    --endpoint-file "$FM_RUN/$name.ep" --world-size 2 --shards 2 --host 127.0.0.1 \
    --heartbeat-timeout $HB --insecure --checkpoint-dir "$dir" --checkpoint-every "$every" \
    --resume --lr 0.05 --momentum 0.9 "$@"
}

# ps_workers EPOCHS [FLAGS...]: ranks 0 and 1 in --mode ps against $FM_EP, waiting up to a
# minute for a restarted flodl-ps.
ps_workers() {
  local epochs=$1 r
  shift
  for r in 0 1; do
    fm_worker w$r 180 $r 2 --mode ps --epochs "$epochs" --reconnect-timeout 60000 \
      --rendezvous-timeout 30000 --timeout 30000 --progress 1000 "$@"
  done
}

final_acc() { fm_out "$1" | sed -n 's/.*summary:.*test accuracy \([0-9.]*\)%.*/\1/p' | tail -1; }

# flodl-ps SIGKILLed mid-training (checkpoints every 100 steps) and started again with the same
# command line: the workers rejoin and finish from the newest checkpoint, losing only the steps
# since it. --full: the final accuracy against a run without the kill.
row_psresume() {
  local dir="$FM_RUN/ckpt" port step_at_kill resumed acc
  mkdir -p "$dir"
  need "flodl-ps did not start: $(fm_tail ps)" start_ps_ckpt ps 0 "$dir" 100 --log-level info || return
  port=${FM_EP##*:}
  ps_workers 3 --metrics "$FM_RUN/m.jsonl" # rank R writes m.jsonl.rankR, a line a step
  need "no checkpoint of step 300 before the kill: $(fm_tail ps)" \
    fm_wait_log 60 ps err "checkpoint of step 300 written" 2 || return
  sleep 0.2
  fm_signal KILL ps
  need "flodl-ps survived SIGKILL" fm_wait_ended 5 ps || return
  need "flodl-ps did not start again on port $port: $(fm_tail ps2)" \
    start_ps_ckpt ps2 "$port" "$dir" 100 --log-level info || return
  need "the job did not finish after the restart: $(fm_tail w0)" fm_wait_ended 150 ps2 w0 w1 || return
  for n in ps2 w0 w1; do
    need "$n exited $(fm_code $n) after the restart: $(fm_tail $n)" [ "$(fm_code $n)" = 0 ] || return
  done
  resumed=$(fm_out w0 | sed -n 's/.*going on from step \([0-9]*\).*/\1/p' | head -1)
  need "rank 0 never said where it went on from: $(fm_tail w0)" [ -n "$resumed" ] || return
  # The last step done before the kill: where rank 0's steps go back. A step done again counts:
  # killed after step N+1 reached the server but before it wrote checkpoint N+1, rank 0 goes
  # on from N and its metrics read N, N.
  step_at_kill=$(sed -n 's/.*"step":\([0-9]*\).*/\1/p' "$FM_RUN/m.jsonl.rank0" |
    awk 'NR > 1 && $1 <= prev { print prev; exit } { prev = $1 }')
  if [ -z "$step_at_kill" ]; then
    # No step went back: flodl-ps died while rank 0 waited at the checkpoint's own step (its
    # next push unanswered), so it went on from there and lost nothing; its steps must then run
    # on through the restart without a gap (the python test's ps_restart case met this too).
    local gap
    gap=$(sed -n 's/.*"step":\([0-9]*\).*/\1/p' "$FM_RUN/m.jsonl.rank0" |
      awk 'NR > 1 && $1 != prev + 1 { print prev ", then step " $1; exit } { prev = $1 }')
    need "rank 0's metrics neither go back to an earlier step nor run on without a gap (after step $gap; it went on from step $resumed)" \
      [ -z "$gap" ] || return
    step_at_kill=$((resumed - 1))
  fi
  local lost=$((step_at_kill + 1 - resumed))
  acc=$(final_acc w0)
  fm_figure "killed at step $((step_at_kill + 1)), went on from $resumed: $lost steps lost; final accuracy $acc%"
  need "flodl-ps does not say it resumed" grep -q "resumed from" "$FM_RUN/ps2.err" || return
  need "went on from step $resumed, not a checkpoint at or after 300" \
    eval '[ $((resumed % 100)) = 0 ] && [ "$resumed" -ge 300 ]' || return
  need "$lost steps lost (checkpoints every 100)" eval '[ $lost -ge 0 ] && [ $lost -le 100 ]' || return
  if [ $FM_FULL = 1 ]; then
    local acc0
    mkdir -p "$FM_RUN/ckpt-nokill"
    need "flodl-ps (no kill) did not start: $(fm_tail ps3)" start_ps_ckpt ps3 0 "$FM_RUN/ckpt-nokill" 100 || return
    ps_workers 3
    need "the run without a kill did not finish" fm_wait_ended 150 ps3 w0 w1 || return
    acc0=$(final_acc w0)
    fm_figure "$FM_FIGURE, $acc0% without the kill"
    need "final accuracy $acc% against $acc0% without the kill (more than 1 point apart)" \
      awk -v a="$acc" -v b="$acc0" 'BEGIN { exit !(a - b < 1.0 && b - a < 1.0) }' || return
  fi
  fm_pass
}

# flodl-ps SIGKILLed inside checkpoint writes (one every step of a 1.1 M-parameter model, the
# kill as soon as a temporary file shows), restarted with --resume each time: every restart
# loads a whole checkpoint (none refused as corrupt), and no *.tmp.* file is left once a start
# has opened the directory.
row_ckptkill() {
  local kills=$((FM_FULL ? 10 : 3)) dir="$FM_RUN/ckpt" port k n=ps0 steps=() until_ms bad
  mkdir -p "$dir"
  need "flodl-ps did not start: $(fm_tail ps0)" start_ps_ckpt ps0 0 "$dir" 1 --keep 2 || return
  port=${FM_EP##*:}
  ps_workers 1000 --layers 64,1024,1024,10 --quiet
  for ((k = 1; k <= kills; k++)); do
    need "restart $((k - 1)): no checkpoint written: $(fm_tail $n)" \
      fm_wait_log 60 "$n" err "checkpoint of step" 2 || return
    until_ms=$(($(fm_now_ms) + 5000))
    while ! compgen -G "$dir/*.tmp.*" > /dev/null && [ "$(fm_now_ms)" -lt $until_ms ]; do :; done
    fm_signal KILL "$n"
    need "flodl-ps survived SIGKILL" fm_wait_ended 5 "$n" || return
    n=ps$k
    need "restart $k: flodl-ps did not start: $(fm_tail $n)" \
      start_ps_ckpt "$n" "$port" "$dir" 1 --keep 2 || return
    need "restart $k: no resume: $(fm_tail $n)" fm_wait_log 30 "$n" err "resumed from" || return
    bad=$(grep -iE "corrupt|truncated|crc|refus" "$FM_RUN/$n.err" | head -1 | cut -c 1-160)
    need "restart $k: $bad" [ -z "$bad" ] || return
    steps+=("$(sed -n 's/.*resumed from.*(step \([0-9]*\),.*/\1/p' "$FM_RUN/$n.err" | head -1)")
  done
  need "no checkpoint after the last restart" fm_wait_log 60 "$n" err "checkpoint of step" 2 || return
  # A last kill anywhere, then a start that only opens the directory (nobody joins).
  fm_signal KILL w0
  fm_signal KILL w1
  fm_signal KILL "$n"
  fm_wait_ended 5 "$n"
  need "the last start failed: $(fm_tail last)" start_ps_ckpt last "$port" "$dir" 1 --keep 2 || return
  need "the last start did not look for checkpoints: $(fm_tail last)" \
    fm_wait_log 10 last err "resuming:" || return
  fm_signal KILL last
  local tmps hit
  tmps=$(find "$dir" -name '*.tmp.*' | wc -l)
  hit=$(cat "$FM_RUN"/ps*.err "$FM_RUN/last.err" | grep -c "temporary file(s) of killed checkpoint writers")
  fm_figure "$kills kills and restarts, resumed at steps $(join , "${steps[@]}"); $hit of $((kills + 1)) kills left a temporary, removed at the next start; $tmps left"
  need "$tmps *.tmp.* files left in the checkpoint directory" [ "$tmps" = 0 ] || return
  fm_pass
}

# One setting given differently to rank 1, one sub-run each: the rendezvous is refused and every
# process is out in under a second, all naming the setting and both ranks' values.
row_mismatch() {
  local cases=("--lr 0.1 lr" "--batch-size 32 batch-size" "--topk 0.01 topk"
    "--layers 64,128,10 layers" "--optimizer adam optimizer" "--epochs 2 epochs"
    "--seed 7 seed" "--data-seed 3 data") # flag, rank 1's value, the name the line gives
  local c flag val name worst=0 slowest="" figs=() t0 last n line
  for c in "${cases[@]}"; do
    read -r flag val name <<< "$c"
    FM_RUN="$FM_ROWDIR/${flag#--}"
    mkdir -p "$FM_RUN"
    need "$flag: flodl-ps did not start" fm_ps ps 30 2 --log-level info || return
    fm_worker w0 30 0 2 --epochs 1
    need "$flag: rank 0 did not register: $(fm_tail ps)" fm_wait_log 20 ps err "rank 0 registered" || return
    fm_worker w1 30 1 2 --epochs 1 "$flag" "$val"
    need "$flag: still running 20 s after rank 1 started: $(fm_tail ps)" fm_wait_ended 20 ps w0 w1 || return
    # From flodl-ps's refusal, logged as rank 1's registration arrives, to the last exit.
    t0=$(fm_log_ms ps "refused a registration")
    need "$flag: flodl-ps logged no refusal: $(fm_tail ps)" [ -n "$t0" ] || return
    last=$(max "$(fm_end_ms ps)" "$(fm_end_ms w0)" "$(fm_end_ms w1)")
    for n in ps w0 w1; do
      need "$flag: $n exited $(fm_code $n), want 2: $(fm_tail $n)" [ "$(fm_code $n)" = 2 ] || return
      line=$(grep -m 1 "disagree on $name: .* on rank 1, .* on rank 0" "$FM_RUN/$n.err")
      need "$flag: $n does not name '$name' and both values: $(fm_tail $n)" [ -n "$line" ] || return
    done
    figs+=("${flag#--} $((last - t0))")
    [ $((last - t0)) -gt $worst ] && { worst=$((last - t0)); slowest=$flag; }
    fm_stop_all
  done
  FM_RUN=$FM_ROWDIR
  fm_figure "every process out at most ${worst} ms ($slowest) after the refusal: $(join , "${figs[@]}") ms"
  need "$slowest: the last process out ${worst} ms after the refusal (bound 1000 ms)" [ $worst -lt 1000 ] || return
  fm_pass
}

# A rank's own error names that rank, with its reason, in flodl-ps and in both others: at
# the start (a missing --init file), and mid-job (a --checkpoint it cannot make, at the end of
# epoch 1), where all three leave together from the same agreement and their goodbyes race to
# flodl-ps. The mid-job case runs OWN_RUNS times (3; 20 with --full): the culprit every time.
own_run() {
  local tag=$1 flag=$2 good=$3 epochs=$4 r first last ok=()
  [ -n "$good" ] && ok=("$flag" "$good")
  need "flodl-ps did not start" fm_ps ps 60 3 --log-level info || return
  fm_worker w0 60 0 3 --epochs "$epochs" --batch-size 1024 --quiet "${ok[@]}"
  fm_worker w1 60 1 3 --epochs "$epochs" --batch-size 1024 --quiet "${ok[@]}"
  fm_worker w2 60 2 3 --epochs "$epochs" --batch-size 1024 --quiet "$flag" "$FM_RUN/file/$tag"
  need "still running 40 s on: $(fm_tail w0)" fm_wait_ended 40 ps w0 w1 w2 || return
  first=$(fm_end_ms w2)
  last=$(max "$(fm_end_ms ps)" "$(fm_end_ms w0)" "$(fm_end_ms w1)")
  OWN_MS+=($((last - first)))
  need "flodl-ps exited $(fm_code ps), want 1" [ "$(fm_code ps)" = 1 ] || return
  need "no outcome line naming rank 2 and its $tag: $(grep outcome "$FM_RUN/ps.err" | cut -c 1-200)" \
    grep -q "outcome: .*rank 2 failed: .*file/$tag" "$FM_RUN/ps.err" || return
  for r in 0 1 2; do
    need "rank $r exited 0" [ "$(fm_code w$r)" != 0 ] || return
  done
  for r in 0 1; do
    need "rank $r does not name rank 2 and its $tag: $(fm_tail w$r)" \
      grep -q "rank 2 .*failed: .*file/$tag" "$FM_RUN/w$r.err" || return
  done
  need "the last process ended $((last - first)) ms after rank 2 (bound 2000 ms)" [ $((last - first)) -le 2000 ] || return
}

row_ownerror() {
  local i runs=${OWN_RUNS:-3} top=$FM_RUN
  [ $FM_FULL = 1 ] && runs=${OWN_RUNS:-20}
  OWN_MS=()
  for ((i = 0; i <= runs; i++)); do
    FM_RUN=$top/run$i
    mkdir -p "$FM_RUN"
    touch "$FM_RUN/file" # a file where a directory should be: nothing can be made under it
    if [ $i = 0 ]; then
      own_run init --init "" 50 || return
    else
      own_run ckpt --checkpoint "$FM_RUN/ckpt" 3 || return
    fi
    fm_stop_all
  done
  fm_figure "rank 2 named with its reason at the start and in $runs of $runs mid-job checkpoint failures; every process out $(max "${OWN_MS[@]}") ms after it at most"
  fm_pass
}

# A second flodl-worker --rank 1 while the job trains: refused, and the job finishes.
row_duprank() {
  need "flodl-ps did not start" fm_ps ps 90 2 --log-level info || return
  fm_worker w0 90 0 2 --epochs 8
  fm_worker w1 90 1 2 --epochs 8
  need "the job did not start: $(fm_tail ps)" fm_wait_log 30 ps err "job 'flodl' running" || return
  local t0 d
  t0=$(fm_now_ms)
  fm_worker dup 30 1 2 --epochs 8 --quiet --rendezvous-timeout 10000
  need "the second rank 1 was not refused within 20 s" fm_wait_ended 20 dup || return
  d=$(($(fm_end_ms dup) - t0))
  need "the job ended before the duplicate was refused: the row proves nothing" \
    not eval 'fm_ended w0 || fm_ended w1' || return
  need "the job did not finish after the duplicate" fm_wait_ended 80 ps w0 w1 || return
  fm_figure "the duplicate out ${d} ms after it started (exit $(fm_code dup)); the job finished: $(final_acc w0)%"
  need "the duplicate rank 1 exited 0" [ "$(fm_code dup)" != 0 ] || return
  need "the duplicate does not say the rank is taken: $(fm_tail dup)" \
    grep -q "already registered" "$FM_RUN/dup.err" || return
  for n in ps w0 w1; do
    need "$n exited $(fm_code $n): $(fm_tail $n)" [ "$(fm_code $n)" = 0 ] || return
  done
  fm_pass
}

# flood_case insecure|curve: 1.3 MB of random bytes on 20 connections, then 2000 idle ones
# (from 127.0.0.2, each opened again a second after flodl-ps closes it) at a flodl-ps limited
# to 1024 open files; a 2-worker job must still register (15 s) and train. Sets FLOOD_FIG, and
# FLOOD_WHY when it fails.
flood_case() {
  local mode=$1 sec=() ps_sec=(--insecure) t0
  if [ "$mode" = curve ]; then
    "$KEYGEN_BIN" "$FM_RUN/keys" > /dev/null || { FLOOD_WHY="flodl-keygen failed"; return 1; }
    sec=(--curve-dir "$FM_RUN/keys")
    ps_sec=("${sec[@]}")
  fi
  fm_start_ep "ps-$mode" 120 "$FM_RUN/ps-$mode.ep" sh -c 'ulimit -n 1024 && exec "$@"' sh \
    "$PS_BIN" --bind tcp://127.0.0.1:0 --endpoint-file "$FM_RUN/ps-$mode.ep" --world-size 2 \
    --heartbeat-timeout $HB --log-level info "${ps_sec[@]}" ||
    { FLOOD_WHY="flodl-ps ($mode) did not start: $(fm_tail "ps-$mode")"; return 1; }
  "${TOOL[@]}" garbage 127.0.0.1 "${FM_EP##*:}" 20 65536 > "$FM_RUN/garbage-$mode.out" 2>&1 ||
    { FLOOD_WHY="garbage: $(tail -1 "$FM_RUN/garbage-$mode.out")"; return 1; }
  fm_start "flood-$mode" 120 "${TOOL[@]}" flood 127.0.0.1 "${FM_EP##*:}" 2000 127.0.0.2
  fm_wait_log 15 "flood-$mode" out "opened 2000"
  sleep 1
  t0=$(fm_now_ms)
  fm_worker "w0-$mode" 60 0 2 --epochs 1 --rendezvous-timeout 15000 "${sec[@]}"
  fm_worker "w1-$mode" 60 1 2 --epochs 1 --rendezvous-timeout 15000 "${sec[@]}"
  fm_wait_ended 60 "w0-$mode" "w1-$mode"
  fm_signal KILL "flood-$mode"
  if [ "$(fm_code "w0-$mode")" != 0 ] || [ "$(fm_code "w1-$mode")" != 0 ]; then
    FLOOD_FIG="$mode: not trained ($(flood_stats "$mode"))"
    FLOOD_WHY="$mode: workers exit $(fm_code "w0-$mode")/$(fm_code "w1-$mode") beside the idle connections: $(fm_tail "w0-$mode" | cut -c 1-100)"
    return 1
  fi
  FLOOD_FIG="$mode: trained in $(($(fm_end_ms "w0-$mode") - t0)) ms ($(flood_stats "$mode"))"
  grep -q "rank 0 summary:" "$FM_RUN/w0-$mode.out" || { FLOOD_WHY="$mode: rank 0 printed no summary"; return 1; }
  fm_wait_ended 10 "ps-$mode"
  [ "$(fm_code "ps-$mode")" = 0 ] || { FLOOD_WHY="$mode: flodl-ps exited $(fm_code "ps-$mode")"; return 1; }
}

# What the flood saw ("opened A established B closed-by-server C open-now D", a line a second).
flood_stats() {
  tail -1 "$FM_RUN/flood-$1.out" |
    awk '{ printf "%d idle connections closed by flodl-ps, %d open at the end", $6, $8 }'
}

# permille N: N tenths as "N/10.N%10" (a share with one decimal).
permille() { echo "$(($1 / 10)).$(($1 % 10))"; }

# CPU seconds (user + system, in clock ticks) a process has used so far.
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/${FM_PID[$1]}/stat" 2> /dev/null || echo 0; }

# hdrflood_case insecure|curve: while a 2-worker job trains, one connection (under CURVE with
# the job's client key, from flood_case's keys) sends the coordinator heartbeat headers
# declaring 130,000 frames each (780 KB) for 3 s, and another times the answer to a header of
# another version every 100 ms. The job must outlast the flood and finish, the slowest answer
# stay under half the heartbeat timeout, and the flood be refused and its connection cut. Sets
# FLOOD_FIG, and FLOOD_WHY when it fails.
hdrflood_case() {
  local mode=$1 sec=() keys=() t0 c0 c1 ms slow cut n=ps-hdr-$1
  [ "$mode" = curve ] && sec=(--curve-dir "$FM_RUN/keys") keys=("$FM_RUN/keys")
  fm_ps $n 120 2 --log-level info "${sec[@]}" ||
    { FLOOD_WHY="flodl-ps (header flood, $mode) did not start: $(fm_tail $n)"; return 1; }
  fm_worker w0-$n 90 0 2 --epochs 6 --quiet "${sec[@]}"
  fm_worker w1-$n 90 1 2 --epochs 6 --quiet "${sec[@]}"
  fm_wait_log 30 $n err "job 'flodl' running" ||
    { FLOOD_WHY="header flood ($mode): the job did not start: $(fm_tail $n)"; return 1; }
  t0=$(fm_now_ms) c0=$(cpu_ticks $n)
  "${TOOL[@]}" hdrflood "$FM_EP" 3 130000 "${keys[@]}" > "$FM_RUN/hdrflood-$mode.out" 2>&1
  ms=$(($(fm_now_ms) - t0)) c1=$(cpu_ticks $n)
  ! fm_ended w0-$n || { FLOOD_WHY="header flood ($mode): the job ended before the flood did: $(fm_tail w0-$n)"; return 1; }
  slow=$(sed -n 's/.*the slowest in \([0-9]*\) ms.*/\1/p' "$FM_RUN/hdrflood-$mode.out")
  cut=$(grep -c "malformed messages within" "$FM_RUN/$n.err")
  FLOOD_FIG="header flood ($mode): $(sed -n 's/^queued \([0-9]*\) headers of \([0-9]*\) bytes (\([0-9]*\) MiB\/s) on \([0-9]*\) connections.*/\1 headers of \2 bytes queued at \3 MiB\/s on \4 connections/p' "$FM_RUN/hdrflood-$mode.out"), flodl-ps at $(permille $((1000 * (c1 - c0) * 1000 / $(getconf CLK_TCK) / ms)))% CPU, its slowest answer ${slow:-none} ms, sender cut (${cut} logged)"
  fm_wait_ended 80 $n w0-$n w1-$n
  local p
  for p in $n w0-$n w1-$n; do
    [ "$(fm_code $p)" = 0 ] || { FLOOD_WHY="header flood ($mode): $p exited $(fm_code $p): $(fm_tail $p | cut -c 1-120)"; return 1; }
  done
  FLOOD_FIG+=", the job trained"
  [ -n "$slow" ] && [ "$slow" -lt $((HB / 2)) ] ||
    { FLOOD_WHY="header flood ($mode): the slowest answer took ${slow:-forever} ms (bound $((HB / 2)))"; return 1; }
  [ "$cut" -ge 1 ] || { FLOOD_WHY="header flood ($mode): the sender was never cut: $(fm_tail $n)"; return 1; }
}

row_flood() {
  need_tool || return
  local figs=() whys=() m
  for m in insecure curve; do
    FLOOD_WHY="" FLOOD_FIG=""
    flood_case $m || whys+=("$FLOOD_WHY")
    [ -n "$FLOOD_FIG" ] && figs+=("$FLOOD_FIG")
    fm_stop_all
    FLOOD_WHY="" FLOOD_FIG=""
    hdrflood_case $m || whys+=("$FLOOD_WHY")
    [ -n "$FLOOD_FIG" ] && figs+=("$FLOOD_FIG")
    fm_stop_all
  done
  fm_figure "random bytes, then 2000 idle connections at a flodl-ps limited to 1024 files; $(join ';' "${figs[@]}")"
  need "$(join ';' "${whys[@]}")" [ ${#whys[@]} = 0 ] || return
  fm_pass
}

# takeover_partial: 40 connections each send 16 MiB of a message that never ends (under the
# coordinator's 17 MiB bound for one connection, 640 MiB together): flodl-ps's peak must stay
# within its 256 MiB process bound and a 192 MiB margin of where it was, cutting the largest
# holders with a line. Sets PARTIAL_FIG, and PARTIAL_WHY when it fails.
takeover_partial() {
  local rss0 hwm out
  PARTIAL_FIG="" PARTIAL_WHY=""
  rss0=$(fm_status_kib ps VmRSS)
  out=$("${TOOL[@]}" partial 127.0.0.1 "${FM_EP##*:}" 40 16 1 2>&1)
  hwm=$(fm_status_kib ps VmHWM)
  [ -n "$hwm" ] || { PARTIAL_WHY="flodl-ps is gone after 40 partial messages: $(fm_tail ps)"; return 1; }
  PARTIAL_FIG="40 x 16 MiB partial messages: peak $((hwm / 1024)) MiB, +$(((hwm - rss0) / 1024)) MiB ($out)"
  [ $((hwm - rss0)) -lt $((448 * 1024)) ] ||
    { PARTIAL_WHY="flodl-ps peaked $(((hwm - rss0) / 1024)) MiB above $((rss0 / 1024)) MiB under 40 partial messages (bound 448)"; return 1; }
  grep -q "over its bound of 256 MiB" "$FM_RUN/ps.err" ||
    { PARTIAL_WHY="flodl-ps logged no connection cut for its process bound: $(fm_tail ps)"; return 1; }
}

# 512 ranks of one host (drill, 4 KiB) rendezvous in plain text and under CurveZMQ while 2000
# idle connections come from their own address, 127.0.0.1: every rank registers and verifies its
# steps (scripts/rendezvous-bench.sh, which gives the time from the last start to the last
# WELCOME). --full only: 1024 processes' start on 2 cores.
row_scale() {
  [ $FM_FULL = 1 ] || { fm_skip "--full only (about 2 minutes)"; return; }
  need_tool || return
  local out="$FM_RUN/bench.md" figs
  "$root/scripts/rendezvous-bench.sh" --ranks 512 --flood 2000 --build-dir "$FM_BUILD" \
    > "$out" 2> "$FM_RUN/bench.err"
  local rc=$?
  figs=$(awk -F' *[|] *' '/^[|] 512 /{ printf "%s %s: %s s, %s verified, anon %s", sep, $3, $4, $5, $6; sep=";" }' "$out")
  fm_figure "512 ranks beside 2000 idle connections from 127.0.0.1, last start to last WELCOME:$figs"
  need "$(grep -m1 ' verified; ' "$FM_RUN/bench.err" | cut -c 1-200)" [ $rc = 0 ] || return
  fm_pass
}

# probe_fig NAME: "median M ms, max X ms" of a fault_tool.py probe's last line.
probe_fig() { tail -1 "$FM_RUN/$1.out" | sed -n 's/.*within [0-9]* ms, //p'; }

# /healthz while a job trains beside hostile HTTP clients (half idle, half trickling a byte of
# headers that never end every 0.5 s, each reconnecting 0.1 s after it is closed): 200 from
# 127.0.0.2 on flodl-ps's metrics port, 300 on its health listener (--health-port; more than
# its 256 slots), 150 from 127.0.0.2 and 150 from the probe's own 127.0.0.1; 20 probes of each
# port from 127.0.0.1 must answer 200 within 1 s, and the job must train to the end.
row_health() {
  need_tool || return
  need "flodl-ps did not start" fm_ps ps 90 2 --metrics-port 0 --health-port 0 \
    --metrics-bind 127.0.0.1 --log-level info || return
  need "flodl-ps printed no health port: $(fm_tail ps)" fm_wait_log 10 ps err "health on http" || return
  local mport hport r n
  mport=$(sed -n 's|.*metrics on http://127.0.0.1:\([0-9]*\)/metrics.*|\1|p' "$FM_RUN/ps.err" | head -1)
  hport=$(sed -n 's|.*health on http://127.0.0.1:\([0-9]*\)/healthz.*|\1|p' "$FM_RUN/ps.err" | head -1)
  for r in 0 1; do fm_worker w$r 90 $r 2 --epochs 6; done
  need "the job did not start: $(fm_tail ps)" fm_wait_log 30 ps err "job 'flodl' running" || return
  fm_start holdm 60 "${TOOL[@]}" httphold 127.0.0.1 "$mport" 200 127.0.0.2
  fm_start holdh2 60 "${TOOL[@]}" httphold 127.0.0.1 "$hport" 150 127.0.0.2
  fm_start holdh1 60 "${TOOL[@]}" httphold 127.0.0.1 "$hport" 150 127.0.0.1
  need "the clients did not connect: $(fm_tail holdm)" fm_wait_log 10 holdm out "open-now" 2 || return
  fm_start pm 30 "${TOOL[@]}" probe 127.0.0.1 "$mport" 20 1000
  need "the metrics port's probes did not end" fm_wait_ended 30 pm || return
  fm_start ph 30 "${TOOL[@]}" probe 127.0.0.1 "$hport" 20 1000
  need "the health port's probes did not end" fm_wait_ended 30 ph || return
  local running=0
  fm_ended w0 || fm_ended w1 || running=1
  fm_signal KILL holdm
  fm_signal KILL holdh2
  fm_signal KILL holdh1
  need "the job did not finish: $(fm_tail w0)" fm_wait_ended 60 ps w0 w1 || return
  local cut=0 f
  for f in holdh1 holdh2; do cut=$((cut + $(tail -1 "$FM_RUN/$f.out" | awk '{ print $4 + 0 }'))); done
  fm_figure "20 probes of each port: metrics port beside 200 clients from 127.0.0.2: $(probe_fig pm); health port beside 300 from 127.0.0.2 and the probe's own address ($cut of their connections closed by it): $(probe_fig ph); the job trained: $(final_acc w0)%"
  need "the metrics port: $(tail -1 "$FM_RUN/pm.out")" [ "$(fm_code pm)" = 0 ] || return
  need "the health port: $(tail -1 "$FM_RUN/ph.out")" [ "$(fm_code ph)" = 0 ] || return
  need "the job ended while the probes ran: the row proves nothing" [ $running = 1 ] || return
  for n in ps w0 w1; do
    need "$n exited $(fm_code $n): $(fm_tail $n)" [ "$(fm_code $n)" = 0 ] || return
  done
  fm_pass
}

# In a job with a parameter server (flodl-ps serving 2 shards, 2 ranks in --mode ps), while it
# trains: a raw client claims the server role, from another host and pid and then with
# flodl-ps's own; and rank 1 stalls (SIGSTOP) while a client claims it with its host and pid
# after 0, 1, 2 and 3 heartbeat periods of quiet (400 ms each: a 1.2 s stall at the 2 s
# timeout). Every claim is refused, telling neither host, pid nor generation, and the job
# trains to the end.
takeover_ps() {
  need "flodl-ps (2 shards) did not start: $(fm_tail ps2)" \
    fm_ps ps2 120 2 --shards 2 --host 127.0.0.1 --log-level info || return
  local r server stall
  for r in 0 1; do fm_worker v$r 90 $r 2 --mode ps --epochs 3 --quiet --timeout 30000; done
  need "the parameter-server job did not start: $(fm_tail ps2)" fm_wait_log 30 ps2 err "job 'flodl' running" || return
  sleep 0.3
  server=$("${TOOL[@]}" takeover-server "$FM_EP" 2 127.0.0.1 "${FM_PID[ps2]}" 2>&1) ||
    { fm_fail "server-role takeover: $server"; return 1; }
  need "rank 1 ended before its stall: $(fm_tail v1)" not fm_ended v1 || return 1
  # The tool stops rank 1 itself once it is ready, and lets it go on after its claims.
  stall=$("${TOOL[@]}" takeover-stalled "$FM_EP" 1 2 127.0.0.1 "${FM_PID[v1]}" 400 1201 2>&1) ||
    { fm_signal CONT v1; fm_fail "stalled-rank takeover: $stall"; return 1; }
  TAKEOVER_FIG="server role refused twice; $stall"
  need "the parameter-server job did not finish after the claims" fm_wait_ended 80 ps2 v0 v1 || return
  for n in ps2 v0 v1; do
    need "$n exited $(fm_code $n) after the claims: $(fm_tail $n)" [ "$(fm_code $n)" = 0 ] || return
  done
  need "flodl-ps did not log the refused server claim" \
    grep -q "refused a registration for shards 0..1" "$FM_RUN/ps2.err" || return
  need "flodl-ps did not log the refused claims of stalled rank 1" \
    grep -q "refused a registration for rank 1" "$FM_RUN/ps2.err" || return
}

# During the rendezvous of 3 ranks (0 and 1 registered): a raw client claims rank 1 from another
# host and pid (refused, telling nothing about the holder), then sends one message of 512
# frames of 1.9 MB: flodl-ps's RSS must come back within 8 MiB (peak under 160 MiB); then 40
# partial messages (takeover_partial); then rank 2 registers and the job trains to the end.
# Then the server-role and stalled-rank claims of takeover_ps.
row_takeover() {
  need_tool || return
  need "flodl-ps did not start" fm_ps ps 120 3 --log-level info || return
  fm_worker w0 90 0 3 --epochs 1 --quiet --rendezvous-timeout 60000
  fm_worker w1 90 1 3 --epochs 1 --quiet --rendezvous-timeout 60000
  need "ranks 0 and 1 did not register: $(fm_tail ps)" fm_wait_log 30 ps err "2 of 3" || return
  local claim rss0 rss1 hwm1
  claim=$("${TOOL[@]}" takeover "$FM_EP" 1 3 2>&1) || { fm_fail "takeover: $claim"; return; }
  sleep 0.5
  rss0=$(fm_status_kib ps VmRSS)
  fm_start big 60 "${TOOL[@]}" bigmsg "$FM_EP" 512 1900000 8
  need "the big message's sender still running after 40 s" fm_wait_ended 40 big || return
  sleep 1.5
  rss1=$(fm_status_kib ps VmRSS)
  hwm1=$(fm_status_kib ps VmHWM)
  need "flodl-ps is gone after the big message: $(fm_tail ps)" [ -n "$rss1" ] || return
  takeover_partial
  fm_worker w2 90 2 3 --epochs 1 --quiet --rendezvous-timeout 60000
  need "the job did not finish after the attacks" fm_wait_ended 80 ps w0 w1 w2 || return
  local grow=$(((rss1 - rss0) / 1024)) peak=$(((hwm1 - rss0) / 1024))
  local fig="claim refused; 512 x 1.9 MB: RSS $((rss0 / 1024)) -> $((rss1 / 1024)) MiB after, peak +$peak MiB; ${PARTIAL_FIG:-no partial messages}; the job trained"
  fm_figure "$fig"
  need "$PARTIAL_WHY" [ -z "$PARTIAL_WHY" ] || return
  for n in ps w0 w1 w2; do
    need "$n exited $(fm_code $n) after the attacks: $(fm_tail $n)" [ "$(fm_code $n)" = 0 ] || return
  done
  need "flodl-ps did not log the refused claim" grep -q "refused a registration for rank 1" "$FM_RUN/ps.err" || return
  need "flodl-ps's RSS grew by $grow MiB after the 512-frame message (bound 8 MiB)" \
    [ $((rss1 - rss0)) -lt $((8 * 1024)) ] || return
  need "flodl-ps's RSS peaked $peak MiB above its start during the 512-frame message (bound 160 MiB)" \
    [ $((hwm1 - rss0)) -lt $((160 * 1024)) ] || return
  fm_stop_all
  TAKEOVER_FIG=""
  takeover_ps
  local ok=$?
  fm_figure "$fig; ${TAKEOVER_FIG:-not all claims of the parameter-server job made}"
  [ $ok = 0 ] || return
  fm_figure "$fig; $TAKEOVER_FIG; the PS job trained"
  fm_pass
}

# bad_file NAME WANT CMD...: CMD must exit non-zero with exactly one line on stderr besides its
# log lines ("[time who] level: ...") and the plain-text notice, and its stderr must say WANT
# (an extended regex). Appends NAME to BAD_OK, or fails the row.
bad_file() {
  local name=$1 want=$2 lines
  shift 2
  fm_start "$name" 30 "$@"
  fm_wait_ended 30 "$name"
  lines=$(grep -v -e "running in plain text" -e '^\[' "$FM_RUN/$name.err" | grep -c .)
  need "$name accepted (exit 0)" [ "$(fm_code "$name")" != 0 ] || return
  need "$name: no verdict within 30 s" [ "$(fm_code "$name")" != 137 ] || return
  need "$name: $lines lines on stderr, want 1: $(head -c 160 "$FM_RUN/$name.err" | tr '\n' ' ')" \
    [ "$lines" = 1 ] || return
  need "$name: the line does not say '$want': $(fm_tail "$name")" grep -qE -- "$want" "$FM_RUN/$name.err" || return
  BAD_OK+=("$name")
}

# flip FILE: one byte near the end (in the data) changed.
flip() {
  local f=$1 at b
  at=$(($(stat -c %s "$f") - 64))
  b=$(od -An -tu1 -j "$at" -N1 "$f" | tr -d ' ')
  printf '%b' "\\$(printf %03o $(((b + 1) % 256)))" | dd of="$f" bs=1 seek="$at" conv=notrunc status=none
}

# Each bad file refused with one line and a non-zero exit: IDX labels out of range, a malformed
# CSV, a transposed and a NaN --init (worker and flodl-ps), a worker checkpoint truncated and
# with a bit flipped (--resume), flodl-ps's checkpoints likewise (--checkpoint-dir --resume;
# flodl-ps logs each file it refuses, then gives its verdict).
row_badfiles() {
  need_tool || return
  BAD_OK=()
  local d=$FM_RUN f
  local wk=("$WK_BIN" --mode local --epochs 1)
  local ps=("$PS_BIN" --world-size 2 --insecure --bind tcp://127.0.0.1:0 --shards 2 --resume)
  need "could not write the bad files" eval '"${TOOL[@]}" idx "$d/img.idx" "$d/lab.idx" 200 12 &&
    "${TOOL[@]}" safetensors "$d/transposed.safetensors" 64,256,128,10 transposed &&
    "${TOOL[@]}" safetensors "$d/nan.safetensors" 64,256,128,10 nan' || return
  printf '1,0.5,0.25,0.125,0\n2,0.5,abc,0.1,0\n0,1,1,1,1\n' > "$d/bad.csv"
  bad_file idx "lab.idx: label 12" "${wk[@]}" --layers 64,16,10 --train-images "$d/img.idx" \
    --train-labels "$d/lab.idx" || return
  bad_file csv "bad.csv: line 2" "${wk[@]}" --layers 4,8,3 --train-csv "$d/bad.csv" || return
  bad_file init-transposed "layers.0.weight" "${wk[@]}" --init "$d/transposed.safetensors" || return
  bad_file init-nan "layers.1.weight.*NaN" "${wk[@]}" --init "$d/nan.safetensors" || return
  bad_file ps-init-nan "layers.1.weight.*NaN" "${ps[@]}" --init "$d/nan.safetensors" || return
  # CURVE keys: a key directory anyone may write; a secret key its group may read, where the
  # group is not flodl-ps's (root alone can give it such a group).
  need "flodl-keygen failed" "$KEYGEN_BIN" "$d/keys" > /dev/null || return
  local kps=("$PS_BIN" --world-size 2 --bind tcp://127.0.0.1:0 --curve-dir "$d/keys")
  chmod 777 "$d/keys"
  bad_file key-dir-777 "keys holds the keys and is writable by its group or others \(mode 777\)" \
    "${kps[@]}" || return
  chmod 700 "$d/keys"
  if [ "$(id -u)" = 0 ]; then
    chmod 640 "$d/keys/server.key" && chgrp 54321 "$d/keys/server.key"
    bad_file key-group-640 "server.key .*readable by group 54321, not this process's \(mode 640\)" \
      "${kps[@]}" || return
  fi
  # A worker's checkpoint (--checkpoint): a file truncated; in a copy, a bit flipped.
  fm_start ck 60 "${wk[@]}" --checkpoint "$d/wk-ckpt" --quiet
  need "the worker did not write its checkpoint: $(fm_tail ck)" fm_wait_ended 60 ck || return
  f=$(basename "$(ls "$d"/wk-ckpt/shard-*.safetensors | head -1)")
  cp -r "$d/wk-ckpt" "$d/wk-flip"
  truncate -s $(($(stat -c %s "$d/wk-ckpt/$f") / 2)) "$d/wk-ckpt/$f"
  flip "$d/wk-flip/$f"
  bad_file resume-truncated "$f.*truncated" "${wk[@]}" --resume "$d/wk-ckpt" || return
  bad_file resume-corrupt "$f.*CRC" "${wk[@]}" --resume "$d/wk-flip" || return
  # flodl-ps's checkpoints (two kept per shard): shard 0's files truncated; in a copy, a bit of
  # each flipped. No whole checkpoint of every shard is left: --resume must refuse.
  mkdir -p "$d/ps-ckpt"
  need "flodl-ps did not start: $(fm_tail psck)" start_ps_ckpt psck 0 "$d/ps-ckpt" 100 --keep 2 || return
  ps_workers 1 --quiet
  need "the PS job that writes checkpoints failed: $(fm_tail psck)" \
    eval 'fm_wait_ended 90 psck w0 w1 && [ "$(fm_code psck)" = 0 ]' || return
  cp -r "$d/ps-ckpt" "$d/ps-flip"
  for f in "$d"/ps-ckpt/shard-0-of-2.*; do truncate -s $(($(stat -c %s "$f") / 2)) "$f"; done
  for f in "$d"/ps-flip/shard-0-of-2.*; do flip "$f"; done
  bad_file ps-resume-truncated "shard-0-of-2.*truncated" "${ps[@]}" --checkpoint-dir "$d/ps-ckpt" || return
  bad_file ps-resume-corrupt "shard-0-of-2.*CRC" "${ps[@]}" --checkpoint-dir "$d/ps-flip" || return
  fm_pass
  fm_figure "${#BAD_OK[@]} refused, one line each: $(join , "${BAD_OK[@]}")"
}

# A parameter-server job (2 workers, 2 shards, a checkpoint every 30 s) for FM_SOAK_S seconds
# (600; 1800 by hand for the 30-minute figure): RSS of flodl-ps and the workers every 10 s,
# in rss.txt (ms, then KiB of flodl-ps and of each worker). The heap reaches its working set
# within the first checkpoints (about 100 s: the first one pruned); from the warm-up's end
# (180 s, or a third of a shorter soak) RSS must stay flat: at most SOAK_KIB (256 KiB) more.
row_soak() {
  local secs=${FM_SOAK_S:-600} bound=${SOAK_KIB:-256}
  [ $FM_FULL = 1 ] || { fm_skip "--full only (${secs} s)"; return; }
  local dir="$FM_RUN/ckpt" i t0 n first=() last=() warm=180 steps rate
  mkdir -p "$dir"
  need "flodl-ps did not start: $(fm_tail soak)" fm_start_ep soak $((secs + 120)) "$FM_RUN/soak.ep" \
    "$PS_BIN" --bind tcp://127.0.0.1:0 --endpoint-file "$FM_RUN/soak.ep" --world-size 2 \
    --shards 2 --host 127.0.0.1 --heartbeat-timeout $HB --insecure --checkpoint-dir "$dir" \
    --checkpoint-every 30s --keep 2 --log-level info || return
  for i in 0 1; do
    fm_worker w$i $((secs + 120)) $i 2 --mode ps --epochs 100000 --quiet --timeout 30000
  done
  t0=$(fm_now_ms)
  [ "$secs" -lt $((3 * warm)) ] && warm=$((secs / 3))
  while [ $(($(fm_now_ms) - t0)) -lt $((secs * 1000)) ]; do
    sleep 10
    for n in soak w0 w1; do
      need "$n ended during the soak: $(fm_tail $n)" not fm_ended $n || return
    done
    if [ ${#first[@]} = 0 ] && [ $(($(fm_now_ms) - t0)) -ge $((warm * 1000)) ]; then
      first=("$(fm_status_kib soak VmRSS)" "$(fm_status_kib w0 VmRSS)" "$(fm_status_kib w1 VmRSS)")
    fi
    echo "$(($(fm_now_ms) - t0)) $(fm_status_kib soak VmRSS) $(fm_status_kib w0 VmRSS) $(fm_status_kib w1 VmRSS)" >> "$FM_RUN/rss.txt"
  done
  last=("$(fm_status_kib soak VmRSS)" "$(fm_status_kib w0 VmRSS)" "$(fm_status_kib w1 VmRSS)")
  steps=$(sed -n 's/.*checkpoint of step \([0-9]*\) written.*/\1/p' "$FM_RUN/soak.err" | tail -1)
  rate=$(awk -v d=$((last[0] - first[0])) -v s=$((secs - warm)) 'BEGIN { printf "%.3f", d * 1.024 / s }')
  fm_figure "${secs} s, ${steps:-no} steps at the last checkpoint; RSS from ${warm} s to the end: flodl-ps ${first[0]} -> ${last[0]} KiB (${rate} KB/s), workers ${first[1]} -> ${last[1]} and ${first[2]} -> ${last[2]} KiB"
  local who=(flodl-ps "rank 0" "rank 1")
  for i in 0 1 2; do
    need "${who[i]}'s RSS grew by $((last[i] - first[i])) KiB after the warm-up (bound $bound KiB)" \
      [ $((last[i] - first[i])) -le "$bound" ] || return
  done
  fm_pass
}

# ---- the matrix ----

rows=(
  "kill|SIGKILL mid-allreduce"
  "stop|SIGSTOP then CONT"
  "partition|partition (netns link down)"
  "psresume|PS kill and resume"
  "ckptkill|kill during checkpoint write"
  "mismatch|mismatch at rendezvous"
  "ownerror|a rank's own error"
  "duprank|duplicate rank"
  "flood|hostile bytes and idle-connection flood"
  "health|/healthz beside idle and slow HTTP clients"
  "scale|512 ranks from one address beside an idle flood"
  "takeover|rank, stalled-rank and server-role takeover attempts, oversized multipart"
  "badfiles|bad files"
  "soak|a soak"
)

md() { printf '%s' "$1" | tr '\n' ' ' | sed 's/|/\\|/g'; }

table=("| row | result | figure |" "|---|---|---|")
failed=0
start=$(fm_now_ms)
for entry in "${rows[@]}"; do
  id=${entry%%|*}
  title=${entry#*|}
  [ -n "$only" ] && [[ ",$only," != *",$id,"* ]] && continue
  FM_ROWDIR="$FM_TMP/$id"
  FM_RUN=$FM_ROWDIR
  mkdir -p "$FM_RUN"
  FM_RESULT="FAIL: the row gave no verdict" FM_FIGURE=""
  echo "fault-matrix: $title ..." >&2
  t=$(fm_now_ms)
  "row_$id"
  fm_stop_all
  FM_RUN=$FM_ROWDIR
  echo "fault-matrix: $title: $FM_RESULT${FM_FIGURE:+ ($FM_FIGURE)} [$((($(fm_now_ms) - t) / 1000)) s]" >&2
  case "$FM_RESULT" in FAIL*) failed=$((failed + 1)) ;; esac
  table+=("| $(md "$title") | $(md "$FM_RESULT") | $(md "${FM_FIGURE:--}") |")
done
printf '%s\n' "${table[@]}"
echo
echo "$([ $FM_FULL = 1 ] && echo "--full" || echo "default rows"): $((($(fm_now_ms) - start) / 1000)) s, $failed failed"
[ $failed = 0 ]
