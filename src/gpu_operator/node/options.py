"""Options and helpers the node commands share (node/cli.py, node/vfio/cli.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

HostRoot = Annotated[
    str | None,
    typer.Option(
        "--host-root",
        envvar="GPU_OPERATOR_HOST_ROOT",
        help="Directory holding the host's root file system (default: /host when it exists, else /).",
    ),
]
WorkloadOption = Annotated[
    str | None,
    typer.Option(
        "--workload-config",
        help="The node's GPU workload: container, vm-passthrough or vm-vgpu (default: the node label, else inferred from the host).",
    ),
]


def host_fs(host_root: str | None) -> Any:
    from gpu_operator.node.host.hostfs import HostFS

    root = host_root or ("/host" if Path("/host").is_dir() else "/")
    if not Path(root).is_dir():
        raise typer.BadParameter(f"--host-root {root}: no such directory")
    return HostFS(root)
