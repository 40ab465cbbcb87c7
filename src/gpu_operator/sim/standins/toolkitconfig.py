"""What NVIDIA's container toolkit (the container-toolkit DaemonSet's `nvidia-toolkit`) writes on a
host to register its runtime with containerd, played on a host tree: only through the pod's own
channel, its env and hostPath mounts, as the toolkit does (facts from nvidia-container-toolkit's
cmd/nvidia-ctk-installer and pkg/config/engine/containerd; see docs/distributions.md):

- the config it edits is RUNTIME_CONFIG (else CONTAINERD_CONFIG), a path in its container: the
  hostPath volume mounted there decides where on the host the write lands;
- it starts from RUNTIME_CONFIG_SOURCE (`command,file` when unset): `file=<path>` reads that file
  (the DaemonSet points it under the /host mount of the host's root), `file` reads the config
  itself; `command` (`containerd config dump`) is not played here (no containerd runs in a tree)
  and falls through to the next source, as the toolkit does when the command fails;
- with RUNTIME_DROP_IN_CONFIG set, the runtime goes to that drop-in (RUNTIME_DROP_IN_CONFIG_HOST_PATH
  on the host) and the config gains an `imports` entry for it; set empty, the runtime is written
  into the config itself;
- the runtime: CONTAINERD_RUNTIME_CLASS (`nvidia`), runc v2 with BinaryName the toolkit's
  nvidia-container-runtime under its install dir (ROOT), in the CRI plugin's table of the config's
  version (2: io.containerd.grpc.v1.cri, 3: io.containerd.cri.v1.runtime).

CRI-O (RUNTIME=crio) is played by `sim/standins/toolkitcrio.py`. Not played: Docker's daemon.json, the NRI
plugin, restarting containerd and the toolkit's cleanup on containerd (`k3s_start` plays the one
distribution step a test needs: k3s and RKE2 regenerate config.toml from their template).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from gpu_operator.sim.realnode.edits import InjectionError
from gpu_operator.sim.standins import identity as ident
from gpu_operator.sim.standins import toolkitcrio
from gpu_operator.sim.standins.toolkitfiles import Mounts, channel, host_path, source, to_toml, write_toml

__all__ = [
    "Mounts",
    "ToolkitStandIn",
    "channel",
    "configure",
    "distribution_start",
    "host_path",
    "k3s_start",
    "to_toml",
    "toolkit_apps",
    "unconfigure",
]

log = logging.getLogger("gpu_operator.sim.standins")
TABLES = {
    2: ("plugins", "io.containerd.grpc.v1.cri", "containerd", "runtimes"),
    3: ("plugins", "io.containerd.cri.v1.runtime", "containerd", "runtimes"),
}


def _runtime(env: dict[str, str]) -> dict[str, Any]:
    root = env.get("ROOT") or "/usr/local/nvidia"
    return {
        "runtime_type": "io.containerd.runc.v2",
        "options": {"BinaryName": f"{root}/toolkit/nvidia-container-runtime"},
    }


def _put(doc: dict[str, Any], version: int, name: str, runtime: dict[str, Any]) -> None:
    table = doc
    for key in TABLES[3 if version >= 3 else 2]:
        table = table.setdefault(key, {})
    table[name] = runtime


def configure(env: dict[str, str], mounts: Mounts, tree: Path) -> list[str]:
    """Register the nvidia runtime as a toolkit container with this env and these hostPath mounts
    would on the host whose root is `tree`; returns the host paths written."""
    runtime = env.get("RUNTIME", "containerd")
    if runtime == "crio":
        return toolkitcrio.configure(env, mounts, tree)
    if runtime != "containerd":
        raise InjectionError(f"the toolkit stand-in plays containerd and crio, not RUNTIME={runtime}")
    config = env.get("RUNTIME_CONFIG") or env.get("CONTAINERD_CONFIG") or "/etc/containerd/config.toml"
    config_host = host_path(mounts, config)
    doc = source(tree, mounts, env, config_host)
    version = int(doc.get("version", 2)) if isinstance(doc.get("version", 2), int) else 2
    doc.setdefault("version", version)
    name = env.get("CONTAINERD_RUNTIME_CLASS") or "nvidia"
    written: list[str] = []
    drop_in = env.get("RUNTIME_DROP_IN_CONFIG", "/etc/containerd/conf.d/99-nvidia.toml")
    if drop_in:
        extra: dict[str, Any] = {"version": version}
        _put(extra, version, name, _runtime(env))
        landing = host_path(mounts, drop_in)
        if landing is not None:
            write_toml(tree, landing, extra)
            written.append(landing)
        imported = env.get("RUNTIME_DROP_IN_CONFIG_HOST_PATH") or drop_in
        doc["imports"] = [*[i for i in doc.get("imports", []) if i != imported], imported]
    else:
        _put(doc, version, name, _runtime(env))
    if config_host is not None:
        write_toml(tree, config_host, doc)
        written.append(config_host)
    return written


def unconfigure(env: dict[str, str], mounts: Mounts, tree: Path) -> list[str]:
    """What the toolkit's shutdown (SIGTERM: its pod stops) changes on the host: played for CRI-O
    (`toolkitcrio.cleanup`); containerd's is not played. Returns the host paths changed."""
    if env.get("RUNTIME", "containerd") == "crio":
        return toolkitcrio.cleanup(env, mounts, tree)
    return []


def distribution_start(tree: Path, distribution: str) -> str:
    """What a distribution does to containerd's config when it (re)starts, where it does anything:
    k3s and RKE2 regenerate config.toml from their template, MicroK8s renders args/containerd.toml
    from args/containerd-template.toml. Returns the file it read, or ""."""
    if distribution in ("k3s", "rke2"):
        return k3s_start(tree, f"/var/lib/rancher/{distribution}/agent/etc/containerd")
    if distribution == "microk8s":
        args = tree / "var/snap/microk8s/current/args"
        (args / "containerd.toml").write_text((args / "containerd-template.toml").read_text())
        return "/var/snap/microk8s/current/args/containerd-template.toml"
    return ""


def k3s_start(tree: Path, containerd_dir: str) -> str:
    """What k3s (and RKE2) do to containerd's config at start: config.toml is regenerated from
    config-v3.toml.tmpl, else config.toml.tmpl, where one exists (`{{ template "base" . }}` stands for
    the config k3s would write itself: here, the one on the host). Returns the template used, or ""."""
    base = tree / containerd_dir.lstrip("/")
    for name in ("config-v3.toml.tmpl", "config.toml.tmpl"):
        template = base / name
        if template.is_file():
            generated = base / "config.toml"
            own = generated.read_text() if generated.is_file() else ""
            generated.write_text(template.read_text().replace('{{ template "base" . }}', own))
            return f"{containerd_dir}/{name}"
    return ""


class ToolkitStandIn:
    """The container toolkit on kwok nodes of a distribution's shape (a `podwatch.Player` per toolkit
    DaemonSet, `app` its name): where its pod runs, the runtime is registered in the node's own host
    tree (`faults.NodeHosts`) through the pod's env and hostPath mounts, once per pod; when no pod of
    it runs there any more, the last one's shutdown is played (`unconfigure`). Nodes of the stock
    shapes keep their shape's tree as it is (the thousands of nodes of a bench build no tree)."""

    field_manager = "nvidia-container-toolkit"
    identity = ident.NO_API  # it writes the host's runtime config only

    def __init__(self, app: str, hosts: Path) -> None:
        from gpu_operator.sim.hardware.faults import NodeHosts

        self.app, self.hosts = app, NodeHosts(hosts)
        self.done: dict[str, Any] = {}  # node -> the pod (PodView) whose writes are made

    async def start(self, client: Any) -> None:
        return None

    async def sync(self, client: Any, node: str, view: Any, pods: list[Any]) -> float | None:
        from gpu_operator.sim.hardware.faults import node_host_spec
        from gpu_operator.sim.realnode.realspec import distribution

        running = sorted((p for p in pods if p.running), key=lambda p: (p.started, p.name))
        if view is None or view.shape is None or distribution(view.shape) == "containerd":
            self.done.pop(node, None)
            return None
        last = self.done.pop(node, None)
        pod = running[-1] if running else None
        if pod is None and last is not None:  # its pod stopped: the toolkit's shutdown
            await self._play(node, "shutdown", unconfigure, last, node_host_spec(view.shape.name))
        elif pod is not None and (last is None or last.uid != pod.uid):
            await self._play(node, "setup", configure, pod, node_host_spec(view.shape.name))
        if pod is not None:
            self.done[node] = pod
        return None

    async def _play(self, node: str, step: str, action: Any, pod: Any, spec: Any) -> None:
        tree = self.hosts.faults(node, spec).root
        try:
            changed = await asyncio.to_thread(action, pod.env, pod.host_mounts, tree)
        except (InjectionError, ValueError, OSError) as err:
            log.warning("node %s: container toolkit %s: %s", node, step, err)
        else:
            log.info("node %s: container toolkit %s changed %s", node, step, ", ".join(changed) or "nothing")


def toolkit_apps() -> list[str]:
    """The toolkit DaemonSets' names (their pods' `app`): the stock one and one per containerd
    distribution and CRI-O (render/states/container_toolkit.py); Docker's is not played."""
    from gpu_operator.render.distributions import DISTRIBUTIONS, STOCK
    from gpu_operator.render.states.container_toolkit import OPERAND

    assert OPERAND.daemonset is not None
    base = OPERAND.daemonset.name
    groups = [
        g
        for d in DISTRIBUTIONS.values()
        if d.runtime in ("containerd", "crio") and d.name != STOCK
        for g in ([d.name, f"{d.name}-v3"] if d.config_v3 else [d.name])
    ]
    return [base, *(f"{base}-{g}" for g in groups)]
