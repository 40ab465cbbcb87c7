"""The vGPU host-state agent's pass around the restore: the node label picks the config, the record on
the host outlives the reboot, the status file and the Node record say what happened, and an
unchanged node is not patched again."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpu_operator.node.vgpuhost import sysfs
from gpu_operator.node.vgpuhost.agent import (
    RECORD,
    STATUS_FILE,
    VGPU_HOST_INCOMPLETE_REASON,
    VGPU_HOST_RESTORED_REASON,
    VGPU_HOST_RESULT_ANNOTATION,
    VGPU_HOST_STATE,
    Settings,
    load_record,
    run_pass,
)
from gpu_operator.vocabulary import VALIDATIONS_DIR
from tests.support.hostsim.vgpusim import VgpuHostSim
from tests.unit.node.vgpuhost.test_vgpuhost import CONFIG


class FakeNode:
    """The two calls the agent makes on its Node, with the Node's metadata kept as the API would."""

    def __init__(self, labels: dict[str, str]) -> None:
        self.labels, self.annotations = dict(labels), {}  # type: dict[str, str], dict[str, str]
        self.events: list[dict[str, str]] = []
        self.patches = 0

    def node_metadata(self) -> tuple[dict[str, str], dict[str, str]]:
        return dict(self.labels), dict(self.annotations)

    def publish(
        self,
        labels: dict[str, str | None],
        events: list[dict[str, str]],
        annotations: dict[str, str | None] | None = None,
    ) -> None:
        self.patches += 1
        self.labels.update({k: v for k, v in labels.items() if v is not None})
        self.annotations.update({k: v for k, v in (annotations or {}).items() if v is not None})
        self.events += events


def settings(text: str | None = CONFIG) -> Settings:
    return Settings(
        config_text=text,
        config_source="config.yaml",
        default_config="default",
        default_workload="container",
        fabric_mode=2,
        fabric_mode_source="FABRIC_MODE",
    )


@pytest.fixture
def host(build_host):  # type: ignore[no-untyped-def]
    fake = build_host("h100-vgpu")
    return fake.fs, VgpuHostSim(fake.fs, fake.spec)


VGPU_NODE = {"nvidia.com/gpu.workload.config": "vm-vgpu", "nvidia.com/vgpu.config": "H100XM-20C"}


def test_the_pass_records_restores_and_reports_then_stays_quiet(host) -> None:  # type: ignore[no-untyped-def]
    fs, sim = host
    node = FakeNode(VGPU_NODE)
    result = run_pass(fs, sim, sim, node, settings())
    assert result.state == "restored" and node.labels[VGPU_HOST_STATE] == "restored"
    assert [e["reason"] for e in node.events] == [VGPU_HOST_RESTORED_REASON]
    assert fs.read_text(f"{VALIDATIONS_DIR}/{STATUS_FILE}") == "state=restored\n"
    record = load_record(fs)
    assert record is not None and record.desired.config == "H100XM-20C"
    assert record.type_ids["H100XM-20C"] == 1059
    steps = json.loads(node.annotations[VGPU_HOST_RESULT_ANNOTATION])["steps"]
    assert {(s["gpu"], s["step"], s["outcome"]) for s in steps} >= {
        ("0000:41:00.0", "vfs", "changed"),
        ("0000:41:00.0", "vgpu-types", "changed"),
    }

    again = run_pass(fs, sim, sim, node, settings())
    assert again.state == "unchanged"
    assert fs.read_text(f"{VALIDATIONS_DIR}/{STATUS_FILE}") == "state=unchanged\n"
    patches = node.patches
    third = run_pass(fs, sim, sim, node, settings())
    assert third.state == "unchanged" and not third.written and node.patches == patches


def test_after_a_reboot_without_the_config_the_record_on_the_host_decides(host) -> None:  # type: ignore[no-untyped-def]
    fs, sim = host
    node = FakeNode(VGPU_NODE)
    run_pass(fs, sim, sim, node, settings())
    sim.reboot()
    result = run_pass(fs, sim, sim, node, settings(text=None))
    assert result.state == "restored"
    assert any(RECORD in note for note in result.notes)
    assert [vf.current for vf in sysfs.read_pf(fs, "0000:c1:00.0").vfs][:5] == [1059] * 4 + [0]


def test_a_fully_used_gpu_keeps_its_vgpus_across_pod_restarts(host) -> None:  # type: ignore[no-untyped-def]
    """4x H100XM-20C fill the GPU: its VFs list no types, so only the recorded ids say they are right."""
    fs, sim = host
    node = FakeNode(VGPU_NODE)
    run_pass(fs, sim, sim, node, settings())
    log = len(sim.log)
    assert run_pass(fs, sim, sim, node, settings()).state == "unchanged"
    assert sim.log[log:] == []


def test_a_bad_config_fails_the_pass_with_the_field_and_no_status_file(host) -> None:  # type: ignore[no-untyped-def]
    fs, sim = host
    node = FakeNode({**VGPU_NODE, "nvidia.com/vgpu.config": "wrong-family"})
    result = run_pass(fs, sim, sim, node, settings())
    assert result.state == "failed"
    assert not fs.exists(f"{VALIDATIONS_DIR}/{STATUS_FILE}")
    event = node.events[-1]
    assert event["reason"] == VGPU_HOST_INCOMPLETE_REASON and event["type"] == "Warning"
    steps: list[dict[str, Any]] = json.loads(node.annotations[VGPU_HOST_RESULT_ANNOTATION])["steps"]
    failed = [s for s in steps if s["outcome"] == "failed"]
    assert failed[0]["field"] == "config.yaml: vgpu-configs.wrong-family[0].vgpu-devices"
    assert failed[0]["creatable"] == ["H100XM-80C", "H100XM-40C", "H100XM-20C", "H100XM-10C"]


def test_an_unknown_config_name_is_reported_on_the_node(host) -> None:  # type: ignore[no-untyped-def]
    fs, sim = host
    node = FakeNode({**VGPU_NODE, "nvidia.com/vgpu.config": "nope"})
    result = run_pass(fs, sim, sim, node, settings())
    assert result.state == "failed"
    error = json.loads(node.annotations[VGPU_HOST_RESULT_ANNOTATION])["error"]
    assert error.startswith("config.yaml: no config 'nope' under vgpu-configs")


def test_a_node_that_is_not_for_vgpu_is_left_alone(host) -> None:  # type: ignore[no-untyped-def]
    fs, sim = host
    node = FakeNode({"nvidia.com/gpu.workload.config": "vm-passthrough"})
    result = run_pass(fs, sim, sim, node, settings())
    assert result.state == "not-applicable" and node.patches == 0 and sim.log == []
