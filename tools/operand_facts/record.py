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
    return subprocess.run(
        ["git", f"--git-dir={git_dir}", *args], check=True, capture_output=True, text=True
    ).stdout


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
    files = [
        f
        for f in _git(git_dir, "ls-tree", "-r", "--name-only", commit, "assets/").split()
        if f.endswith((".yaml", ".yml"))
    ]
    states: dict[str, Any] = {}
    for path in files:
        state = path.split("/")[1]
        entry = states.setdefault(state, {"objects": [], "daemonsets": {}, "rbac": {}, "services": {}})
        for doc in yaml.safe_load_all(_git(git_dir, "show", f"{commit}:{path}")):
            if not doc:
                continue
            kind, name = doc["kind"], doc["metadata"]["name"]
            entry["objects"].append(
                f"{kind}/{run_time(name)}" + (" (openshift)" if "openshift" in path else "")
            )
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


# The GPUCluster states' facts come from upstream's rendered golden files (its manifests under
# manifests/ are templates): one file per state, the fullest case.
GPUCLUSTER_GOLDEN = {
    "state-dra-driver": "gpucluster-dra-driver-full-spec.yaml",
    "state-dcgm": "gpucluster-dcgm.yaml",
    "state-dcgm-exporter": "gpucluster-dcgm-exporter-remote-engine.yaml",
    "state-dra-validation": "gpucluster-dra-validation.yaml",
}


def record_gpucluster(git_dir: str, commit: str) -> dict[str, Any]:
    """The same facts for the four GPUCluster states, keyed `gpucluster/<state>`."""
    states: dict[str, Any] = {}
    for state, name in GPUCLUSTER_GOLDEN.items():
        entry = states.setdefault(
            f"gpucluster/{state}", {"objects": [], "daemonsets": {}, "rbac": {}, "services": {}}
        )
        text = _git(git_dir, "show", f"{commit}:internal/state/testdata/golden/{name}")
        for doc in yaml.safe_load_all(text):
            if not doc:
                continue
            kind, obj_name = doc["kind"], doc["metadata"]["name"]
            entry["objects"].append(f"{kind}/{obj_name}")
            if kind == "DaemonSet":
                entry["daemonsets"][obj_name] = _daemonset(doc)
            elif kind in ("Role", "ClusterRole"):
                entry["rbac"].setdefault(kind, [])
                entry["rbac"][kind] = sorted({*entry["rbac"][kind], *rule_strings(doc)})
            elif kind == "Service":
                entry["services"][obj_name] = {
                    "annotations": doc["metadata"].get("annotations") or {},
                    "ports": [p["port"] for p in doc["spec"].get("ports") or []],
                }
    return states


if __name__ == "__main__":
    git_dir, commit = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "HEAD"
    print(json.dumps({**record(git_dir, commit), **record_gpucluster(git_dir, commit)}, indent=1))
