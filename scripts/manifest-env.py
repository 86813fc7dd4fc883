#!/usr/bin/env python3
"""Prints, as one JSON object, what each Kubernetes manifest of deploy/k8s gives its container:
{"migrate" | "server" | "worker-cpu": {"args": [...], "env": {NAME: VALUE}, "podman": [...]}}.

The env is the manifest's own: the ConfigMap (envFrom configMapRef), the example Secret's keys
(envFrom secretRef, and env entries with secretKeyRef, valued from secret.example.yaml), then
the literal env entries. The cluster topology test (cli/tests/cluster.rs) starts its
processes with exactly this env (replacing only the addresses and secrets of the test site), so
the manifests and the test cannot drift. Needs PyYAML.

`podman` is the pod's and the container's security settings and scratch volumes as `podman run`
options, for the test's containers: the user, dropped and added capabilities, no new
privileges, the seccomp profile (a Localhost profile is the file of that name in
deploy/seccomp/, which nodes install), AppArmor, an unmasked /proc, a read-only root whose
emptyDir mounts are tmpfs. What podman cannot express here: `hostUsers: false` (a pod user
namespace; the test's containers run in the host's), `runAsNonRoot` (implied by the user).
"""
import json
import pathlib
import sys

import yaml

K8S = pathlib.Path(__file__).resolve().parent.parent / "deploy" / "k8s"
SECCOMP = K8S.parent / "seccomp"
ROLES = {"migrate": "migrate-job.yaml", "server": "server.yaml", "worker-cpu": "worker-cpu.yaml"}


def documents(name):
    with open(K8S / name) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def one(name, kind):
    [doc] = [d for d in documents(name) if d["kind"] == kind]
    return doc


def container_env(container, configmaps, secrets):
    env = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            env.update(configmaps[source["configMapRef"]["name"]])
        elif "secretRef" in source:
            env.update(secrets[source["secretRef"]["name"]])
    for entry in container.get("env", []):
        if "value" in entry:
            env[entry["name"]] = str(entry["value"])
        else:
            ref = entry["valueFrom"]["secretKeyRef"]
            env[entry["name"]] = secrets[ref["name"]][ref["key"]]
    return env


def podman_options(pod, container):
    """The pod's and container's securityContext and emptyDir mounts as podman run options."""
    pod_security = pod.get("securityContext", {})
    security = {**pod_security, **container.get("securityContext", {})}
    options = []
    if "runAsUser" in security:
        options += ["--user", f"{security['runAsUser']}:{security.get('runAsGroup', security['runAsUser'])}"]
    capabilities = security.get("capabilities", {})
    options += [o for cap in capabilities.get("drop", []) for o in ("--cap-drop", cap.lower())]
    options += [o for cap in capabilities.get("add", []) for o in ("--cap-add", cap.lower())]
    if security.get("allowPrivilegeEscalation") is False:
        options += ["--security-opt", "no-new-privileges"]
    seccomp = security.get("seccompProfile", {"type": "RuntimeDefault"})
    if seccomp["type"] == "Unconfined":
        options += ["--security-opt", "seccomp=unconfined"]
    elif seccomp["type"] == "Localhost":
        options += ["--security-opt", f"seccomp={SECCOMP / seccomp['localhostProfile']}"]
    if security.get("appArmorProfile", {}).get("type") == "Unconfined":
        options += ["--security-opt", "apparmor=unconfined"]
    if security.get("procMount") == "Unmasked":
        options += ["--security-opt", "systempaths=unconfined"]
    if security.get("readOnlyRootFilesystem"):
        options += ["--read-only", "--read-only-tmpfs=false"]
    empty = {v["name"] for v in pod.get("volumes", []) if "emptyDir" in v}
    for mount in container.get("volumeMounts", []):
        if mount["name"] in empty:
            # an emptyDir is a writable, executable folder, like a tmpfs without podman's noexec
            options += ["--tmpfs", f"{mount['mountPath']}:rw,exec,mode=1777"]
    return options


def main():
    configmap = one("configmap.yaml", "ConfigMap")
    secret = one("secret.example.yaml", "Secret")
    configmaps = {configmap["metadata"]["name"]: configmap["data"]}
    secrets = {secret["metadata"]["name"]: secret["stringData"]}
    out = {}
    for role, name in ROLES.items():
        [workload] = [d for d in documents(name) if d["kind"] in ("Deployment", "Job")]
        [container] = workload["spec"]["template"]["spec"]["containers"]
        out[role] = {
            "args": container.get("args", []),
            "env": container_env(container, configmaps, secrets),
            "podman": podman_options(workload["spec"]["template"]["spec"], container),
        }
    json.dump(out, sys.stdout, indent=1, sort_keys=True)
    print()


if __name__ == "__main__":
    main()
