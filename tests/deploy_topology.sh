#!/usr/bin/env bash
# The topology deploy/k8s describes, run in network namespaces on this machine: flodl-ps as the
# ps Deployment runs it (its args from ps.yaml), and the workers of the Indexed Job (args and
# environment from workers.yaml as they stand: the rank from JOB_COMPLETION_INDEX, FLODL_HOST
# the pod's address, FLODL_COORDINATOR the Service's name resolved to the ps pod), each in its
# own namespace, with CurveZMQ keys from flodl-keygen laid out as the Secret mounts them. Twice,
# as the cluster would: first rank 1's pod dies after the first checkpoint (flodl-ps and rank 0
# must fail, naming it), then every pod is restarted with the same args and environment
# (restartPolicy OnFailure) and must resume from that checkpoint (--resume-if-any) and train to
# the end while the ps answers its readiness probe (/healthz on the probe's port and the pod's
# address, read by flodl-health).
#   tests/deploy_topology.sh BUILD_DIR       exit 0 pass, 1 fail, 77 skip (not root, no ip)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:?usage: deploy_topology.sh BUILD_DIR}
[ "$(id -u)" -eq 0 ] || { echo "SKIP: needs root for network namespaces"; exit 77; }
command -v ip >/dev/null || { echo "SKIP: needs iproute2"; exit 77; }
/usr/bin/python3 -c "import yaml" 2>/dev/null || { echo "SKIP: needs python3-yaml"; exit 77; }

# What the manifests run: one line per item (args, then NAME=value environment, for ps and worker).
manifest() {
  /usr/bin/python3 - "$root/deploy/k8s" "$1" "$2" <<'PY'
import sys, yaml
d, which, part = sys.argv[1:4]
for doc in yaml.safe_load_all(open(f"{d}/{which}.yaml")):
    pod = doc.get("spec", {}).get("template", {}).get("spec")
    if not pod:
        continue
    c = pod["containers"][0]
    if part == "probe":  # the readiness probe's port, as a number
        port = c["readinessProbe"]["httpGet"]["port"]
        print({p["name"]: p["containerPort"] for p in c.get("ports", [])}.get(port, port))
    elif part == "args":
        for a in c.get("args", []):
            print(a)
    else:
        for e in c.get("env", []):
            if "value" in e:
                print(f"{e['name']}={e['value']}")
PY
}

pfx="flodlk$$"
rate=10gbit burst=1mb latency=20ms overhead=0 offload=on
tmp=$(mktemp -d)
. "$root/scripts/netns-lib.sh"
trap netns_cleanup EXIT
workers=2
netns_setup "$workers"

# The Secret, as the pods see it: /keys/{server.key,client.key,authorized/client.pub}.
"$build/server/flodl-keygen" "$tmp/gen" >/dev/null
mkdir -p "$tmp/keys/authorized"
cp "$tmp/gen/server.key" "$tmp/gen/client.key" "$tmp/keys/"
cp "$tmp/gen/authorized/client.pub" "$tmp/keys/authorized/"
chmod 600 "$tmp/keys/"*.key

# The ps pod: ps.yaml's args, its $(VAR) references expanded as the kubelet does (POD_IP: the
# switch namespace's address, where the ps runs).
ps_ip=10.77.0.254
mapfile -t ps_env < <(manifest ps env)
mapfile -t ps_args < <(manifest ps args)
ps_probe=$(manifest ps probe)
for kv in "${ps_env[@]}"; do export "${kv?}"; done
for i in "${!ps_args[@]}"; do
  ps_args[$i]=$(echo "${ps_args[$i]}" | sed -e "s/\$(FLODL_WORLD_SIZE)/$FLODL_WORLD_SIZE/" \
    -e "s/\$(POD_IP)/$ps_ip/")
done
[ "$FLODL_WORLD_SIZE" = "$workers" ] || { echo "FAIL: ps.yaml's world size $FLODL_WORLD_SIZE, this test runs $workers"; exit 1; }
mapfile -t wk_args < <(manifest workers args)
mapfile -t wk_env < <(manifest workers env)

# One run of the pods: the ps, then the workers (the Service name resolves to the ps pod; the
# checkpoint claim is the temp dir).
start_pods() {
  local run=$1 k
  ip netns exec "$(sw_ns)" env FLODL_CURVE_DIR="$tmp/keys" timeout 120 "$build/server/flodl-ps" \
    "${ps_args[@]}" > "$tmp/ps$run.log" 2>&1 &
  ps_pid=$!
  pids+=("$ps_pid")
  wk_pids=()
  for ((k = 0; k < workers; k++)); do
    local env_k=() args_k=() kv a
    for kv in "${wk_env[@]}"; do
      case "$kv" in
        FLODL_COORDINATOR=*) env_k+=("FLODL_COORDINATOR=tcp://10.77.0.254:29500") ;;
        FLODL_CURVE_DIR=*) env_k+=("FLODL_CURVE_DIR=$tmp/keys") ;;
        *) env_k+=("$kv") ;;
      esac
    done
    for a in "${wk_args[@]}"; do
      a=${a//\/checkpoints/$tmp/checkpoints}
      args_k+=("${a//\$(FLODL_HOST)/$(addr "$k")}")
    done
    ip netns exec "$(ns_of "$k")" env -i PATH="$PATH" JOB_COMPLETION_INDEX="$k" \
      FLODL_HOST="$(addr "$k")" "${env_k[@]}" timeout 120 "$build/worker/flodl-worker" \
      "${args_k[@]}" > "$tmp/w$k.$run.log" 2>&1 &
    wk_pids+=($!)
    pids+=($!)
  done
}
dump() {
  local f
  for f in "$tmp"/*.log; do echo "--- $f"; tail -5 "$f"; done
  exit 1
}
mkdir -p "$tmp/checkpoints"
manifest_file="$tmp/checkpoints/ring/manifest.safetensors"

# Run 1: rank 1's pod dies (SIGKILL) once the first checkpoint is written.
start_pods 1
for _ in $(seq 600); do [ -f "$manifest_file" ] && break; sleep 0.1; done
[ -f "$manifest_file" ] || { echo "FAIL: no checkpoint in 60 s"; dump; }
# wk_pids are the timeout wrappers (ip netns exec and env exec into them): kill the worker.
pkill -KILL -P "${wk_pids[1]}" || { echo "FAIL: rank 1 was not running to be killed"; dump; }
for pid in "$ps_pid" "${wk_pids[0]}"; do
  if wait "$pid"; then echo "FAIL: a process exited 0 after rank 1 died"; dump; fi
done
wait "${wk_pids[1]}" || true
pids=()
for f in ps1 w0.1; do
  grep -q 'rank 1 .*declared dead' "$tmp/$f.log" || { echo "FAIL: $f does not name rank 1 dead"; dump; }
done

# Run 2: every pod restarted with the same args and environment resumes from the checkpoint.
start_pods 2
health=""
for _ in $(seq 100); do
  if ip netns exec "$(sw_ns)" "$build/observe/flodl-health" "http://$ps_ip:$ps_probe/healthz" \
    2>/dev/null; then health=200; break; fi
  sleep 0.1
done
status=0
for k in "${!wk_pids[@]}"; do
  wait "${wk_pids[$k]}" || { echo "FAIL: worker $k exited $? after the restart"; status=1; }
done
wait "$ps_pid" || { echo "FAIL: flodl-ps exited $? after the restart"; status=1; }
pids=()
for k in $(seq 0 $((workers - 1))); do
  grep -q "rank $k summary:" "$tmp/w$k.2.log" || { echo "FAIL: rank $k did not finish"; status=1; }
done
resumed=$(grep -m1 -o 'resumed from .*' "$tmp/w0.2.log" || true)
case "$resumed" in
  *", 0 epoch(s) done" | "") echo "FAIL: rank 0 did not resume from the checkpoint ('$resumed')"; status=1 ;;
esac
[ "$health" = 200 ] || { echo "FAIL: the ps's /healthz on $ps_ip:$ps_probe (its readiness probe's port) did not answer 200 (flodl-health)"; status=1; }
[ $status -eq 0 ] || dump
echo "deploy topology: ps + $workers workers as deploy/k8s runs them, CurveZMQ, in namespaces:" \
  "rank 1 killed, ps and rank 0 failed naming it; restarted: $resumed," \
  "$(grep -o 'test accuracy [0-9.]*%' "$tmp/w0.2.log" | tail -1), /healthz 200 on the probe's port $ps_probe"
