"""The agent's lines that docs/kubevirt.md quotes ("vGPU hosts after a reboot") are what a pass prints
on the fixture host after a reboot: the page's block is compared with a real run here."""

from __future__ import annotations

import re
from pathlib import Path

from gpu_operator.node.host.hostfs import HostFS
from gpu_operator.node.vgpuhost.agent import Settings, run_pass
from tests.support.hostsim import fakehost
from tests.support.hostsim.vgpusim import VgpuHostSim
from tests.unit.node.nodekit import HOSTS_DIR
from tests.unit.node.vgpuhost.test_vgpuhost import CONFIG
from tests.unit.node.vgpuhost.test_vgpuhost_agent import FakeNode

DOC = Path(__file__).resolve().parents[4] / "docs" / "kubevirt.md"
MARK = "<!-- the lines of tests/unit/node/vgpuhost/test_vgpuhost_docs.py -->"


def doc_block() -> list[str]:
    text = DOC.read_text()
    found = re.search(re.escape(MARK) + r"\n```text\n(.*?)```", text, re.S)
    assert found, f"{DOC}: no ```text block after {MARK}"
    return found.group(1).splitlines()


def after_reboot(tmp: Path) -> list[str]:
    fake = fakehost.build_file(HOSTS_DIR / "h100-vgpu.yaml", tmp / "root")
    fs: HostFS = fake.fs
    sim = VgpuHostSim(fs, fake.spec)
    node = FakeNode({"nvidia.com/gpu.workload.config": "vm-vgpu", "nvidia.com/vgpu.config": "mixed"})
    settings = Settings(
        config_text=CONFIG,
        config_source="/vgpu-config/config.yaml",
        default_config="default",
        default_workload="container",
        fabric_mode=2,
        fabric_mode_source="FABRIC_MODE",
    )
    run_pass(fs, sim, sim, node, settings)  # the first boot: the state is set up
    sim.reboot()
    return (
        run_pass(fs, sim, sim, node, settings).lines()
        + ["# a second pass:"]
        + run_pass(fs, sim, sim, node, settings).lines()
    )


def test_the_quoted_lines_are_a_real_run(tmp_path: Path) -> None:
    assert doc_block() == after_reboot(tmp_path)
