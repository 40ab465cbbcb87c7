"""CDI requests resolved against the host tree's CDI specs, as the `nvidia` runtime does in CDI mode.

From the Container Device Interface specification (cncf-tags/container-device-interface,
SPEC.md): spec files (YAML or JSON) in /etc/cdi and /var/run/cdi, the later directory winning for
the same device; each has `kind` (`vendor/class`), `devices` (each a `name` and its
`containerEdits`) and spec-wide `containerEdits` applied once with any of its devices. A request
is a fully qualified name `vendor/class=name`. Edits: `env` (K=V), `deviceNodes` (`path`,
optional `hostPath`, `major`, `minor`), `mounts` (`hostPath`, `containerPath`, `options`), `hooks`.
Host paths are read in the host tree. Hooks (nvidia-ctk's create-symlinks, update-ldcache, ...)
are not run here; they are counted in the summary. An unresolvable name fails the container.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gpu_operator.sim.hardware import devnodes
from gpu_operator.sim.realnode.edits import Edits, InjectionError

SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
SPEC_SUFFIXES = (".yaml", ".yml", ".json")


def load(host_root: Path) -> tuple[dict[str, tuple[dict[str, Any], dict[str, Any]]], list[str]]:
    """Qualified name -> (device, spec) over the tree's spec dirs, and the problems of files skipped."""
    found: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    problems: list[str] = []
    for directory in SPEC_DIRS:
        base = host_root / directory.lstrip("/")
        for path in sorted(base.iterdir()) if base.is_dir() else []:
            if path.suffix not in SPEC_SUFFIXES:
                continue
            where = f"{directory}/{path.name}"
            try:
                spec = yaml.safe_load(path.read_text())
            except yaml.YAMLError as err:
                problems.append(f"{where}: not YAML/JSON ({err.__class__.__name__})")
                continue
            kind = spec.get("kind") if isinstance(spec, dict) else None
            if not isinstance(kind, str) or "/" not in kind:
                problems.append(f"{where}: `kind` must be vendor/class, e.g. nvidia.com/gpu")
                continue
            for device in spec.get("devices") or []:
                if isinstance(device, dict) and device.get("name"):
                    found[f"{kind}={device['name']}"] = (device, spec)
    return found, problems


def _node(host_root: Path, entry: dict[str, Any], where: str) -> tuple[Path, str, int, int]:
    path = entry.get("path")
    if not isinstance(path, str) or not path.startswith("/"):
        raise InjectionError(f"{where}: deviceNodes[].path must be an absolute path")
    host = host_root / str(entry.get("hostPath") or path).lstrip("/")
    ids = devnodes.char_device(host)
    if entry.get("major") is not None and entry.get("minor") is not None:
        ids = (int(entry["major"]), int(entry["minor"]))
    if ids is None:
        raise InjectionError(f"{where}: device node {entry.get('hostPath') or path} is missing on the host")
    return host, path, ids[0], ids[1]


def _apply(edits: Edits, host_root: Path, container_edits: dict[str, Any], where: str) -> int:
    """Add one containerEdits block; returns how many hooks it lists (not run here)."""
    edits.env.extend(str(item) for item in container_edits.get("env") or [])
    for entry in container_edits.get("deviceNodes") or []:
        node = _node(host_root, entry, where)
        if node[1] not in {d[1] for d in edits.devices}:
            edits.devices.append(node)
    for mount in container_edits.get("mounts") or []:
        host = host_root / str(mount.get("hostPath", "")).lstrip("/")
        if not host.exists():
            raise InjectionError(f"{where}: mount source {mount.get('hostPath')} is missing on the host")
        edits.mounts.append((host, str(mount["containerPath"])))
    return len(container_edits.get("hooks") or [])


def edits(host_root: Path, names: list[str]) -> Edits:
    """The edits for CDI requests `names`, or an error naming the unresolvable ones."""
    known, problems = load(host_root)
    missing = [name for name in names if name not in known]
    if missing:
        have = ", ".join(sorted(known)) or "none"
        skipped = f"; skipped spec files: {'; '.join(problems)}" if problems else ""
        raise InjectionError(f"unresolvable CDI devices {', '.join(missing)} (known: {have}){skipped}")
    out = Edits(mode="cdi")
    hooks = 0
    seen_specs: list[int] = []
    for name in names:
        device, spec = known[name]
        if id(spec) not in seen_specs:
            seen_specs.append(id(spec))
            hooks += _apply(out, host_root, spec.get("containerEdits") or {}, f"CDI spec of {spec['kind']}")
        hooks += _apply(out, host_root, device.get("containerEdits") or {}, f"CDI device {name}")
    out.mode = f"cdi (hooks not run: {hooks})" if hooks else "cdi"
    return out
