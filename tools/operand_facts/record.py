"""Record upstream facts for the operand contracts from a checkout of NVIDIA's gpu-operator.

    python tools/operand_facts/record.py GIT_DIR [COMMIT] > facts.json

Reads the manifests under assets/ at COMMIT (default HEAD) with `git show` and keeps only facts:
DaemonSet, container and volume names, env names and values, mount paths and their host paths
or ConfigMaps, privilege, commands, RBAC rules, Service ports and annotations. The contract
files (src/gpu_operator/render/states/contracts/*.yaml) were written from this output, then
completed by hand with what upstream's transforms and the components' sources add.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import yaml


def _git(git_dir: str, *args: str) -> str:
    return subprocess.run(["git", f"--git-dir={git_dir}", *args], check=True, capture_output=True, text=True).stdout


def _env(ctr: dict[str, Any]) -> dict[str, str]:
    out = {}
    for entry in ctr.get("env") or []:
        if "valueFrom" in entry:
            ref = entry["valueFrom"].get("fieldRef", {}).get("fieldPath", "")
            out[entry["name"]] = f"fieldRef:{ref}"
        else:
            out[entry["name"]] = str(entry.get("value", ""))
    return out


def _volume(volume: dict[str, Any]) -> str:
    if "hostPath" in volume:
        return f"hostPath:{volume['hostPath']['path']}"
    if "configMap" in volume:
        return f"configMap:{volume['configMap'].get('name', '')}"
    if "secret" in volume:
        return f"secret:{volume['secret'].get('secretName', '')}"
    return next(iter(k for k in volume if k != "name"), "")


def _daemonset(doc: dict[str, Any]) -> dict[str, Any]:
    pod = doc["spec"]["template"]["spec"]
    volumes = {v["name"]: _volume(v) for v in pod.get("volumes") or []}
    containers = {}
    for kind in ("initContainers", "containers"):
        for ctr in pod.get(kind) or []:
            sc = ctr.get("securityContext") or {}
            containers[ctr["name"]] = {
                "init": kind == "initContainers",
                "command": [*(ctr.get("command") or []), *(ctr.get("args") or [])],
                "env": _env(ctr),
                "mounts": {m["mountPath"]: volumes.get(m["name"], m["name"]) + (
                    f" ({m['mountPropagation']})" if m.get("mountPropagation") else "")
                    for m in ctr.get("volumeMounts") or []},
                "privileged": bool(sc.get("privileged")),
                "runAsUser": sc.get("runAsUser"),
                "probes": sorted(k for k in ("startupProbe", "livenessProbe", "readinessProbe") if k in ctr),
            }
    return {
        "serviceAccount": pod.get("serviceAccountName", ""),
        "pod": {k: pod[k] for k in ("hostPID", "hostIPC", "hostNetwork") if pod.get(k)},
        "containers": containers,
    }


def _rules(doc: dict[str, Any]) -> list[str]:
    out = []
    for rule in doc.get("rules") or []:
        for group in rule.get("apiGroups") or [""]:
            for resource in rule.get("resources") or []:
                for verb in rule.get("verbs") or []:
                    names = ",".join(rule.get("resourceNames") or [])
                    out.append(f"{group or 'core'} {resource} {verb}" + (f" {names}" if names else ""))
    return sorted(set(out))


def record(git_dir: str, commit: str) -> dict[str, Any]:
    files = [f for f in _git(git_dir, "ls-tree", "-r", "--name-only", commit, "assets/").split() if f.endswith((".yaml", ".yml"))]
    states: dict[str, Any] = {}
    for path in files:
        state = path.split("/")[1]
        entry = states.setdefault(state, {"objects": [], "daemonsets": {}, "rbac": {}, "services": {}})
        for doc in yaml.safe_load_all(_git(git_dir, "show", f"{commit}:{path}")):
            if not doc:
                continue
            kind, name = doc["kind"], doc["metadata"]["name"]
            entry["objects"].append(f"{kind}/{name}" + (" (openshift)" if "openshift" in path else ""))
            if kind == "DaemonSet":
                entry["daemonsets"][name] = _daemonset(doc)
            elif kind in ("Role", "ClusterRole") and "openshift" not in path:
                entry["rbac"][kind] = _rules(doc)
            elif kind == "Service":
                entry["services"][name] = {
                    "annotations": doc["metadata"].get("annotations") or {},
                    "ports": [p["port"] for p in doc["spec"].get("ports") or []],
                }
    return states


if __name__ == "__main__":
    print(json.dumps(record(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "HEAD"), indent=1))
