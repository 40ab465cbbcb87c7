"""The simulator's vGPU hosts: the vgpu-host-h100 shape's tree is a vGPU host as it boots, the
stand-in reads the init container of the pod the operator renders, and `--reboot` loses exactly
what a reboot loses (the VFs, their vGPUs, MIG mode on Hopper, /run's status files), keeps what is
on disk, and refuses what it cannot play."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from lightkube.resources.core_v1 import Pod

from gpu_operator.node.host.hostfs import HostFS
from gpu_operator.node.vgpuhost import sysfs
from gpu_operator.node.vgpuhost.agent import Settings, run_pass
from gpu_operator.node.vgpuhost.cli import driver_ready
from gpu_operator.node.vgpuhost.config import vgpu_gpus
from gpu_operator.sim.commands.faultinject import check_action
from gpu_operator.sim.hardware.faults import FaultError, NodeHosts, boot_id, node_host_spec
from gpu_operator.sim.hardware.vgpuhw import FM_CONFIG, VGPU_STATE, VgpuHostSim, is_vgpu_host
from gpu_operator.sim.realnode.realspec import host_spec
from gpu_operator.sim.standins.vgpustandin import init_container
from gpu_operator.vocabulary import VALIDATIONS_DIR
from tests.unit.node.vgpuhost.test_vgpuhost_agent import FakeNode
from tests.unit.render.renderkit import daemonset, run

SHAPE = "vgpu-host-h100"
CONFIG = """\
version: v1
vgpu-configs:
  lab:
    - devices: [0]
      vgpu-devices: {H100XM-1-10C: 2}
    - devices: all
      vgpu-devices: {H100XM-40C: 2}
"""


def test_only_the_vgpu_shape_boots_as_a_vgpu_host() -> None:
    spec = host_spec(SHAPE)
    assert is_vgpu_host(spec) and "nvidia_vgpu_vfio" in spec["modules"]
    gpus = [d for d in spec["devices"] if str(d["class"]).startswith("03")]
    assert len(gpus) == 8 and {d["attributes"]["sriov_numvfs"] for d in gpus} == {0}
    assert not is_vgpu_host(host_spec("host-driver")) and not is_vgpu_host(host_spec("vfio-passthrough"))
    # the node's own tree carries no status file of the container stack's validator (it does not run there)
    assert not any(path.startswith(VALIDATIONS_DIR) for path in node_host_spec(SHAPE)["files"])


def test_the_stand_in_reads_the_rendered_init_containers_env_and_configmap() -> None:
    spec = {
        "sandboxWorkloads": {"enabled": True},
        "vgpuDeviceManager": {"enabled": True, "config": {"name": "vgpu-lab", "default": "lab"}},
    }
    ds = daemonset(run(spec, f"{SHAPE}:1"), "state-sandbox-validation")
    pod = Pod.from_dict(
        {"metadata": {"name": "p", "namespace": "ns"}, "spec": ds["spec"]["template"]["spec"]}
    )
    ctr = init_container(pod)
    assert ctr is not None
    assert (ctr.config_map, ctr.config_key, ctr.optional) == ("vgpu-lab", "config.yaml", True)
    assert ctr.env["DEFAULT_VGPU_CONFIG"] == "lab" and ctr.env["FABRIC_MODE"] == "2"
    assert ctr.env["CONFIG_FILE"] == "/vgpu-config/config.yaml"
    off = daemonset(run({"sandboxWorkloads": {"enabled": True}}, f"{SHAPE}:1"), "state-sandbox-validation")
    bare = Pod.from_dict(
        {"metadata": {"name": "p", "namespace": "ns"}, "spec": off["spec"]["template"]["spec"]}
    )
    assert init_container(bare) is None  # no vGPU device manager config: no init container, no pass


def snapshot(fs: HostFS, hardware: VgpuHostSim) -> dict[str, Any]:
    out = {}
    for gpu in vgpu_gpus(fs):
        pf = sysfs.read_pf(fs, gpu.address)
        out[gpu.address] = (pf.numvfs, [vf.current for vf in pf.vfs], hardware.mig_mode(gpu.address))
    return out


def test_reboot_loses_the_vgpu_state_and_a_pass_in_another_process_puts_it_back(tmp_path: Path) -> None:
    spec = node_host_spec(SHAPE)
    faults = NodeHosts(tmp_path).faults("n", spec)
    fs, state = HostFS(faults.root), faults.root.parent / VGPU_STATE
    assert driver_ready(fs, "/run/nvidia/driver")[0] is None  # what the init container waits for
    node = FakeNode({"nvidia.com/gpu.workload.config": "vm-vgpu"})
    settings = Settings(CONFIG, "/vgpu-config/config.yaml", "lab", "container", fabric_mode=2)

    # each pass its own model, as each pod's: what it knows is in the tree and beside it
    def one_pass() -> str:
        hardware = VgpuHostSim(fs, spec, state)
        return run_pass(fs, hardware, hardware, node, settings).state

    assert one_pass() == "restored"
    before = snapshot(fs, VgpuHostSim(fs, spec, state))
    first = next(iter(before.values()))
    assert first[0] == 16 and first[1][:3] == [1061, 1061, 0] and first[2] == (True, True)
    assert one_pass() == "unchanged"
    boot = boot_id(fs)

    faults.reboot_vgpu_host(spec)
    lost = snapshot(fs, VgpuHostSim(fs, spec, state))
    assert all(v == (0, [], (False, False)) for v in lost.values()), lost
    assert fs.listdir(VALIDATIONS_DIR) == [] and boot_id(fs) != boot
    assert "FABRIC_MODE=2" in (fs.read_text(FM_CONFIG) or "")  # a file on disk: kept

    assert one_pass() == "restored"
    assert snapshot(fs, VgpuHostSim(fs, spec, state)) == before


def test_reboot_refuses_a_host_that_is_not_a_vgpu_host(tmp_path: Path) -> None:
    spec = node_host_spec("host-driver")
    faults = NodeHosts(tmp_path).faults("n", spec)
    with pytest.raises(FaultError, match="not a vGPU host"):
        faults.reboot_vgpu_host(spec)


def test_reboot_is_the_whole_nodes_and_one_action() -> None:
    assert check_action(None, False, False, None, True) == ("reboot", None)
    with pytest.raises(FaultError, match="--gpu with --reboot: a reboot is the whole node's"):
        check_action(None, False, False, 1, True)
    with pytest.raises(FaultError, match="--clear and --reboot given: give exactly one of"):
        check_action(None, False, True, None, True)
