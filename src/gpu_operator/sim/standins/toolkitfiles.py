"""The host files NVIDIA's container toolkit works on, as its pod reaches them: where a path of its
container lands on the host (its hostPath mounts), the config it starts from (its config sources)
and the TOML it writes (shared by `toolkitconfig`, containerd, and `toolkitcrio`, CRI-O)."""

from __future__ import annotations

import posixpath
import tomllib
from pathlib import Path
from typing import Any

DEFAULT_SOURCE = "command,file"

Mounts = tuple[tuple[str, str], ...]  # (path in the container, host path) of its hostPath mounts


def channel(pod: dict[str, Any]) -> tuple[dict[str, str], Mounts]:
    """The toolkit container's env and hostPath mounts in a rendered pod spec (`podwatch.PodView`
    reads the same of a running pod)."""
    ctr = pod["containers"][0]
    volumes = {v["name"]: v["hostPath"]["path"] for v in pod.get("volumes", []) if "hostPath" in v}
    return (
        {e["name"]: str(e["value"]) for e in ctr.get("env", []) if "value" in e},
        tuple(
            (m["mountPath"], volumes[m["name"]]) for m in ctr.get("volumeMounts", []) if m["name"] in volumes
        ),
    )


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
    rest = path[len(best[0]) :].lstrip("/")
    return posixpath.join(best[1], rest) if rest else best[1]


def _read(tree: Path, path: str | None) -> dict[str, Any] | None:
    if path is None:
        return None
    file = tree / path.lstrip("/")
    return tomllib.loads(file.read_text()) if file.is_file() else None


def source(tree: Path, mounts: Mounts, env: dict[str, str], config_host: str | None) -> dict[str, Any]:
    """The config the toolkit starts from: the first of its config sources (RUNTIME_CONFIG_SOURCES,
    else RUNTIME_CONFIG_SOURCE, else `command,file`) that gives one; {} where none does."""
    sources = env.get("RUNTIME_CONFIG_SOURCES") or env.get("RUNTIME_CONFIG_SOURCE") or DEFAULT_SOURCE
    for entry in sources.split(","):
        kind, _, where = entry.strip().partition("=")
        if kind != "file":
            continue  # `command`: no containerd to ask in a tree
        found = _read(tree, host_path(mounts, where) if where else config_host)
        if found is not None:
            return found
    return {}


def write_toml(tree: Path, path: str, doc: dict[str, Any]) -> None:
    """Write `doc` at the host path; an empty document removes the file (as the toolkit's flush does)."""
    file = tree / path.lstrip("/")
    text = to_toml(doc)
    if not text:
        file.unlink(missing_ok=True)
        return
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(text)


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
