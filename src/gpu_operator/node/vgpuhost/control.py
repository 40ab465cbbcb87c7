"""The vGPU manager's own tools, run in its driver root: `sriov-manage -e/-d <PF>` (shipped with
the vGPU manager at /usr/lib/nvidia/sriov-manage; what NVIDIA's vGPU user guide and its
gpu-driver-container entrypoint use to enable VFs) and nvidia-smi for MIG mode
(`--query-gpu=mig.mode.current,mig.mode.pending`, `-mig 0|1`)."""

from __future__ import annotations

from gpu_operator.node.host.runner import CommandRunner

SRIOV_MANAGE = "/usr/lib/nvidia/sriov-manage"


def smi_bus_id(address: str) -> str:
    """nvidia-smi's PCI bus id: an 8-digit domain ("0000:41:00.0" -> "00000000:41:00.0")."""
    domain, rest = address.split(":", 1)
    return f"{domain.zfill(8)}:{rest}".upper()


class ToolControl:
    """VgpuControl over the host's (or the vGPU manager container's) nvidia-smi and sriov-manage."""

    def __init__(self, runner: CommandRunner, root: str, smi: str) -> None:
        self.runner, self.root, self.smi = runner, root, smi

    def _run(self, argv: list[str]) -> tuple[bool, str]:
        result = self.runner.run(argv, root=self.root, timeout=300)
        return result.ok, (result.stdout if result.ok else result.summary())

    def mig_mode(self, address: str) -> tuple[bool, bool] | None:
        ok, out = self._run(
            [
                self.smi,
                "-i",
                smi_bus_id(address),
                "--query-gpu=mig.mode.current,mig.mode.pending",
                "--format=csv,noheader",
            ]
        )
        words = [w.strip() for w in out.strip().split(",")] if ok else []
        if len(words) != 2 or not all(w in ("Enabled", "Disabled") for w in words):
            return None  # [N/A]: not MIG-capable (or nvidia-smi failed; the step says so when MIG is wanted)
        return words[0] == "Enabled", words[1] == "Enabled"

    def set_mig_mode(self, address: str, enabled: bool) -> str | None:
        ok, out = self._run([self.smi, "-i", smi_bus_id(address), "-mig", "1" if enabled else "0"])
        return None if ok else out

    def enable_vfs(self, address: str) -> str | None:
        ok, out = self._run([SRIOV_MANAGE, "-e", address])
        return None if ok else out

    def disable_vfs(self, address: str) -> str | None:
        ok, out = self._run([SRIOV_MANAGE, "-d", address])
        return None if ok else out
