"""Node agents on hostile host roots (property-based): symlinks that lead out of the root or loop,
absurdly long sysfs values, binary garbage in /proc and /etc, missing files, and a device directory
that disappears while it is being read. Whatever the tree, probe, doctor, the validator and the
node-status exporter and vfio-manage finish without an exception, write nothing outside the host root, and every
path they could not read is named in the doctor's findings."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from rich.console import Console

from gpu_operator.node.doctor.findings import diagnose
from gpu_operator.node.doctor.report import run as doctor_run
from gpu_operator.node.exporter import NodeStatusCollector, registry_for
from gpu_operator.node.host.hostfs import HostFS, KernelWriter
from gpu_operator.node.host.probe import probe
from gpu_operator.node.validate.base import Outcome
from gpu_operator.node.validate.run import validate
from gpu_operator.node.vfio import manage as vfio
from tests.support.hostsim import fakehost
from tests.unit.node.nodekit import HOSTS_DIR, FakeNodeView, context

HOSTS = ("ubuntu-apt-driver", "h100-vfio", "h100-nvidia-bound", "operator-driver", "nouveau")
DEVICE = {
    "ubuntu-apt-driver": "0000:41:00.0",
    "h100-vfio": "0000:0a:00.0",
    "h100-nvidia-bound": "0000:0a:00.0",
    "operator-driver": "",
    "nouveau": "",
}
# Paths every probe reads, and paths it reads on some hosts; "{dev}" is a GPU's sysfs directory.
ALWAYS_READ = ("/proc/cmdline", "/etc/os-release", "/proc/sys/kernel/osrelease", "/proc/modules")
TARGETS = (
    *ALWAYS_READ,
    "/sys/bus/pci/devices",
    "/sys/kernel/iommu_groups",
    "/usr/bin/nvidia-smi",
    "/run/nvidia",
    "/run/nvidia/validations",
    "/etc/containerd/config.toml",
    "/sys/module",
    "{dev}/vendor",
    "{dev}/device",
    "{dev}/class",
    "{dev}/driver",
    "{dev}/iommu_group",
    "{dev}/numa_node",
    "{dev}/driver_override",
    "{dev}/sriov_totalvfs",
    "{dev}",
)
COMPONENTS = ("driver", "toolkit", "plugin", "vfio-pci", "nvidia-fs")


@dataclass(frozen=True)
class Mutation:
    kind: str  # escape | loop | huge | garbage | missing
    target: str
    data: bytes = b""


mutations = st.builds(
    Mutation,
    kind=st.sampled_from(["escape", "absolute-escape", "loop", "huge", "garbage", "missing"]),
    target=st.sampled_from(TARGETS),
    data=st.binary(min_size=1, max_size=256),
)


def _apply(root: Path, outside: Path, mutation: Mutation, dev: str) -> str | None:
    """Change the tree; returns the host path when it is a symlink no reader may follow."""
    if "{dev}" in mutation.target and not dev:
        return None
    host_path = mutation.target.replace("{dev}", f"/sys/bus/pci/devices/{dev}")
    real = root / host_path.lstrip("/")
    for parent in real.relative_to(root).parents:
        if (root / parent).is_symlink() or (root / parent).is_file():
            return None  # an earlier change already replaced a directory on the way
    if real.is_symlink() or real.is_file():
        real.unlink()
    elif real.is_dir():
        shutil.rmtree(real)
    real.parent.mkdir(parents=True, exist_ok=True)
    if mutation.kind == "escape":
        # Enough `..` to climb out of any depth, then into the directory beside the root.
        real.symlink_to("../" * (host_path.count("/") + 2) + str(outside).lstrip("/"))
        return host_path
    if mutation.kind == "absolute-escape":
        # Absolute targets start again at the host root (as in a chroot): this one stays inside
        # unless a reader followed it on the container's own file system.
        real.symlink_to(str(outside))
        return None
    if mutation.kind == "loop":
        real.symlink_to(real.name)
        return host_path
    if mutation.kind == "huge":
        real.write_bytes(b"1" * (4 << 20))
    elif mutation.kind == "garbage":
        real.write_bytes(mutation.data + b"\x00\xff\xfe" + mutation.data)
    return None


class VanishingFS(HostFS):
    """A host whose device directories disappear right after they were listed (a hot-unplug)."""

    def listdir(self, path: str) -> list[str]:
        entries = super().listdir(path)
        if path.rstrip("/") == "/sys/bus/pci/devices" and entries:
            real = self.resolve(f"{path}/{entries[0]}", follow_last=False)
            if real.is_symlink():
                real.unlink()
            elif real.is_dir():
                shutil.rmtree(real)
        return entries


def _snapshot(directory: Path) -> dict[str, tuple[int, bytes]]:
    out = {}
    for dirpath, _dirs, files in os.walk(directory):
        for name in files:
            path = Path(dirpath, name)
            out[str(path)] = (path.stat().st_mtime_ns, path.read_bytes())
    return out


@settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
)
@given(host=st.sampled_from(HOSTS), changes=st.lists(mutations, min_size=1, max_size=4), vanish=st.booleans())
def test_agents_survive_hostile_host_roots(host: str, changes: list[Mutation], vanish: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        outside = base / "outside"
        (outside / "sys" / "bus" / "pci" / "devices").mkdir(parents=True)
        (outside / "sentinel").write_text("must stay as it is\n")
        (outside / "validations").mkdir()
        root = base / "root"
        fakehost.build(fakehost.load_spec(HOSTS_DIR / f"{host}.yaml"), root)
        refused_by_target = {
            m.target: _apply(root, outside, m, DEVICE[host]) for m in changes
        }  # last one wins
        unreadable = {p for p in refused_by_target.values() if p}
        before = _snapshot(outside)

        fs: HostFS = VanishingFS(root) if vanish else HostFS(root)
        report = probe(fs)
        probed = dict(fs.refused)
        findings = diagnose(report, None)
        assert doctor_run(report, None, True, Console(file=open(os.devnull, "w"))) in (0, 1)  # noqa: SIM115
        ctx, _clock = context(fs, {"WITH_WAIT": "false"}, kube=FakeNodeView())
        for component in COMPONENTS:
            result = validate(ctx, component)
            assert result.message or result.outcome != Outcome.FAILED, result
        assert list(registry_for(NodeStatusCollector(fs)).collect())
        # vfio-manage with the writer of a real host: its sysfs writes land in the tree's files.
        for plan in vfio.execute(fs, KernelWriter(fs), "bind", [], True):
            assert plan.ok or plan.refused or plan.result, plan

        assert _snapshot(outside) == before, "an agent wrote outside the host root"
        named = {line for f in findings if f.code == "host-path-unreadable" for line in f.evidence}
        for path in probed:
            assert any(line.startswith(path + ":") for line in named), (path, named)
        for path in unreadable & set(ALWAYS_READ):
            assert path in probed, (path, probed)
