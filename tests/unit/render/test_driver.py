"""The driver transform: image tags, kernel module type, sidecars, config maps, secrets, manager."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.render.renderkit import ctr, daemonset, env_of, run

CM_KEYS = {"repos": ("cuda.list", "extra.list"), "certs": ("corp.crt",), "kmods": ("nvidia.conf",)}


def driver(data: dict[str, Any], *nodes: str, **kwargs: Any) -> dict[str, Any]:
    return daemonset(
        run({"driver": data} if "driver" not in data else data, *nodes, **kwargs), "state-driver"
    )


def test_defaults() -> None:
    ds = driver({})
    main = ctr(ds, "nvidia-driver-ctr")
    assert main["image"] == "nvcr.io/nvidia/driver:595.91.07-ubuntu22.04"
    assert env_of(main)["KERNEL_MODULE_TYPE"] == "auto"
    assert ds["spec"]["updateStrategy"] == {"type": "OnDelete"}
    assert ds["metadata"]["labels"]["app.kubernetes.io/component"] == "nvidia-driver"
    assert ds["metadata"]["labels"]["nvidia.com/precompiled"] == "false"
    assert [c["name"] for c in ds["spec"]["template"]["spec"]["containers"]] == ["nvidia-driver-ctr"]
    manager = ctr(ds, "k8s-driver-manager")
    assert manager["image"] == "nvcr.io/nvidia/cloud-native/k8s-driver-manager:v0.12.0"
    assert ds["spec"]["template"]["spec"]["nodeSelector"] == {"nvidia.com/gpu.deploy.driver": "true"}


@pytest.mark.parametrize(
    ("data", "image"),
    [
        # NVIDIA's operator ignores a version without repository and image (DRIVER_IMAGE as a whole):
        # here it retags the image the operator would otherwise use, so changing it starts an upgrade
        ({"version": "580.95.05"}, "nvcr.io/nvidia/driver:580.95.05-ubuntu22.04"),
        (
            {"version": "sha256:" + "a" * 64},
            "nvcr.io/nvidia/driver@sha256:" + "a" * 64,
        ),  # digests get no OS suffix
        (
            {"repository": "registry.example.com/nvidia"},
            "registry.example.com/nvidia/driver:595.91.07-ubuntu22.04",
        ),
        (
            {"repository": "r.example.com/nv", "image": "drv", "version": "1.2"},
            "r.example.com/nv/drv:1.2-ubuntu22.04",
        ),
    ],
)
def test_a_driver_version_alone_retags_the_operators_driver_image(data: dict[str, Any], image: str) -> None:
    default, changed = driver({}), driver(data)
    assert ctr(changed, "nvidia-driver-ctr")["image"] == image
    # a new pod template (a new ControllerRevision: the upgrade controller replaces the pods) and a
    # new install digest (k8s-driver-manager does not skip the reinstall)
    assert default["spec"]["template"] != changed["spec"]["template"]
    assert (
        env_of(ctr(default, "nvidia-driver-ctr"))["DRIVER_CONFIG_DIGEST"]
        != env_of(ctr(changed, "nvidia-driver-ctr"))["DRIVER_CONFIG_DIGEST"]
    )


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"kernelModuleType": "open"}, {"KERNEL_MODULE_TYPE": "open", "OPEN_KERNEL_MODULES_ENABLED": "true"}),
        ({"kernelModuleType": "proprietary"}, {"KERNEL_MODULE_TYPE": "proprietary"}),
        ({"rdma": {"enabled": True}}, {"GPU_DIRECT_RDMA_ENABLED": "true"}),
        (
            {"rdma": {"enabled": True, "useHostMofed": True}},
            {"GPU_DIRECT_RDMA_ENABLED": "true", "USE_HOST_MOFED": "true"},
        ),
    ],
)
def test_feature_env(data: dict[str, Any], expected: dict[str, str]) -> None:
    got = env_of(ctr(driver(data), "nvidia-driver-ctr"))
    assert {k: got.get(k) for k in expected} == expected


@pytest.mark.parametrize(
    ("spec", "sidecars", "images"),
    [
        (
            {"driver": {"rdma": {"enabled": True}}},
            ["nvidia-peermem-ctr"],
            {"nvidia-peermem-ctr": "nvcr.io/nvidia/driver:595.91.07-ubuntu22.04"},
        ),
        (
            {"gds": {"enabled": True}},
            ["nvidia-fs-ctr"],
            {"nvidia-fs-ctr": "nvcr.io/nvidia/cloud-native/nvidia-fs:2.29.4-ubuntu22.04"},
        ),
        (
            {"gdrcopy": {"enabled": True}},
            ["nvidia-gdrcopy-ctr"],
            {"nvidia-gdrcopy-ctr": "nvcr.io/nvidia/cloud-native/gdrdrv:v2.6-ubuntu22.04"},
        ),
    ],
)
def test_sidecars_only_with_their_feature(
    spec: dict[str, Any], sidecars: list[str], images: dict[str, str]
) -> None:
    ds = daemonset(run(spec), "state-driver")
    names = [c["name"] for c in ds["spec"]["template"]["spec"]["containers"]]
    assert names == ["nvidia-driver-ctr", *sidecars]
    assert {n: ctr(ds, n)["image"] for n in images} == images


@pytest.mark.parametrize(
    ("licensing", "volume_key", "mounts"),
    [
        (
            {"secretName": "lic"},
            "secret",
            ["/drivers/gridd.conf", "/drivers/ClientConfigToken/client_configuration_token.tok"],
        ),
        ({"configMapName": "lic", "nlsEnabled": False}, "configMap", ["/drivers/gridd.conf"]),
    ],
)
def test_licensing(licensing: dict[str, Any], volume_key: str, mounts: list[str]) -> None:
    ds = driver({"licensingConfig": licensing})
    volume = next(v for v in ds["spec"]["template"]["spec"]["volumes"] if v["name"] == "licensing-config")
    assert volume_key in volume
    got = [
        m["mountPath"]
        for m in ctr(ds, "nvidia-driver-ctr")["volumeMounts"]
        if m["name"] == "licensing-config"
    ]
    assert got == mounts


@pytest.mark.parametrize(
    ("data", "volume", "paths"),
    [
        (
            {"repoConfig": {"configMapName": "repos"}},
            "repo-config",
            ["/etc/apt/sources.list.d/cuda.list", "/etc/apt/sources.list.d/extra.list"],
        ),
        ({"certConfig": {"name": "certs"}}, "cert-config", ["/usr/local/share/ca-certificates/corp.crt"]),
        ({"kernelModuleConfig": {"name": "kmods"}}, "kernel-module-config", ["/drivers/nvidia.conf"]),
        ({"virtualTopology": {"config": "topo"}}, "topology-config", ["/etc/nvidia/nvidia-topologyd.conf"]),
    ],
)
def test_config_maps(data: dict[str, Any], volume: str, paths: list[str]) -> None:
    ds = driver(data, configmap_keys=CM_KEYS)
    got = [m["mountPath"] for m in ctr(ds, "nvidia-driver-ctr")["volumeMounts"] if m["name"] == volume]
    assert got == paths


def test_kernel_module_config_with_unknown_keys_mounts_optional_standard_files() -> None:
    ds = driver({"kernelModuleConfig": {"name": "kmods"}})
    volume = next(v for v in ds["spec"]["template"]["spec"]["volumes"] if v["name"] == "kernel-module-config")
    assert volume["configMap"]["optional"] is True
    assert [i["key"] for i in volume["configMap"]["items"]][0] == "nvidia.conf"


def test_secret_env_and_manager_settings() -> None:
    ds = driver(
        {
            "secretEnv": "s",
            "manager": {
                "repository": "r",
                "image": "m",
                "version": "2",
                "env": [
                    {"name": "ENABLE_GPU_POD_EVICTION", "value": "false"},
                    {"name": "ENABLE_AUTO_DRAIN", "value": "true"},
                ],
            },
            "rdma": {"enabled": True},
        }
    )
    assert ctr(ds, "nvidia-driver-ctr")["envFrom"] == [{"secretRef": {"name": "s"}}]
    manager = ctr(ds, "k8s-driver-manager")
    assert manager["image"] == "r/m:2"
    got = env_of(manager)
    assert got["ENABLE_GPU_POD_EVICTION"] == "false"
    assert got["ENABLE_AUTO_DRAIN"] == "true" and got["DRAIN_TIMEOUT_SECONDS"] == "0s"
    assert got["GPU_DIRECT_RDMA_ENABLED"] == "true"


def test_probe_override() -> None:
    probe = ctr(driver({"startupProbe": {"failureThreshold": 5, "periodSeconds": 3}}), "nvidia-driver-ctr")[
        "startupProbe"
    ]
    assert (
        probe["failureThreshold"] == 5 and probe["periodSeconds"] == 3 and probe["initialDelaySeconds"] == 60
    )


def test_os_tag_comes_from_the_first_gpu_node() -> None:
    ds = daemonset(run({}, "host-driver:1", "dgx-h100:1"), "state-driver")
    assert ctr(ds, "nvidia-driver-ctr")["image"].endswith("-ubuntu24.04")


def test_openshift_version_env() -> None:
    ds = daemonset(run({}, openshift=True, openshift_version="4.19"), "state-driver")
    assert env_of(ctr(ds, "nvidia-driver-ctr"))["OPENSHIFT_VERSION"] == "4.19"


def test_default_driver_pod_has_upstreams_install_state_layout() -> None:
    # DRIVER_CONFIG_DIGEST hashes images, command/args, plain env, every volume and every driver
    # mount; keeping upstream's names and paths keeps an upgrade from one operator to the other
    # from reinstalling the driver on every node.
    from gpu_operator.render.transforms.digest import state_of_pod

    state = state_of_pod(driver({})["spec"]["template"]["spec"])
    assert state.DriverCommand == ["nvidia-driver"] and state.DriverArgs == ["init"]
    assert [(e.Name, e.Value) for e in state.DriverEnv if e.Name != "DRIVER_CONFIG_DIGEST"] == [
        ("KERNEL_MODULE_TYPE", "auto")
    ]
    assert [(e.Name, e.Value) for e in state.ManagerEnv if e.Name != "DRIVER_CONFIG_DIGEST"] == [
        ("DRAIN_DELETE_EMPTYDIR_DATA", "false"),
        ("DRAIN_POD_SELECTOR_LABEL", ""),
        ("DRAIN_TIMEOUT_SECONDS", "0s"),
        ("DRAIN_USE_FORCE", "false"),
        ("ENABLE_AUTO_DRAIN", "false"),
        ("ENABLE_GPU_POD_EVICTION", "true"),
        ("NVIDIA_VISIBLE_DEVICES", "void"),
    ]
    assert {(v.Name, v.HostPath or v.ConfigMapName) for v in state.AdditionalVolumes} == {
        ("run-nvidia", "/run/nvidia"),
        ("var-log", "/var/log"),
        ("dev-log", "/dev/log"),
        ("host-os-release", "/etc/os-release"),
        ("run-nvidia-fabricmanager", "/run/nvidia-fabricmanager"),
        ("run-nvidia-topologyd", "/run/nvidia-topologyd"),
        ("mlnx-ofed-usr-src", "/run/mellanox/drivers/usr/src"),
        ("run-mellanox-drivers", "/run/mellanox/drivers"),
        ("run-nvidia-validations", "/run/nvidia/validations"),
        ("host-root", "/"),
        ("host-sys", "/sys"),
        ("firmware-search-path", "/sys/module/firmware_class/parameters/path"),
        ("host-sys-devices-system", "/sys/devices/system"),
        ("nv-firmware", "/run/nvidia/driver/lib/firmware"),
        ("driver-startup-probe-script", "nvidia-driver-startup-probe"),
    }
    assert len(state.AdditionalVolumeMounts) == 12 and state.HostRoot == "/"


SLES = (
    "feature.node.kubernetes.io/system-os_release.ID={os},"
    "feature.node.kubernetes.io/system-os_release.VERSION_ID=15.6"
)


def lib_modules(ds: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    pod = ds["spec"]["template"]["spec"]
    return (
        [v for v in pod["volumes"] if v["name"] == "lib-modules"],
        [m for m in ctr(ds, "nvidia-driver-ctr").get("volumeMounts", []) if m["name"] == "lib-modules"],
    )


@pytest.mark.parametrize(
    ("os_id", "precompiled", "mounted"),
    [
        ("sles", True, True),
        ("sl-micro", True, True),
        ("sles", False, False),  # the runfile driver builds against its own tree
        ("ubuntu", True, False),
    ],
)
def test_precompiled_on_suse_reads_the_hosts_lib_modules(
    os_id: str, precompiled: bool, mounted: bool
) -> None:
    result = run(
        {"driver": {"usePrecompiled": precompiled, "version": "595"}}, "dgx-h100:1," + SLES.format(os=os_id)
    )
    volumes, mounts = lib_modules(daemonset(result, "state-driver"))
    if not mounted:
        assert (volumes, mounts) == ([], [])
        return
    assert volumes == [{"name": "lib-modules", "hostPath": {"path": "/lib/modules", "type": "Directory"}}]
    assert mounts == [{"name": "lib-modules", "mountPath": "/run/host/lib/modules", "readOnly": True}]
