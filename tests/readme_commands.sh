#!/usr/bin/env bash
# The README's command lines, run: every line of its ```sh blocks outside the sections that have
# a test of their own (the GPU section: readme_gpu.sh; Reliability: readme_faultmatrix.sh;
# PyTorch: tests/python/run.py, which runs the examples, the benchmark (shortened) and itself,
# each from the README's own line, and whose readme case (ctest readme_pytorch) checks that
# no other line is there;
# Deploying: scripts/deploy-test.sh, whose commands deploy_readme checks are the README's) is
# either run here, the way a user would (hosts, ports and paths of the multi-host examples
# replaced by this machine's, the workers' epochs cut to one), or named in the list of lines
# left to be run by hand, with the reason. A line in neither fails the test, so the README
# cannot gain a command no test runs.
#   tests/readme_commands.sh BUILD_DIR SOURCE_DIR
set -uo pipefail
build=$1
src=$2
tmp=$(mktemp -d /tmp/flodl-readme-XXXXXX)
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill -9 "$p" 2> /dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2> /dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
status=0
fail() { echo "FAIL: $*"; status=1; }

# Lines, continuations joined, of the sh blocks outside the sections tested elsewhere.
lines=$(awk '/^## /{skip = ($0 ~ /^## (Training on GPUs|Reliability|PyTorch|Deploying)/)}
             /^```sh/{blk=1; next} /^```/{blk=0; next} blk && !skip' "$src/README.md" |
        sed 's/ *#.*$//' | grep -v '^ *$' | sed -e ':a' -e '/\\$/N; s/\\\n *//; ta')

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# Runs "$@" (a flodl-ps) in the background on a free port: sets port and ps_pid.
start_ps() {
  port=$(free_port)
  local args=("${@//tcp:\/\/0.0.0.0:29500/tcp://127.0.0.1:$port}")
  timeout 300 "${args[@]}" > "$tmp/ps.log" 2>&1 &
  ps_pid=$!
  pids+=("$ps_pid")
}

# Starts the 4 workers of a multi-host example on this machine (rank k = 0..3, the example's
# coordinator host replaced by 127.0.0.1:port, one epoch) and waits for them and flodl-ps.
run_workers() {
  local host=$1; shift
  local r w=() rc=0
  for r in 0 1 2 3; do
    local args=("$@")
    args=("${args[@]/#k/$r}")
    args=("${args[@]//$host:29500/127.0.0.1:$port}")
    timeout 300 "${args[@]}" --epochs 1 --quiet > "$tmp/w$r.log" 2>&1 &
    w+=($!)
    pids+=("$!")
  done
  for r in 0 1 2 3; do wait "${w[$r]}" || { rc=1; echo "  rank $r: $(tail -n 2 "$tmp/w$r.log")"; }; done
  wait "$ps_pid" || { rc=1; echo "  flodl-ps: $(tail -n 3 "$tmp/ps.log")"; }
  return $rc
}

cd "$src" || { echo "FAIL: no $src"; exit 1; }
mkdir -p "$tmp/keys" "$tmp/ckpt"
while IFS= read -r line; do
  read -r -a words <<< "$line"
  # The README's ./build is the build directory this test runs against.
  words=("${words[@]/#.\/build\//$build/}")
  # Installed binaries: this build's.
  case "${words[0]}" in
    flodl-ps) words[0]=$build/server/flodl-ps ;;
    flodl-worker) words[0]=$build/worker/flodl-worker ;;
    flodl-keygen) words[0]=$build/server/flodl-keygen ;;
  esac
  words=("${words[@]//\/etc\/flodl\/keys/$tmp/keys}")
  words=("${words[@]//\/ckpt/$tmp/ckpt}")
  case "$line" in
    ./scripts/test.sh)
      echo "by hand: $line (the test command itself, which runs this test)" ;;
    ./scripts/run.sh)
      echo "run: $line"
      if ! timeout 600 ./scripts/run.sh > "$tmp/run.log" 2>&1 < /dev/null; then
        fail "'$line': $(tail -n 3 "$tmp/run.log")"
      else
        acc=$(sed -n 's/^\[rank 0\] rank 0 summary: .*test accuracy \([0-9.]*\)%.*/\1/p' "$tmp/run.log")
        awk -v a="${acc:-0}" 'BEGIN { exit !(a >= 90) }' ||
          fail "'$line': rank 0's test accuracy '${acc:-none}', expected at least 90%"
        echo "  rank 0 reached ${acc}%"
      fi ;;
    "flodl-keygen "*)
      echo "run: $line"
      "${words[@]}" > "$tmp/keygen.log" 2>&1 || fail "'$line': $(cat "$tmp/keygen.log")" ;;
    "flodl-ps --bind tcp://0.0.0.0:29500 --world-size 4 --curve-dir"*)
      echo "run: $line (on 127.0.0.1)"
      start_ps "${words[@]}" ;;
    "flodl-worker --rank k --world-size 4 --coordinator tcp://coordinator-host:29500"*)
      echo "run: $line (ranks 0..3 on 127.0.0.1, one epoch)"
      run_workers coordinator-host "${words[@]}" || fail "'$line': the job failed" ;;
    "flodl-ps --bind tcp://0.0.0.0:29500 --world-size 4 --shards 4 --host ps-0.example"*)
      echo "run: $line (on 127.0.0.1)"
      words=("${words[@]/ps-0.example/127.0.0.1}")
      start_ps "${words[@]}" ;;
    "flodl-worker --mode ps --rank k --world-size 4 --coordinator tcp://ps-0.example:29500"*)
      echo "run: $line (ranks 0..3 on 127.0.0.1, one epoch)"
      run_workers ps-0.example "${words[@]}" || fail "'$line': the job failed" ;;
    "./build/launch/flodl-launch --workers 4 --ps-flag"*)
      echo "run: $line"
      timeout 600 "${words[@]}" > "$tmp/launch.log" 2>&1 < /dev/null ||
        fail "'$line': $(tail -n 3 "$tmp/launch.log")" ;;
    "./scripts/hybrid-check.sh --build build --device sim --gpus 0,1 --bound 0")
      echo "run: $line"
      timeout 600 ./scripts/hybrid-check.sh --build "$build" --device sim --gpus 0,1 --bound 0 \
        > "$tmp/hybrid.log" 2>&1 < /dev/null || fail "'$line': $(grep -E '^FAIL' "$tmp/hybrid.log" | head -n 3)" ;;
    "./scripts/two-level-bench.sh --build build")
      echo "run: $line"
      timeout 600 ./scripts/two-level-bench.sh --build "$build" > "$tmp/two-level.log" 2>&1 < /dev/null ||
        fail "'$line': $(tail -n 3 "$tmp/two-level.log")"
      [ "$(grep -cE '^(flat|hybrid) ' "$tmp/two-level.log")" -eq 6 ] ||
        fail "'$line': not six runs: $(cat "$tmp/two-level.log")" ;;
    "./scripts/install-deps.sh bench"*)
      echo "by hand: $line (installs Open MPI and PyTorch, a large download, for the benchmarks)" ;;
    "./build/bench/flodl-bench "*)
      echo "by hand: $line (a benchmark: minutes, beside its peer; the figures are the README's)" ;;
    "sudo ./scripts/netns-bench.sh"*)
      echo "by hand: $line (root and network namespaces over emulated links, minutes)" ;;
    *)
      fail "the README shows '$line', which no test runs: run it here or say why not" ;;
  esac
done <<< "$lines"
[ $status -eq 0 ] && echo PASS
exit $status
