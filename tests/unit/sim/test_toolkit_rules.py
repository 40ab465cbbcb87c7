"""The real node's `nvidia` runtime handler follows NVIDIA's container toolkit: what a container
asks for (NVIDIA_VISIBLE_DEVICES, NVIDIA_DRIVER_CAPABILITIES, CDI annotations) decides what it gets
from the host tree, and nothing else. Each case applies the handler to an OCI config as containerd
writes it and reads the result."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpu_operator.sim.hardware import devnodes, hosttree
from gpu_operator.sim.realnode import nvruntime
from gpu_operator.sim.realnode.edits import InjectionError
from gpu_operator.sim.realnode.realspec import HOST_DRIVER_VERSION, host_spec
from gpu_operator.sim.realnode.toolkit import gpus


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real node's host-driver tree (2 GPUs), with the driver's libraries added."""
    root = tmp_path_factory.mktemp("host")
    spec = host_spec("host-driver")
    lib = "/usr/lib/x86_64-linux-gnu"
    spec["files"].update(
        {
            f"{lib}/libcuda.so.{HOST_DRIVER_VERSION}": "",
            f"{lib}/libnvidia-ml.so.{HOST_DRIVER_VERSION}": "",
            f"{lib}/libcuda.so.470.1": "",
        }
    )  # another driver's library: never chosen
    hosttree.build(spec, root)
    return root


def container(env: dict[str, str] | None = None, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "process": {"env": ["PATH=/usr/bin", *(f"{k}={v}" for k, v in (env or {}).items())]},
        "mounts": [{"destination": "/proc", "type": "proc"}],
        "annotations": {"io.kubernetes.cri.container-type": "container", **(annotations or {})},
    }


def given(config: dict[str, Any], host: Path) -> set[str]:
    nvruntime.inject(config, host)
    return {m["destination"] for m in config["mounts"] if m.get("type") == "bind"}


def allowed(config: dict[str, Any]) -> set[tuple[int, int]]:
    return {(r["major"], r["minor"]) for r in config["linux"]["resources"]["devices"]}


GPU0, GPU1, CTL, UVM = "/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm"


def test_the_tree_has_the_devices_a_loaded_driver_creates(host: Path) -> None:
    for path, ids in {
        GPU0: (195, 0),
        GPU1: (195, 1),
        CTL: (195, 255),
        UVM: (devnodes.UVM_MAJOR, 0),
        "/dev/nvidia-modeset": (195, 254),
    }.items():
        assert devnodes.char_device(host / path.lstrip("/")) == ids, path
    if os.geteuid() == 0:  # root may mknod: real character devices, not the stand-in
        mode = (host / "dev/nvidia0").stat().st_mode
        assert stat.S_ISCHR(mode) and stat.S_IMODE(mode) == 0o666  # any user may open it, as on a host
    found = gpus(host)
    assert [(g.index, g.minor) for g in found] == [(0, 0), (1, 1)]
    assert all(g.uuid.startswith("GPU-") for g in found) and found[0].uuid != found[1].uuid
    assert "195 nvidia-frontend" in (host / "proc/devices").read_text()


def test_no_driver_no_devices(tmp_path: Path) -> None:
    hosttree.build(host_spec("dgx-h100"), tmp_path)
    assert not (tmp_path / "dev").exists()


def test_all_gives_every_gpu_the_control_devices_and_utility_and_compute(host: Path) -> None:
    config = container({"NVIDIA_VISIBLE_DEVICES": "all"})
    paths = given(config, host)
    assert {GPU0, GPU1, CTL, UVM, "/dev/nvidia-uvm-tools", "/usr/bin/nvidia-smi"} <= paths
    assert "/dev/nvidia-modeset" not in paths  # display only
    assert f"/usr/lib/x86_64-linux-gnu/libcuda.so.{HOST_DRIVER_VERSION}" in paths
    assert (
        "/usr/lib/x86_64-linux-gnu/libcuda.so.1" in paths
        and "/usr/lib/x86_64-linux-gnu/libcuda.so.470.1" not in paths
    )
    assert {(195, 0), (195, 1), (195, 255), (devnodes.UVM_MAJOR, 0)} <= allowed(config)
    source = next(m for m in config["mounts"] if m["destination"] == GPU0)
    assert source["source"] == str(host / "dev/nvidia0") and "rw" in source["options"]


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"NVIDIA_VISIBLE_DEVICES": "void"},
        {"NVIDIA_VISIBLE_DEVICES": ""},
        {"NVIDIA_VISIBLE_DEVICES": "0,void"},
    ],
)
def test_unset_empty_or_void_leaves_the_container_as_it_is(host: Path, env: dict[str, str]) -> None:
    config = container(env)
    before = json.dumps(config, sort_keys=True)
    assert nvruntime.inject(config, host) == []
    assert json.dumps(config, sort_keys=True) == before


def test_none_gives_the_driver_without_any_gpu(host: Path) -> None:
    paths = given(container({"NVIDIA_VISIBLE_DEVICES": "none"}), host)
    assert CTL in paths and "/usr/bin/nvidia-smi" in paths
    assert not {GPU0, GPU1} & paths


def gpu_nodes(paths: set[str]) -> set[str]:
    return {p for p in paths if p.startswith("/dev/nvidia") and p[len("/dev/nvidia") :].isdigit()}


def test_indices_and_uuids_pick_those_gpus(host: Path) -> None:
    assert gpu_nodes(given(container({"NVIDIA_VISIBLE_DEVICES": "1"}), host)) == {GPU1}
    uuid0 = gpus(host)[0].uuid
    assert gpu_nodes(given(container({"NVIDIA_VISIBLE_DEVICES": uuid0}), host)) == {GPU0}


def test_an_unknown_device_fails_the_container_with_what_the_node_has(host: Path) -> None:
    with pytest.raises(InjectionError, match=r"unknown device '7'.*this node has: 0 \(GPU-"):
        nvruntime.inject(container({"NVIDIA_VISIBLE_DEVICES": "7"}), host)


def test_capabilities_choose_binaries_libraries_and_uvm(host: Path) -> None:
    utility = given(
        container({"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "utility"}), host
    )
    assert "/usr/bin/nvidia-smi" in utility and UVM not in utility
    assert not any("libcuda" in p for p in utility)
    compute = given(
        container({"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "compute"}), host
    )
    assert "/usr/bin/nvidia-smi" not in compute and UVM in compute
    display = given(container({"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "all"}), host)
    assert "/dev/nvidia-modeset" in display
    with pytest.raises(InjectionError, match="unsupported capabilities warp"):
        nvruntime.inject(
            container({"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "utility,warp"}), host
        )


def test_a_legacy_cuda_image_gets_every_gpu_and_capability_unless_it_says_otherwise(host: Path) -> None:
    legacy = given(container({"CUDA_VERSION": "11.0.3"}), host)
    assert {GPU0, GPU1, "/dev/nvidia-modeset"} <= legacy
    modern = container({"CUDA_VERSION": "12.4.0", "NVIDIA_REQUIRE_CUDA": "cuda>=12.4"})
    assert nvruntime.inject(modern, host) == []


def test_cdi_annotations_win_and_resolve_from_the_trees_specs(host: Path) -> None:
    (host / "etc/cdi").mkdir(parents=True, exist_ok=True)
    (host / "etc/cdi/nvidia.yaml").write_text(
        "cdiVersion: 0.6.0\nkind: nvidia.com/gpu\n"
        "devices:\n- name: '1'\n  containerEdits:\n    deviceNodes: [{path: /dev/nvidia1}]\n"
        "containerEdits:\n  env: [NVIDIA_VISIBLE_DEVICES=void]\n  deviceNodes: [{path: /dev/nvidiactl}]\n"
        "  hooks: [{hookName: createContainer, path: /usr/bin/nvidia-cdi-hook}]\n"
    )
    config = container(
        {"NVIDIA_VISIBLE_DEVICES": "all"}, {"cdi.k8s.io/nvidia-device-plugin_abc": "nvidia.com/gpu=1"}
    )
    paths = given(config, host)
    assert {GPU1, CTL} == {p for p in paths if p.startswith("/dev/")}  # not `all`: the annotation wins
    assert "NVIDIA_VISIBLE_DEVICES=void" in config["process"]["env"]
    by_env = given(container({"NVIDIA_VISIBLE_DEVICES": "nvidia.com/gpu=1"}), host)
    assert GPU1 in by_env and GPU0 not in by_env
    with pytest.raises(
        InjectionError, match=r"unresolvable CDI devices nvidia.com/gpu=3 \(known: nvidia.com/gpu=1\)"
    ):
        nvruntime.inject(container(annotations={"cdi.k8s.io/x": "nvidia.com/gpu=3"}), host)


def test_pod_sandboxes_are_never_touched(host: Path) -> None:
    sandbox = container({"NVIDIA_VISIBLE_DEVICES": "all"})
    sandbox["annotations"]["io.kubernetes.cri.container-type"] = "sandbox"
    assert nvruntime.inject(sandbox, host) == []


def test_a_host_without_driver_fails_a_gpu_container_and_ignores_others(tmp_path: Path) -> None:
    hosttree.build(host_spec("dgx-h100"), tmp_path)
    with pytest.raises(InjectionError, match="no NVIDIA driver is loaded"):
        nvruntime.inject(container({"NVIDIA_VISIBLE_DEVICES": "all"}), tmp_path)
    assert nvruntime.inject(container(), tmp_path) == []


def test_the_wrapper_reports_a_refusal_as_runc_does_and_never_execs(host: Path, tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps(container({"NVIDIA_VISIBLE_DEVICES": "9"})))
    log = tmp_path / "log.json"
    marker = tmp_path / "runc-ran"
    fake_runc = tmp_path / "runc"
    fake_runc.write_text(f"#!/bin/sh\ntouch {marker}\n")
    fake_runc.chmod(0o755)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpu_operator.sim.realnode.nvruntime",
            str(host),
            str(fake_runc),
            "--log",
            str(log),
            "--log-format",
            "json",
            "create",
            "--bundle",
            str(bundle),
            "cid",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1 and not marker.exists()
    entry = json.loads(log.read_text().splitlines()[-1])
    assert entry["level"] == "error" and "unknown device '9'" in entry["msg"]
    (bundle / "config.json").write_text(json.dumps(container({"NVIDIA_VISIBLE_DEVICES": "0"})))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpu_operator.sim.realnode.nvruntime",
            str(host),
            str(fake_runc),
            "create",
            "--bundle",
            str(bundle),
            "cid",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0 and marker.exists()
    written = json.loads((bundle / "config.json").read_text())
    assert GPU0 in {m["destination"] for m in written["mounts"]}
