"""`gpu-operator crds apply` (the Helm hook's command) against the real apiserver: idempotent."""

from __future__ import annotations

import subprocess
import sys

from gpu_operator.sim.controlplane import ControlPlane


def test_crds_apply_twice(control_plane: ControlPlane) -> None:
    argv = [sys.executable, "-m", "gpu_operator.cli", "crds", "apply",
            f"--kubeconfig={control_plane.admin_kubeconfig}"]
    for _ in range(2):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        assert "applied clusterpolicies.nvidia.com (Established)" in done.stdout
        assert "applied nvidiadrivers.nvidia.com (Established)" in done.stdout
    served = control_plane.request("GET", "/apis/nvidia.com/v1")
    assert any(r["name"] == "clusterpolicies" for r in served["resources"])
