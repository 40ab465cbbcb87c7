"""What a drain knows of a pod on the node: shared by the two controllers that drain a node, driver
upgrades (controllers/upgrade.py) and GPU health remediation (controllers/health_exec.py), which
then decide with the same rules (controllers/upgrade_state.py: GPU pods, the policy's selector,
DaemonSet and static pods never evicted, PDBs honoured)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpu_operator.controllers import upgrade_state as us
from gpu_operator.vocabulary import UPGRADE_DRAIN_SKIP_POD_LABEL


def pod_facts(pod: Mapping[str, Any], wait_names: set[str], drain_names: set[str] | None,
              blocked: Mapping[tuple[str, str], str]) -> us.PodFacts:
    meta = pod.get("metadata") or {}
    refs = meta.get("ownerReferences") or []
    controller = next((r for r in refs if r.get("controller")), None)
    name, ns = meta.get("name", ""), meta.get("namespace", "")
    volumes = (pod.get("spec") or {}).get("volumes") or []
    return us.PodFacts(
        name, ns, phase=(pod.get("status") or {}).get("phase", ""), gpu=us.requests_gpu(pod),
        daemonset=bool(controller and controller.get("kind") == "DaemonSet"),
        mirror="kubernetes.io/config.mirror" in (meta.get("annotations") or {}),
        controlled=controller is not None, empty_dir=any("emptyDir" in v for v in volumes),
        drain_skip=(meta.get("labels") or {}).get(UPGRADE_DRAIN_SKIP_POD_LABEL) == "true",
        wait_match=name in wait_names, drain_match=drain_names is None or name in drain_names,
        terminating=bool(meta.get("deletionTimestamp")), blocked_by=blocked.get((ns, name), ""))
