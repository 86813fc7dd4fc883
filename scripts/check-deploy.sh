#!/usr/bin/env bash
# Validates deploy/: every Kubernetes manifest against the Kubernetes API schema
# (kubernetes-validate --strict: unknown fields are errors), the compose file against the
# compose-spec JSON schema (check-jsonschema's vendored copy; no Docker daemon or CLI needed),
# and the references between files (kustomization resources exist; seccomp profiles are shipped;
# compose depends_on names services). A broken manifest is also fed to the validator, to prove it rejects one.
# Tools: the venv that scripts/test-services.sh installs (VERITY_DEPLOY_VENV). scripts/test.sh runs this.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${VERITY_DEPLOY_VENV:-${VERITY_CACHE:-/var/cache/verity-ci}/deploy-check-venv}
if [ ! -x "$venv/bin/kubernetes-validate" ] || [ ! -x "$venv/bin/check-jsonschema" ]; then
  echo "check-deploy: installing kubernetes-validate and check-jsonschema into $venv" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q 'kubernetes-validate==1.37.*' 'check-jsonschema==0.39.*'
fi

# The CRD-based example (KEDA) and the Kustomization have no API schema here; checked below.
manifests=()
for f in deploy/k8s/*.yaml; do
  case "$f" in *kustomization.yaml|*keda.example.yaml) ;; *) manifests+=("$f") ;; esac
done
"$venv/bin/kubernetes-validate" --strict --quiet --no-warn "${manifests[@]}"

broken=$(mktemp --suffix=.yaml)
trap 'rm -f "$broken"' EXIT
sed 's/^\(\s*\)containers:/\1containerz:/' deploy/k8s/worker-cpu.yaml >"$broken"
if "$venv/bin/kubernetes-validate" --strict --quiet --no-warn "$broken" >/dev/null 2>&1; then
  echo "check-deploy: the validator accepted a Deployment without containers" >&2
  exit 1
fi

"$venv/bin/check-jsonschema" --builtin-schema vendor.compose-spec deploy/docker-compose.yml

"$venv/bin/python" - <<'PY'
import pathlib, sys, yaml
k8s = pathlib.Path("deploy/k8s")
kustomization = yaml.safe_load((k8s / "kustomization.yaml").read_text())
missing = [r for r in kustomization["resources"] if not (k8s / r).is_file()]
images = {i["name"] for i in kustomization.get("images", [])}
used = set()
for path in k8s.glob("*.yaml"):
    for doc in yaml.safe_load_all(path.read_text()):
        spec = (doc or {}).get("spec", {}).get("template", {}).get("spec", {})
        used |= {c["image"].rsplit(":", 1)[0] for c in spec.get("containers", [])}
compose = yaml.safe_load(pathlib.Path("deploy/docker-compose.yml").read_text())
services = compose["services"]
bad_deps = [(s, d) for s, v in services.items() for d in (v.get("depends_on") or {}) if d not in services]
bad_volumes = [(s, v.split(":")[0]) for s, sv in services.items() for v in sv.get("volumes", [])
               if not v.startswith((".", "/")) and v.split(":")[0] not in (compose.get("volumes") or {})]
# Seccomp profiles: compose's `seccomp=FILE` (relative to the compose file) and Kubernetes'
# Localhost profiles (installed on nodes from deploy/seccomp/) must name files shipped here.
profiles = [o.split("=", 1)[1] for sv in services.values() for o in sv.get("security_opt", [])
            if o.startswith("seccomp=") and o != "seccomp=unconfined"]
bad_profiles = [p for p in profiles if not (pathlib.Path("deploy") / p).is_file()]
def localhost_profiles(node):
    if isinstance(node, dict):
        if node.get("type") == "Localhost" and "localhostProfile" in node:
            yield node["localhostProfile"]
        for value in node.values():
            yield from localhost_profiles(value)
    elif isinstance(node, list):
        for value in node:
            yield from localhost_profiles(value)
for path in k8s.glob("*.yaml"):
    for doc in yaml.safe_load_all(path.read_text()):
        bad_profiles += [f"{path.name}: {p}" for p in localhost_profiles(doc)
                         if not (pathlib.Path("deploy/seccomp") / p).is_file()]
problems = []
if bad_profiles: problems.append(f"seccomp profiles not in deploy/ (compose) or deploy/seccomp/ (k8s): {bad_profiles}")
if missing: problems.append(f"kustomization.yaml lists missing files: {missing}")
if images - used: problems.append(f"kustomization.yaml sets images no manifest uses: {sorted(images - used)}")
if used - images: problems.append(f"manifests use images kustomization.yaml does not set: {sorted(used - images)}")
if bad_deps: problems.append(f"compose depends_on unknown services: {bad_deps}")
if bad_volumes: problems.append(f"compose mounts undeclared volumes: {bad_volumes}")
if problems:
    sys.exit("check-deploy: " + "; ".join(problems))
PY
echo "check-deploy: deploy/k8s and deploy/docker-compose.yml are valid"
