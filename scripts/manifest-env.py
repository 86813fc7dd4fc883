#!/usr/bin/env python3
"""Prints, as one JSON object, what each Kubernetes manifest of deploy/k8s gives its container:
{"migrate" | "server" | "worker-cpu": {"args": [...], "env": {NAME: VALUE}}}.

The env is the manifest's own: the ConfigMap (envFrom configMapRef), the example Secret's keys
(envFrom secretRef, and env entries with secretKeyRef, valued from secret.example.yaml), then
the literal env entries. The cluster topology test (cli/tests/cluster.rs) starts its
processes with exactly this env (replacing only the addresses and secrets of the test site), so
the manifests and the test cannot drift. Needs PyYAML.
"""
import json
import pathlib
import sys

import yaml

K8S = pathlib.Path(__file__).resolve().parent.parent / "deploy" / "k8s"
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
        }
    json.dump(out, sys.stdout, indent=1, sort_keys=True)
    print()


if __name__ == "__main__":
    main()
