"""The toolkit stand-in writes where the toolkit DaemonSet's env and mounts point, as NVIDIA's
toolkit does; after the distribution restarts, its containerd has the nvidia runtime only when the
DaemonSet was pointed at that distribution's paths (read back by the probe's own runtime reader)."""

from __future__ import annotations

import copy
import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from gpu_operator.node.host.hostfs import HostFS
from gpu_operator.node.host.runtime import ContainerRuntime, detect_runtime
from gpu_operator.render.states.container_toolkit import STATE
from gpu_operator.shapes import load
from gpu_operator.sim.hardware import hosttree
from gpu_operator.sim.realnode.edits import InjectionError
from gpu_operator.sim.realnode.realspec import distribution, host_spec
from gpu_operator.sim.standins import toolkitcrio
from gpu_operator.sim.standins.toolkitconfig import (
    channel,
    configure,
    distribution_start,
    to_toml,
    toolkit_apps,
    unconfigure,
)
from tests.unit.render.renderkit import run

TOOLKIT = "nvidia-container-toolkit-daemonset"


def toolkit_pods(shape: str) -> dict[str, dict[str, Any]]:
    result = run({}, f"{shape}:1")
    return {
        o["metadata"]["name"]: o["spec"]["template"]["spec"]
        for o in result.state(STATE).objects
        if o["kind"] == "DaemonSet"
    }


def restarted_runtime(tmp_path: Path, shape: str, pod: dict[str, Any]) -> tuple[list[str], bool]:
    tree = tmp_path / shape
    hosttree.build(host_spec(shape), tree)
    written = configure(*channel(pod), tree)
    distribution_start(tree, distribution(load(shape)))
    return written, detect_runtime(HostFS(tree)).nvidia_runtime


@pytest.mark.parametrize(
    ("shape", "daemonset", "where"),
    [
        ("a10", TOOLKIT, ["/etc/containerd/conf.d/99-nvidia.toml", "/etc/containerd/config.toml"]),
        ("k3s", f"{TOOLKIT}-k3s", ["/var/lib/rancher/k3s/agent/etc/containerd/config.toml.tmpl"]),
        ("rke2", f"{TOOLKIT}-rke2-v3", ["/var/lib/rancher/rke2/agent/etc/containerd/config-v3.toml.tmpl"]),
        (
            "microk8s",
            f"{TOOLKIT}-microk8s",
            [
                "/etc/containerd/conf.d/99-nvidia.toml",
                "/var/snap/microk8s/current/args/containerd-template.toml",
            ],
        ),
        ("k0s", f"{TOOLKIT}-k0s", ["/etc/k0s/containerd.d/nvidia.toml"]),
    ],
)
def test_the_distributions_containerd_gets_the_runtime(
    tmp_path: Path, shape: str, daemonset: str, where: list[str]
) -> None:
    written, nvidia = restarted_runtime(tmp_path, shape, toolkit_pods(shape)[daemonset])
    assert written == where
    assert nvidia


@pytest.mark.parametrize("shape", ["k3s", "rke2", "k0s"])
def test_stock_paths_on_a_distribution_leave_its_runtime_without_nvidia(tmp_path: Path, shape: str) -> None:
    """What every node got before runtimes by distribution: the stock DaemonSet's /etc/containerd."""
    written, nvidia = restarted_runtime(tmp_path, shape, toolkit_pods(shape)[TOOLKIT])
    assert written == ["/etc/containerd/conf.d/99-nvidia.toml", "/etc/containerd/config.toml"]
    assert not nvidia


def test_toml_round_trip() -> None:
    doc = {
        "version": 2,
        "imports": ["/a.toml"],
        "plugins": {
            "io.containerd.grpc.v1.cri": {
                "containerd": {
                    "runtimes": {
                        "nvidia": {"runtime_type": "io.containerd.runc.v2", "options": {"BinaryName": "/x"}}
                    }
                }
            }
        },
    }
    assert tomllib.loads(to_toml(doc)) == doc


CRIO_DROP_IN = "/etc/crio/crio.conf.d/99-nvidia.conf"
CRIO_HOOK = "/usr/share/containers/oci/hooks.d/oci-nvidia-hook.json"


def crio_runtime(tmp_path: Path, pod: dict[str, Any]) -> tuple[list[str], ContainerRuntime, Path]:
    """The crio shape's host after the toolkit's setup, as CRI-O reads it at its restart."""
    tree = tmp_path / "crio"
    hosttree.build(host_spec("crio"), tree)
    # the kubelet names CRI-O's socket (a stray /etc/containerd must not pass for the node's runtime)
    (tree / "var/lib/kubelet").mkdir(parents=True)
    (tree / "var/lib/kubelet/config.yaml").write_text(
        "containerRuntimeEndpoint: unix:///var/run/crio/crio.sock\n"
    )
    written = configure(*channel(pod), tree)
    return written, detect_runtime(HostFS(tree)), tree


def crio_pod(policy: dict[str, Any]) -> dict[str, Any]:
    """The toolkit pod NVIDIA's operator gives a CRI-O cluster (our render of the crio shape)."""
    result = run(policy, "crio:1")
    return next(
        o["spec"]["template"]["spec"] for o in result.state(STATE).objects if o["kind"] == "DaemonSet"
    )


def test_crio_gets_the_runtimes_in_its_drop_in(tmp_path: Path) -> None:
    """CDI on (the default): config mode; the drop-in under crio.conf.d holds the three runtimes, and
    CRI-O's top-level config is not written; not set as default (NVIDIA_RUNTIME_SET_AS_DEFAULT=false)."""
    written, rt, tree = crio_runtime(tmp_path, crio_pod({}))
    assert written == [CRIO_DROP_IN]
    assert rt.nvidia_runtime and rt.config_files[-1] == CRIO_DROP_IN and rt.default_runtime is None
    runtimes = tomllib.loads((tree / CRIO_DROP_IN.lstrip("/")).read_text())["crio"]["runtime"]["runtimes"]
    assert {n: (r["runtime_path"], r["runtime_type"]) for n, r in runtimes.items()} == {
        "nvidia": ("/usr/local/nvidia/toolkit/nvidia-container-runtime", "oci"),
        "nvidia-cdi": ("/usr/local/nvidia/toolkit/nvidia-container-runtime.cdi", "oci"),
        "nvidia-legacy": ("/usr/local/nvidia/toolkit/nvidia-container-runtime.legacy", "oci"),
    }
    assert (tree / "etc/crio/crio.conf").read_text() == "[crio.runtime]\n"


def test_crio_without_cdi_gets_the_hook(tmp_path: Path) -> None:
    written, rt, tree = crio_runtime(tmp_path, crio_pod({"cdi": {"enabled": False}}))
    assert written == [CRIO_HOOK] and rt.nvidia_hook == CRIO_HOOK and not rt.nvidia_runtime
    hook = json.loads((tree / CRIO_HOOK.lstrip("/")).read_text())
    assert hook["hook"]["path"] == "/usr/local/nvidia/toolkit/nvidia-container-runtime-hook"
    assert hook["stages"] == ["prestart"]


def _volume(pod: dict[str, Any], name: str, path: str) -> dict[str, Any]:
    pod = copy.deepcopy(pod)
    next(v for v in pod["volumes"] if v["name"] == name)["hostPath"]["path"] = path
    return pod


@pytest.mark.parametrize(
    ("policy", "volume", "elsewhere"),
    [
        ({}, "crio-drop-in-config", "/etc/crio/conf.d"),
        (
            {"cdi": {"enabled": False}},
            "crio-hooks",
            "/run/containers/oci/hooks.d",
        ),  # OpenShift's, not CRI-O's default
    ],
)
def test_a_daemonset_pointed_where_crio_does_not_read_leaves_it_without_nvidia(
    tmp_path: Path, policy: dict[str, Any], volume: str, elsewhere: str
) -> None:
    written, rt, _ = crio_runtime(tmp_path, _volume(crio_pod(policy), volume, elsewhere))
    assert written and all(w.startswith(elsewhere) for w in written)
    assert not rt.nvidia_runtime and rt.nvidia_hook is None


def test_the_stock_containerd_toolkit_on_crio_leaves_it_without_nvidia(tmp_path: Path) -> None:
    written, rt, _ = crio_runtime(tmp_path, toolkit_pods("a10")[TOOLKIT])
    assert written == ["/etc/containerd/conf.d/99-nvidia.toml", "/etc/containerd/config.toml"]
    assert (rt.name, rt.nvidia_runtime, rt.nvidia_hook) == ("crio", False, None)


def test_crio_shutdown(tmp_path: Path) -> None:
    """Hook mode removes its hook; config mode leaves its drop-in and only unsets its own default."""
    hook_pod = crio_pod({"cdi": {"enabled": False}})
    _, _, tree = crio_runtime(tmp_path / "hook", hook_pod)
    assert unconfigure(*channel(hook_pod), tree) == [CRIO_HOOK]
    assert detect_runtime(HostFS(tree)).nvidia_hook is None
    for default, after in (("false", None), ("true", None)):
        pod = crio_pod({"toolkit": {"env": [{"name": "NVIDIA_RUNTIME_SET_AS_DEFAULT", "value": default}]}})
        _, rt, tree = crio_runtime(tmp_path / default, pod)
        assert rt.default_runtime == ("nvidia" if default == "true" else None)
        assert unconfigure(*channel(pod), tree) == ([CRIO_DROP_IN] if default == "true" else [])
        rt = detect_runtime(HostFS(tree))
        assert rt.nvidia_runtime and rt.default_runtime == after


def test_crio_runtimes_start_from_the_default_runtimes_options() -> None:
    found = {
        "crio": {
            "runtime": {
                "default_runtime": "crun",
                "runtimes": {
                    "crun": {"runtime_root": "/run/crun", "monitor_path": "/usr/libexec/crio/conmon"},
                    "runc": {"x": 1},
                },
            }
        }
    }
    assert toolkitcrio.default_options(found) == {
        "runtime_root": "/run/crun",
        "monitor_path": "/usr/libexec/crio/conmon",
    }
    assert toolkitcrio.default_options({}) == {}


def test_a_bad_crio_mode_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(InjectionError) as err:
        configure({"RUNTIME": "crio", "CRIO_CONFIG_MODE": "drop-in"}, (), tmp_path)
    assert str(err.value) == "invalid cri-o config mode CRIO_CONFIG_MODE='drop-in': use one of config, hook"


def test_on_a_containerd_cluster_the_crio_nodes_daemonset_is_played_and_reaches_crio(tmp_path: Path) -> None:
    """A CRI-O node among containerd nodes gets the DaemonSet of its own group; the stand-in plays it."""
    result = run({}, "a10:1", "crio:1")
    pods = {
        o["metadata"]["name"]: o["spec"]["template"]["spec"]
        for o in result.state(STATE).objects
        if o["kind"] == "DaemonSet"
    }
    assert set(pods) == {TOOLKIT, f"{TOOLKIT}-crio"} and set(pods) <= set(toolkit_apps())
    written, rt, _ = crio_runtime(tmp_path, pods[f"{TOOLKIT}-crio"])
    assert written == [CRIO_DROP_IN] and rt.nvidia_runtime
