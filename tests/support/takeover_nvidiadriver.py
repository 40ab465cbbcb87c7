"""The state NVIDIA's operator v26.7.0 left with its driver run from an NVIDIADriver
(tests/fixtures/nvidia-v26.7.0-nvidiadriver, recorded by tools/takeover/record.py), put back onto
the test control plane as that operator wrote it: the ClusterPolicy (driver.useNvidiaDriverCRD)
and the NVIDIADriver `default` with their status, the objects each owns, and the node labels.

Beyond tests/support/takeover.py's tokens, the hash of the NVIDIADriver's uid in its driver
DaemonSet's name (NVIDIA's getDriverAppName, ours render/nvidiadriver.py daemonset_name) is a
token: it is filled with the hash of the uid the test's NVIDIADriver got, so the DaemonSet carries
the name NVIDIA's operator would have given it on this cluster."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from lightkube import Client

from gpu_operator.kube.client import ClusterPolicyResource, NVIDIADriverResource
from gpu_operator.render.nvidiadriver import name_hash
from tests.support.takeover import (
    NAMESPACE_TOKEN,
    OWNER_UID_TOKEN,
    _create,
    _merged,
    _replace,
    create_with_status,
    label_nodes,
)

FIXTURE = Path(__file__).parents[1] / "fixtures" / "nvidia-v26.7.0-nvidiadriver"
OWNER_HASH_TOKEN = "@UIDHASH@-NVIDIADriver"  # + "-<name>", as tools/takeover/record.py writes it


def read(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((FIXTURE / name).read_text()) if d]


def recorded_nodes() -> list[dict[str, Any]]:
    return sorted(read("nodes.yaml"), key=lambda r: r["name"])


@dataclass
class Loaded:
    policy_uid: str
    driver_uids: dict[str, str]  # NVIDIADriver name -> uid
    objects: list[dict[str, Any]]  # as created (namespace, owner uids and name hashes filled in)
    nodes: dict[str, str] = field(default_factory=dict)  # recorded node name -> test node

    def owned_by(self, uid: str, kind: str | None = None) -> dict[str, dict[str, Any]]:
        """`Kind/name` -> object, of the objects whose controller reference is `uid`."""
        return {
            f"{o['kind']}/{o['metadata']['name']}": o
            for o in self.objects
            if (kind is None or o["kind"] == kind)
            and any(
                r.get("controller") and r["uid"] == uid for r in o["metadata"].get("ownerReferences") or []
            )
        }


def load(kube: Client, namespace: str, nodes: list[str], driver_spec: dict[str, Any] | None = None) -> Loaded:
    """NVIDIA's state into `namespace`, its node labels onto `nodes` (in the recorded order).
    `driver_spec`: values merged into each recorded NVIDIADriver's spec before it is created."""
    tokens = {NAMESPACE_TOKEN: namespace}
    crs = [_replace(d, tokens) for d in read("policy.yaml")]
    (policy,) = [d for d in crs if d["kind"] == "ClusterPolicy"]
    policy_uid = create_with_status(kube, ClusterPolicyResource, policy)
    tokens[f"{OWNER_UID_TOKEN}-ClusterPolicy-{policy['metadata']['name']}"] = policy_uid
    driver_uids = {}
    for driver in (d for d in crs if d["kind"] == "NVIDIADriver"):
        driver["spec"] = _merged(driver["spec"], driver_spec or {})
        name = driver["metadata"]["name"]
        uid = create_with_status(kube, NVIDIADriverResource, driver)
        driver_uids[name] = uid
        tokens[f"{OWNER_UID_TOKEN}-NVIDIADriver-{name}"] = uid
        tokens[f"{OWNER_HASH_TOKEN}-{name}"] = name_hash(uid)
    objects = [_replace(o, tokens) for o in read("objects.yaml")]
    for obj in objects:
        _create(kube, obj)
    return Loaded(policy_uid, driver_uids, objects, label_nodes(kube, recorded_nodes(), nodes))
