"""Record upstream facts for the operand contracts from a checkout of NVIDIA's gpu-operator.

    python -m tools.operand_facts.record GIT_DIR [COMMIT] > facts.json   (from the repository root)

Reads the manifests under assets/ at COMMIT (default HEAD) with `git show` and keeps only facts:
DaemonSet, container and volume names, env names and values, mount paths and their host paths
or ConfigMaps, privilege, commands, RBAC rules, Service ports and annotations. The contract
files (tools/operand_facts/contracts/*.yaml) were written from this output, then
completed by hand with what upstream's transforms and the components' sources add.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import yaml
from tools.operand_facts.contract import container_facts, rule_strings, run_time


def _git(git_dir: str, *args: str) -> str:
    return subprocess.run(["git", f"--git-dir={git_dir}", *args], check=True, capture_output=True, text=True).stdout


def _daemonset(doc: dict[str, Any]) -> dict[str, Any]:
    pod = doc["spec"]["template"]["spec"]
    containers = container_facts(doc)
    for facts in containers.values():
        if not facts["init"]:
            del facts["init"]
    return {
        "serviceAccount": pod.get("serviceAccountName", ""),
        "pod": {k: pod[k] for k in ("hostPID", "hostIPC", "hostNetwork") if pod.get(k)},
        "containers": containers,
    }


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
            entry["objects"].append(f"{kind}/{run_time(name)}" + (" (openshift)" if "openshift" in path else ""))
            if kind == "DaemonSet":
                entry["daemonsets"][name] = _daemonset(doc)
            elif kind in ("Role", "ClusterRole") and "openshift" not in path:
                entry["rbac"][kind] = sorted(rule_strings(doc))
            elif kind == "Service":
                entry["services"][name] = {
                    "annotations": doc["metadata"].get("annotations") or {},
                    "ports": [p["port"] for p in doc["spec"].get("ports") or []],
                }
    return states


if __name__ == "__main__":
    print(json.dumps(record(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "HEAD"), indent=1))
