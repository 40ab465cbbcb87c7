"""vfio-manage in the cluster: bind this node's passthrough GPUs (all of them, or those its annotation
lists on a mixed node) with the command's safety rules, and record the result on the Node."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpu_operator.node.host import pci
from gpu_operator.node.host.hostfs import HostFS, SysfsWriter
from gpu_operator.node.vfio import manage as vfio
from gpu_operator.vocabulary import (
    CONTAINER,
    PASSTHROUGH_DEVICES_ANNOTATION,
    VFIO_BOUND_REASON,
    VFIO_REFUSED_REASON,
    VFIO_RESULT_ANNOTATION,
    VFIO_STATE,
    VM_VGPU,
    WORKLOAD_CONFIG,
)


class NodeRecorder(Protocol):
    """The two API calls the agent makes: read its Node's metadata, write the result (+ events)."""

    def node_metadata(self) -> tuple[dict[str, str], dict[str, str]]: ...

    def publish(
        self,
        labels: dict[str, str | None],
        events: list[dict[str, str]],
        annotations: dict[str, str | None] | None = None,
    ) -> None: ...


@dataclass
class Selection:
    """Which GPUs go to VMs on this node, and why."""

    devices: list[str] = field(default_factory=list)
    all_gpus: bool = False
    why: str = ""
    error: str = ""


def parse_passthrough_devices(
    value: str, source: str = f"annotation {PASSTHROUGH_DEVICES_ANNOTATION}"
) -> list[str]:
    """A comma (or space) separated list of PCI addresses, normalized; VfioUsageError names `source` and the bad one."""
    words = [w for w in value.replace(",", " ").split() if w]
    out = []
    for word in words:
        try:
            out.append(vfio.normalize_address(word))
        except vfio.VfioUsageError:
            raise vfio.VfioUsageError(
                f"{source}: {word!r} is not a PCI address; "
                "list the passthrough GPUs like 0000:0a:00.0,0000:18:00.0"
            ) from None
    return sorted(set(out))


def select(labels: dict[str, str], annotations: dict[str, str]) -> Selection:
    """The annotation decides on a mixed node; otherwise every GPU, unless the node is declared for containers or vGPU."""
    listed = annotations.get(PASSTHROUGH_DEVICES_ANNOTATION)
    if listed is not None and listed.strip():
        try:
            devices = parse_passthrough_devices(listed)
        except vfio.VfioUsageError as err:
            return Selection(error=str(err))
        return Selection(devices=devices, why=f"listed in {PASSTHROUGH_DEVICES_ANNOTATION}")
    workload = labels.get(WORKLOAD_CONFIG, "")
    if workload in (CONTAINER, VM_VGPU):
        return Selection(
            why=f"the node is labelled {WORKLOAD_CONFIG}={workload} and has no {PASSTHROUGH_DEVICES_ANNOTATION} "
            "annotation: no GPU goes to VMs"
        )
    return Selection(all_gpus=True, why="every GPU (vm-passthrough node without a device list)")


def state_of(plans: list[vfio.GpuPlan], selection: Selection) -> str:
    if selection.error:
        return "failed"
    if not plans:
        return "none"
    ok = [p for p in plans if p.ok]
    if len(ok) == len(plans):
        return "bound"
    if ok:
        return "partial"
    return "refused" if any(p.refused for p in plans) else "failed"


def result_record(fs: HostFS, plans: list[vfio.GpuPlan], selection: Selection) -> dict[str, Any]:
    """What goes into the result annotation: deterministic, so an unchanged node is not patched again."""
    chosen = {p.gpu for p in plans}
    gpus: dict[str, dict[str, str]] = {}
    for p in plans:
        now = pci.read_function(fs, p.gpu).driver or "none"
        # "bound now" and "already bound" read the same, so a second pass finds nothing to record.
        result = f"REFUSED: {p.refused}" if p.refused else ("for VMs: on vfio-pci" if p.ok else p.result)
        gpus[p.gpu] = {"driver": now, "result": result}
    for func in pci.scan(fs, pci.NVIDIA_VENDOR):
        if func.is_gpu and func.address not in chosen:
            gpus[func.address] = {
                "driver": func.driver or "none",
                "result": "not for VMs on this node; left as is",
            }
    record: dict[str, Any] = {"state": state_of(plans, selection), "selection": selection.why, "gpus": gpus}
    if selection.error:
        record["error"] = selection.error
    return record


def event_for(record: dict[str, Any]) -> dict[str, str] | None:
    state = record["state"]
    gpus = record["gpus"]
    on_vfio = sorted(a for a, g in gpus.items() if g["driver"] in pci.VFIO_DRIVERS)
    left = sorted(a for a, g in gpus.items() if g["result"].startswith("not for VMs"))
    if state == "none":
        return None
    if state == "bound":
        message = f"{len(on_vfio)} GPU(s) on vfio-pci ({record['selection']}): {', '.join(on_vfio)}"
        if left:
            message += f"; {len(left)} left for containers: {', '.join(left)}"
        return {"reason": VFIO_BOUND_REASON, "type": "Normal", "message": message}
    problems = record.get("error") or "; ".join(
        f"{a}: {g['result']}"
        for a, g in sorted(gpus.items())
        if g["result"].startswith("REFUSED")
        or (g["driver"] not in pci.VFIO_DRIVERS and not g["result"].startswith("not for VMs"))
    )
    return {"reason": VFIO_REFUSED_REASON, "type": "Warning", "message": f"vfio-manage {state}: {problems}"}


def reconcile(
    fs: HostFS,
    writer: SysfsWriter,
    node: NodeRecorder,
    *,
    load_vfio: Callable[[], None] | None = None,
) -> tuple[dict[str, Any], bool]:
    """One pass: select, bind, record. Returns the record and whether the Node was written."""
    labels, annotations = node.node_metadata()
    selection = select(labels, annotations)
    plans: list[vfio.GpuPlan] = []
    if not selection.error and (selection.all_gpus or selection.devices):
        try:
            plans = vfio.execute(
                fs, writer, "bind", selection.devices, selection.all_gpus, load_vfio=load_vfio
            )
        except vfio.VfioUsageError as err:
            selection.error = f"annotation {PASSTHROUGH_DEVICES_ANNOTATION}: {err}"
    record = result_record(fs, plans, selection)
    text = json.dumps(record, sort_keys=True, separators=(",", ":"))
    if annotations.get(VFIO_RESULT_ANNOTATION) == text and labels.get(VFIO_STATE) == record["state"]:
        return record, False
    event = event_for(record)
    node.publish({VFIO_STATE: record["state"]}, [event] if event else [], {VFIO_RESULT_ANNOTATION: text})
    return record, True
