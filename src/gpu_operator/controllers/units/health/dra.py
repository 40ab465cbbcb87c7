"""GPU health on the DRA stack (GPUCluster): a GPU the health agent reports unhealthy or gone is
kept from new ResourceClaims by one DeviceTaintRule (effect NoSchedule) that selects it as NVIDIA's
DRA driver publishes it: driver gpu.nvidia.com, pool = the node's name, device = the name the
node's ResourceSlice gives the GPU whose PCI bus id (the standard attribute
resource.kubernetes.io/pciBusID) is the report's. The rule is deleted once the GPU is healthy
again (or the node is gone); the GPUCluster owns every rule, so the garbage collector takes them
when it goes, and `gpu-operator cleanup` deletes what is left (label managed-by gpu-operator).

Only where the apiserver serves DeviceTaintRule (kube/devicetaints.py: the newest version it
serves, v1 from Kubernetes 1.37, v1beta2 before, looked up once); elsewhere
the node's condition and quarantine taint are the signals. docs/health.md (DRA) has the sources.

Pure rules first (`device_names`, `wanted`, `plan`); `DeviceTaints` carries them out.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpu_operator.api.health import HealthReport
from gpu_operator.kube import devicetaints as dt
from gpu_operator.kube.client import Kube
from gpu_operator.vocabulary import HEALTH_TAINT, MANAGED_BY, MANAGED_BY_VALUE, MANAGED_SELECTOR

log = logging.getLogger("gpu_operator.health")

DRIVER = "gpu.nvidia.com"  # NVIDIA's DRA driver for GPUs (its kubelet plugin's DriverName)
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"  # k8s.io/dynamic-resource-allocation/deviceattribute
EFFECT = "NoSchedule"
PREFIX = "gpu-health-"
_BUS = re.compile(r"^([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")


def normal_bus(text: str) -> str | None:
    """A PCI address as the report writes it (0000:3b:00.0): NVML's eight-digit domain and upper
    case (00000000:3B:00.0) folded; None for anything else."""
    match = _BUS.match(text.strip())
    if match is None:
        return None
    domain, bus, device, function = match.groups()
    if len(domain) > 4 and int(domain[:-4], 16):
        return None  # a domain beyond 16 bits is no sysfs address
    return f"{domain[-4:]}:{bus}:{device}.{function}".lower()


def device_names(slices: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Bus id -> device name, from the ResourceSlices of our driver (MIG and other devices without
    the bus id attribute are left out)."""
    out: dict[str, str] = {}
    for found in slices:
        spec = found.get("spec") or {}
        if spec.get("driver") != DRIVER:
            continue
        for device in spec.get("devices") or []:
            attribute = (device.get("attributes") or {}).get(PCI_BUS_ID) or {}
            bus = normal_bus(str(attribute.get("string") or ""))
            if bus is not None and device.get("name"):
                out.setdefault(bus, str(device["name"]))
    return out


def rule_name(node: str, device: str) -> str:
    """gpu-health-<node>-<device>; a digest stands in for the part past an object name's 253 characters."""
    name = f"{PREFIX}{node}-{device}"
    if len(name) <= 253:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:10]
    return f"{name[:242]}-{digest}"


def sick_buses(report: HealthReport | None) -> dict[str, str] | None:
    """Bus id -> state (unhealthy, gone) of the report's GPUs that must not be handed out; None when
    there is no report or it cannot be read (then the rules stay as they are)."""
    if report is None:
        return None
    return {g.bus: g.state for g in report.unhealthy}


def rule(
    node: str, device: str, state: str, owner: Mapping[str, Any] | None, version: str = dt.RULE_VERSIONS[0]
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": rule_name(node, device), "labels": {MANAGED_BY: MANAGED_BY_VALUE}}
    if owner is not None:
        meta["ownerReferences"] = [dict(owner)]
    return {
        "apiVersion": f"{dt.GROUP}/{version}",
        "kind": dt.KIND,
        "metadata": meta,
        "spec": {
            "deviceSelector": {"driver": DRIVER, "pool": node, "device": device},
            "taint": {"key": HEALTH_TAINT, "value": state, "effect": EFFECT},
        },
    }


def wanted(
    node: str,
    sick: Mapping[str, str],
    names: Mapping[str, str],
    owner: Mapping[str, Any] | None,
    version: str = dt.RULE_VERSIONS[0],
) -> dict[str, dict[str, Any]]:
    """The rules `node` should have, by name: one per sick GPU its slices name (a GPU its driver
    does not publish cannot be allocated anyway)."""
    out = {}
    for bus, state in sorted(sick.items()):
        device = names.get(bus)
        if device is not None:
            body = rule(node, device, state, owner, version)
            out[body["metadata"]["name"]] = body
    return out


@dataclass
class DeviceTaintPlan:
    create: list[dict[str, Any]] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.create and not self.delete


def plan(want: Mapping[str, Mapping[str, Any]], have: Mapping[str, Mapping[str, Any]]) -> DeviceTaintPlan:
    """Create what is wanted and missing (or whose taint or selector changed: deleted first);
    delete what is not wanted."""
    out = DeviceTaintPlan()
    for name, body in have.items():
        if name not in want or dict(body.get("spec") or {}) != dict(want[name]["spec"]):
            out.delete.append(name)
    for name, body in want.items():
        if name not in have or name in out.delete:
            out.create.append(dict(body))
    out.delete.sort()
    return out


def pool_of(body: Mapping[str, Any]) -> str:
    return str(((body.get("spec") or {}).get("deviceSelector") or {}).get("pool") or "")


class DeviceTaints:
    """Keeps the DeviceTaintRules of the DRA stack's nodes. `owner()`: the ownerReference of the
    active GPUCluster, None while the stack is not DRA (then nothing is written)."""

    def __init__(self, kube: Kube, owner: Callable[[], Mapping[str, Any] | None]) -> None:
        self.kube, self.owner = kube, owner
        self.version: str | None = None  # of DeviceTaintRule, None: not served
        self.discovered = False  # looked up once
        self.rules: dict[str, dict[str, dict[str, Any]]] | None = None  # node (pool) -> name -> body
        self.written = 0

    async def ready(self) -> bool:
        """Whether rules are kept here: served, and what exists is known (listed once)."""
        if not self.discovered:
            self.version = await dt.rule_version(self.kube)
            self.discovered = True
            if self.version is None:
                log.info(
                    "DRA device taints: DeviceTaintRule (%s) is not served: the node's condition and "
                    "taint are the signals",
                    " or ".join(f"{dt.GROUP}/{v}" for v in dt.RULE_VERSIONS),
                )
            else:
                log.info(
                    "DRA device taints: DeviceTaintRule %s/%s is served: unhealthy GPUs are tainted",
                    dt.GROUP,
                    self.version,
                )
        if self.version is None:
            return False
        if self.rules is None:
            rules: dict[str, dict[str, dict[str, Any]]] = {}
            for body in await dt.list_rules(self.kube, self.version, MANAGED_SELECTOR):
                name = str(body["metadata"]["name"])
                if name.startswith(PREFIX):
                    rules.setdefault(pool_of(body), {})[name] = body
            self.rules = rules
        return True

    async def pools(self) -> set[str]:
        """The nodes (pools) that have rules now (none while the stack is not DRA)."""
        if self.owner() is None or not await self.ready():
            return set()
        return {pool for pool, rules in (self.rules or {}).items() if rules}

    def forget(self) -> None:
        """After a failed write: list again before the next one."""
        self.rules = None

    async def node(self, node: str, report: HealthReport | None, *, gone: bool = False) -> bool:
        """Bring `node`'s rules in line with its report (as the unit parsed it this pass; None: none,
        or unreadable). True while a sick GPU has no device in the node's slices yet (the plugin has
        not published them): the caller looks again later."""
        owner = self.owner()
        if owner is None or not await self.ready():
            return False
        assert self.rules is not None and self.version is not None
        have = self.rules.get(node, {})
        sick = {} if gone else sick_buses(report)
        if sick is None or (not sick and not have):
            return False
        names = device_names(await dt.node_slices(self.kube, node, DRIVER)) if sick else {}
        waiting = any(bus not in names for bus in sick)
        steps = plan(wanted(node, sick, names, owner, self.version), have)
        if steps.empty:
            return waiting
        try:
            for name in steps.delete:
                await dt.delete_rule(self.kube, self.version, name)
                have.pop(name, None)
                self.written += 1
            for body in steps.create:
                if not await dt.create_rule(self.kube, self.version, body):
                    raise RuntimeError(
                        f"DeviceTaintRule {body['metadata']['name']} exists already: listing again"
                    )
                have[body["metadata"]["name"]] = body
                self.written += 1
        except Exception:
            self.forget()
            raise
        self.rules[node] = have
        log.info(
            "node %s: DRA device taints: %s",
            node,
            ", ".join(
                [f"tainted {b['spec']['deviceSelector']['device']}" for b in steps.create]
                + [f"deleted {n}" for n in steps.delete]
            ),
        )
        return waiting


async def delete_rules(kube: Kube) -> list[str]:
    """Uninstall: every DeviceTaintRule GPU health keeps (the garbage collector takes those of a
    deleted GPUCluster too, in its own time); their names. Nothing where the kind is not served."""
    version = await dt.rule_version(kube)
    if version is None:
        return []
    deleted = []
    for body in await dt.list_rules(kube, version, MANAGED_SELECTOR):
        name = str(body["metadata"]["name"])
        if name.startswith(PREFIX) and await dt.delete_rule(kube, version, name):
            deleted.append(name)
    return deleted
