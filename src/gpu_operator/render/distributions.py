"""Which Kubernetes distribution's container runtime a node runs, and where NVIDIA's toolkit must
write on it (pure; the facts and their sources: docs/operands.md, "Runtimes by distribution").

A node's distribution comes from two places (docs/distributions.md):
- the host's files, as the node probe found them (its `runtime` in the probe-facts annotation:
  `flavor`, `config`, `template`, `socket`); where the probe has looked, its answer wins;
- the kubelet's report in Node.status.nodeInfo: `containerRuntimeVersion` (`containerd://`,
  `cri-o://`, `docker://`; k3s and RKE2 ship containerd as `<version>-k3s<N>`) and
  `kubeletVersion` (`+k3s<N>`, `+rke2r<N>`, `+k0s`).

MicroK8s says nothing of itself in nodeInfo: its kubelet labels the node `microk8s.io/cluster=true`
(MICROK8S_LABEL), and the probe finds its files. Talos' containerd config
is read-only (its toolkit is a system extension), so the toolkit cannot configure it. A node whose
runtime is none of these is UNRECOGNISED: no toolkit runs there until the user names its paths in
spec.toolkit.env (`problem`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

STOCK = "containerd"  # containerd in its upstream locations: today's toolkit DaemonSet
UNRECOGNISED = "unrecognised"
# A node whose kubelet has not reported its runtime yet (status.nodeInfo.containerRuntimeVersion
# empty, no probe answer): nothing is decided for it, and nothing blames its runtime; the decision
# is made when the field appears (the node's update brings it).
PENDING = "pending"
# The toolkit.env keys that name the runtime's config and socket (NVIDIA's toolkit reads these,
# cmd/nvidia-ctk-installer: RUNTIME_CONFIG or <RUNTIME>_CONFIG, RUNTIME_SOCKET or <RUNTIME>_SOCKET).
CONFIG_KEYS = ("RUNTIME_CONFIG", "CONTAINERD_CONFIG", "CRIO_CONFIG", "DOCKER_CONFIG")
SOCKET_KEYS = ("RUNTIME_SOCKET", "CONTAINERD_SOCKET", "CRIO_SOCKET", "DOCKER_SOCKET")
HINT_KEYS = (
    "RUNTIME",
    "CONTAINERD_CONFIG",
    "CONTAINERD_SOCKET",
    "RUNTIME_CONFIG_SOURCE",
    "RUNTIME_DROP_IN_CONFIG",
)

_K3S = "/var/lib/rancher/k3s/agent/etc/containerd"
_RKE2 = "/var/lib/rancher/rke2/agent/etc/containerd"
_K3S_SOCKET = "/run/k3s/containerd/containerd.sock"  # RKE2 uses the same path
_MICROK8S = "/var/snap/microk8s"
MICROK8S_LABEL = "microk8s.io/cluster"  # MicroK8s' kubelet args: --node-labels=microk8s.io/cluster=true


@dataclass(frozen=True)
class Distribution:
    """Where the toolkit writes on one distribution's nodes (host paths)."""

    name: str
    runtime: str  # the toolkit's RUNTIME: containerd, crio or docker
    config: str  # the file the toolkit edits: RUNTIME_CONFIG / <RUNTIME>_CONFIG
    socket: str  # RUNTIME_SOCKET / <RUNTIME>_SOCKET ("" none mounted)
    drop_in: str  # RUNTIME_DROP_IN_CONFIG ("": the toolkit writes `config` itself, no drop-in)
    source: str = ""  # RUNTIME_CONFIG_SOURCE: where the toolkit reads the current config
    config_v3: str = ""  # the file to edit under containerd 2.x (config version 3), where it differs


# Stock containerd, CRI-O and Docker: upstream's defaults (controllers/object_controls.go), which a
# cluster of that runtime gets unchanged; the others: the distributions' own (docs/operands.md).
DISTRIBUTIONS: Mapping[str, Distribution] = {
    d.name: d
    for d in (
        Distribution(
            STOCK,
            "containerd",
            "/etc/containerd/config.toml",
            "/run/containerd/containerd.sock",
            "/etc/containerd/conf.d/99-nvidia.toml",
        ),
        # k3s/RKE2 regenerate config.toml at every start from config.toml.tmpl (config-v3.toml.tmpl
        # with containerd 2): the toolkit edits the template, starting from the generated config.
        Distribution(
            "k3s",
            "containerd",
            f"{_K3S}/config.toml.tmpl",
            _K3S_SOCKET,
            "",
            source=f"file={_K3S}/config.toml",
            config_v3=f"{_K3S}/config-v3.toml.tmpl",
        ),
        Distribution(
            "rke2",
            "containerd",
            f"{_RKE2}/config.toml.tmpl",
            _K3S_SOCKET,
            "",
            source=f"file={_RKE2}/config.toml",
            config_v3=f"{_RKE2}/config-v3.toml.tmpl",
        ),
        # MicroK8s renders args/containerd.toml from args/containerd-template.toml (NVIDIA's docs).
        Distribution(
            "microk8s",
            "containerd",
            f"{_MICROK8S}/current/args/containerd-template.toml",
            f"{_MICROK8S}/common/run/containerd.sock",
            "/etc/containerd/conf.d/99-nvidia.toml",
            source=f"file={_MICROK8S}/current/args/containerd.toml",
        ),
        # k0s merges every /etc/k0s/containerd.d/*.toml into its own config but follows no further
        # imports: the toolkit writes its runtime there, with no drop-in of its own.
        Distribution(
            "k0s",
            "containerd",
            "/etc/k0s/containerd.d/nvidia.toml",
            "/run/k0s/containerd.sock",
            "",
            source="file",
        ),
        Distribution("crio", "crio", "/etc/crio/config.toml", "", "/etc/crio/crio.conf.d/99-nvidia.conf"),
        Distribution("docker", "docker", "/etc/docker/daemon.json", "/var/run/docker.sock", ""),
    )
}
# The probe's flavours the toolkit cannot configure, and why (the message names the fix).
NOT_CONFIGURABLE = {
    "talos": "Talos' containerd config is read-only: use Talos' nvidia-container-toolkit system extension "
    "and set spec.toolkit.enabled=false",
}
_SCHEMES = {"containerd": STOCK, "cri-o": "crio", "docker": "docker"}
_KUBELET_SUFFIX = (("+rke2", "rke2"), ("+k3s", "k3s"), ("+k0s", "k0s"))
_MAJOR = re.compile(r"^(\d+)\.")


def detect(
    runtime_version: str,
    kubelet_version: str,
    probe: Mapping[str, str],
    labels: Mapping[str, str] | None = None,
) -> str:
    """A node's distribution (a DISTRIBUTIONS key, a NOT_CONFIGURABLE flavour, UNRECOGNISED, or
    PENDING while nodeInfo names no runtime yet).

    The host's files win: the probe's flavour, when it found one, decides over what nodeInfo says."""
    flavour = str(probe.get("flavor") or "")
    if flavour:
        return flavour if flavour in DISTRIBUTIONS or flavour in NOT_CONFIGURABLE else UNRECOGNISED
    if not runtime_version:
        return PENDING
    scheme, _, version = runtime_version.partition("://")
    plain = _SCHEMES.get(scheme)
    if plain is None:
        return UNRECOGNISED
    if plain != STOCK:
        return plain
    for suffix, name in _KUBELET_SUFFIX:
        if suffix in kubelet_version:
            return name
    if (labels or {}).get(MICROK8S_LABEL) == "true":
        return "microk8s"
    # k3s' and RKE2's containerd reports `<version>-k3s<N>`; an RKE2 kubelet says +rke2 (above)
    return "k3s" if "-k3s" in version else STOCK


def containerd_major(runtime_version: str) -> int | None:
    scheme, _, version = runtime_version.partition("://")
    found = _MAJOR.match(version) if scheme == "containerd" else None
    return int(found[1]) if found else None


def config_of(dist: Distribution, runtime_version: str, probe: Mapping[str, str]) -> str:
    """The file the toolkit edits: the template the probe found on the host, else the distribution's
    (its containerd 2 variant when the node reports containerd 2)."""
    found = str(probe.get("template") or "")
    if found and probe.get("flavor") == dist.name:
        return found
    major = containerd_major(runtime_version)
    return dist.config_v3 if dist.config_v3 and major is not None and major >= 2 else dist.config


def toolkit_group(
    runtime_version: str,
    kubelet_version: str,
    probe: Mapping[str, str],
    labels: Mapping[str, str] | None = None,
) -> str:
    """The toolkit DaemonSet a node belongs to: its distribution, `-v3` added where the toolkit edits
    the distribution's containerd 2 config (the node label RUNTIME_GROUP carries it)."""
    name = detect(runtime_version, kubelet_version, probe, labels)
    dist = DISTRIBUTIONS.get(name)
    if dist is not None and dist.config_v3 and config_of(dist, runtime_version, probe) == dist.config_v3:
        return f"{name}-v3"
    return name


def distribution_of(group: str) -> Distribution | None:
    return DISTRIBUTIONS.get(group.removesuffix("-v3"))


def user_names_paths(env: Sequence[tuple[str, str]]) -> bool:
    """Whether spec.toolkit.env names both the runtime's config and its socket."""
    keys = {name for name, value in env if value}
    return bool(keys & set(CONFIG_KEYS)) and bool(keys & set(SOCKET_KEYS))


def problem(node: str, distribution: str, runtime_version: str, probe_flavour: str = "") -> str:
    """The message for a node whose runtime the toolkit cannot be pointed at by detection."""
    if distribution in NOT_CONFIGURABLE:
        why = NOT_CONFIGURABLE[distribution]
    elif probe_flavour:
        why = (
            f"the node probe found no container runtime it knows in the host's files (it reported "
            f"{probe_flavour!r}; nodeInfo says {runtime_version or 'nothing'})"
        )
    else:
        why = (
            f"its container runtime ({runtime_version or 'none reported'}) is not one the operator recognises "
            f"(containerd of stock, k3s, RKE2, MicroK8s or k0s; CRI-O; Docker)"
        )
    return (
        f"node {node}: no container toolkit runs there: {why}; name its runtime in spec.toolkit.env "
        f"({', '.join(HINT_KEYS)}) or label it nvidia.com/gpu.deploy.container-toolkit=false "
        f"(docs/distributions.md)"
    )
