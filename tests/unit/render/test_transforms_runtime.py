"""Table tests for the runtime transforms: which container runtime a cluster has, the runtime class,
the toolkit's runtime settings and the device plugin's CDI, RDMA and MIG environment."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_operator.render.facts import NodeFacts, runtime_of
from gpu_operator.render.objects import container, env
from gpu_operator.render.transforms.cdi import device_plugin_cdi, gpu_access, rdma_storage_env
from gpu_operator.render.transforms.mig import mig_strategy_env
from gpu_operator.render.transforms.runtime import runtime_class_name, toolkit_runtime
from tests.unit.render.renderkit import ctr, daemonset, env_of, run
from tests.unit.render.test_transforms import ds_with, spec


@pytest.mark.parametrize(
    ("runtimes", "openshift", "expected"),
    [
        ([], False, "containerd"),
        (["docker://24"], False, "docker"),
        (["cri-o://1.30"], False, "crio"),
        (["cri-o://1.30", "containerd://1.7"], False, "containerd"),
        (["docker://1", "cri-o://1"], False, "crio"),
        (["containerd://1.7"], True, "crio"),
        (["unknown://1"], False, "containerd"),
    ],
)
def test_runtime_detection(runtimes: list[str], openshift: bool, expected: str) -> None:
    nodes = [NodeFacts(f"n{i}", {"nvidia.com/gpu.present": "true"}, rt) for i, rt in enumerate(runtimes)]
    nodes.append(NodeFacts("cpu", {}, "docker://1"))  # non-GPU nodes never count
    assert runtime_of(nodes, openshift) == expected


@pytest.mark.parametrize(
    ("data", "runtime", "expected"),
    [
        ({}, "containerd", "nvidia"),
        ({"operator": {"runtimeClass": "gpu"}}, "containerd", "gpu"),
        ({"cdi": {"enabled": False}}, "crio", None),
        ({"cdi": {"enabled": False}}, "containerd", "nvidia"),
        ({"cdi": {"nriPluginEnabled": True}}, "containerd", None),
    ],
)
def test_runtime_class_rule(data: dict[str, Any], runtime: str, expected: str | None) -> None:
    assert runtime_class_name(spec(data), runtime) == expected


def test_gpu_access_with_nri_annotates_every_container() -> None:
    ds = ds_with(container("a"), container("b"))
    gpu_access(ds, spec({"cdi": {"nriPluginEnabled": True}}), "containerd")
    template = ds["spec"]["template"]
    assert "runtimeClassName" not in template["spec"]
    assert template["metadata"]["annotations"] == {
        "nvidia.cdi.k8s.io/container.a": "management.nvidia.com/gpu=all",
        "nvidia.cdi.k8s.io/container.b": "management.nvidia.com/gpu=all",
    }


K3S_CONFIG = "/var/lib/rancher/k3s/agent/etc/containerd/config.toml"


@pytest.mark.parametrize(
    ("runtime", "data", "user_env", "env_expect", "volumes"),
    [
        (
            "containerd",
            {},
            {},
            {
                "RUNTIME": "containerd",
                "CDI_ENABLED": "true",
                "NVIDIA_CONTAINER_RUNTIME_MODE": "cdi",
                "RUNTIME_CONFIG": "/runtime/config-dir/config.toml",
                "CONTAINERD_CONFIG": "/runtime/config-dir/config.toml",
                "RUNTIME_DROP_IN_CONFIG": "/runtime/config-dir.d/99-nvidia.toml",
                "RUNTIME_DROP_IN_CONFIG_HOST_PATH": "/etc/containerd/conf.d/99-nvidia.toml",
                "RUNTIME_SOCKET": "/runtime/sock-dir/containerd.sock",
                "CONTAINERD_RUNTIME_CLASS": "nvidia",
            },
            {
                "containerd-config": "/etc/containerd",
                "containerd-drop-in-config": "/etc/containerd/conf.d",
                "containerd-socket": "/run/containerd",
            },
        ),
        (
            "containerd",
            {},
            {
                "CONTAINERD_CONFIG": K3S_CONFIG,
                "CONTAINERD_SOCKET": "/run/k3s/containerd/containerd.sock",
                "RUNTIME_CONFIG_SOURCE": "file=/etc/x.toml,command",
            },
            {
                "CONTAINERD_CONFIG": "/runtime/config-dir/config.toml",
                "RUNTIME_CONFIG_SOURCE": "file=/host/etc/x.toml,command",
            },
            {
                "containerd-config": "/var/lib/rancher/k3s/agent/etc/containerd",
                "containerd-socket": "/run/k3s/containerd",
            },
        ),
        (
            "crio",
            {},
            {},
            {
                "RUNTIME": "crio",
                "CRIO_CONFIG": "/runtime/config-dir/config.toml",
                "RUNTIME_DROP_IN_CONFIG": "/runtime/config-dir.d/99-nvidia.conf",
            },
            {"crio-config": "/etc/crio", "crio-drop-in-config": "/etc/crio/crio.conf.d"},
        ),
        (
            "crio",
            {"cdi": {"enabled": False}},
            {},
            {"CRIO_CONFIG_MODE": "hook"},
            {"crio-hooks": "/usr/share/containers/oci/hooks.d"},
        ),
        (
            "docker",
            {},
            {},
            {
                "DOCKER_CONFIG": "/runtime/config-dir/daemon.json",
                "DOCKER_SOCKET": "/runtime/sock-dir/docker.sock",
            },
            {"docker-config": "/etc/docker", "docker-socket": "/var/run"},
        ),
        (
            "containerd",
            {"cdi": {"nriPluginEnabled": True}},
            {},
            {"ENABLE_NRI_PLUGIN": "true", "NRI_SOCKET": "/runtime/nri-sock-dir/nri.sock"},
            {"nri-socket": "/var/run/nri"},
        ),
        (
            "containerd",
            {"toolkit": {"installDir": "/opt/nv"}},
            {},
            {"ROOT": "/opt/nv"},
            {"toolkit-install-dir": "/opt/nv"},
        ),
    ],
)
def test_toolkit_runtime(
    runtime: str,
    data: dict[str, Any],
    user_env: dict[str, str],
    env_expect: dict[str, str],
    volumes: dict[str, str],
) -> None:
    pod = {"containers": [container("tk", env_vars=[env(k, v) for k, v in user_env.items()])]}
    toolkit_runtime(pod, spec(data), runtime, openshift=False)
    got = env_of(pod["containers"][0])
    assert {k: got.get(k) for k in env_expect} == env_expect
    got_volumes = {v["name"]: v["hostPath"]["path"] for v in pod.get("volumes", [])}
    assert {k: got_volumes.get(k) for k in volumes} == volumes
    if data.get("cdi", {}).get("nriPluginEnabled"):
        assert "RUNTIME_CONFIG" not in got
    if runtime == "docker":
        assert "RUNTIME_DROP_IN_CONFIG" not in got


@pytest.mark.parametrize(
    ("data", "openshift", "host"),
    [
        ({"cdi": {"enabled": False}}, False, "/usr/share/containers/oci/hooks.d"),
        ({"cdi": {"enabled": False}}, True, "/run/containers/oci/hooks.d"),
        (
            {},
            False,
            "/usr/share/containers/oci/hooks.d",
        ),  # config mode: there for CRIO_CONFIG_MODE=hook in toolkit.env
    ],
)
def test_crio_hooks_land_where_crio_reads(data: dict[str, Any], openshift: bool, host: str) -> None:
    """NVIDIA's toolkit writes its OCI hook under its default CRIO_HOOKS_DIR in the container,
    /usr/share/containers/oci/hooks.d; the hostPath behind that path is the directory CRI-O reads
    (NVIDIA's operator: the same container path, OpenShift's /run/containers/oci/hooks.d on the host)."""
    pod = {"containers": [container("tk")]}
    toolkit_runtime(pod, spec(data), "crio", openshift=openshift)
    volumes = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["crio-hooks"] == "/usr/share/containers/oci/hooks.d"
    assert volumes["crio-hooks"] == host


@pytest.mark.parametrize(
    ("data", "expected", "absent"),
    [
        (
            {},
            {
                "CDI_ENABLED": "true",
                "DEVICE_LIST_STRATEGY": "cdi-annotations,cdi-cri",
                "CDI_ANNOTATION_PREFIX": "cdi.k8s.io/",
                "NVIDIA_CDI_HOOK_PATH": "/usr/local/nvidia/toolkit/nvidia-cdi-hook",
            },
            [],
        ),
        ({"toolkit": {"enabled": False}}, {"CDI_ENABLED": "true"}, ["NVIDIA_CDI_HOOK_PATH"]),
        ({"cdi": {"enabled": False}}, {}, ["CDI_ENABLED"]),
        (
            {"gds": {"enabled": True}, "gdrcopy": {"enabled": True}},
            {"GDS_ENABLED": "true", "MOFED_ENABLED": "true", "GDRCOPY_ENABLED": "true"},
            [],
        ),
    ],
)
def test_device_plugin_cdi_and_rdma_env(
    data: dict[str, Any], expected: dict[str, str], absent: list[str]
) -> None:
    main = container("dp")
    device_plugin_cdi(main, spec(data))
    rdma_storage_env(main, spec(data))
    got = env_of(main)
    assert {k: got.get(k) for k in expected} == expected
    assert not set(absent) & set(got)


@pytest.mark.parametrize(
    ("strategy", "expected"),
    [
        (None, {"NVIDIA_MIG_MONITOR_DEVICES": "all"}),
        ("none", {"MIG_STRATEGY": "none"}),
        ("single", {"MIG_STRATEGY": "single", "NVIDIA_MIG_MONITOR_DEVICES": "all"}),
        ("mixed", {"MIG_STRATEGY": "mixed", "NVIDIA_MIG_MONITOR_DEVICES": "all"}),
    ],
)
def test_mig_strategy_env(strategy: str | None, expected: dict[str, str]) -> None:
    main = container("dp")
    mig_strategy_env(main, spec({"mig": {"strategy": strategy}} if strategy else {}))
    assert env_of(main) == expected


@pytest.mark.parametrize(
    ("data", "name", "value"),
    [
        ({"cdi": {"enabled": False}}, "CRIO_CONFIG_MODE", "config"),
        ({}, "CRIO_CONFIG_MODE", "hook"),
        ({}, "NVIDIA_RUNTIME_SET_AS_DEFAULT", "true"),
    ],
)
def test_the_users_toolkit_env_wins_over_the_crio_mode(data: dict[str, Any], name: str, value: str) -> None:
    """NVIDIA's operator applies toolkit.env after it sets the CDI variables and CRIO_CONFIG_MODE;
    the rendered crio DaemonSet keeps the user's value."""
    result = run({**data, "toolkit": {"env": [{"name": name, "value": value}]}}, "crio:1")
    assert (
        env_of(ctr(daemonset(result, "state-container-toolkit"), "nvidia-container-toolkit-ctr"))[name]
        == value
    )
