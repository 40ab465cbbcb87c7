"""One driver root per node for every component: the validator's driver-ready file is where each
consumer takes it from, each consumer sees it where the file says, and the DRA kubelet plugin's
CDI spec on a Talos host names only paths the host has."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from gpu_operator.api.gpucluster import GPUCluster
from gpu_operator.node.validate.base import Outcome
from gpu_operator.node.validate.run import validate
from gpu_operator.render.defaults import CHART_DEFAULT_IMAGES
from gpu_operator.render.dra import DRAFacts, render_gpucluster
from gpu_operator.sim.realnode import cdi
from tests.support import dracdi
from tests.support.hostsim import fakehost
from tests.unit.node.nodekit import HOSTS_DIR, context
from tests.unit.render.renderkit import run

SOURCES_DRIVER_READY = re.compile(
    r"^\s*(?:set -a;?\s*)?(?:\.|source) /run/nvidia/validations/driver-ready", re.MULTILINE
)
INSTALL_DIR = "/opt/nvidia/driver"
DRA = {
    "draDriver": {
        "repository": "nvcr.io/nvidia",
        "image": "dra-driver-nvidia-gpu",
        "version": "v0.5.0",
        "computeDomains": {"enabled": True},
    }
}


def _scripts(objects: list[dict[str, Any]]) -> dict[str, str]:
    return {
        o["metadata"]["name"]: "\n".join(o.get("data", {}).values())
        for o in objects
        if o["kind"] == "ConfigMap"
    }


def _consumers(objects: list[dict[str, Any]]) -> dict[str, tuple[dict[str, Any], dict[str, str]]]:
    """Containers whose start sources driver-ready (inline, or from a ConfigMap they mount), with
    the host path of each of their hostPath mounts."""
    scripts = _scripts(objects)
    found = {}
    for ds in (o for o in objects if o["kind"] == "DaemonSet"):
        pod = ds["spec"]["template"]["spec"]
        configmaps = {v["name"]: v["configMap"]["name"] for v in pod.get("volumes", []) if "configMap" in v}
        hostpaths = {v["name"]: v["hostPath"]["path"] for v in pod.get("volumes", []) if "hostPath" in v}
        for ctr in [*pod.get("initContainers", []), *pod["containers"]]:
            text = "\n".join(
                [*ctr.get("command", []), *ctr.get("args", [])]
                + [scripts.get(configmaps.get(m["name"], ""), "") for m in ctr.get("volumeMounts", [])]
            )
            if SOURCES_DRIVER_READY.search(text):
                found[f"{ds['metadata']['name']}/{ctr['name']}"] = (
                    ctr,
                    {
                        m["mountPath"]: hostpaths[m["name"]]
                        for m in ctr.get("volumeMounts", [])
                        if m["name"] in hostpaths
                    },
                )
    return found


def test_every_consumer_of_driver_ready_sees_both_roots_it_may_name() -> None:
    """driver-ready names the host root's /host (a host driver: / or e.g. /host/usr/local) or the
    install dir's /driver-root (the operator's driver, hostPaths.driverInstallDir): every container
    that sources it mounts both, and none sets the driver root itself."""
    policy = run({"hostPaths": {"driverInstallDir": INSTALL_DIR}})
    objects = [o for s in policy.states for o in s.objects]
    dra = render_gpucluster(
        GPUCluster.model_validate(
            {
                "metadata": {"name": "gpu-cluster"},
                "spec": {**DRA, "hostPaths": {"driverInstallDir": INSTALL_DIR}},
            }
        ),
        DRAFacts(operator_env=dict(CHART_DEFAULT_IMAGES)),
    )
    objects += [o for s in dra.states for o in s.objects]
    consumers = _consumers(objects)
    assert set(consumers) == {
        "nvidia-container-toolkit-daemonset/nvidia-container-toolkit-ctr",
        "nvidia-device-plugin-daemonset/nvidia-device-plugin",
        "nvidia-mig-manager/nvidia-mig-manager",
        "nvidia-dra-driver-kubelet-plugin/gpus",
        "nvidia-dra-driver-kubelet-plugin/compute-domains",
    }
    for name, (ctr, mounts) in consumers.items():
        assert (mounts.get("/host"), mounts.get("/driver-root")) == ("/", INSTALL_DIR), name
        assert not {"NVIDIA_DRIVER_ROOT", "DRIVER_ROOT_CTR_PATH"} & {e["name"] for e in ctr.get("env", [])}, (
            name
        )


def test_a_custom_host_root_reaches_every_container_that_mounts_it() -> None:
    """hostPaths.rootFS: the host-root volume moves and every container of its pod, init
    containers too (the driver validation writes the driver root under it), gets HOST_ROOT."""
    result = run({"hostPaths": {"rootFS": "/hosts/a"}})
    checked = 0
    for ds in (o for s in result.states for o in s.objects if o["kind"] == "DaemonSet"):
        pod = ds["spec"]["template"]["spec"]
        roots = [v["hostPath"]["path"] for v in pod.get("volumes", []) if v["name"] == "host-root"]
        if not roots:
            continue
        assert roots == ["/hosts/a"], ds["metadata"]["name"]
        for ctr in [*pod.get("initContainers", []), *pod["containers"]]:
            assert {e["name"]: e.get("value") for e in ctr.get("env", [])}.get("HOST_ROOT") == "/hosts/a", (
                ds["metadata"]["name"],
                ctr["name"],
            )
            checked += 1
    assert checked > 10


def test_gpu_clients_take_the_driver_through_the_toolkits_runtime() -> None:
    """GFD, DCGM and the DCGM exporter reach the driver through the runtime the toolkit configured
    from driver-ready (its runtime class), not through a root of their own."""
    result = run({"dcgm": {"enabled": True}})
    for state in ("gpu-feature-discovery", "state-dcgm", "state-dcgm-exporter"):
        for ds in (o for o in result.state(state).objects if o["kind"] == "DaemonSet"):
            pod = ds["spec"]["template"]["spec"]
            assert pod.get("runtimeClassName") == "nvidia", ds["metadata"]["name"]
            names = {e["name"] for c in pod["containers"] for e in c.get("env", [])}
            assert not {"NVIDIA_DRIVER_ROOT", "DRIVER_ROOT_CTR_PATH"} & names, ds["metadata"]["name"]


def _plugin(spec: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """The kubelet plugin DaemonSet's driver-validation init container, gpus container and volumes."""
    result = render_gpucluster(
        GPUCluster.model_validate({"metadata": {"name": "gpu-cluster"}, "spec": spec}),
        DRAFacts(operator_env=dict(CHART_DEFAULT_IMAGES)),
    )
    ds = next(
        o
        for s in result.states
        for o in s.objects
        if o["kind"] == "DaemonSet" and o["metadata"]["name"] == "nvidia-dra-driver-kubelet-plugin"
    )
    pod = ds["spec"]["template"]["spec"]
    init = next(c for c in pod["initContainers"] if c["name"] == "driver-validation")
    gpus = next(c for c in pod["containers"] if c["name"] == "gpus")
    return init, gpus, pod["volumes"]


def _validated(tmp_path: Path, fixture: str, init: dict[str, Any]) -> Path:
    """The host tree after the plugin's driver-validation init container ran there with its env."""
    host = fakehost.build(fakehost.load_spec(HOSTS_DIR / f"{fixture}.yaml"), tmp_path / fixture / "root")
    env = {e["name"]: str(e["value"]) for e in init["env"] if "value" in e}
    ctx, _ = context(host.fs, env)
    result = validate(ctx, "driver")
    assert result.outcome == Outcome.PASSED, result.message
    return Path(host.fs.root)


@pytest.mark.parametrize("fixture", ["talos", "ubuntu-apt-driver"])
def test_the_dra_plugins_cdi_spec_names_only_paths_the_host_has(tmp_path: Path, fixture: str) -> None:
    init, gpus, volumes = _plugin(DRA)
    root = _validated(tmp_path, fixture, init)
    spec, written, names = dracdi.claim_spec(root, gpus, volumes, "0b6e1a4c-claim", [0])
    paths = dracdi.host_paths(spec)
    assert any(p.endswith("/nvidia-smi") for p in paths) and any("/libnvidia-ml.so." in p for p in paths)
    assert "/dev/nvidia0" in paths and "/dev/nvidiactl" in paths
    missing = [p for p in paths if not (root / p.lstrip("/")).exists()]
    assert missing == []
    # and the runtime resolves the claim's device from the file the plugin wrote (each source checked)
    assert written.parent == root / "var/run/cdi"
    edits = cdi.edits(root, names)
    assert {str(host.relative_to(root)) for host, _ in edits.mounts} == {
        p.lstrip("/") for p in paths if not p.startswith("/dev/")
    }


def test_a_talos_host_with_the_root_at_slash_gives_the_plugin_no_driver(tmp_path: Path) -> None:
    """What NVIDIA's validator writes for every host driver (NVIDIA_DRIVER_ROOT=/, /host): on Talos
    the plugin finds neither nvidia-smi nor libnvidia-ml there."""
    init, gpus, volumes = _plugin(DRA)
    root = _validated(tmp_path, "talos", init)
    (root / "run/nvidia/validations/driver-ready").write_text(
        "IS_HOST_DRIVER=true\nNVIDIA_DRIVER_ROOT=/\nDRIVER_ROOT_CTR_PATH=/host\nNVIDIA_DEV_ROOT=/\nDEV_ROOT_CTR_PATH=/host\n"
    )
    with pytest.raises(dracdi.PluginError) as err:
        dracdi.claim_spec(root, gpus, volumes, "0b6e1a4c-claim", [0])
    assert str(err.value) == "/host (/ on host): nvidia-smi, libnvidia-ml.so not found"


def test_driver_roots_naming_two_trees_give_a_spec_with_paths_the_host_lacks(tmp_path: Path) -> None:
    """NVIDIA_DRIVER_ROOT and DRIVER_ROOT_CTR_PATH must be the same tree: files found in one and
    named from the other are paths the host lacks (what this view's check catches)."""
    init, gpus, volumes = _plugin(DRA)
    root = _validated(tmp_path, "talos", init)
    (root / "run/nvidia/validations/driver-ready").write_text(
        "IS_HOST_DRIVER=true\nNVIDIA_DRIVER_ROOT=/\nDRIVER_ROOT_CTR_PATH=/host/usr/local\n"
    )
    spec, _, _ = dracdi.claim_spec(root, gpus, volumes, "0b6e1a4c-claim", [0])
    missing = [p for p in dracdi.host_paths(spec) if not (root / p.lstrip("/")).exists()]
    assert "/bin/nvidia-smi" in missing
