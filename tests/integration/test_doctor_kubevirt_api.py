"""doctor --node against the real apiserver with KubeVirt's CRD: the resource name from the KubeVirt
CR's pciHostDevices, the count from the Node's allocatable, the mixed list from the Node's
annotation (host side: the seed-001 fixture split 4 + 4 with the kernel simulator)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from lightkube import Client
from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

from gpu_operator.node.vfio import manage as vfio
from gpu_operator.sim.plane.controlplane import ControlPlane
from gpu_operator.vocabulary import PASSTHROUGH_DEVICES_ANNOTATION
from tests.integration.test_kubevirt_sync import kubevirt_cr, kubevirt_crd  # noqa: F401  (fixtures)
from tests.support.hostsim import fakehost

HOSTS = Path(__file__).resolve().parents[1] / "fixtures" / "hosts"
H100 = [
    "0000:0a:00.0",
    "0000:18:00.0",
    "0000:3b:00.0",
    "0000:44:00.0",
    "0000:87:00.0",
    "0000:90:00.0",
    "0000:b8:00.0",
    "0000:c1:00.0",
]
RESOURCE = "nvidia.com/H100_SXM5_80GB"


def doctor(control_plane: ControlPlane, node: str, root: Path) -> dict[str, dict[str, object]]:
    env = {**os.environ, "NODE_NAME": node, "KUBECONFIG": str(control_plane.admin_kubeconfig)}
    done = subprocess.run(
        [sys.executable, "-m", "gpu_operator.cli", "doctor", f"--host-root={root}", "--json"],
        env=env,
        text=True,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.stdout, done.stderr
    return {f["code"]: f for f in json.loads(done.stdout)["findings"]}


def test_doctor_compares_what_kubevirt_advertises_with_what_is_bound(
    control_plane: ControlPlane,
    kube: Client,
    fake_nodes: Callable[..., list[str]],
    kubevirt_cr: Callable[..., str],  # noqa: F811
    tmp_path: Path,
) -> None:
    kubevirt_cr(
        [{"pciVendorSelector": "10DE:2330", "resourceName": RESOURCE, "externalResourceProvider": False}]
    )
    node = fake_nodes("vfio-passthrough:1")[0]
    kube.patch(
        Node.Status,
        node,
        {"status": {"capacity": {RESOURCE: "8"}, "allocatable": {RESOURCE: "8"}}},
        patch_type=PatchType.MERGE,
    )
    kube.patch(
        Node,
        node,
        {"metadata": {"annotations": {PASSTHROUGH_DEVICES_ANNOTATION: ",".join(H100[:4])}}},
        patch_type=PatchType.MERGE,
    )
    host = fakehost.build_file(HOSTS / "h100-nvidia-bound.yaml", tmp_path / "root")
    assert all(p.ok for p in vfio.execute(host.fs, host.kernel(), "bind", H100[:4], False))
    found = doctor(control_plane, node, host.fs.root)
    summary = str(found["kubevirt-advertises-unbound"]["summary"])
    assert f"KubeVirt advertises 8 GPUs of 10DE:2330 ({RESOURCE}) on the node but only 4 are bound" in summary
    assert "kubevirt-count-unchecked" not in found
    # Bind the other four: what KubeVirt advertises is now what the host has on vfio-pci.
    assert all(p.ok for p in vfio.execute(host.fs, host.kernel(), "bind", H100[4:], False))
    kube.patch(
        Node,
        node,
        {"metadata": {"annotations": {PASSTHROUGH_DEVICES_ANNOTATION: None}}},
        patch_type=PatchType.MERGE,
    )
    found = doctor(control_plane, node, host.fs.root)
    assert "kubevirt-advertises-unbound" not in found and "kubevirt-count-unchecked" not in found
