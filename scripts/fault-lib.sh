# shellcheck shell=bash
# Helpers of scripts/fault-matrix.sh (sourced, not run on its own): processes started with a
# deadline and their PID, exit code and end time recorded, bounded waits on their logs, the
# row's verdict, and cleanup. Every process is started by fm_start, runs under `timeout -s KILL`
# and is stopped, on every path, by the PID it reported itself (never by name).
#
# The caller sets FM_BUILD (the build directory) and calls fm_init once; each row works in
# FM_RUN, a directory of its own.

export LC_ALL=C # EPOCHREALTIME with a '.'

FM_TMP=""
FM_RUN="" # the current row's directory: NAME.out, NAME.err, NAME.pid, NAME.end
FM_EP=""  # the coordinator endpoint fm_start_ep read
FM_KEEP=0
FM_NETNS=() # network namespaces made by the partition row
declare -A FM_PID # NAME -> PID of everything started since the last fm_stop_all

fm_init() {
  FM_TMP=$(mktemp -d /tmp/flodl-fault-matrix-XXXXXX)
  PS_BIN="$FM_BUILD/server/flodl-ps"
  WK_BIN="$FM_BUILD/worker/flodl-worker"
  KEYGEN_BIN="$FM_BUILD/server/flodl-keygen"
  # A launcher's environment would change what the binaries do: the rows say everything.
  unset FLODL_RANK FLODL_WORLD_SIZE FLODL_COORDINATOR FLODL_HOST FLODL_JOB_ID FLODL_LOG RANK \
    WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE \
    JOB_COMPLETION_INDEX FLODL_CURVE_DIR FLODL_INSECURE
  fm_clock_sync
  trap fm_cleanup EXIT
  trap 'exit 130' INT TERM
}

# Kills (by PID) what the current row started and has not ended, and reaps the wrappers.
fm_stop_all() {
  local n
  for n in "${!FM_PID[@]}"; do fm_ended "$n" || kill -KILL "${FM_PID[$n]}" 2> /dev/null; done
  wait 2> /dev/null
  FM_PID=()
}

fm_cleanup() {
  local ns
  fm_stop_all
  for ns in "${FM_NETNS[@]}"; do ip netns del "$ns" 2> /dev/null; done
  if [ "$FM_KEEP" = 1 ]; then
    echo "logs kept in $FM_TMP" >&2
  elif [ -n "$FM_TMP" ]; then
    rm -rf "$FM_TMP"
  fi
}

# ---- clocks ----

fm_now_ms() {
  local t=${EPOCHREALTIME/./}
  echo $((10#$t / 1000))
}

# The binaries log wall-clock time (ISO 8601 UTC with milliseconds), the clock of fm_now_ms:
# nothing to synchronise.
fm_clock_sync() { :; }

# fm_log_ms NAME TEXT: when NAME logged its first line holding TEXT
# ("[2026-11-25T16:30:01.123Z who] ..."), on the clock of fm_now_ms; empty when there is no
# such line.
fm_log_ms() {
  local line ts secs
  line=$(grep -m 1 -F -- "$2" "$FM_RUN/$1.err" 2> /dev/null) || return 0
  ts=${line#\[}
  ts=${ts%% *}
  [[ $ts =~ ^([0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2})\.([0-9]{3})Z$ ]] || return 0
  secs=$(date -u -d "${BASH_REMATCH[1]}" +%s) || return 0
  echo $((secs * 1000 + 10#${BASH_REMATCH[2]}))
}

# ---- processes ----

# fm_start NAME SECONDS CMD...: runs CMD in the background, killed after SECONDS; its stdout
# and stderr in $FM_RUN/NAME.out and .err; when it ends, "CODE END_MS" in NAME.end (CODE 137:
# killed). FM_PID[NAME] is its PID (sh writes its own PID, then execs CMD).
fm_start() {
  local name=$1 secs=$2 f="$FM_RUN/$1" i
  shift 2
  rm -f "$f.pid" "$f.end"
  (
    timeout -s KILL "$secs" sh -c 'echo $$ > "$0.pid"; exec "$@"' "$f" "$@" \
      > "$f.out" 2> "$f.err" < /dev/null
    echo "$? $(fm_now_ms)" > "$f.end.tmp" && mv "$f.end.tmp" "$f.end"
  ) 2> /dev/null & # the wrapper's "Killed" notices; the command's stderr is in NAME.err
  for ((i = 0; i < 500; i++)); do
    [ -s "$f.pid" ] && break
    sleep 0.01
  done
  FM_PID[$name]=$(cat "$f.pid" 2> /dev/null)
}

# fm_start_ep NAME SECONDS EPFILE CMD...: fm_start for a flodl-ps that writes its endpoint to
# EPFILE (--endpoint-file); sets FM_EP. False when none comes within 10 s or it ends first.
fm_start_ep() {
  local name=$1 secs=$2 ep=$3 i
  shift 3
  rm -f "$ep"
  FM_EP=""
  fm_start "$name" "$secs" "$@"
  for ((i = 0; i < 1000; i++)); do
    if [ -s "$ep" ] && [ "$(tail -c 1 "$ep" | od -An -tx1 | tr -d ' ')" = 0a ]; then
      FM_EP=$(head -1 "$ep")
      return 0
    fi
    fm_ended "$name" && return 1
    sleep 0.01
  done
  return 1
}

# fm_ps NAME SECONDS WORLD [FLAGS...]: flodl-ps on an ephemeral port of 127.0.0.1, heartbeat
# timeout $HB ms, in plain text unless FLAGS give --curve-dir; sets FM_EP.
fm_ps() {
  local name=$1 secs=$2 world=$3 sec=(--insecure)
  shift 3
  case " $* " in *" --curve-dir "*) sec=() ;; esac
  fm_start_ep "$name" "$secs" "$FM_RUN/$name.ep" "$PS_BIN" --bind tcp://127.0.0.1:0 \
    --endpoint-file "$FM_RUN/$name.ep" --world-size "$world" --heartbeat-timeout "$HB" \
    "${sec[@]}" "$@"
}

# fm_worker NAME SECONDS RANK WORLD [FLAGS...]: flodl-worker against $FM_EP, in plain text
# unless FLAGS give --curve-dir.
fm_worker() {
  local name=$1 secs=$2 rank=$3 world=$4 sec=(--insecure)
  shift 4
  case " $* " in *" --curve-dir "*) sec=() ;; esac
  fm_start "$name" "$secs" "$WK_BIN" --rank "$rank" --world-size "$world" \
    --coordinator "$FM_EP" --host 127.0.0.1 "${sec[@]}" "$@"
}

fm_ended() { [ -s "$FM_RUN/$1.end" ]; }
fm_code() { cut -d' ' -f1 "$FM_RUN/$1.end" 2> /dev/null || echo none; }
fm_end_ms() { cut -d' ' -f2 "$FM_RUN/$1.end" 2> /dev/null || echo 0; }
fm_err() { cat "$FM_RUN/$1.err" 2> /dev/null; }
fm_out() { cat "$FM_RUN/$1.out" 2> /dev/null; }
# fm_signal SIG NAME: only while NAME runs (its PID is not reused by another process then).
fm_signal() { fm_ended "$2" || kill -"$1" "${FM_PID[$2]}" 2> /dev/null; }

# fm_wait_ended SECONDS NAME...: true once every NAME ended, false at the deadline.
fm_wait_ended() {
  local until=$(($(fm_now_ms) + $1 * 1000)) n all
  shift
  while :; do
    all=1
    for n in "$@"; do fm_ended "$n" || all=0; done
    [ $all = 1 ] && return 0
    [ "$(fm_now_ms)" -ge $until ] && return 1
    sleep 0.02
  done
}

# fm_wait_log SECONDS NAME out|err TEXT [TIMES]: true once NAME's stream holds TEXT (a fixed
# string) TIMES times (default 1); false at the deadline or when NAME ended without it.
fm_wait_log() {
  local until=$(($(fm_now_ms) + $1 * 1000)) f="$FM_RUN/$2.$3" text=$4 times=${5:-1}
  while :; do
    [ "$(grep -cF -- "$text" "$f" 2> /dev/null)" -ge "$times" ] && return 0
    if fm_ended "$2"; then
      [ "$(grep -cF -- "$text" "$f")" -ge "$times" ]
      return
    fi
    [ "$(fm_now_ms)" -ge $until ] && return 1
    sleep 0.02
  done
}

# fm_status_kib NAME FIELD: a field of /proc/PID/status in KiB (VmRSS, VmHWM); empty when gone.
fm_status_kib() {
  awk -v f="$2:" '$1 == f { print $2 }' "/proc/${FM_PID[$1]}/status" 2> /dev/null
}

# ---- the row's verdict ----
# A row sets FM_RESULT (PASS, FAIL: why, SKIP: why) and FM_FIGURE through these.

fm_pass() { FM_RESULT="PASS"; }
fm_fail() { FM_RESULT="FAIL: $1"; }
fm_skip() { FM_RESULT="SKIP: $1"; }
fm_figure() { FM_FIGURE=$1; }

# need WHY CMD...: runs CMD (a test); when it fails, the row fails saying WHY. Use as
# `need "..." [ ... ] || return`.
need() {
  local why=$1
  shift
  "$@" && return 0
  fm_fail "$why"
  return 1
}

not() { ! "$@"; }

# The last line of NAME's stderr, shortened: what a FAIL reason quotes.
fm_tail() { tail -n 1 "$FM_RUN/$1.err" 2> /dev/null | cut -c 1-160; }

# join SEP WORD...: the words joined by "SEP ".
join() {
  local sep=$1 out=$2 w
  shift 2
  for w in "$@"; do out+="$sep $w"; done
  echo "$out"
}

# max N...: the largest.
max() {
  local m=$1 v
  for v in "$@"; do [ "$v" -gt "$m" ] && m=$v; done
  echo "$m"
}
