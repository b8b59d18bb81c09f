#!/usr/bin/python3
"""Offline checks of deploy/ (no container engine or cluster is reachable here):
- compose.yaml renders alone (the CPU job, no profiles) and with the GPU overlay
  compose.gpu.yaml (docker-compose config, Debian's); health checks run flodl-health (no
  shell), the keys come from a one-shot service after an init service that owns the volumes,
  the workers checkpoint and resume from the same directory;
- every Kubernetes manifest parses and matches deploy/k8s/schema.json (the parts of the API
  they use; unknown fields refused), and the kustomization lists files that exist; the
  workers run on CPU by default, are restarted on failure and resume (--resume-if-any), the
  checkpoint claim is ReadWriteMany; the GPU overlay (deploy/k8s/gpu, JSON 6902 patches
  applied here) gives them the CUDA image, --device cuda and a GPU each, and still matches;
- every flag the manifests and the Compose file give flodl-ps or flodl-worker is one the
  binaries accept (their --help), every FLODL_ variable one they read;
- the Secret's keys are the ones the pods mount, at the paths a key directory needs;
- the pods' probes read the health listener's port (--health-port), and both HTTP ports bind
  the pod's address (--metrics-bind $(VAR), VAR from the downward API's status.podIP);
- the Dockerfiles build with the README's scripts (the image group only), the CPU one names no
  CUDA image, and .dockerignore keeps build directories out of the context.
  usage: deploy/check.py --bin-dir BUILD_DIR      exit 0 pass, 1 fail, 77 a tool is missing"""
import argparse, json, os, re, subprocess, sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
KNOWN_VARS = {"FLODL_RANK", "FLODL_WORLD_SIZE", "FLODL_COORDINATOR", "FLODL_HOST", "FLODL_JOB_ID",
              "FLODL_LOG", "FLODL_CURVE_DIR", "FLODL_INSECURE", "FLODL_IMAGE"}
problems = []


def fail(msg):
    problems.append(msg)


def flags_of(binary):
    out = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=30)
    return set(re.findall(r"--[a-z][a-z0-9-]*", out.stdout + out.stderr))


def validate(doc, schema, jsonschema):
    """Validates doc against the branch of the schema for its kind, for a precise message."""
    for branch in schema["oneOf"]:
        props = branch["properties"]
        if props["kind"]["const"] == doc.get("kind") and \
                props["apiVersion"]["const"] == doc.get("apiVersion"):
            sub = dict(branch, definitions=schema["definitions"])
            err = jsonschema.exceptions.best_match(jsonschema.Draft7Validator(sub).iter_errors(doc))
            return None if err is None else f"{err.message} at {'.'.join(map(str, err.absolute_path))}"
    return f"{doc.get('apiVersion')} {doc.get('kind')} is not a kind these manifests may use"


def apply_json6902(doc, ops):
    """Applies JSON 6902 add/replace/remove operations (what the GPU overlay uses) to doc."""
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        parent = doc
        for p in parts[:-1]:
            parent = parent[int(p)] if isinstance(parent, list) else parent[p]
        last = parts[-1]
        if op["op"] == "remove":
            del parent[int(last) if isinstance(parent, list) else last]
        elif isinstance(parent, list):
            if last == "-":
                parent.append(op["value"])
            elif op["op"] == "add":
                parent.insert(int(last), op["value"])
            else:
                parent[int(last)] = op["value"]
        else:
            if op["op"] == "replace" and last not in parent:
                raise KeyError(f"replace of missing {op['path']}")
            parent[last] = op["value"]


def flag_value(argv, flag):
    return argv[argv.index(flag) + 1] if flag in argv and argv.index(flag) + 1 < len(argv) else None


def check_worker_pod(what, c, gpu):
    """The workers' contract: CPU by default, CUDA with a GPU in the overlay; resume always."""
    args = c.get("args", [])
    limits = (c.get("resources") or {}).get("limits") or {}
    if gpu:
        if flag_value(args, "--device") != "cuda":
            fail(f"{what}: the GPU overlay's workers do not train with --device cuda")
        if str(limits.get("nvidia.com/gpu")) != "1":
            fail(f"{what}: the GPU overlay's workers do not ask for nvidia.com/gpu: 1")
        if "cuda" not in c["image"]:
            fail(f"{what}: the GPU overlay's workers run {c['image']}, not the CUDA image")
    else:
        if "nvidia.com/gpu" in limits or flag_value(args, "--device") == "cuda":
            fail(f"{what}: the default workers ask for a GPU (that is the overlay's job)")
        if "cuda" in c["image"]:
            fail(f"{what}: the default workers run the CUDA image {c['image']}")
    ckpt = flag_value(args, "--checkpoint")
    if ckpt is None or flag_value(args, "--resume-if-any") != ckpt:
        fail(f"{what}: a restarted worker must resume from its checkpoint: "
             f"--resume-if-any {ckpt} is missing")


def check_probes(what, c):
    """The probes read /healthz from the health listener (--health-port), which idle or slow
    clients cannot starve, and both HTTP ports bind the pod's address (the downward API's
    status.podIP), not every address."""
    args = c.get("args", [])
    ports = {p.get("name"): p.get("containerPort") for p in c.get("ports", [])}
    health = flag_value(args, "--health-port")
    if health is None:
        fail(f"{what}: no --health-port: the probes would share the metrics port's connections")
    for kind in ("readinessProbe", "livenessProbe"):
        port = ((c.get(kind) or {}).get("httpGet") or {}).get("port")
        number = ports.get(port, port)
        if port is None or str(number) != str(health):
            fail(f"{what}: the {kind} reads port {port} ({number}), not --health-port {health}")
    bind = flag_value(args, "--metrics-bind") or ""
    m = re.fullmatch(r"\$\((\w+)\)", bind)
    src = {e["name"]: ((e.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
           for e in c.get("env", [])}
    if m is None or src.get(m.group(1)) != "status.podIP":
        fail(f"{what}: --metrics-bind '{bind}' is not $(VAR) of an env var from status.podIP")


def check_args(where, argv, known):
    for tok in argv:
        if isinstance(tok, str) and tok.startswith("--"):
            flag = tok.split("=", 1)[0]
            if flag not in known:
                fail(f"{where}: {flag} is not a flag of the binary")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", required=True)
    a = ap.parse_args()
    try:
        import yaml, jsonschema
    except ImportError as e:
        print(f"SKIP: deploy checks need python3-yaml and python3-jsonschema ({e})")
        return 77
    compose = subprocess.run(["which", "docker-compose"], capture_output=True).returncode == 0
    if not compose:
        print("SKIP: deploy checks need docker-compose (Debian's)")
        return 77
    bins = {"flodl-ps": os.path.join(a.bin_dir, "server", "flodl-ps"),
            "flodl-worker": os.path.join(a.bin_dir, "worker", "flodl-worker"),
            "flodl-keygen": os.path.join(a.bin_dir, "server", "flodl-keygen"),
            "flodl-health": os.path.join(a.bin_dir, "observe", "flodl-health")}
    known = {name: flags_of(path) for name, path in bins.items()}

    # Compose: the CPU job alone, the GPU overlay on top.
    cfile = os.path.join(HERE, "compose.yaml")
    gfile = os.path.join(HERE, "compose.gpu.yaml")
    for label, files in (("compose.yaml", [cfile]), ("compose.yaml + compose.gpu.yaml", [cfile, gfile])):
        argv = ["docker-compose"]
        for f in files:
            argv += ["-f", f]
        r = subprocess.run(argv + ["config"], capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            fail(f"{label}: {r.stderr.strip()}")
            continue
        doc = yaml.safe_load(r.stdout)
        services = doc.get("services", {})
        gpu = len(files) > 1
        for need in ("init", "keys", "ps", "worker-0", "worker-1"):
            if need not in services:
                fail(f"{label}: no {need} service")
        for name, svc in services.items():
            if svc.get("profiles"):
                fail(f"{label}: {name} sits behind a profile (up with no flags must run it)")
            ep = svc.get("entrypoint") or []
            prog = ep[0] if ep else None
            if prog in known:
                check_args(f"compose {name}", (svc.get("command") or []), known[prog])
            for var in (svc.get("environment") or {}):
                if var.startswith("FLODL_") and var not in KNOWN_VARS:
                    fail(f"compose {name}: {var} is not a variable flodl reads")
            hc = (svc.get("healthcheck") or {}).get("test")
            if hc is not None:
                if hc[:2] != ["CMD", "flodl-health"]:
                    fail(f"{label} {name}: the health check is not ['CMD', 'flodl-health', ...]: {hc}")
                else:
                    check_args(f"compose {name} healthcheck", hc[2:], known["flodl-health"])
            if name.startswith("worker-"):
                c = {"args": svc.get("command") or [], "image": svc.get("image", ""),
                     "resources": {}}
                devs = (((svc.get("deploy") or {}).get("resources") or {}).get("reservations")
                        or {}).get("devices") or []
                if devs:
                    c["resources"] = {"limits": {"nvidia.com/gpu": devs[0].get("count")}}
                check_worker_pod(f"{label} {name}", c, gpu)
        init, keys = services.get("init", {}), services.get("keys", {})
        if str(init.get("user")) != "0" or (init.get("entrypoint") or [None])[0] != "chown":
            fail(f"{label}: the init service does not chown the volumes as root")
        if (keys.get("entrypoint") or [])[:2] != ["flodl-keygen", "--if-missing"]:
            fail(f"{label}: the keys service does not run flodl-keygen --if-missing")
        if keys.get("depends_on", {}).get("init", {}).get("condition") != \
                "service_completed_successfully":
            fail(f"{label}: the keys service does not wait for init to complete")

    # Kubernetes.
    schema = json.load(open(os.path.join(HERE, "k8s", "schema.json")))
    kust = yaml.safe_load(open(os.path.join(HERE, "k8s", "kustomization.yaml")))
    err = validate(kust, schema, jsonschema)
    if err:
        fail(f"kustomization.yaml: {err}")
    secret_keys = set()
    for gen in kust.get("secretGenerator", []):
        for f in gen.get("files", []):
            secret_keys.add(f.split("=", 1)[0])
    base_docs = []
    for res in kust.get("resources", []):
        path = os.path.join(HERE, "k8s", res)
        if not os.path.exists(path):
            fail(f"kustomization.yaml: {res} does not exist")
            continue
        base_docs += [(res, doc) for doc in yaml.safe_load_all(open(path))]
    # The GPU overlay: its patches applied to a copy of the base.
    overlay_dir = os.path.join(HERE, "k8s", "gpu")
    gkust = yaml.safe_load(open(os.path.join(overlay_dir, "kustomization.yaml")))
    err = validate(gkust, schema, jsonschema)
    if err:
        fail(f"gpu/kustomization.yaml: {err}")
    if gkust.get("resources") != ["../"]:
        fail("gpu/kustomization.yaml: the overlay's resource is not the base (../)")
    gpu_docs = [("gpu/" + res, json.loads(json.dumps(doc))) for res, doc in base_docs]
    for p in gkust.get("patches", []):
        t = p["target"]
        hits = [d for _, d in gpu_docs if d.get("kind") == t.get("kind")
                and d.get("metadata", {}).get("name") == t.get("name")]
        if len(hits) != 1:
            fail(f"gpu/kustomization.yaml: patch target {t} matches {len(hits)} documents")
            continue
        try:
            apply_json6902(hits[0], yaml.safe_load(p["patch"]))
        except (KeyError, IndexError, ValueError, TypeError) as e:
            fail(f"gpu/kustomization.yaml: patch on {t.get('name')} does not apply: {e}")
    for res, doc in base_docs + gpu_docs:
        gpu = res.startswith("gpu/")
        what = f"{res} {doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
        if doc.get("kind") == "PersistentVolumeClaim" and \
                doc["spec"].get("accessModes") != ["ReadWriteMany"]:
            fail(f"{what}: every worker pod mounts the checkpoints: accessModes "
                 f"[ReadWriteMany], not {doc['spec'].get('accessModes')}")
        if doc.get("kind") == "Job":
            spec = doc["spec"]
            if spec.get("backoffLimit", 6) < 1:
                fail(f"{what}: backoffLimit {spec.get('backoffLimit')}: a failed pod ends the job")
            for c in spec["template"]["spec"]["containers"]:
                check_worker_pod(f"{what} {c['name']}", c, gpu)
        err = validate(doc, schema, jsonschema)
        if err:
            fail(f"{what}: {err}")
        pod = doc.get("spec", {}).get("template", {}).get("spec")
        if not pod:
            continue
        for c in pod["containers"]:
            prog = (c.get("command") or [None])[0]
            if prog in known:
                check_args(f"{what} {c['name']}", c.get("args", []), known[prog])
            if prog in ("flodl-ps", "flodl-worker"):
                check_probes(f"{what} {c['name']}", c)
            for e in c.get("env", []):
                if e["name"].startswith("FLODL_") and e["name"] not in KNOWN_VARS:
                    fail(f"{what}: {e['name']} is not a variable flodl reads")
            if doc["kind"] == "Job" and doc["spec"].get("completionMode") != "Indexed":
                fail(f"{what}: the rank comes from JOB_COMPLETION_INDEX: completionMode: Indexed")
        for v in pod.get("volumes", []):
            if "secret" not in v:
                continue
            items = v["secret"].get("items", [])
            paths = {i["path"] for i in items}
            for need in ("server.key", "client.key"):
                if need not in paths:
                    fail(f"{what}: the key volume lacks {need}")
            if not any(p.startswith("authorized/") and p.endswith(".pub") for p in paths):
                fail(f"{what}: the key volume has no authorized/*.pub (the allowlist)")
            for i in items:
                if i["key"] not in secret_keys:
                    fail(f"{what}: mounts secret key {i['key']} the kustomization does not make")

    # Dockerfiles: the README's scripts, the image group only; the CPU one names no CUDA image.
    readme = open(os.path.join(ROOT, "README.md")).read()
    for name in ("Dockerfile", "Dockerfile.cuda"):
        dock = open(os.path.join(HERE, name)).read()
        for script in ("scripts/install-deps.sh image", "scripts/build.sh --deps image"):
            if script not in dock or script.split("/")[1].split()[0] not in readme:
                fail(f"{name}: does not build with {script} as the README says")
        froms = re.findall(r"^FROM\s+(\S+)", dock, re.M)
        if name == "Dockerfile" and any("cuda" in f for f in froms):
            fail(f"Dockerfile: the CPU image's stages name a CUDA image: {froms}")
    ignore = open(os.path.join(ROOT, ".dockerignore")).read().split()
    for need in ("build*", "**/CMakeCache.txt", ".git"):
        if need not in ignore:
            fail(f".dockerignore: {need} is not left out of the build context")

    for p in problems:
        print("FAIL:", p)
    print(f"deploy checks: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
