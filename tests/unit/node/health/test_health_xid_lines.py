"""Only the NVIDIA driver's own Xid lines count (node/health/xidlines.py): a kernel record (facility
kern) whose message BEGINS with `NVRM: Xid (`, in the driver's format, naming one of this node's
GPUs, and not a GPU whose Xid events NVML delivers. Every forged or foreign line is counted by
reason in gpu_operator_gpu_xid_lines_ignored_total and marks nothing."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_operator.node.health import HealthAgent, HealthMetrics
from gpu_operator.node.health.catalogue import classify
from gpu_operator.node.health.kmsg import KmsgRecord, _record
from gpu_operator.node.health.xidlines import judge
from gpu_operator.node.host.hostfs import HostFS
from gpu_operator.sim.hardware import faults
from tests.unit.node.health.nvml_standin import XID_EVENT, NvmlStandin
from tests.unit.node.health.test_health import GPUS, SEQ, validated

# The 8 GPUs of the fixture host (0000:0a:00.0 ... 0000:c1:00.0).
NODE_GPUS = set(GPUS)

# Real driver lines: (prio, message, bus, xid, source). prio 4: the driver prints with KERN_CONT and
# no level (kernel-open/nvidia/os-interface.c nv_printf), so the record takes the default level,
# warning, facility kern. Addresses changed to GPUs of the fixture host.
REAL = [
    (
        4,
        "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
        "0000:3b:00.0",
        79,
        "open-gpu-kernel-modules kernel_rc.c XID_PRINT_WITH_ATTR with a process; "
        "NVIDIA's Xid catalogue's example",
    ),
    (
        4,
        "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
        "0000:3b:00.0",
        79,
        "kernel_rc.c XID_PRINT_WITH_ATTR, no process (procName NULL)",
    ),
    (
        4,
        "NVRM: Xid (PCI:0000:0a:00): 13, pid=1234, name=python3, Graphics SM Warp Exception on (GPC 0, TPC 1, "
        "SM 0): Out Of Range Address",
        "0000:0a:00.0",
        13,
        "kernel_rc.c, the catalogue's Xid 13 text",
    ),
    (
        4,
        "NVRM: Xid (PCI:0000:44:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9). RST: No, D-RST: No",
        "0000:44:00.0",
        94,
        "src/nvidia/src/kernel/gpu/arch/ampere/kern_gpu_error_cont_ga100.c (comment)",
    ),
    (
        4,
        "NVRM: Xid (PCI:0000:44:00): 95, pid=7062, Uncontained: LTC TAG (0x2, 0x1). RST: Yes, D-RST: No",
        "0000:44:00.0",
        95,
        "kern_gpu_error_cont_ga100.c (comment)",
    ),
    (
        4,
        "NVRM: Xid (PCI:0000:c1:00 GPU-I:02 GPU-CI:01): 43, pid=99, name=train, Ch 00000008",
        "0000:c1:00.0",
        43,
        "kernel_rc.c, GPU-I and GPU-CI attribution",
    ),
    (
        3,
        faults.xid_message("0000:87:00", 48),
        "0000:87:00.0",
        48,
        "the simulator's `sim fault --xid` record (sim/hardware/faults.py, facility kern level err)",
    ),
]

SEGV = "segfault at 0 ip 00007f3a2b1c0000 sp 00007ffd5e1f0000 error 4"
# Forged or foreign: (prio or None for no header, message, reason)
FORGED = [
    (6, f"evil[4242]: {SEGV} in NVRM: Xid (PCI:0000:3b:00): 79, x[7f3a2b1c0000+1000]", "not-at-start"),
    (
        6,
        f"python3[77]: {SEGV} in NVRM: Xid (PCI:0000:0a:00): 48, pid=1, name=x, y.so[7f00+2000] likely on CPU 3",
        "not-at-start",
    ),
    # a process named to start with the prefix: comm holds 15 characters, so the address never follows
    (6, f"NVRM: Xid (PCI:[4242]: {SEGV} in libc.so.6[7f00+1000]", "unparsed"),
    (4, " NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.", "not-at-start"),
    (
        12,
        "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
        "not-kernel",
    ),  # user.warning: what `echo ... > /dev/kmsg` writes
    (27, "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.", "not-kernel"),  # daemon.err
    (None, "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.", "not-kernel"),  # no kmsg header
    (4, "NVRM: Xid (PCI:0000:3c:00): 79, GPU has fallen off the bus.", "not-a-gpu"),  # no GPU there
    (
        4,
        "NVRM: Xid (PCI:0000:3b:00.1): 79, GPU has fallen off the bus.",
        "not-a-gpu",
    ),  # the GPU's audio function
    (4, "NVRM: Xid (PCI:0001:3b:00): 79, GPU has fallen off the bus.", "not-a-gpu"),  # another domain
    (4, "NVRM: Xid (PCI:0000:3b:00): 79 GPU has fallen off the bus.", "unparsed"),  # not the driver's format
]


def raw(prio: int | None, message: str) -> str:
    return f"{prio},{next(SEQ)},1000,-;{message}\n" if prio is not None else f"{message}\n"


@pytest.fixture
def host(build_host: Any) -> HostFS:
    fs: HostFS = build_host("h100-nvidia-bound").fs
    fs.write_text("/dev/kmsg", raw(6, "Linux version 6.8.0-generic"))
    validated(fs)
    return fs


def append(fs: HostFS, text: str) -> None:
    with fs.resolve("/dev/kmsg").open("a") as handle:
        handle.write(text)


def parsed(prio: int | None, message: str) -> KmsgRecord:
    record = _record(raw(prio, message).rstrip("\n").encode())
    assert record is not None
    return record


@pytest.mark.parametrize(
    ("prio", "message", "bus", "xid", "source"), REAL, ids=[f"xid{r[3]}-{i}" for i, r in enumerate(REAL)]
)
def test_real_driver_lines_count(prio: int, message: str, bus: str, xid: int, source: str) -> None:
    event, reason = judge(parsed(prio, message), NODE_GPUS)
    assert reason == "" and event is not None, source
    assert (event.bus, event.xid, event.source) == (bus, xid, "kmsg")


@pytest.mark.parametrize(
    ("prio", "message", "reason"), FORGED, ids=[f"{r[2]}-{i}" for i, r in enumerate(FORGED)]
)
def test_forged_lines_are_dropped_with_their_reason(prio: int | None, message: str, reason: str) -> None:
    assert judge(parsed(prio, message), NODE_GPUS) == (None, reason)


def test_the_record_header_gives_facility_and_level() -> None:
    record = parsed(27, "x")
    assert (record.facility, record.level) == (3, 3)
    assert parsed(4, "y").facility == 0 and parsed(None, "z").facility is None


def test_no_forged_line_marks_the_node_and_each_is_counted(host: HostFS) -> None:
    metrics = HealthMetrics()
    logs: list[str] = []
    agent = HealthAgent(host, "node-a", nvml=False, metrics=metrics, log=logs.append)
    append(host, "".join(raw(prio, message) for prio, message, _ in FORGED))
    report = agent.observe()
    assert (report["state"], report["gpus"], report["healthy"]) == ("healthy", [], 8)
    expected: dict[str, int] = {}
    for _, _, reason in FORGED:
        expected[reason] = expected.get(reason, 0) + 1
    assert dict(agent.kernel_xids.ignored) == expected
    for reason, count in expected.items():
        assert (
            metrics.registry.get_sample_value("gpu_operator_gpu_xid_lines_ignored_total", {"reason": reason})
            == count
        )
    assert len([line for line in logs if line.startswith("kernel log: a record naming an Xid")]) == len(
        expected
    )
    # the real lines, after them, still count
    append(host, "".join(raw(prio, message) for prio, message, *_ in REAL))
    listed = {g["bus"]: g for g in agent.observe()["gpus"]}
    assert {bus for _, _, bus, xid, _ in REAL if classify(xid).state != "healthy"} == set(listed)
    assert listed["0000:3b:00.0"]["xid"] == 79 and listed["0000:3b:00.0"]["action"] == "reboot"


def test_nvml_events_are_the_channel_where_nvml_watches_the_gpu(host: HostFS) -> None:
    """NVML registered for Xid events: its events count, the kernel log's lines for those GPUs do not
    (counted as nvml-watches); a GPU NVML took no Xid registration for keeps the kernel log."""
    nvml = NvmlStandin(GPUS)
    agent = HealthAgent(host, "node-a", nvml=True, nvml_module=nvml, log=lambda _: None)
    assert agent.nvml is not None and agent.nvml.xid_buses == NODE_GPUS
    append(host, raw(4, "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."))
    assert agent.observe()["gpus"] == []
    assert dict(agent.kernel_xids.ignored) == {"nvml-watches": 1}
    nvml.queue.append((2, XID_EVENT, 79))
    got = agent.observe()["gpus"]
    assert [(g["bus"], g["xid"], g["reason"].endswith("(nvml)")) for g in got] == [("0000:3b:00.0", 79, True)]


def test_the_kernel_log_is_the_fallback_where_nvml_takes_no_xid_registration(host: HostFS) -> None:
    nvml = NvmlStandin(GPUS)
    nvml.supported = 0x2  # double-bit ECC only
    agent = HealthAgent(host, "node-a", nvml=True, nvml_module=nvml, log=lambda _: None)
    assert agent.nvml is not None and agent.nvml.xid_buses == set()
    append(host, raw(4, "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."))
    assert [(g["bus"], g["xid"]) for g in agent.observe()["gpus"]] == [("0000:3b:00.0", 79)]


def test_doctor_finds_the_driver_lines_and_no_forged_one(host: HostFS) -> None:
    """doctor's kernel-log findings (node/doctor/kernellog.py) from /dev/kmsg and from a syslog file: the
    real lines give their Xids; the forged ones that are no kern record, or carry the text
    elsewhere than at the start of the kernel's message, give none."""
    from gpu_operator.node.doctor.kernellog import kernel_log_findings

    forged = [(p, m) for p, m, reason in FORGED if reason in ("not-kernel", "not-at-start", "unparsed")]
    host.write_text("/dev/kmsg", "".join(raw(p, m) for p, m in forged))
    assert [f.code for f in kernel_log_findings(host) if f.code.startswith("xid-")] == []
    host.write_text("/dev/kmsg", "".join(raw(p, m) for p, m in forged) + raw(4, REAL[0][1]))
    assert [f.code for f in kernel_log_findings(host) if f.code.startswith("xid-")] == ["xid-79"]
    host.remove("/dev/kmsg")
    # a syslog file shows no facility: the kernel's message must begin with the driver's line
    inside = [
        m for _, m, reason in FORGED if reason in ("not-at-start", "unparsed") and not m.startswith(" ")
    ]
    host.write_text(
        "/var/log/kern.log", "".join(f"Dec  2 00:41:12 gpu-1 kernel: [ 12.5] {m}\n" for m in inside)
    )
    assert [f.code for f in kernel_log_findings(host) if f.code.startswith("xid-")] == []


def test_sim_fault_writes_the_record_the_kernel_would(host: HostFS, tmp_path: Any) -> None:
    """`gpu-operator sim fault --xid` (sim/hardware/faults.py) appends a kern record the agent counts."""
    from gpu_operator.node.health.kmsg import read_records

    agent = HealthAgent(host, "node-a", nvml=False, log=lambda _: None)
    gpu = faults.HostFaults(host.root, tmp_path / "book").xid(48, 3)
    record = (read_records(host) or [])[-1]
    assert (record.facility, judge(record, NODE_GPUS)[1]) == (0, "")
    listed = {g["bus"]: g for g in agent.observe()["gpus"]}
    assert (listed[gpu.address]["xid"], listed[gpu.address]["reason"].endswith("(kmsg)")) == (48, True)
    assert not agent.kernel_xids.ignored
