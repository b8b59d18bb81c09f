#!/usr/bin/python3
"""Offline checks of deploy/ (no container engine or cluster is reachable here):
- compose.yaml parses and renders for both profiles (docker-compose config, Debian's);
- every Kubernetes manifest parses and matches deploy/k8s/schema.json (the parts of the API
  they use; unknown fields refused), and the kustomization lists files that exist;
- every flag the manifests and the Compose file give flodl-ps or flodl-worker is one the
  binaries accept (their --help), every FLODL_ variable one they read;
- the Secret's keys are the ones the pods mount, at the paths a key directory needs;
- the Dockerfile builds with the README's scripts.
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
            "flodl-worker": os.path.join(a.bin_dir, "worker", "flodl-worker")}
    known = {name: flags_of(path) for name, path in bins.items()}

    # Compose.
    cfile = os.path.join(HERE, "compose.yaml")
    for profile in ("cpu", "gpu"):
        r = subprocess.run(["docker-compose", "-f", cfile, "--profile", profile, "config"],
                           capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            fail(f"compose.yaml (profile {profile}): {r.stderr.strip()}")
            continue
        doc = yaml.safe_load(r.stdout)
        for name, svc in doc.get("services", {}).items():
            ep = svc.get("entrypoint") or []
            prog = ep[0] if ep else None
            if prog in known:
                check_args(f"compose {name}", (svc.get("command") or []), known[prog])
            for var in (svc.get("environment") or {}):
                if var.startswith("FLODL_") and var not in KNOWN_VARS:
                    fail(f"compose {name}: {var} is not a variable flodl reads")

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
    for res in kust.get("resources", []):
        path = os.path.join(HERE, "k8s", res)
        if not os.path.exists(path):
            fail(f"kustomization.yaml: {res} does not exist")
            continue
        for doc in yaml.safe_load_all(open(path)):
            what = f"{res} {doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
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

    # Dockerfile: the README's scripts.
    dock = open(os.path.join(HERE, "Dockerfile")).read()
    readme = open(os.path.join(ROOT, "README.md")).read()
    for script in ("scripts/install-deps.sh", "scripts/build.sh"):
        if script not in dock or script.split("/")[1] not in readme:
            fail(f"Dockerfile: does not build with {script} as the README does")

    for p in problems:
        print("FAIL:", p)
    print(f"deploy checks: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
