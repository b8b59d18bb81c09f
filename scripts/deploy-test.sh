#!/usr/bin/env bash
# The deployment, run for real in a container engine on this machine (needs root):
#   1. a Docker engine: the running one, else Debian's docker.io installed and started
#      (dockerd --iptables=false --storage-driver=vfs);
#   2. the debian:12-slim base image, made offline if missing (debootstrap of bookworm from the
#      mirror apt uses, then docker import; the root filesystem cached in $FLODL_DEPLOY_CACHE,
#      default /var/cache/flodl-deploy, so a second run reuses it);
#   3. the CPU image, built with docs/deploy.md's command (nothing of CUDA fetched, only the build
#      group of install-deps.sh installed, the build context free of build directories);
#   4. docs/deploy.md's docker-compose up: the job reaches the README's accuracy, every container
#      exits 0, every flodl process uses the CurveZMQ keys the keys service made, the
#      checkpoints are on the volume, the health checks passed;
#   5. a worker container killed mid-training: flodl-ps and the other worker exit non-zero
#      within the heartbeat timeout + 2 s, naming the dead rank;
#   6. the same up again: the job resumes from the last checkpoint and finishes;
#   7. cleanup: the job's containers, network and volumes, the images this run built or
#      imported, and the engine if this run started it.
# Each step prints what it checks; a step that cannot run fails with the reason.
#   scripts/deploy-test.sh                exit 0 pass, 1 fail
#   scripts/deploy-test.sh --check-readme only that docs/deploy.md shows the commands run here
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${FLODL_DEPLOY_CACHE:-/var/cache/flodl-deploy}
min_acc=93.5        # the README: "about 94% test accuracy (94.9% measured)"
t_start=$(date +%s)

# The commands docs/deploy.md shows, run as they are written.
build_cmd='docker build --network host -f deploy/Dockerfile -t flodl:cpu .'
up_cmd='docker-compose -p flodl -f deploy/compose.yaml up'
down_cmd='docker-compose -p flodl -f deploy/compose.yaml down -v'
compose=(docker-compose -p flodl -f deploy/compose.yaml)
# The health checks every second (deploy/compose.yaml's FLODL_HEALTH_INTERVAL, 3 s by default):
# on a fast machine a worker trains its 10 epochs in about 3 s, and with the default interval
# it could exit before its first probe.
export FLODL_HEALTH_INTERVAL=1s

say() { echo "== deploy-test [$(($(date +%s) - t_start)) s]: $*"; }
fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# The page's command lines (tests/doc_lines.py gives this runner docs/deploy.md) must be the
# ones run here, in this order: a line added there that this script does not run fails.
check_readme() {
  local got want
  got=$(python3 "$root/tests/doc_lines.py" "$root" --runner deploy_readme --bare) ||
    fail "tests/doc_lines.py: $got"
  want=$(printf '%s\n' "$build_cmd" "$up_cmd" "$down_cmd")
  [ "$got" = "$want" ] || fail "docs/deploy.md shows other commands than this test runs; it shows:
$got
this test runs:
$want"
  echo "docs/deploy.md's commands are the ones deploy-test.sh runs ($(wc -l <<< "$got") lines)"
}
if [ "${1:-}" = "--check-readme" ]; then
  check_readme
  exit 0
fi

[ "$(id -u)" -eq 0 ] || fail "needs root (it installs and starts a Docker engine, debootstraps)"
cd "$root" || fail "no $root"
work=$(mktemp -d /tmp/flodl-deploy-test-XXXXXX)
started_engine=0
dockerd_pid=""
imported_base=0
built_image=0

cleanup() {
  local rc=$?
  trap - EXIT
  say "7. cleanup: the job's containers, network and volumes; images this run built; the engine if started here"
  if docker info >/dev/null 2>&1; then
    "${compose[@]}" down -v --remove-orphans >/dev/null 2>&1 ||
      echo "cleanup: $down_cmd failed" >&2
    [ $built_image -eq 1 ] && docker image rm -f flodl:cpu >/dev/null 2>&1
    [ $imported_base -eq 1 ] && docker image rm -f debian:12-slim >/dev/null 2>&1
    # The build's intermediate images: dangling ones, on an engine of this run's only.
    [ $started_engine -eq 1 ] && docker image prune -f >/dev/null 2>&1
    left=$(docker ps -aq --filter label=com.docker.compose.project=flodl)
    [ -z "$left" ] || { echo "cleanup: containers left: $left" >&2; rc=1; }
  fi
  if [ $started_engine -eq 1 ] && [ -n "$dockerd_pid" ]; then
    kill "$dockerd_pid" 2>/dev/null
    for _ in $(seq 100); do kill -0 "$dockerd_pid" 2>/dev/null || break; sleep 0.2; done
    if kill -0 "$dockerd_pid" 2>/dev/null; then
      echo "cleanup: dockerd $dockerd_pid did not stop" >&2
      rc=1
    else
      echo "cleanup: stopped the engine this run started (pid $dockerd_pid)"
    fi
  fi
  rm -rf "$work"
  say "done, exit $rc"
  exit $rc
}
trap cleanup EXIT

check_readme

# 1. The engine.
say "1. a Docker engine and docker-compose"
need=()
command -v dockerd >/dev/null || need+=(docker.io)
command -v docker-compose >/dev/null || need+=(docker-compose)
command -v debootstrap >/dev/null || need+=(debootstrap)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing ${need[*]} (Debian's)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}" \
    >"$work/apt.log" 2>&1 || {
    DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null 2>&1
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}" \
      >"$work/apt.log" 2>&1
  } || fail "cannot install ${need[*]}: $(tail -3 "$work/apt.log")"
fi
if docker info >/dev/null 2>&1; then
  echo "an engine is running already: using it (it stays running)"
else
  mkdir -p "$cache"
  dockerd --iptables=false --storage-driver=vfs >"$cache/dockerd.log" 2>&1 &
  dockerd_pid=$!
  started_engine=1
  for _ in $(seq 150); do docker info >/dev/null 2>&1 && break; sleep 0.2; done
  docker info >/dev/null 2>&1 ||
    fail "dockerd (pid $dockerd_pid) did not answer in 30 s: $(tail -3 "$cache/dockerd.log")"
  echo "started dockerd (pid $dockerd_pid, log $cache/dockerd.log)"
fi
echo "engine $(docker version -f '{{.Server.Version}}'), $(docker-compose version --short 2>/dev/null | sed 's/^/docker-compose /')"

# 2. The base image, offline.
say "2. the debian:12-slim base image (made here, never pulled)"
if docker image inspect debian:12-slim >/dev/null 2>&1; then
  echo "debian:12-slim is in the engine already"
else
  tarball="$cache/debian-12-minbase.tar"
  if [ -s "$tarball" ]; then
    echo "importing the cached root filesystem $tarball"
  else
    mirror=$(grep -hs -E '^(URIs:|deb )' /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
               /etc/apt/sources.list.d/*.sources | grep -v security |
             grep -o -m1 -E 'https?://[^ ]*debian/?' | head -1)
    mirror=${mirror:-http://deb.debian.org/debian}
    echo "debootstrap --variant=minbase bookworm from $mirror (once; cached in $cache)"
    rm -rf "$cache/rootfs"
    debootstrap --variant=minbase bookworm "$cache/rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 ||
      fail "debootstrap failed: $(tail -3 "$work/debootstrap.log")"
    rm -rf "$cache/rootfs/var/cache/apt/archives/"*.deb "$cache/rootfs/var/lib/apt/lists/"*
    tar -C "$cache/rootfs" --numeric-owner -cf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball" ||
      fail "cannot write $tarball"
    rm -rf "$cache/rootfs"
  fi
  docker import "$tarball" debian:12-slim >/dev/null || fail "docker import $tarball failed"
  imported_base=1
  echo "debian:12-slim imported"
fi

# 3. The CPU image.
say "3. the CPU image: $build_cmd"
built_image=1
t0=$(date +%s)
bash -c "$build_cmd" >"$work/build.log" 2>&1 ||
  fail "the image did not build: $(tail -20 "$work/build.log")"
echo "built flodl:cpu in $(($(date +%s) - t0)) s"
ctx=$(grep -o 'Sending build context to Docker daemon *[0-9.]* *[kMG]*B' "$work/build.log" | grep -o '[0-9.]* *[kMG]*B$')
echo "build context: ${ctx:-(BuildKit: not reported)}"
case "$ctx" in *GB | [0-9][0-9][0-9]*MB | [2-9][0-9]*MB) fail "the build context is $ctx: .dockerignore lets build output in" ;; esac
if docker images --format '{{.Repository}}' | grep -q cuda; then
  fail "a CUDA image is in the engine after building the CPU image: $(docker images | grep cuda)"
fi
echo "no CUDA base image fetched"
installed=$(grep -o 'install-deps.sh: installing .*' "$work/build.log" | head -1)
if [ -n "$installed" ]; then
  echo "build stage: $installed"
  for tool in clang docker-compose check prometheus; do
    case " $installed " in *" $tool "*) fail "the build stage installed $tool (a test tool)" ;; esac
  done
  echo "the build stage installed the image group only"
elif grep -q 'Using cache' "$work/build.log"; then
  echo "build stage: from the engine's layer cache (what it installs is checked when it runs)"
else
  fail "the build log does not say what the build stage installed: $(tail -5 "$work/build.log")"
fi

# Helpers over the job's containers.
cid() { "${compose[@]}" ps -q "$1" 2>/dev/null; }
vol() { docker volume inspect -f '{{.Mountpoint}}' "flodl_$1"; }
manifest_meta() { # manifest_meta KEY: the checkpoint manifest's metadata value
  /usr/bin/python3 - "$(vol checkpoints)/ring/manifest.safetensors" "$1" <<'PY'
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    print(json.loads(f.read(n))["__metadata__"]["flodl." + sys.argv[2]])
PY
}
accuracy() { # the final test accuracy rank 0 reported since $2
  docker logs --since "$2" "$(cid "$1")" 2>&1 | grep -o 'summary: .*test accuracy [0-9.]*%' |
    grep -o '[0-9.]*%$' | tr -d % | tail -1
}
all_exit_zero() {
  local s ok=0
  for s in init keys ps worker-0 worker-1; do
    c=$(cid "$s")
    [ -n "$c" ] || { echo "  $s: no container"; ok=1; continue; }
    code=$(docker inspect -f '{{.State.ExitCode}}' "$c")
    echo "  $s exited $code"
    [ "$code" = 0 ] || ok=1
  done
  return $ok
}
show_logs() { "${compose[@]}" logs --no-color --tail 15 >&2 2>&1; }

# 4. The job, as docs/deploy.md runs it.
say "4. the job: $up_cmd"
"${compose[@]}" down -v >/dev/null 2>&1
since=$(date -u +%Y-%m-%dT%H:%M:%S.%NZ)
t0=$(date +%s)
timeout 600 bash -c "$up_cmd" >"$work/up1.log" 2>&1 ||
  { show_logs; fail "$up_cmd exited $? (log: $(tail -5 "$work/up1.log"))"; }
echo "the job ran in $(($(date +%s) - t0)) s; every container exits 0:"
all_exit_zero || { show_logs; fail "a container exited non-zero"; }
acc=$(accuracy worker-0 "$since")
[ -n "$acc" ] || { show_logs; fail "rank 0 printed no summary"; }
awk -v a="$acc" -v m="$min_acc" 'BEGIN { exit !(a >= m) }' ||
  fail "rank 0's test accuracy $acc% is below the README's ($min_acc%)"
echo "rank 0's test accuracy $acc% (README: about 94%, at least $min_acc% here)"
echo "CurveZMQ: every flodl process with the keys the keys service made:"
keys=$(vol keys)
for f in server.key client.key authorized/client.pub; do
  [ "$(stat -c %u "$keys/$f" 2>/dev/null)" = 10001 ] || fail "$f is not on the keys volume, owned by uid 10001"
done
echo "  server.key, client.key, authorized/client.pub on the keys volume, owner uid 10001"
docker logs "$(cid keys)" 2>&1 | grep -q 'keys in /keys' || fail "the keys service did not make /keys"
for s in ps worker-0 worker-1; do
  c=$(cid "$s")
  docker inspect -f '{{range .Config.Env}}{{println .}}{{end}}' "$c" | grep -qx 'FLODL_CURVE_DIR=/keys' ||
    fail "$s does not get FLODL_CURVE_DIR=/keys"
  docker inspect -f '{{range .Mounts}}{{.Name}}:{{.Destination}} {{end}}' "$c" | grep -q 'flodl_keys:/keys' ||
    fail "$s does not mount the keys volume at /keys"
  if docker logs "$c" 2>&1 | grep -q -i -E 'plain text|insecure|refused'; then
    fail "$s ran in plain text or was refused: $(docker logs "$c" 2>&1 | grep -i -E -m1 'plain text|insecure|refused')"
  fi
  echo "  $s: FLODL_CURVE_DIR=/keys from the keys volume, no plain text, no refusal"
done
[ "$(grep -c 'registered from' <(docker logs "$(cid ps)" 2>&1))" -eq 2 ] ||
  fail "the ps did not register both ranks over CurveZMQ"
[ "$(manifest_meta epoch 2>/dev/null)" = 10 ] ||
  fail "no checkpoint of epoch 10 on the checkpoints volume ($(ls "$(vol checkpoints)/ring" 2>&1))"
echo "checkpoints on the volume: $(ls "$(vol checkpoints)/ring" | tr '\n' ' ')(epoch 10)"
for s in ps worker-0 worker-1; do
  n=$(docker inspect -f '{{range .State.Health.Log}}{{.ExitCode}} {{end}}' "$(cid "$s")" | tr ' ' '\n' | grep -c '^0$')
  if [ "$n" -lt 1 ]; then
    docker inspect -f '{{range .State.Health.Log}}{{.Start}} exit {{.ExitCode}}: {{.Output}}{{println}}{{end}}' \
      "$(cid "$s")" | sed 's/^/    /'
    fail "$s: flodl-health never passed while it ran ($(docker inspect -f '{{.State.StartedAt}} to {{.State.FinishedAt}}' "$(cid "$s")"), probing every $FLODL_HEALTH_INTERVAL)"
  fi
  echo "  $s: health check (flodl-health) passed $n time(s)"
done

# 5. A worker killed mid-training.
hb=$(grep -o '"--heartbeat-timeout", "[0-9]*"' deploy/compose.yaml | grep -o '[0-9]*"$' | tr -d '"')
[ -n "$hb" ] || fail "deploy/compose.yaml gives flodl-ps no --heartbeat-timeout"
say "5. worker-1 killed after the first checkpoint: ps and worker-0 exit non-zero within $hb ms + 2 s, naming rank 1"
"${compose[@]}" down -v >/dev/null 2>&1
bash -c "$up_cmd" >"$work/up2.log" 2>&1 &
up_pid=$!
ckpt=""
for _ in $(seq 1200); do
  m=$(docker volume inspect -f '{{.Mountpoint}}' flodl_checkpoints 2>/dev/null)
  [ -n "$m" ] && [ -f "$m/ring/manifest.safetensors" ] && { ckpt=$m; break; }
  sleep 0.05
done
[ -n "$ckpt" ] || { kill "$up_pid" 2>/dev/null; show_logs; fail "no checkpoint within 60 s"; }
w1=$(cid worker-1)
t_kill=$(date +%s.%N) # before the kill: its own latency counts against the deadline
docker kill "$w1" >/dev/null || fail "cannot kill worker-1"
echo "killed worker-1 (SIGKILL) after epoch $(manifest_meta epoch)"
wait "$up_pid"
for s in ps worker-0; do
  c=$(cid "$s")
  code=$(docker inspect -f '{{.State.ExitCode}}' "$c")
  fin=$(date -d "$(docker inspect -f '{{.State.FinishedAt}}' "$c")" +%s.%N)
  took=$(awk -v a="$fin" -v b="$t_kill" 'BEGIN { printf "%.1f", a - b }')
  [ "$code" != 0 ] || fail "$s exited 0 after worker-1 died"
  awk -v t="$took" -v h="$hb" 'BEGIN { exit !(t <= h / 1000 + 2) }' ||
    fail "$s exited $took s after the kill (heartbeat timeout $hb ms + 2 s)"
  why=$(docker logs "$c" 2>&1 | grep -m1 -E 'rank 1[^0-9].*(dead|died|fail|lost)')
  [ -n "$why" ] || fail "$s did not name the dead rank: $(docker logs "$c" 2>&1 | tail -3)"
  echo "  $s exited $code, $took s after the kill: $why"
done
epoch=$(manifest_meta epoch)
step=$(manifest_meta step)
[ "$epoch" -lt 10 ] || fail "the job finished before worker-1 was killed"
echo "the last checkpoint: epoch $epoch, step $step"

# 6. Restarted: resumes from the last checkpoint.
say "6. the job again ($up_cmd): resumes from epoch $epoch and finishes"
since=$(date -u +%Y-%m-%dT%H:%M:%S.%NZ)
timeout 600 bash -c "$up_cmd" >"$work/up3.log" 2>&1 || { show_logs; fail "$up_cmd exited $?"; }
all_exit_zero || { show_logs; fail "a container exited non-zero after the restart"; }
line=$(docker logs --since "$since" "$(cid worker-0)" 2>&1 | grep -m1 'resumed from')
[ "$line" = "resumed from /checkpoints/ring: step $step, $epoch epoch(s) done" ] ||
  fail "worker-0 did not resume from the last checkpoint (step $step, epoch $epoch): '${line:-no resume line}'"
echo "worker-0: $line"
acc=$(accuracy worker-0 "$since")
awk -v a="${acc:-0}" -v m="$min_acc" 'BEGIN { exit !(a >= m) }' ||
  fail "after the resume rank 0's test accuracy is '${acc}'%, below $min_acc%"
[ "$(manifest_meta epoch)" = 10 ] || fail "the resumed job left no checkpoint of epoch 10"
echo "finished from the checkpoint: test accuracy $acc%, checkpoint of epoch 10"
say "all steps passed"
