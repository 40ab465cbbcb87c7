"""What the real node's `nvidia` runtime adds to a container (see `toolkit`, `cdi`, `nvruntime`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


class InjectionError(RuntimeError):
    """The container asked for something the toolkit would refuse; the runtime fails its creation."""


@dataclass
class Edits:
    """What the runtime adds to a container's OCI config."""

    mounts: list[tuple[Path, str]] = field(default_factory=list)  # (host file, container path)
    devices: list[tuple[Path, str, int, int]] = field(default_factory=list)  # (host node, path, major, minor)
    env: list[str] = field(default_factory=list)
    mode: str = "none"  # none (untouched), legacy, cdi
