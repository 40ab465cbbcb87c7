"""What a drain knows of a pod on the node: shared by the two controllers that drain a node, driver
upgrades (controllers/upgrade.py) and GPU health remediation (controllers/health_exec.py), which
then decide with the same rules (controllers/upgrade_state.py: GPU pods, the policy's selector,
DaemonSet and static pods never evicted, PDBs honoured). Which pods hold GPUs: controllers/gpuholders.py."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from gpu_operator.controllers import upgrade_state as us
from gpu_operator.controllers.gpuholders import ClaimKey, RuntimeAccess, claim_keys, holds_gpu
from gpu_operator.kube.client import Kube
from gpu_operator.vocabulary import UPGRADE_DRAIN_SKIP_POD_LABEL

log = logging.getLogger("gpu_operator.drain")

Claims = Mapping[ClaimKey, Mapping[str, Any]]


async def claims_of(kube: Kube, pods: Iterable[Mapping[str, Any]]) -> Claims | None:
    """The ResourceClaims the pods name, one list per namespace that holds one (no read when no pod
    names a claim); None when they cannot be read (the apiserver serves no ResourceClaim version we
    read, or refused): then every claim a pod names counts, as NVIDIA's operator counts a claim it
    cannot read (an eviction too many is recoverable, a driver unloaded under a GPU pod is not)."""
    found: dict[ClaimKey, Mapping[str, Any]] = {}
    for namespace in sorted({ns for pod in pods for ns, _ in claim_keys(pod)}):
        try:
            items = await kube.list_resource_claims(namespace)
        except Exception as err:  # counted as GPU claims; the next pass reads again
            log.warning("ResourceClaims in %s not readable (%s): the pods naming one count as GPU pods",
                        namespace, err)
            return None
        if items is None:
            return None
        found.update(((namespace, c["metadata"]["name"]), c) for c in items)
    return found


def pod_facts(pod: Mapping[str, Any], wait_names: set[str], drain_names: set[str] | None,
              blocked: Mapping[tuple[str, str], str], *, access: RuntimeAccess, claims: Claims | None) -> us.PodFacts:
    meta = pod.get("metadata") or {}
    refs = meta.get("ownerReferences") or []
    controller = next((r for r in refs if r.get("controller")), None)
    name, ns = meta.get("name", ""), meta.get("namespace", "")
    volumes = (pod.get("spec") or {}).get("volumes") or []
    return us.PodFacts(
        name, ns, phase=(pod.get("status") or {}).get("phase", ""), gpu=holds_gpu(pod, access, claims),
        daemonset=bool(controller and controller.get("kind") == "DaemonSet"),
        mirror="kubernetes.io/config.mirror" in (meta.get("annotations") or {}),
        controlled=controller is not None, empty_dir=any("emptyDir" in v for v in volumes),
        drain_skip=(meta.get("labels") or {}).get(UPGRADE_DRAIN_SKIP_POD_LABEL) == "true",
        wait_match=name in wait_names, drain_match=drain_names is None or name in drain_names,
        terminating=bool(meta.get("deletionTimestamp")), blocked_by=blocked.get((ns, name), ""))
