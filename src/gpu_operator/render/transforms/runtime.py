"""Container-runtime wiring: the runtimeClassName rule and the toolkit's runtime config paths."""

from __future__ import annotations

import posixpath
from typing import Any

from gpu_operator.api.clusterpolicy import ClusterPolicySpec
from gpu_operator.render.distributions import DISTRIBUTIONS, Distribution
from gpu_operator.render.objects import add_mount, add_volume, get_env, hostpath, mount, upsert_env

CONFIG_DIR = "/runtime/config-dir/"
DROP_IN_DIR = "/runtime/config-dir.d/"
SOCKET_DIR = "/runtime/sock-dir/"
NRI_SOCKET_DIR = "/runtime/nri-sock-dir/"
DEFAULT_NRI_SOCKET = "/var/run/nri/nri.sock"
DEFAULT_INSTALL_DIR = "/usr/local/nvidia"
# the toolkit's default CRIO_HOOKS_DIR (nvidia-ctk-installer's crio defaultHooksDir), CRI-O's default hooks_dir
CRIO_HOOKS_DIR = "/usr/share/containers/oci/hooks.d"

# the toolkit's env prefix of each runtime (CONTAINERD_CONFIG, CRIO_CONFIG, DOCKER_SOCKET, ...)
PREFIXES = {"containerd": "CONTAINERD", "crio": "CRIO", "docker": "DOCKER"}


def runtime_class_name(spec: ClusterPolicySpec, runtime: str) -> str | None:
    """Operands that need GPUs run with the nvidia RuntimeClass, except with NRI or crio without CDI."""
    if spec.cdi.nri() or (not spec.cdi.on() and runtime == "crio"):
        return None
    return spec.operator.runtimeClass


def _pick(ctr: dict[str, Any], names: tuple[str, ...], default: str) -> str:
    for name in names:
        value = get_env(ctr, name)
        if value:
            return value
    return default


def _mount_dir(
    pod: dict[str, Any], ctr: dict[str, Any], volume: str, host_file: str, target: str, type_: str | None
) -> str:
    add_volume(pod, hostpath(volume, posixpath.dirname(host_file), type_))
    add_mount(ctr, mount(volume, target))
    return target + posixpath.basename(host_file)


def _default_env(ctr: dict[str, Any], name: str, value: str) -> None:
    """The operator's value for a toolkit variable unless spec.toolkit.env set it (already on the
    container): NVIDIA's operator sets the CDI variables and CRIO_CONFIG_MODE before it applies
    toolkit.env (controllers/object_controls.go, TransformToolkit), so the user's value wins."""
    if get_env(ctr, name) is None:
        upsert_env(ctr, name, value)


def toolkit_runtime(
    pod: dict[str, Any],
    spec: ClusterPolicySpec,
    runtime: str,
    openshift: bool,
    dist: Distribution | None = None,
    config: str = "",
) -> None:
    """Point the toolkit at the host's runtime config, drop-in dir and socket through /runtime/*:
    upstream's defaults for `runtime`, or a distribution's paths (`dist`, its config file `config`);
    what spec.toolkit.env names wins over both."""
    ctr = pod["containers"][0]
    if dist is not None:
        runtime = dist.runtime
    upsert_env(ctr, "RUNTIME", runtime)
    if spec.cdi.on():
        for name, value in (
            ("CDI_ENABLED", "true"),
            ("NVIDIA_RUNTIME_SET_AS_DEFAULT", "false"),
            ("NVIDIA_CONTAINER_RUNTIME_MODE", "cdi"),
            ("CRIO_CONFIG_MODE", "config"),
        ):
            _default_env(ctr, name, value)
        if spec.cdi.nri():
            _default_env(ctr, "ENABLE_NRI_PLUGIN", "true")
    elif runtime == "crio":
        _default_env(ctr, "CRIO_CONFIG_MODE", "hook")
    if runtime == "crio":
        # The toolkit writes its OCI hook (hook mode, CDI off or CRIO_CONFIG_MODE=hook in toolkit.env)
        # under its own default CRIO_HOOKS_DIR in the container; the host directory behind it is the
        # one CRI-O reads: OpenShift's /run/containers/oci/hooks.d, else CRI-O's default hooks_dir.
        hooks = "/run/containers/oci/hooks.d" if openshift else CRIO_HOOKS_DIR
        add_volume(pod, hostpath("crio-hooks", hooks, "DirectoryOrCreate"))
        add_mount(ctr, mount("crio-hooks", CRIO_HOOKS_DIR))
    install_dir = spec.toolkit.installDir
    if install_dir != DEFAULT_INSTALL_DIR:
        upsert_env(ctr, "ROOT", install_dir)
        add_volume(pod, hostpath("toolkit-install-dir", install_dir, "DirectoryOrCreate"))
        add_mount(ctr, mount("toolkit-install-dir", install_dir))
    if spec.cdi.nri():
        socket = _pick(ctr, ("NRI_SOCKET",), DEFAULT_NRI_SOCKET)
        upsert_env(
            ctr, "NRI_SOCKET", _mount_dir(pod, ctr, "nri-socket", socket, NRI_SOCKET_DIR, "DirectoryOrCreate")
        )
        return
    if dist is not None:
        _distribution_defaults(ctr, dist)
    _runtime_paths(pod, ctr, dist or DISTRIBUTIONS[runtime], config)


def _distribution_defaults(ctr: dict[str, Any], dist: Distribution) -> None:
    """The distribution's config source and its lack of a drop-in, unless spec.toolkit.env says."""
    if dist.source and get_env(ctr, "RUNTIME_CONFIG_SOURCE") is None:
        upsert_env(ctr, "RUNTIME_CONFIG_SOURCE", dist.source)
    if not dist.drop_in and get_env(ctr, "RUNTIME_DROP_IN_CONFIG") is None:
        upsert_env(ctr, "RUNTIME_DROP_IN_CONFIG", "")  # the toolkit edits the config itself


def _runtime_paths(
    pod: dict[str, Any], ctr: dict[str, Any], dist: Distribution, config_file: str = ""
) -> None:
    """Upstream's rule: each host path (spec.toolkit.env's, else the distribution's) mounted by its
    directory under /runtime/*, the env pointed at the container path."""
    runtime = dist.runtime
    prefix = PREFIXES[runtime]
    default_config, default_drop_in, default_socket = config_file or dist.config, dist.drop_in, dist.socket
    config = _pick(ctr, (f"{prefix}_CONFIG", "RUNTIME_CONFIG"), default_config)
    target = _mount_dir(pod, ctr, f"{runtime}-config", config, CONFIG_DIR, "DirectoryOrCreate")
    upsert_env(ctr, "RUNTIME_CONFIG", target)
    upsert_env(ctr, f"{prefix}_CONFIG", target)
    drop_in = _pick(ctr, ("RUNTIME_DROP_IN_CONFIG",), default_drop_in)
    if drop_in:
        target = _mount_dir(pod, ctr, f"{runtime}-drop-in-config", drop_in, DROP_IN_DIR, "DirectoryOrCreate")
        upsert_env(ctr, "RUNTIME_DROP_IN_CONFIG", target)
        upsert_env(ctr, "RUNTIME_DROP_IN_CONFIG_HOST_PATH", drop_in)
    socket = _pick(ctr, (f"{prefix}_SOCKET", "RUNTIME_SOCKET"), default_socket)
    if socket:
        target = _mount_dir(pod, ctr, f"{runtime}-socket", socket, SOCKET_DIR, None)
        upsert_env(ctr, "RUNTIME_SOCKET", target)
        upsert_env(ctr, f"{prefix}_SOCKET", target)
    if runtime == "containerd":
        upsert_env(ctr, "CONTAINERD_RUNTIME_CLASS", _pick(ctr, ("CONTAINERD_RUNTIME_CLASS",), "nvidia"))
    source = get_env(ctr, "RUNTIME_CONFIG_SOURCE")
    if source:
        # the toolkit reads host files through the /host mount of the root filesystem
        parts = [f"file=/host{p[5:]}" if p.startswith("file=/") else p for p in source.split(",")]
        upsert_env(ctr, "RUNTIME_CONFIG_SOURCE", ",".join(parts))
