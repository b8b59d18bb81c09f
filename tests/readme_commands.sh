#!/usr/bin/env bash
# The documentation's command lines, run: every line of the ```sh blocks of README.md,
# CONTRIBUTING.md and every docs/ page that no other runner owns (tests/doc_lines.py says which
# pages the others own: docs/gpus.md readme_gpu.sh, docs/reliability.md readme_faultmatrix.sh,
# docs/pytorch.md tests/python/run.py, docs/deploy.md scripts/deploy-test.sh) is either run
# here, the way a user would (hosts, ports and paths of the multi-host examples replaced by
# this machine's, the workers' epochs cut to one), or named in the list of lines left to be run
# by hand, with the reason. A line in neither fails the test, so no page can gain a command no
# test runs. A line shown on several pages runs once.
#   tests/readme_commands.sh BUILD_DIR SOURCE_DIR [--check]
# --check runs nothing: it only says what would become of each line, failing on a line no case
# knows (ctest docs_coverage, seconds instead of minutes).
set -uo pipefail
build=$1
src=$2
check=0
[ "${3:-}" = "--check" ] && check=1
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

# PAGE<TAB>LINE for every line of the pages this runner owns, continuations joined.
lines=$(python3 "$src/tests/doc_lines.py" "$src" --runner readme_commands) ||
  { echo "FAIL: tests/doc_lines.py: $lines"; exit 1; }
[ -n "$lines" ] || { echo "FAIL: the documentation shows no command line at all"; exit 1; }
grep -q $'^README.md\t./scripts/run.sh$' <<< "$lines" ||
  { echo "FAIL: README.md does not show the line ./scripts/run.sh"; exit 1; }

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

# Fails naming the line unless log holds the summary of each rank given.
summaries() {
  local what=$1 log=$2 r
  shift 2
  for r in "$@"; do
    grep -q "^\[rank $r\] rank $r summary: " "$log" ||
      fail "'$what': no summary of rank $r: $(tail -n 3 "$log")"
  done
}

# What becomes of a line: "run" (run_line knows it) or "by hand: REASON"; nothing when no case
# knows the line, which fails the test.
plan() {
  case "$1" in
    ./scripts/test.sh | "./scripts/test.sh --quick")
      echo "by hand: the test command itself, which runs this test" ;;
    "./scripts/build.sh build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFLODL_CUDA=on")
      echo "by hand: the test command's plain pass builds this (CUDA on only where nvcc is)" ;;
    ./scripts/run.sh | "./scripts/install-deps.sh image" | "cmake -S . -B build" | \
      "cmake --build build -j "[0-9]* | "cmake --install build --prefix /opt/flodl" | \
      ./scripts/build.sh | "ctest --test-dir build -R '^core_' --output-on-failure" | \
      "flodl-keygen "* | \
      "flodl-ps --bind tcp://0.0.0.0:29500 --world-size 4 --curve-dir"* | \
      "flodl-worker --rank k --world-size 4 --coordinator tcp://coordinator-host:29500"* | \
      "flodl-ps --bind tcp://0.0.0.0:29500 --world-size 4 --shards 4 --host ps-0.example"* | \
      "flodl-worker --mode ps --rank k --world-size 4 --coordinator tcp://ps-0.example:29500"* | \
      "./build/launch/flodl-launch --workers 4 --ps-flag"* | \
      "flodl-launch --hosts 2 --nproc-per-host 2 -- --epochs 1" | \
      "flodl-launch --nnodes 2 --node-rank "[01]" --nproc-per-host 2 --coordinator tcp://10.0.0.1:29600 "* | \
      "./scripts/hybrid-check.sh --build build --device sim --gpus 0,1 --bound 0" | \
      "./scripts/two-level-bench.sh --build build")
      echo run ;;
    "tests/readme_commands.sh build . --check")
      echo "by hand: the docs_coverage test runs it" ;;
    "scripts/format.sh --check")
      echo "by hand: the test command's formatting check runs it (clang-format 14)" ;;
    "./scripts/install-deps.sh bench"*)
      echo "by hand: installs Open MPI and PyTorch, a large download, for the benchmarks" ;;
    "./build/bench/flodl-bench "*)
      echo "by hand: a benchmark: minutes, beside its peer; the figures are the docs'" ;;
    "./scripts/rendezvous-bench.sh"*)
      echo "by hand: a benchmark: up to 2048 processes, minutes; the fault matrix's --full scale row runs it at 512 ranks" ;;
    "sudo ./scripts/netns-bench.sh"*)
      echo "by hand: root and network namespaces over emulated links, minutes" ;;
  esac
}

# Runs one line the way a user would, on this machine, against this build.
run_line() {
  local line=$1
  local words
  read -r -a words <<< "$line"
  # The docs' ./build is the build directory this test runs against.
  words=("${words[@]/#.\/build\//$build/}")
  # Installed binaries: this build's.
  case "${words[0]}" in
    flodl-ps) words[0]=$build/server/flodl-ps ;;
    flodl-worker) words[0]=$build/worker/flodl-worker ;;
    flodl-keygen) words[0]=$build/server/flodl-keygen ;;
    flodl-launch) words[0]=$build/launch/flodl-launch ;;
  esac
  words=("${words[@]//\/etc\/flodl\/keys/$tmp/keys}")
  words=("${words[@]//\/ckpt/$tmp/ckpt}")
  case "$line" in
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
    "./scripts/install-deps.sh image")
      echo "run: $line (installs nothing when the packages are there)"
      timeout 600 ./scripts/install-deps.sh image > "$tmp/deps.log" 2>&1 < /dev/null ||
        fail "'$line': $(tail -n 3 "$tmp/deps.log")" ;;
    "cmake -S . -B build" | "cmake --build build -j "* | ./scripts/build.sh)
      # The build directory is this test's own: configured and built already, so this checks
      # that the commands work on it without rebuilding the tree.
      echo "run: $line (on $build)"
      words=("${words[@]/#build/$build}")
      [ "$line" = ./scripts/build.sh ] && words+=("$build")
      timeout 600 "${words[@]}" > "$tmp/cmake.log" 2>&1 < /dev/null ||
        fail "'$line': $(tail -n 5 "$tmp/cmake.log")" ;;
    "cmake --install build --prefix /opt/flodl")
      echo "run: $line (from $build into a temporary prefix)"
      if ! timeout 300 cmake --install "$build" --prefix "$tmp/prefix" > "$tmp/install.log" 2>&1
      then
        fail "'$line': $(tail -n 5 "$tmp/install.log")"
      else
        local f
        for f in bin/flodl-ps bin/flodl-worker bin/flodl-launch bin/flodl-keygen \
                 include/flodl/flodl.h; do
          [ -e "$tmp/prefix/$f" ] || fail "'$line' installed no $f"
        done
        [ -n "$(find "$tmp/prefix" -name libflodl.so)" ] || fail "'$line' installed no libflodl.so"
      fi ;;
    "ctest --test-dir build "*)
      # This build's tests, from a directory of our own that names the build as its one
      # subdirectory: ctest writes its logs (Testing/) there, not into the build, whose logs the
      # ctest running this test is writing. Through the shell, for the line's quoting; a regex
      # that matches no test must fail.
      echo "run: $line (the tests of $build)"
      mkdir -p "$tmp/ctest"
      echo "subdirs(\"$build\")" > "$tmp/ctest/CTestTestfile.cmake"
      timeout 300 bash -c "${line/--test-dir build /--test-dir $tmp/ctest } --no-tests=error" \
        > "$tmp/ctest.log" 2>&1 < /dev/null || fail "'$line': $(tail -n 5 "$tmp/ctest.log")" ;;
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
    "flodl-launch --hosts 2 --nproc-per-host 2 -- --epochs 1")
      echo "run: $line"
      timeout 300 "${words[@]}" > "$tmp/hosts.log" 2>&1 < /dev/null ||
        fail "'$line': $(tail -n 3 "$tmp/hosts.log")"
      summaries "$line" "$tmp/hosts.log" 0 1 2 3 ;;
    "flodl-launch --nnodes 2 --node-rank 0 "*)
      # Node 0 in the background; node 1's line, next on the page, runs beside it.
      echo "run: $line (node 0 on 127.0.0.1, in the background)"
      node_port=$(free_port)
      words=("${words[@]//10.0.0.1:29600/127.0.0.1:$node_port}")
      timeout 300 "${words[@]}" > "$tmp/node0.log" 2>&1 < /dev/null &
      node0_pid=$!
      pids+=("$node0_pid") ;;
    "flodl-launch --nnodes 2 --node-rank 1 "*)
      echo "run: $line (node 1 on this machine, beside node 0)"
      words=("${words[@]//10.0.0.1:29600/127.0.0.1:${node_port:-1}}")
      timeout 300 "${words[@]}" > "$tmp/node1.log" 2>&1 < /dev/null ||
        fail "'$line': $(tail -n 3 "$tmp/node1.log")"
      if [ -z "${node0_pid:-}" ]; then
        fail "'$line': node 0's line did not run first"
      else
        wait "$node0_pid" || fail "node 0 of '$line': $(tail -n 3 "$tmp/node0.log")"
        summaries "node 0" "$tmp/node0.log" 0 1
        summaries "$line" "$tmp/node1.log" 2 3
        grep -q '^\[ps\] ' "$tmp/node1.log" && fail "'$line': node 1 ran a flodl-ps"
      fi ;;
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
    *)
      fail "'$line': plan says run, but no case runs it" ;;
  esac
}

cd "$src" || { echo "FAIL: no $src"; exit 1; }
mkdir -p "$tmp/keys" "$tmp/ckpt"
declare -A seen=()
while IFS=$'\t' read -r page line; do
  if [ -n "${seen[$line]:-}" ]; then
    echo "again ($page): $line (run once, from ${seen[$line]})"
    continue
  fi
  seen[$line]=$page
  what=$(plan "$line")
  case "$what" in
    "")
      fail "$page shows '$line', which no test runs: run it here or say why not" ;;
    run)
      if [ $check -eq 1 ]; then echo "run ($page): $line"; else run_line "$line"; fi ;;
    *)
      echo "$what ($page): $line" ;;
  esac
done <<< "$lines"
[ $status -eq 0 ] && echo PASS
exit $status
