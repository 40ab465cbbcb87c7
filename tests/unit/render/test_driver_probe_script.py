"""The driver container's startup probe (ConfigMap nvidia-driver-startup-probe), run for real under
sh against a temporary tree: its absolute paths (/sys/module/nvidia, /run/nvidia/validations) are
moved under the tree, and nvidia-smi is a stub on PATH that succeeds or fails as the case says.
What it writes is then read by our validator's own parser, as on a node."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from gpu_operator.node.host.hostfs import HostFS
from gpu_operator.node.validate.base import StatusDir
from gpu_operator.node.validate.config import DRIVER_CTR_READY
from gpu_operator.node.validate.host import _EXTRA_MODULES
from gpu_operator.render.states.driver import PROBE_SCRIPT
from gpu_operator.vocabulary import VALIDATIONS_DIR


def probe(
    tmp: Path,
    *,
    module: bool = True,
    daemons: str | None = None,
    smi_ok: bool = True,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    root = tmp / "root"
    if module:
        (root / "sys/module/nvidia").mkdir(parents=True, exist_ok=True)
        (root / "sys/module/nvidia/refcnt").write_text("1\n")
    validations = root / VALIDATIONS_DIR.lstrip("/")
    if daemons is not None:
        validations.mkdir(parents=True, exist_ok=True)
        (validations / ".driver-daemons-status").write_text(daemons)
    bin_dir = tmp / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\nexit {0 if smi_ok else 9}\n")
    smi.chmod(0o755)
    script = PROBE_SCRIPT.replace("/sys/module/nvidia", f"{root}/sys/module/nvidia").replace(
        VALIDATIONS_DIR, f"{root}{VALIDATIONS_DIR}"
    )
    assert (
        script.count(f"{root}{VALIDATIONS_DIR}") == PROBE_SCRIPT.count(VALIDATIONS_DIR) > 0
    )  # every path moved
    return subprocess.run(
        ["sh", "-c", script],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", **(env or {})},
    )


def ready_flags(tmp: Path) -> dict[str, str] | None:
    status = StatusDir(HostFS(str(tmp / "root")), VALIDATIONS_DIR)
    return status.read_flags(DRIVER_CTR_READY) if status.exists(DRIVER_CTR_READY) else None


@pytest.mark.parametrize(
    ("daemons", "ready"),
    [
        (None, True),  # a driver image that reports no daemons
        ("Ready\n", True),
        ("NotReady\n", False),  # contains "Ready": must not pass
        ("", False),
        ("Readyish\n", False),
    ],
)
def test_the_probe_passes_only_when_the_driver_daemons_say_exactly_ready(
    tmp_path: Path, daemons: str | None, ready: bool
) -> None:
    done = probe(tmp_path, daemons=daemons)
    assert (done.returncode == 0) is ready, done.stdout + done.stderr
    assert (ready_flags(tmp_path) is not None) is ready
    if not ready:
        assert "want Ready" in done.stdout


def test_no_module_or_a_failing_nvidia_smi_is_not_ready(tmp_path: Path) -> None:
    assert "kernel module is not loaded" in probe(tmp_path / "a", module=False).stdout
    failing = probe(tmp_path / "b", smi_ok=False)
    assert failing.returncode != 0 and "nvidia-smi failed" in failing.stdout
    assert ready_flags(tmp_path / "a") is None and ready_flags(tmp_path / "b") is None


def test_the_ready_file_tells_the_validator_which_gpudirect_modules_to_wait_for(tmp_path: Path) -> None:
    done = probe(tmp_path, env={"GDRCOPY_ENABLED": "true", "GPU_DIRECT_RDMA_ENABLED": "true"})
    assert done.returncode == 0, done.stdout + done.stderr
    flags = ready_flags(tmp_path)
    assert flags == {"GDRCOPY_ENABLED": "true", "GDS_ENABLED": "false", "GPU_DIRECT_RDMA_ENABLED": "true"}
    waits = sorted(c for flag, c in _EXTRA_MODULES.items() if flags.get(flag) == "true")
    assert waits == ["gdrcopy", "nvidia-peermem"]
    assert not [p for p in os.listdir(tmp_path / "root" / VALIDATIONS_DIR.lstrip("/")) if p.endswith(".tmp")]
