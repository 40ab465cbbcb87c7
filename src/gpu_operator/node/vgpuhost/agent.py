"""The agent's pass on a vm-vgpu node: decide the desired state (the vGPU device manager's config
under the node's nvidia.com/vgpu.config, the policy's Fabric Manager mode), record it on the host
(it survives the reboot, with the type ids seen, which a fully used GPU no longer lists), restore,
and report: a line per step, the status file vgpu-host-state-ready for the sandbox validator, and on
the Node a label, an annotation with every step and an Event when something changed or could not.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from gpu_operator.node.host.hostfs import HostFS, SysfsWriter
from gpu_operator.node.vfio.incluster import NodeRecorder
from gpu_operator.node.vgpuhost.config import DesiredVGPUConfig, VGPUConfigError, desired_from_config
from gpu_operator.node.vgpuhost.restore import RestoreStep, VgpuControl, restore, state_of
from gpu_operator.vocabulary import NVIDIA, VALIDATIONS_DIR, VM_VGPU, WORKLOAD_CONFIG

# NVIDIA's vgpu-device-manager picks its config by this node label; the agent follows the same one.
VGPU_CONFIG = f"{NVIDIA}/vgpu.config"
# The agent's result on its Node (ours): restored | unchanged | partial | failed, and every step (JSON).
VGPU_HOST_STATE = f"{NVIDIA}/gpu.vgpu-host.state"
VGPU_HOST_RESULT_ANNOTATION = f"{NVIDIA}/gpu.vgpu-host.result"
VGPU_HOST_RESTORED_REASON = "VGPUHostStateRestored"
VGPU_HOST_INCOMPLETE_REASON = "VGPUHostStateIncomplete"

RECORD = "/var/lib/gpu-operator/vgpu-host-state.json"
STATUS_FILE = "vgpu-host-state-ready"


class Record(BaseModel):
    """What the agent keeps on the host's disk between boots."""

    desired: DesiredVGPUConfig
    type_ids: dict[str, int] = Field(default_factory=dict)


@dataclass
class Settings:
    config_text: str | None  # the vGPU device manager's config file, None when it cannot be read
    config_source: str
    default_config: str
    default_workload: str
    fabric_mode: int | None = None
    fabric_mode_source: str = ""
    status_dir: str = VALIDATIONS_DIR


@dataclass
class PassResult:
    state: str  # restored | unchanged | partial | failed | not-applicable
    steps: list[RestoreStep] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    written: bool = False

    def lines(self) -> list[str]:
        return [*self.notes, *(s.line() for s in self.steps), f"vGPU host state: {self.state}"]


def load_record(fs: HostFS) -> Record | None:
    text = fs.read_text(RECORD)
    if not text:
        return None
    try:
        return Record.model_validate_json(text)
    except ValidationError:
        return None  # an unreadable record is rewritten by this pass


def _desired(
    fs: HostFS, settings: Settings, labels: dict[str, str], record: Record | None, notes: list[str]
) -> DesiredVGPUConfig:
    name = labels.get(VGPU_CONFIG) or settings.default_config
    chosen = f"node label {VGPU_CONFIG}" if labels.get(VGPU_CONFIG) else "DEFAULT_VGPU_CONFIG"
    if settings.config_text is None:
        if record is None:
            raise VGPUConfigError(
                f"{settings.config_source}: cannot be read, and no earlier record at {RECORD}; "
                "check the vGPU device manager's ConfigMap (spec.vgpuDeviceManager.config.name)"
            )
        notes.append(
            f"{settings.config_source} cannot be read: following the record at {RECORD} "
            f"(config {record.desired.config})"
        )
        return record.desired
    return desired_from_config(
        fs,
        settings.config_text,
        name,
        source=settings.config_source,
        chosen_by=chosen,
        fabric_mode=settings.fabric_mode,
        fabric_mode_source=settings.fabric_mode_source,
    )


def result_record(result: PassResult, desired: DesiredVGPUConfig | None, error: str = "") -> dict[str, Any]:
    """The Node annotation: deterministic, so a pass that finds everything in place patches nothing."""
    out: dict[str, Any] = {
        "state": result.state,
        "steps": [s.model_dump(exclude_defaults=True) for s in result.steps],
    }
    if desired is not None:
        out["config"] = desired.config
    if error:
        out["error"] = error
    return out


def event_for(result: PassResult, error: str) -> dict[str, str] | None:
    if result.state == "restored":
        changed = [s.line() for s in result.steps if s.outcome == "changed"]
        return {"reason": VGPU_HOST_RESTORED_REASON, "type": "Normal", "message": "; ".join(changed)}
    if result.state in ("partial", "failed"):
        problems = error or "; ".join(s.line() for s in result.steps if s.outcome in ("failed", "skipped"))
        return {"reason": VGPU_HOST_INCOMPLETE_REASON, "type": "Warning", "message": problems}
    return None


def run_pass(
    fs: HostFS, writer: SysfsWriter, control: VgpuControl, node: NodeRecorder | None, settings: Settings
) -> PassResult:
    labels, annotations = node.node_metadata() if node is not None else ({}, {})
    workload = labels.get(WORKLOAD_CONFIG) or settings.default_workload
    status = f"{settings.status_dir}/{STATUS_FILE}"
    if workload != VM_VGPU:
        return PassResult(
            "not-applicable", notes=[f"workload config is {workload}: no vGPU host state to keep"]
        )
    fs.remove(status)
    record = load_record(fs)
    result = PassResult("failed")
    desired: DesiredVGPUConfig | None = None
    error = ""
    try:
        desired = _desired(fs, settings, labels, record, result.notes)
    except VGPUConfigError as err:
        error = str(err)
        result.notes.append(error)
    if desired is not None:
        known = dict(record.type_ids) if record is not None else {}
        result.steps = restore(fs, desired, writer, control, known)
        result.state = state_of(result.steps)
        new = Record(desired=desired, type_ids=known)
        if record is None or new != record:
            fs.write_atomic(RECORD, new.model_dump_json(indent=1) + "\n")
    if result.state != "failed":
        fs.write_atomic(status, f"state={result.state}\n")
    if node is None:
        return result
    text = json.dumps(result_record(result, desired, error), sort_keys=True, separators=(",", ":"))
    if annotations.get(VGPU_HOST_RESULT_ANNOTATION) == text and labels.get(VGPU_HOST_STATE) == result.state:
        return result
    event = event_for(result, error)
    node.publish(
        {VGPU_HOST_STATE: result.state}, [event] if event else [], {VGPU_HOST_RESULT_ANNOTATION: text}
    )
    result.written = True
    return result
