"""Objects the validator creates at run time, its workload pods, checked against the contract's
`workload_pods` facts: what NVIDIA's validator creates (names the CDI annotation addresses, the
ServiceAccount the platform grants privileged pods to, privilege, GPU requests, owner), so a
change to node/validate/workload.py that would break a real node shows here, not on one."""

from __future__ import annotations

from typing import Any

from tools.operand_facts.contract import Deviation, _env, runs

Manifest = dict[str, Any]
GPU_RESOURCE = "gpu-resource"  # the contract's word for the resource the validator picks


def _security(ctr: Manifest) -> dict[str, Any]:
    sc = ctr.get("securityContext") or {}
    return {k: sc[k] for k in ("privileged", "allowPrivilegeEscalation", "readOnlyRootFilesystem") if k in sc}


def facts_of(pod: Manifest, validator_tolerations: list[Any]) -> dict[str, Any]:
    """The contract's view of one workload pod."""
    spec = pod["spec"]
    (init,), (main,) = spec["initContainers"], spec["containers"]
    limits = sorted((init.get("resources") or {}).get("limits") or {})
    return {
        "annotations": dict(pod["metadata"].get("annotations") or {}),
        "serviceAccount": spec.get("serviceAccountName", "default"),
        "restartPolicy": spec.get("restartPolicy", "Always"),
        "owner": ",".join(r["kind"] for r in pod["metadata"].get("ownerReferences") or []) or "none",
        "tolerations": "validator" if spec.get("tolerations") == validator_tolerations else "own",
        "init": {
            "name": init["name"],
            "runs": runs(init),
            "env": _env(init),
            **_security(init),
            **({"limits": [GPU_RESOURCE] * len(limits)} if limits else {}),
        },
        "main": {"name": main["name"], **_security(main)},
    }


def _diff(prefix: str, ours: Any, theirs: Any) -> list[tuple[str, str]]:
    if isinstance(theirs, dict) and isinstance(ours, dict):
        out: list[tuple[str, str]] = []
        for key in sorted(set(theirs) | set(ours)):
            out += _diff(f"{prefix}.{key}" if prefix else key, ours.get(key), theirs.get(key))
        return out
    return [] if ours == theirs else [(prefix, f"ours {ours!r}, upstream {theirs!r}")]


def check(
    state: str, app: str, pod: Manifest, fact: dict[str, Any], validator_tolerations: list[Any]
) -> list[Deviation]:
    """Every difference between one workload pod and its recorded facts."""
    ours = facts_of(pod, validator_tolerations)
    return [Deviation(state, f"workload:{app}:{where}", detail) for where, detail in _diff("", ours, fact)]
