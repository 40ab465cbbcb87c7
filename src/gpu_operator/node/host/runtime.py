"""The host's container runtime (containerd in its distro locations, cri-o, docker) and its CDI specs."""

from __future__ import annotations

import fnmatch
import json
import posixpath
import tomllib
from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import BaseModel, Field

from gpu_operator.node.host.hostfs import HostFS

CDI_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi", "/run/cdi")
KUBELET_CONFIG = "/var/lib/kubelet/config.yaml"
CRIO_CONFIG = "/etc/crio/crio.conf"
CRIO_DROP_IN_DIR = "/etc/crio/crio.conf.d"
# CRI-O's hooks_dir default (containers/common pkg/hooks DefaultDir, vendored by cri-o v1.31.3)
CRIO_HOOKS_DIRS = ("/usr/share/containers/oci/hooks.d",)
NVIDIA_HOOK = "nvidia-container-runtime-hook"


@dataclass(frozen=True)
class _Candidate:
    name: str
    flavor: str
    configs: tuple[str, ...]
    socket: str
    drop_in_globs: tuple[str, ...] = ()
    templates: tuple[str, ...] = ()  # the first that exists is the one the distribution reads
    drop_in_dir: str = ""  # every file below it, in lexical order, after the config (CRI-O's rule)


# Order matters when several are present: a distro's own containerd wins over a stray
# /etc/containerd left by a package, unless the kubelet names its endpoint.
_CANDIDATES = (
    _Candidate(
        "containerd",
        "k3s",
        ("/var/lib/rancher/k3s/agent/etc/containerd/config.toml",),
        "/run/k3s/containerd/containerd.sock",
        templates=(
            "/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.tmpl",
            "/var/lib/rancher/k3s/agent/etc/containerd/config.toml.tmpl",
        ),
    ),
    _Candidate(
        "containerd",
        "rke2",
        ("/var/lib/rancher/rke2/agent/etc/containerd/config.toml",),
        "/run/k3s/containerd/containerd.sock",
        templates=(
            "/var/lib/rancher/rke2/agent/etc/containerd/config-v3.toml.tmpl",
            "/var/lib/rancher/rke2/agent/etc/containerd/config.toml.tmpl",
        ),
    ),
    _Candidate(
        "containerd",
        "microk8s",
        (
            "/var/snap/microk8s/current/args/containerd-template.toml",
            "/var/snap/microk8s/current/args/containerd.toml",
        ),
        "/var/snap/microk8s/common/run/containerd.sock",
    ),
    _Candidate(
        "containerd",
        "k0s",
        ("/etc/k0s/containerd.toml",),
        "/run/k0s/containerd.sock",
        ("/etc/k0s/containerd.d/*.toml",),
    ),
    _Candidate(
        "containerd",
        "talos",
        ("/etc/cri/containerd.toml",),
        "/run/containerd/containerd.sock",
        ("/etc/cri/conf.d/*.part",),
    ),
    _Candidate(
        "containerd",
        "containerd",
        ("/etc/containerd/config.toml",),
        "/run/containerd/containerd.sock",
        ("/etc/containerd/conf.d/*.toml",),
    ),
    # CRI-O reads /etc/crio/crio.conf (when it exists), then every file below /etc/crio/crio.conf.d,
    # lexical order, each later one overriding (cri-o v1.31.3 internal/criocli/criocli.go mergeConfig,
    # pkg/config/config.go UpdateFromPath: filepath.Walk); packages may ship drop-ins only.
    _Candidate("crio", "crio", (CRIO_CONFIG,), "/var/run/crio/crio.sock", drop_in_dir=CRIO_DROP_IN_DIR),
    _Candidate("docker", "docker", ("/etc/docker/daemon.json",), "/var/run/docker.sock"),
)


class ContainerRuntime(BaseModel):
    """The runtime the kubelet uses and what its configuration says about NVIDIA."""

    name: str = Field(description="containerd, crio, docker, or '' when none was found")
    flavor: str = ""
    config_path: str | None = None
    template_path: str | None = Field(
        default=None,
        description="k3s/rke2 regenerate config_path from this at start (config-v3.toml.tmpl "
        "first, for containerd 2)",
    )
    config_files: list[str] = Field(
        default_factory=list, description="config plus every drop-in that was read"
    )
    socket: str | None = None
    nvidia_runtime: bool = False
    nvidia_hook: str | None = Field(
        default=None,
        description="CRI-O: the OCI hook file in its hooks_dir that runs NVIDIA's runtime hook "
        "(the toolkit's hook mode), None when there is none",
    )
    default_runtime: str | None = None
    cdi_enabled: bool | None = Field(default=None, description="None when the configuration does not say")
    errors: list[str] = Field(default_factory=list)


class CdiSpec(BaseModel):
    path: str
    kind: str = ""
    devices: int = 0
    error: str | None = None


def _kubelet_endpoint(fs: HostFS) -> str | None:
    text = fs.read_text(KUBELET_CONFIG)
    if not text:
        return None
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError:
        return None
    endpoint = data.get("containerRuntimeEndpoint") if isinstance(data, dict) else None
    return str(endpoint).removeprefix("unix://") if endpoint else None


def _glob(fs: HostFS, pattern: str) -> list[str]:
    directory, _, mask = pattern.rpartition("/")
    return [f"{directory}/{n}" for n in fs.listdir(directory) if fnmatch.fnmatch(n, mask)]


def _walk_files(fs: HostFS, directory: str) -> list[str]:
    """Every file below `directory`, depth first, entries in lexical order (Go's filepath.Walk)."""
    out: list[str] = []
    for name in fs.listdir(directory):
        path = f"{directory}/{name}"
        if fs.is_dir(path):
            out.extend(_walk_files(fs, path))
        elif fs.is_file(path):
            out.append(path)
    return out


def _has_config(fs: HostFS, cand: _Candidate) -> bool:
    return any(fs.is_file(c) for c in cand.configs) or bool(
        cand.drop_in_dir and _walk_files(fs, cand.drop_in_dir)
    )


def _nvidia_hook(fs: HostFS, docs: list[dict[str, Any]]) -> str | None:
    """The hook file in CRI-O's hooks_dir (the last config that sets it wins) whose prestart hook is
    NVIDIA's runtime hook."""
    dirs: Any = CRIO_HOOKS_DIRS
    for doc in docs:
        runtime = (doc.get("crio") or {}).get("runtime") if isinstance(doc.get("crio"), dict) else None
        if isinstance(runtime, dict) and isinstance(runtime.get("hooks_dir"), list):
            dirs = runtime["hooks_dir"]
    for directory in dirs:
        for name in fs.listdir(str(directory)):
            path = f"{directory}/{name}"
            if not name.endswith(".json") or not fs.is_file(path):
                continue
            try:
                hook = json.loads(fs.read_text(path) or "")
            except ValueError:
                continue
            command = (hook.get("hook") or {}).get("path", "") if isinstance(hook, dict) else ""
            if posixpath.basename(str(command)) == NVIDIA_HOOK and "prestart" in (hook.get("stages") or []):
                return path
    return None


def _walk(node: Any) -> list[tuple[str, Any]]:
    """Every (key, value) pair of nested tables, depth first."""
    out: list[tuple[str, Any]] = []
    if isinstance(node, dict):
        for key, value in node.items():
            out.append((str(key), value))
            out.extend(_walk(value))
    return out


def _is_nvidia_runtime(name: str, table: Any) -> bool:
    binary = ""
    if isinstance(table, dict):
        options = table.get("options") or {}
        binary = str(options.get("BinaryName") or table.get("runtime_path") or table.get("path") or "")
    return name.startswith("nvidia") or "nvidia-container-runtime" in binary


def _parse(path: str, text: str, name: str) -> dict[str, Any]:
    if name == "docker":
        data = json.loads(text)
        return data if isinstance(data, dict) else {}
    return tomllib.loads(text)


def _facts(runtime: ContainerRuntime, docs: list[dict[str, Any]], config_version: int | None) -> None:
    cdi: bool | None = None
    for doc in docs:
        for key, value in _walk(doc):
            if key == "runtimes" and isinstance(value, dict):
                runtime.nvidia_runtime |= any(_is_nvidia_runtime(n, t) for n, t in value.items())
            elif key in ("enable_cdi", "cdi") and isinstance(value, bool):
                cdi = value
            elif key in ("default_runtime_name", "default_runtime", "default-runtime") and isinstance(
                value, str
            ):
                runtime.default_runtime = value
    if cdi is None and runtime.name == "containerd" and config_version is not None:
        # containerd 2.x (config version 3) turns CDI on by default; 1.x (version 2) does not.
        cdi = config_version >= 3
    if cdi is None and runtime.name == "crio":
        cdi = True  # cri-o has read CDI specs by default since 1.23
    runtime.cdi_enabled = cdi


def detect_runtime(fs: HostFS) -> ContainerRuntime:
    endpoint = _kubelet_endpoint(fs)
    # Several runtimes share a socket path (k3s and rke2; talos and plain containerd): the
    # config file tells them apart, the socket only breaks ties or stands in when no config exists.
    configured = [c for c in _CANDIDATES if _has_config(fs, c)]
    listening = [c for c in _CANDIDATES if fs.exists(c.socket)]
    chosen = next(
        (c for c in configured if endpoint and fs.canonical(c.socket) == fs.canonical(endpoint)), None
    )
    chosen = chosen or next(iter(configured), None) or next(iter(listening), None)
    if chosen is None:
        return ContainerRuntime(name="")
    config = next((c for c in chosen.configs if fs.is_file(c)), None)
    runtime = ContainerRuntime(
        name=chosen.name,
        flavor=chosen.flavor,
        config_path=config or chosen.configs[0],
        template_path=next((t for t in chosen.templates if fs.is_file(t)), None),
        socket=chosen.socket if fs.exists(chosen.socket) else None,
    )
    docs: list[dict[str, Any]] = []
    version: int | None = None
    files = ([config] if config else []) + [f for g in chosen.drop_in_globs for f in _glob(fs, g)]
    if chosen.drop_in_dir:
        files += _walk_files(fs, chosen.drop_in_dir)
    for index, path in enumerate(files):
        try:
            doc = _parse(path, fs.read_text(path) or "", chosen.name)
        except (ValueError, tomllib.TOMLDecodeError) as err:
            runtime.errors.append(f"{path}: {err}")
            continue
        docs.append(doc)
        runtime.config_files.append(path)
        if index == 0 and config:
            version = int(doc.get("version", 1)) if isinstance(doc.get("version", 1), int) else None
            files.extend(
                f
                for pattern in doc.get("imports", []) or []
                for f in _glob(fs, str(pattern))
                if f not in files
            )
    _facts(runtime, docs, version)
    if chosen.name == "crio":
        runtime.nvidia_hook = _nvidia_hook(fs, docs)
    return runtime


def cdi_specs(fs: HostFS) -> list[CdiSpec]:
    """CDI spec files in the standard directories (a /var/run -> /run link is counted once)."""
    seen: set[str] = set()
    specs: list[CdiSpec] = []
    for directory in CDI_SPEC_DIRS:
        if not fs.is_dir(directory) or fs.canonical(directory) in seen:
            continue
        seen.add(fs.canonical(directory))
        for name in fs.listdir(directory):
            if not name.endswith((".yaml", ".yml", ".json")):
                continue
            path = f"{directory}/{name}"
            try:
                data = yaml.safe_load(fs.read_text(path) or "") or {}
            except yaml.YAMLError as err:
                specs.append(CdiSpec(path=path, error=str(err).splitlines()[0]))
                continue
            if not isinstance(data, dict):
                specs.append(CdiSpec(path=path, error="not a mapping"))
                continue
            specs.append(
                CdiSpec(path=path, kind=str(data.get("kind", "")), devices=len(data.get("devices") or []))
            )
    return specs
