"""Compare what the renderer produces with the recorded operand contracts; rerunnable.

    .venv/bin/python -m tools.operand_facts.compare [--all] [--docs docs/operands.md]   (from the repository root)

Renders every example policy (examples/clusterpolicy-*.yaml), one policy with every optional operand on
and the GPUCluster of upstream's golden files (its states keyed `gpucluster/<state>`),
against the node shapes of the simulator, and prints each deviation from the contracts
(tools/operand_facts/contracts/*.yaml): deliberate ones with their reason (with --all),
undocumented ones always. Exit status 1 when a deviation is not deliberate, when a deliberate
entry matches nothing any more, or when one is not listed in docs/operands.md.
"""

from __future__ import annotations

import argparse
import fnmatch
import sys
from pathlib import Path
from typing import Any

import yaml
from tools.operand_facts.contract import Deviation, compare, compare_state, contracts, shared_deliberate

from gpu_operator import shapes
from gpu_operator.api.clusterpolicy import ClusterPolicy
from gpu_operator.render import RenderResult, render
from gpu_operator.render.clitext import label_gpu_nodes
from gpu_operator.render.defaults import CHART_DEFAULT_IMAGES
from gpu_operator.render.facts import ClusterFacts

ROOT = Path(__file__).resolve().parents[2]
IMAGES = {**CHART_DEFAULT_IMAGES, "VGPU_MANAGER_IMAGE": "registry.example.com/nvidia/vgpu-manager:595.91.07"}
# Every optional operand on: the kata/CC managers, GPUDirect, MIG manager, config-manager, NRI off.
EVERYTHING: dict[str, Any] = {
    "sandboxWorkloads": {"enabled": True, "mode": "kata"},
    "kataManager": {"enabled": True},
    "kataSandboxDevicePlugin": {"enabled": True},
    "ccManager": {"enabled": True},
    "vfioManager": {"enabled": True},
    "nodeStatusExporter": {"enabled": True},
    "gds": {"enabled": True},
    "gdrcopy": {"enabled": True},
    "driver": {"rdma": {"enabled": True}},
    "devicePlugin": {"config": {"name": "time-slicing", "default": "any"}},
    "dcgmExporter": {"serviceMonitor": {"enabled": True}},
}


def policies() -> dict[str, dict[str, Any]]:
    out = {
        p.name: yaml.safe_load(p.read_text())
        for p in sorted((ROOT / "examples").glob("clusterpolicy-*.yaml"))
    }
    out["everything-on"] = {"metadata": {"name": "cluster-policy"}, "spec": EVERYTHING}
    return out


def render_policy(manifest: dict[str, Any]) -> RenderResult:
    """One policy rendered for two labelled DGX H100 nodes with the chart's default images."""
    nodes = shapes.nodes(["dgx-h100:2"])
    label_gpu_nodes(nodes)
    facts = ClusterFacts.from_nodes(
        nodes, namespace="gpu-operator", k8s_version="1.36.3", operator_env=IMAGES, servicemonitor_crd=True
    )
    return render(ClusterPolicy.model_validate(manifest), facts)


def deviations(name: str, manifest: dict[str, Any]) -> list[Deviation]:
    return compare(render_policy(manifest))


# The GPUCluster upstream's golden files render (its sample with compute domains, the gpus
# health-check port 52000, DCGM and the exporter): our render of it against the contracts.
GPUCLUSTER_FIXTURE: dict[str, Any] = {
    "draDriver": {
        "repository": "nvcr.io/nvidia",
        "image": "dra-driver-nvidia-gpu",
        "version": "v0.5.0",
        "featureGates": {"MPSSupport": True, "AdminAccess": False},
        "gpus": {"kubeletPlugin": {"healthcheck": {"port": 52000}}},
        "computeDomains": {"enabled": True},
    },
    "dcgm": {"enabled": True},
    "dcgmExporter": {},
}


def gpucluster_deviations() -> list[Deviation]:
    """Every state of the GPUCluster fixture against its contract (`gpucluster/<state>`)."""
    from gpu_operator.api.gpucluster import GPUCluster
    from gpu_operator.render.dra import DRAFacts, render_gpucluster

    cluster = GPUCluster.model_validate({"metadata": {"name": "gpu-cluster"}, "spec": GPUCLUSTER_FIXTURE})
    result = render_gpucluster(cluster, DRAFacts(operator_env=dict(CHART_DEFAULT_IMAGES)))
    return [
        d
        for s in result.states
        if s.enabled and s.objects
        for d in compare_state(f"gpucluster/{s.name}", s.objects)
    ]


def markdown() -> str:
    """The deliberate-deviation tables of docs/operands.md, from the contracts."""
    lines = [
        "## Deliberate deviations",
        "",
        "Each entry is a pattern over the deviation ids `tools/operand_facts/compare.py` prints",
        "(`<DaemonSet>/<container>:<kind>:<name>` or `<state>:<Role|ClusterRole>:rule-...`), with its reason.",
        "Regenerate this section with `.venv/bin/python -m tools.operand_facts.compare --markdown`.",
        "",
    ]
    sections = [("Every state", shared_deliberate())]
    sections += [(state, c.deliberate) for state, c in sorted(contracts().items()) if c.deliberate]
    for title, entries in sections:
        lines += [f"### {title}", "", "| deviation | reason |", "|---|---|"]
        lines += [f"| `{k}` | {v} |" for k, v in entries.items()]
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="also print the deliberate deviations")
    parser.add_argument("--docs", default=str(ROOT / "docs" / "operands.md"))
    parser.add_argument("--markdown", action="store_true", help="print the docs' deviation tables and exit")
    args = parser.parse_args()
    if args.markdown:
        print(markdown())
        return 0
    table = contracts()
    failed = False
    seen: dict[str, set[str]] = {}
    runs = {name: deviations(name, manifest) for name, manifest in policies().items()}
    runs["gpucluster (upstream's golden case)"] = gpucluster_deviations()
    for name, found in runs.items():
        for dev in sorted(set(found)):
            reason = table[dev.state].explains(dev) if dev.state in table else None
            if reason is None:
                failed = True
                print(f"UNDOCUMENTED [{name}] {dev.state} {dev}")
            else:
                seen.setdefault(dev.state, set()).add(dev.id)
                if args.all:
                    print(f"deliberate   [{name}] {dev.state} {dev} -- {reason}")
    matched = {
        pattern
        for state, ids in seen.items()
        for pattern in [*table[state].deliberate, *shared_deliberate()]
        if any(fnmatch.fnmatchcase(i, pattern) for i in ids)
    }
    for pattern in sorted({p for c in table.values() for p in c.deliberate} | set(shared_deliberate())):
        # the validator's workload pods are made at run time: tests/unit/render/test_contracts.py checks them
        if pattern not in matched and not pattern.startswith("workload:"):
            failed = True
            print(
                f"STALE        deliberate `{pattern}` matches no deviation any more: remove it (and from the docs)"
            )
    docs = Path(args.docs).read_text() if Path(args.docs).exists() else ""
    for state, contract in sorted(table.items()):
        for pattern in contract.deliberate:
            if f"`{pattern}`" not in docs:
                failed = True
                print(f"NOT IN DOCS  {state} deliberate `{pattern}` is missing from {args.docs}")
    total = sum(len(v) for v in seen.values())
    print(
        f"{total} deliberate deviation(s) over {len(policies())} policies; "
        + ("undocumented ones above" if failed else "none undocumented")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
