"""docs/node-agents.md, "The health agent", against the code: the example report is the agent's own
output for the scenario the page names, the metrics table is what the agent registers, and the
bucket table is what the catalogue does."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from gpu_operator.api.health import HealthReport
from gpu_operator.node.health import HealthAgent, HealthMetrics, encode
from gpu_operator.node.health.catalogue import DEVICE_PLUGIN_APPLICATION_XIDS, catalogue, classify
from gpu_operator.node.host.hostfs import HostFS
from gpu_operator.vocabulary import VALIDATIONS_DIR
from tests.unit.docs.test_tables import tables

PAGE = Path(__file__).resolve().parents[4] / "docs" / "node-agents.md"


def section() -> str:
    text = PAGE.read_text()
    start = text.index("## The health agent")
    return text[start : text.index("\n## ", start + 1)]


def test_the_example_report_is_the_agents_output(build_host: Any) -> None:
    block = section().split("<!-- health-report-example -->", 1)[1]
    documented = json.loads(block.split("```json", 1)[1].split("```", 1)[0])
    fs: HostFS = build_host("h100-nvidia-bound").fs
    fs.write_text("/dev/kmsg", "6,1,0,-;Linux version 6.8.0-generic\n")
    for component in ("driver", "toolkit", "cuda"):
        fs.write_text(f"{VALIDATIONS_DIR}/{component}-ready", "")
    agent = HealthAgent(fs, "node-a", nvml=False, log=lambda _: None)
    with fs.resolve("/dev/kmsg").open("a") as kmsg:
        kmsg.write(
            "3,2,5000,-;NVRM: Xid (PCI:0000:0a:00): 79, pid=0, name=kworker, GPU has fallen off the bus.\n"
        )
        kmsg.write(
            "3,3,6000,-;NVRM: Xid (PCI:0000:c1:00): 13, pid=4242, name=python, Graphics SM Warp Exception\n"
        )
    fs.remove("/sys/bus/pci/devices/0000:18:00.0")
    report = agent.observe()
    assert report == documented
    assert HealthReport.parse(encode(report)).state == "gone"


def test_the_metrics_table_is_what_the_agent_registers() -> None:
    rows = tables(PAGE, "health metric")
    documented = {re.sub(r"\{.*\}$", "", re.findall(r"`([^`]+)`", row[0])[0]) for row in rows}
    registered = {
        f.name + ("_total" if f.type == "counter" else "") for f in HealthMetrics().registry.collect()
    }
    assert documented == registered


def test_the_bucket_table_is_what_the_catalogue_does() -> None:
    rows = tables(PAGE, "catalogue bucket")
    assert len(rows) == 5
    buckets = {bucket for bucket, _ in catalogue().values()}
    for row in rows:
        action, state = row[1].strip("`"), row[2].strip("`")
        for name in re.findall(r"`([A-Z_0-9]+)`", row[0]):
            assert name in buckets, name
            codes = [code for code, (bucket, _) in catalogue().items() if bucket == name]
            assert codes, name
            for code in codes:
                # the device plugin's application Xids stay at `warning` whatever the bucket (109: RESET_GPU)
                want = "warning" if code in DEVICE_PLUGIN_APPLICATION_XIDS and state == "unhealthy" else state
                assert (classify(code).action, classify(code).state) == (action, want), (name, code)
        for code in re.findall(r"\b(\d+)\b", row[3]):
            assert (classify(int(code)).action, classify(int(code)).state) == (action, state), code


def test_doctors_xid_row_matches_its_severities() -> None:
    from gpu_operator.node.doctor.kernellog import xid_kind

    row = next(r for r in tables(PAGE, "code") if r[0] == "`xid-N`")[1]
    parts = {
        "error": row.split("is an error (", 1)[1].split(")", 1)[0],
        "warning": row.split("a warning (", 1)[1].split("any number", 1)[0],
        "info": row.split("`healthy` information (", 1)[1].split(")", 1)[0],
    }
    for severity, text in parts.items():
        codes = [int(n) for n in re.findall(r"\d+", text)]
        assert codes, severity
        assert {str(xid_kind(code)[0]) for code in codes} == {severity}, (severity, codes)
