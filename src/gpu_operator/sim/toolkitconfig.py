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

Not played: CRI-O and Docker configs, the NRI plugin, restarting containerd (`k3s_start` plays the
one distribution step a test needs: k3s and RKE2 regenerate config.toml from their template).
"""

from __future__ import annotations

import asyncio
import logging
import posixpath
import tomllib
from pathlib import Path
from typing import Any

from gpu_operator.sim.edits import InjectionError

log = logging.getLogger("gpu_operator.sim.standins")
DEFAULT_SOURCE = "command,file"
TABLES = {2: ("plugins", "io.containerd.grpc.v1.cri", "containerd", "runtimes"),
          3: ("plugins", "io.containerd.cri.v1.runtime", "containerd", "runtimes")}


Mounts = tuple[tuple[str, str], ...]  # (path in the container, host path) of its hostPath mounts


def channel(pod: dict[str, Any]) -> tuple[dict[str, str], Mounts]:
    """The toolkit container's env and hostPath mounts in a rendered pod spec (`podwatch.PodView`
    reads the same of a running pod)."""
    ctr = pod["containers"][0]
    volumes = {v["name"]: v["hostPath"]["path"] for v in pod.get("volumes", []) if "hostPath" in v}
    return ({e["name"]: str(e["value"]) for e in ctr.get("env", []) if "value" in e},
            tuple((m["mountPath"], volumes[m["name"]]) for m in ctr.get("volumeMounts", []) if m["name"] in volumes))


def host_path(mounts: Mounts, path: str) -> str | None:
    """Where a path of the container lands on the host: through the hostPath mount at the longest
    prefix of it; None when no hostPath mount holds it (the write stays in the container)."""
    best: tuple[str, str] | None = None
    for mount_path, host in mounts:
        target = mount_path.rstrip("/") or "/"
        holds = path == target or path.startswith(target.rstrip("/") + "/")
        if holds and (best is None or len(target) > len(best[0])):
            best = (target, host)
    if best is None:
        return None
    rest = path[len(best[0]):].lstrip("/")
    return posixpath.join(best[1], rest) if rest else best[1]


def _read(tree: Path, path: str | None) -> dict[str, Any] | None:
    if path is None:
        return None
    file = tree / path.lstrip("/")
    return tomllib.loads(file.read_text()) if file.is_file() else None


def _source(tree: Path, mounts: Mounts, env: dict[str, str], config_host: str | None) -> dict[str, Any]:
    for entry in (env.get("RUNTIME_CONFIG_SOURCE") or DEFAULT_SOURCE).split(","):
        kind, _, where = entry.strip().partition("=")
        if kind != "file":
            continue  # `command`: no containerd to ask in a tree
        found = _read(tree, host_path(mounts, where) if where else config_host)
        if found is not None:
            return found
    return {}


def _runtime(env: dict[str, str]) -> dict[str, Any]:
    root = env.get("ROOT") or "/usr/local/nvidia"
    return {"runtime_type": "io.containerd.runc.v2",
            "options": {"BinaryName": f"{root}/toolkit/nvidia-container-runtime"}}


def _put(doc: dict[str, Any], version: int, name: str, runtime: dict[str, Any]) -> None:
    table = doc
    for key in TABLES[3 if version >= 3 else 2]:
        table = table.setdefault(key, {})
    table[name] = runtime


def configure(env: dict[str, str], mounts: Mounts, tree: Path) -> list[str]:
    """Register the nvidia runtime as a toolkit container with this env and these hostPath mounts
    would on the host whose root is `tree`; returns the host paths written."""
    if env.get("RUNTIME", "containerd") != "containerd":
        raise InjectionError(f"the toolkit stand-in plays containerd only, not RUNTIME={env['RUNTIME']}")
    config = env.get("RUNTIME_CONFIG") or env.get("CONTAINERD_CONFIG") or "/etc/containerd/config.toml"
    config_host = host_path(mounts, config)
    doc = _source(tree, mounts, env, config_host)
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
            _write(tree, landing, extra)
            written.append(landing)
        imported = env.get("RUNTIME_DROP_IN_CONFIG_HOST_PATH") or drop_in
        doc["imports"] = [*[i for i in doc.get("imports", []) if i != imported], imported]
    else:
        _put(doc, version, name, _runtime(env))
    if config_host is not None:
        _write(tree, config_host, doc)
        written.append(config_host)
    return written


def _write(tree: Path, path: str, doc: dict[str, Any]) -> None:
    file = tree / path.lstrip("/")
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(to_toml(doc))


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    text = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'


def _key(key: str) -> str:
    return key if key.replace("_", "").replace("-", "").isalnum() else f'"{key}"'


def to_toml(doc: dict[str, Any], prefix: tuple[str, ...] = ()) -> str:
    """A TOML text of nested tables and plain values (what containerd's configs hold)."""
    lines = [f"{_key(k)} = {_value(v)}" for k, v in doc.items() if not isinstance(v, dict)]
    if prefix and lines:
        lines.insert(0, "[" + ".".join(_key(p) for p in prefix) + "]")
    out = "\n".join(lines) + ("\n" if lines else "")
    for key, value in doc.items():
        if isinstance(value, dict):
            out += to_toml(value, (*prefix, key))
    return out


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
    tree (`faults.NodeHosts`) through the pod's env and hostPath mounts, once per pod. Nodes of the
    stock shapes keep their shape's tree as it is (the thousands of nodes of a bench build no tree)."""

    field_manager = "nvidia-container-toolkit"

    def __init__(self, app: str, hosts: Path) -> None:
        from gpu_operator.sim.faults import NodeHosts

        self.app, self.hosts = app, NodeHosts(hosts)
        self.done: dict[str, str] = {}  # node -> uid of the pod whose writes are made

    async def start(self, client: Any) -> None:
        return None

    async def sync(self, client: Any, node: str, view: Any, pods: list[Any]) -> float | None:
        from gpu_operator.sim.faults import node_host_spec
        from gpu_operator.sim.realspec import distribution

        running = sorted((p for p in pods if p.running), key=lambda p: (p.started, p.name))
        if view is None or view.shape is None or not running or distribution(view.shape) == "containerd":
            self.done.pop(node, None)
            return None
        pod = running[-1]
        if self.done.get(node) == pod.uid:
            return None
        tree = self.hosts.faults(node, node_host_spec(view.shape.name)).root
        try:
            written = await asyncio.to_thread(configure, pod.env, pod.host_mounts, tree)
        except (InjectionError, ValueError) as err:
            log.warning("node %s: container toolkit: %s", node, err)
        else:
            log.info("node %s: container toolkit registered the nvidia runtime in %s", node, ", ".join(written))
        self.done[node] = pod.uid
        return None


def toolkit_apps() -> list[str]:
    """The toolkit DaemonSets' names (their pods' `app`): the stock one and one per containerd
    distribution (render/states/container_toolkit.py)."""
    from gpu_operator.render.distributions import DISTRIBUTIONS, STOCK
    from gpu_operator.render.states.container_toolkit import OPERAND

    assert OPERAND.daemonset is not None
    base = OPERAND.daemonset.name
    groups = [g for d in DISTRIBUTIONS.values() if d.runtime == "containerd" and d.name != STOCK
              for g in ([d.name, f"{d.name}-v3"] if d.config_v3 else [d.name])]
    return [base, *(f"{base}-{g}" for g in groups)]
