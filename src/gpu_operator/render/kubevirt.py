"""KubeVirt's permitted host devices from the GPUs of passthrough nodes (pure).

Input: the policy, the nodes' labels and annotations (the probe's published facts, a mixed node's
passthrough list) and the live KubeVirt CR. Output: the pciHostDevices list to apply, the findings
to report, and the ClusterPolicy condition. The controller does the reads and the one apply.

KubeVirt's `pciHostDevices` is an atomic list (`+listType=atomic` in kubevirt.io/api core/v1), so
server-side apply cannot own single entries: we apply the whole list, carrying every entry someone
else wrote unchanged, and record the selectors we added in an annotation on the CR.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpu_operator.api.clusterpolicy import ClusterPolicySpec
from gpu_operator.render.facts import passthrough_list, workload_config
from gpu_operator.vocabulary import (
    HOST_DEVICE_LISTED_BY_OTHERS,
    HOST_DEVICES_NOT_SYNCED,
    HOST_DEVICES_SYNCED,
    HOST_DRIVER_ON_PASSTHROUGH_REASON,
    KUBEVIRT_DEVICES_ANNOTATION,
    PASSTHROUGH_DEVICE_UNKNOWN,
    PROBE_FACTS_ANNOTATION,
    PROBE_FACTS_MISSING,
    VM_PASSTHROUGH,
    VM_PASSTHROUGH_CONDITION,
)

API_VERSION = "kubevirt.io/v1"
KIND = "KubeVirt"
RESOURCE_DOMAIN = "nvidia.com"
# vfio-pci, and the Grace-Hopper variant NVIDIA's sandbox plugin also accepts.
VFIO_DRIVERS = ("vfio-pci", "nvgrace_gpu_vfio_pci")


@dataclass(frozen=True)
class NodeInput:
    """What the sync reads of one Node."""

    name: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]


@dataclass(frozen=True)
class VmGpu:
    node: str
    address: str
    selector: str  # "10DE:2330"
    product: str  # "H100 SXM5 80GB" (the bracketed pci.ids name)
    name: str  # "GH100 [H100 SXM5 80GB]" (the whole pci.ids name)


@dataclass(frozen=True)
class KubeVirtFinding:
    reason: str
    message: str
    node: str | None = None  # a Node the finding is about (for its Event), else the KubeVirt CR


@dataclass
class Inventory:
    """The GPUs that count (bound to vfio-pci on a node that gives them to VMs) and the findings."""

    bound: list[VmGpu] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)  # "node address": for VMs but on no driver yet
    no_facts: list[str] = field(default_factory=list)  # passthrough nodes whose probe published nothing
    findings: list[KubeVirtFinding] = field(default_factory=list)


def _resource_part(text: str) -> str:
    """The name rule of NVIDIA's sandbox device plugin: uppercase; `/`, `.` and blanks to `_`; other
    characters dropped. Applied to the bracketed product name it gives seed 001's KubeVirt names."""
    out = re.sub(r"\s+", "_", text.strip().upper().replace("/", "_").replace(".", "_"))
    return re.sub(r"[^A-Z0-9_]+", "", out)


def resource_name(gpu: VmGpu, external: bool) -> str:
    """`nvidia.com/H100_SXM5_80GB` for KubeVirt's own plugin (externalResourceProvider false);
    `nvidia.com/GH100_H100_SXM5_80GB` as NVIDIA's sandbox plugin advertises it (whole pci.ids name)."""
    part = _resource_part(gpu.name if external else gpu.product) or gpu.selector.replace(":", "_")
    return f"{RESOURCE_DOMAIN}/{part}"


def _facts(node: NodeInput) -> dict[str, Any] | None:
    raw = node.annotations.get(PROBE_FACTS_ANNOTATION)
    if not raw:
        return None
    try:
        facts = json.loads(raw)
    except ValueError:
        return None
    return facts if isinstance(facts, dict) else None


def node_for_vms(node: NodeInput, spec: ClusterPolicySpec) -> tuple[bool, list[str] | None]:
    """Whether a node gives GPUs to VMs, and which (None: all of them; a list: a mixed node's)."""
    if not spec.sandbox_on():
        return False, None
    listed = passthrough_list(node.annotations)
    if listed is not None:
        return True, listed
    config = workload_config(node.labels, True, spec.sandboxWorkloads.defaultWorkload)
    return config == VM_PASSTHROUGH, None


def inventory(nodes: list[NodeInput], spec: ClusterPolicySpec) -> Inventory:
    out = Inventory()
    for node in sorted(nodes, key=lambda n: n.name):
        for_vms, listed = node_for_vms(node, spec)
        if not for_vms:
            continue
        facts = _facts(node)
        if facts is None:
            out.no_facts.append(node.name)
            continue
        gpus = {str(g.get("address", "")).lower(): g for g in facts.get("gpus") or [] if isinstance(g, dict)}
        chosen = sorted(gpus) if listed is None else listed
        for address in chosen:
            gpu = gpus.get(address)
            if gpu is None:
                out.findings.append(
                    KubeVirtFinding(
                        PASSTHROUGH_DEVICE_UNKNOWN,
                        f"Node {node.name}: {address} is listed in nvidia.com/gpu.passthrough.devices but the probe "
                        f"found no NVIDIA GPU there (GPUs: {', '.join(sorted(gpus)) or 'none'}); fix the annotation",
                        node.name,
                    )
                )
                continue
            driver = str(gpu.get("driver") or "")
            if driver in VFIO_DRIVERS:
                out.bound.append(
                    VmGpu(
                        node.name,
                        address,
                        str(gpu.get("vendorDevice", "")).upper(),
                        str(gpu.get("product") or ""),
                        str(gpu.get("name") or ""),
                    )
                )
            elif driver:
                out.findings.append(
                    KubeVirtFinding(
                        HOST_DRIVER_ON_PASSTHROUGH_REASON,
                        f"Node {node.name}: GPU {address} is for VMs but bound to the host driver {driver!r}; "
                        "VMs cannot use it and KubeVirt does not list it. Fix: `gpu-operator node vfio-manage "
                        f"bind --device {address}` on the node (or remove the host driver), or give the GPU to "
                        "containers (leave it out of nvidia.com/gpu.passthrough.devices)",
                        node.name,
                    )
                )
            else:
                out.pending.append(f"{node.name} {address}")
    return out


def desired_entries(gpus: list[VmGpu], external: bool) -> list[dict[str, Any]]:
    """One entry per PCI ID, sorted; the first GPU of an ID names it."""
    first: dict[str, VmGpu] = {}
    for gpu in gpus:
        first.setdefault(gpu.selector, gpu)
    return [
        {
            "pciVendorSelector": sel,
            "resourceName": resource_name(gpu, external),
            "externalResourceProvider": external,
        }
        for sel, gpu in sorted(first.items())
    ]


def _live_list(cr: Mapping[str, Any]) -> list[dict[str, Any]]:
    config = (cr.get("spec") or {}).get("configuration") or {}
    return [dict(e) for e in (config.get("permittedHostDevices") or {}).get("pciHostDevices") or []]


def ours_recorded(cr: Mapping[str, Any]) -> set[str]:
    raw = ((cr.get("metadata") or {}).get("annotations") or {}).get(KUBEVIRT_DEVICES_ANNOTATION, "")
    return {w.strip().upper() for w in raw.split(",") if w.strip()}


def _same(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return a.get("resourceName") == b.get("resourceName") and bool(a.get("externalResourceProvider")) == bool(
        b.get("externalResourceProvider")
    )


@dataclass
class Merge:
    entries: list[dict[str, Any]]  # the whole list to apply
    ours: list[str]  # selectors we added (the annotation's value)
    findings: list[KubeVirtFinding]
    changed: bool


def merge(cr: Mapping[str, Any], desired: list[dict[str, Any]]) -> Merge:
    """Others' entries stay as they are, in their order; ours follow. A selector someone else lists
    differently is reported, never overwritten; one listed exactly as we would is left to them."""
    live = _live_list(cr)
    recorded = ours_recorded(cr)
    name = f"KubeVirt {(cr.get('metadata') or {}).get('namespace', '')}/{(cr.get('metadata') or {}).get('name', '')}"
    others = [e for e in live if str(e.get("pciVendorSelector", "")).upper() not in recorded]
    by_selector = {str(e.get("pciVendorSelector", "")).upper(): e for e in others}
    ours: list[dict[str, Any]] = []
    findings: list[KubeVirtFinding] = []
    for entry in desired:
        theirs = by_selector.get(entry["pciVendorSelector"])
        if theirs is None:
            ours.append(entry)
        elif not _same(theirs, entry):
            findings.append(
                KubeVirtFinding(
                    HOST_DEVICE_LISTED_BY_OTHERS,
                    f"{name} already lists {entry['pciVendorSelector']} as {theirs.get('resourceName')!r} "
                    f"(externalResourceProvider {bool(theirs.get('externalResourceProvider'))}); the operator would "
                    f"list it as {entry['resourceName']!r} (externalResourceProvider "
                    f"{entry['externalResourceProvider']}), so two device plugins could advertise the same GPUs. "
                    "Left as it is: remove that entry from spec.configuration.permittedHostDevices.pciHostDevices "
                    "to let the operator manage it, or set spec.sandboxWorkloads.kubevirt.syncPermittedHostDevices="
                    "false in the ClusterPolicy",
                )
            )
    entries = others + ours
    selectors = [e["pciVendorSelector"] for e in ours]
    changed = entries != live or sorted(recorded) != sorted(selectors)
    return Merge(entries, selectors, findings, changed)


def apply_body(cr: Mapping[str, Any], result: Merge) -> dict[str, Any]:
    """The server-side apply body: the list, our annotation, and the resourceVersion we read (a
    concurrent edit makes the apply fail with 409 instead of being lost)."""
    meta = cr.get("metadata") or {}
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "resourceVersion": meta.get("resourceVersion"),
            "annotations": {KUBEVIRT_DEVICES_ANNOTATION: ",".join(result.ours)},
        },
        "spec": {"configuration": {"permittedHostDevices": {"pciHostDevices": result.entries}}},
    }


def summary(inv: Inventory, entries: list[dict[str, Any]]) -> str:
    counts: dict[str, set[str]] = {}
    per_id: dict[str, int] = {}
    for gpu in inv.bound:
        counts.setdefault(gpu.selector, set()).add(gpu.node)
        per_id[gpu.selector] = per_id.get(gpu.selector, 0) + 1
    names = {e["pciVendorSelector"]: e["resourceName"] for e in entries}
    parts = [
        f"{sel} {names.get(sel, '?')}: {per_id[sel]} GPU(s) on vfio-pci on {len(nodes)} node(s)"
        for sel, nodes in sorted(counts.items())
    ]
    text = "; ".join(parts) or "no GPU bound to vfio-pci on a passthrough node"
    if inv.pending:
        text += f"; not bound yet: {_some(inv.pending)}"
    if inv.no_facts:
        text += f"; no probe facts yet from: {_some(inv.no_facts)}"
    return text


def _some(items: list[str], limit: int = 8) -> str:
    """A status message stays readable on a thousand nodes: the first few, then how many more."""
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def condition(
    findings: list[KubeVirtFinding], synced: bool, text: str, no_facts: list[str] | None = None
) -> dict[str, str]:
    """The VMPassthrough condition (without times): False with the first finding's reason when any;
    False (ProbeFactsMissing) while a passthrough node's GPUs are not seen (no probe facts from it):
    what was synced leaves them out, so it is not True."""
    if findings:
        shown = " | ".join(f.message for f in findings[:5])
        more = (
            f" | and {len(findings) - 5} more finding(s): see the Warning Events" if len(findings) > 5 else ""
        )
        return {
            "type": VM_PASSTHROUGH_CONDITION,
            "status": "False",
            "reason": findings[0].reason,
            "message": shown + more,
        }
    if no_facts:
        return {
            "type": VM_PASSTHROUGH_CONDITION,
            "status": "False",
            "reason": PROBE_FACTS_MISSING,
            "message": (
                f"the GPUs of {len(no_facts)} passthrough node(s) are not seen: {_some(no_facts)} "
                f"(no {PROBE_FACTS_ANNOTATION} annotation from the GPU probe); the probe runs on passthrough "
                "nodes while spec.sandboxWorkloads.enabled=true: check that its pod runs there "
                "(kubectl get pods -A -l app=nvidia-gpu-probe -o wide) and read its log. " + text
            ),
        }
    return {
        "type": VM_PASSTHROUGH_CONDITION,
        "status": "True",
        "reason": HOST_DEVICES_SYNCED if synced else HOST_DEVICES_NOT_SYNCED,
        "message": text,
    }
