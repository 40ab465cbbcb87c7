"""The driver transform: OS/kernel image tags, kernel module type, sidecars, config maps, secrets."""

from __future__ import annotations

import re
from typing import Any

from gpu_operator.api.clusterpolicy import ClusterPolicySpec
from gpu_operator.render.facts import ClusterFacts
from gpu_operator.render.objects import (
    add_mount,
    add_volume,
    configmap_volume,
    find,
    hostpath,
    mount,
    remove_containers,
    upsert_env,
)
from gpu_operator.render.result import RenderError
from gpu_operator.render.transforms.component import apply_image, env_upsert
from gpu_operator.render.transforms.driver_manager import driver_manager
from gpu_operator.render.transforms.image import image_path, with_os_tag

DRIVER_CTR = "nvidia-driver-ctr"
PEERMEM_CTR = "nvidia-peermem-ctr"
GDS_CTR = "nvidia-fs-ctr"
GDRCOPY_CTR = "nvidia-gdrcopy-ctr"
LICENSE_FILE = "gridd.conf"
NLS_TOKEN = "client_configuration_token.tok"
TOPOLOGY_FILE = "nvidia-topologyd.conf"
KERNEL_MODULE_FILES = ("nvidia.conf", "nvidia-uvm.conf", "nvidia-modeset.conf", "nvidia-peermem.conf")
_APT, _YUM, _ZYPP = "/etc/apt/sources.list.d", "/etc/yum.repos.d", "/etc/zypp/repos.d"
REPO_DIRS = {
    "ubuntu": _APT,
    "debian": _APT,
    "rhel": _YUM,
    "centos": _YUM,
    "rocky": _YUM,
    "ol": _YUM,
    "fedora": _YUM,
    "amzn": _YUM,
    "sles": _ZYPP,
    "sl-micro": _ZYPP,
}
_DEB_CERTS, _RH_CERTS, _SUSE_CERTS = (
    "/usr/local/share/ca-certificates",
    "/etc/pki/ca-trust/extracted/pem",
    "/etc/pki/trust/anchors",
)
CERT_DIRS = {
    "ubuntu": _DEB_CERTS,
    "debian": _DEB_CERTS,
    "rhel": _RH_CERTS,
    "centos": _RH_CERTS,
    "rocky": _RH_CERTS,
    "ol": _RH_CERTS,
    "fedora": _RH_CERTS,
    "amzn": _RH_CERTS,
    "sles": _SUSE_CERTS,
    "sl-micro": _SUSE_CERTS,
}
# NVIDIA's precompiled driver images for SUSE read the host's modules tree at this path
# (object_controls.go: precompiled and the GPU nodes' os-release ID sles or sl-micro).
SUSE_OS = ("sles", "sl-micro")
HOST_LIB_MODULES = "/run/host/lib/modules"
_ARCH_SUFFIX = re.compile(r"[._-]?(x86_64|aarch64_64k|aarch64)$")


def sanitize_kernel(kernel: str) -> str:
    """A kernel version usable in an object name: no arch suffix, `_` -> `.`, lower case."""
    return _ARCH_SUFFIX.sub("", kernel).replace("_", ".").lower()


def precompiled_name(kernel: str, os_tag: str) -> str:
    return f"nvidia-driver-daemonset-{sanitize_kernel(kernel)}-{os_tag}".rstrip("-")


def driver_image(base: str, os_tag: str, kernel: str | None) -> str:
    """`<image>-<osTag>`, or `<image>-<kernel>-<osTag>` for precompiled drivers (digests unchanged)."""
    if kernel and "sha256:" not in base:
        base = f"{base}-{kernel}"
    return with_os_tag(base, os_tag)


def configmap_keys(facts: ClusterFacts, name: str, field_path: str) -> tuple[str, ...]:
    keys = facts.configmap_keys.get(name)
    if keys is None:
        raise RenderError(
            field_path,
            f"the keys of ConfigMap {name!r} are unknown: the operator reads them "
            "into ClusterFacts.configmap_keys; check that the ConfigMap exists in the operator namespace",
        )
    return tuple(keys)


def _mount_keys(
    pod: dict[str, Any],
    main: dict[str, Any],
    volume: str,
    configmap: str,
    keys: tuple[str, ...],
    directory: str,
    optional: bool = False,
) -> None:
    items = [{"key": key, "path": key} for key in keys]
    source = configmap_volume(volume, configmap, items=items)
    if optional:
        source["configMap"]["optional"] = True
    add_volume(pod, source)
    for key in keys:
        add_mount(main, mount(volume, f"{directory}/{key}", readonly=True, sub_path=key))


def _probes(main: dict[str, Any], spec: ClusterPolicySpec) -> None:
    for key, probe in (
        ("startupProbe", spec.driver.startupProbe),
        ("livenessProbe", spec.driver.livenessProbe),
        ("readinessProbe", spec.driver.readinessProbe),
    ):
        if probe is None:
            continue
        target = main.setdefault(key, {"exec": {"command": ["sh", "/usr/local/bin/startup-probe.sh"]}})
        target.update({k: v for k, v in probe.dump().items() if v is not None})


def _sidecars(
    pod: dict[str, Any], spec: ClusterPolicySpec, facts: ClusterFacts, driver_img: str, precompiled: bool
) -> None:
    """RDMA (peermem), GDS (nvidia-fs) and GDRCopy sidecars exist only when their feature is on."""
    env = dict(facts.operator_env)
    if precompiled and (spec.gds.on() or spec.gdrcopy.on()):
        raise RenderError(
            "spec.driver.usePrecompiled",
            "precompiled drivers cannot be combined with gds.enabled or gdrcopy.enabled: turn one off",
        )
    if spec.driver.rdma_on():
        peermem = find(pod, PEERMEM_CTR)
        if peermem is not None:
            peermem["image"] = driver_img
    else:
        remove_containers(pod, PEERMEM_CTR)
    for name, component, env_name, field in (
        (GDS_CTR, spec.gds, "GDS_IMAGE", "gds"),
        (GDRCOPY_CTR, spec.gdrcopy, "GDRCOPY_IMAGE", "gdrcopy"),
    ):
        ctr = find(pod, name)
        if not component.on():
            remove_containers(pod, name)
            continue
        if ctr is None:
            continue
        image = with_os_tag(image_path(component, env_name, env, f"spec.{field}"), facts.os_tag)
        apply_image(ctr, pod, image, component)
        if component.args:
            ctr["args"] = list(component.args)
        env_upsert(ctr, component.env)


def _features(main: dict[str, Any], pod: dict[str, Any], spec: ClusterPolicySpec) -> None:
    driver = spec.driver
    upsert_env(main, "KERNEL_MODULE_TYPE", driver.kernelModuleType)
    if driver.kernelModuleType == "open":
        upsert_env(main, "OPEN_KERNEL_MODULES_ENABLED", "true")
    if spec.gdrcopy.on():
        upsert_env(main, "GDRCOPY_ENABLED", "true")
    if spec.gds.on():
        upsert_env(main, "GDS_ENABLED", "true")
    if driver.rdma_on():
        upsert_env(main, "GPU_DIRECT_RDMA_ENABLED", "true")
        if driver.host_mofed():
            upsert_env(main, "USE_HOST_MOFED", "true")
            for volume in pod.get("volumes", []):
                if volume["name"] == "mlnx-ofed-usr-src":
                    volume["hostPath"]["path"] = "/usr/src"


def _configs(main: dict[str, Any], pod: dict[str, Any], spec: ClusterPolicySpec, facts: ClusterFacts) -> None:
    """Licensing, virtual topology, kernel-module options, package repositories and certificates."""
    driver = spec.driver
    licensing = driver.licensingConfig
    if licensing and (licensing.secretName or licensing.configMapName):
        files = [LICENSE_FILE] + ([NLS_TOKEN] if licensing.nlsEnabled is not False else [])
        items = [{"key": f, "path": f} for f in files]
        if licensing.secretName:
            add_volume(
                pod,
                {"name": "licensing-config", "secret": {"secretName": licensing.secretName, "items": items}},
            )
        else:
            add_volume(pod, configmap_volume("licensing-config", str(licensing.configMapName), items=items))
        add_mount(
            main, mount("licensing-config", f"/drivers/{LICENSE_FILE}", readonly=True, sub_path=LICENSE_FILE)
        )
        if NLS_TOKEN in files:
            add_mount(
                main,
                mount(
                    "licensing-config",
                    f"/drivers/ClientConfigToken/{NLS_TOKEN}",
                    readonly=True,
                    sub_path=NLS_TOKEN,
                ),
            )
    if driver.virtualTopology and driver.virtualTopology.config:
        _mount_keys(
            pod, main, "topology-config", driver.virtualTopology.config, (TOPOLOGY_FILE,), "/etc/nvidia"
        )
    if driver.kernelModuleConfig and driver.kernelModuleConfig.name:
        name = driver.kernelModuleConfig.name
        known = facts.configmap_keys.get(name)
        # unknown keys: offer the files the driver container looks for, each optional
        _mount_keys(
            pod,
            main,
            "kernel-module-config",
            name,
            tuple(known or KERNEL_MODULE_FILES),
            "/drivers",
            optional=known is None,
        )
    os_id = facts.os_id
    for volume, ref, dirs, path in (
        (
            "repo-config",
            driver.repoConfig.configMapName if driver.repoConfig else None,
            REPO_DIRS,
            "spec.driver.repoConfig.configMapName",
        ),
        (
            "cert-config",
            driver.certConfig.name if driver.certConfig else None,
            CERT_DIRS,
            "spec.driver.certConfig.name",
        ),
    ):
        if not ref:
            continue
        if os_id not in dirs:
            raise RenderError(
                path, f"no known {volume} directory for OS {os_id!r}; supported: {', '.join(dirs)}"
            )
        _mount_keys(pod, main, volume, ref, configmap_keys(facts, ref, path), dirs[os_id])
    if driver.secretEnv:
        for name in (DRIVER_CTR, GDS_CTR, GDRCOPY_CTR):
            ctr = find(pod, name)
            if ctr is not None:
                ctr["envFrom"] = [{"secretRef": {"name": driver.secretEnv}}]


def host_lib_modules(pod: dict[str, Any], main: dict[str, Any], os_id: str) -> None:
    """A precompiled driver on SUSE gets the host's /lib/modules, read-only, at /run/host/lib/modules."""
    if os_id in SUSE_OS:
        add_volume(pod, hostpath("lib-modules", "/lib/modules", "Directory"))
        add_mount(main, mount("lib-modules", HOST_LIB_MODULES, readonly=True))


def transform_driver(
    ds: dict[str, Any], spec: ClusterPolicySpec, facts: ClusterFacts, kernel: str | None
) -> None:
    """Everything particular to the driver DaemonSet; the digest is computed by the caller last."""
    pod = ds["spec"]["template"]["spec"]
    main = find(pod, DRIVER_CTR)
    assert main is not None
    main["image"] = driver_image(main["image"], facts.os_tag, kernel)
    driver_manager(pod, spec.driver.manager, dict(facts.operator_env), "spec.driver.manager", spec)
    _features(main, pod, spec)
    _probes(main, spec)
    _sidecars(pod, spec, facts, main["image"], kernel is not None)
    _configs(main, pod, spec, facts)
    if facts.openshift and facts.openshift_version:
        upsert_env(main, "OPENSHIFT_VERSION", facts.openshift_version)
    if kernel is not None:
        host_lib_modules(pod, main, facts.os_id)
    precompiled = "true" if kernel else "false"
    for meta in (ds["metadata"], ds["spec"]["template"]["metadata"]):
        meta["labels"]["nvidia.com/precompiled"] = precompiled
