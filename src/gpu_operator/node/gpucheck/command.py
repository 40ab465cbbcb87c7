"""`gpu-operator node gpu-check`: the command line of the check (docs/real-hosts.md)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer


def gpu_check(
    host_root: Annotated[
        str, typer.Option("--host-root", help="The host's root: / on the GPU machine itself, or a host tree.")
    ] = "/",
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="Directory for report.json and the validator's status files "
            "(default: /tmp/gpu-check-<UTC time>).",
        ),
    ] = None,
    search_path: Annotated[
        list[str] | None,
        typer.Option(
            help="Extra directory for the probe and the validator to look for nvidia-smi in "
            "(repeatable), as doctor's --search-path and DRIVER_SEARCH_PATHS."
        ),
    ] = None,
) -> None:
    """Run our node agents read-only on this host beside nvidia-smi, NVML and the CUDA driver, and
    compare. Exit 0: no defect; 1: a step failed or contradicts NVIDIA's tools; 3: no NVIDIA GPU found."""
    from rich.console import Console

    from gpu_operator.node.gpucheck.check import run_check
    from gpu_operator.node.gpucheck.report import render, write_json

    if not Path(host_root).is_dir():
        raise typer.BadParameter(f"--host-root {host_root}: no such directory")
    report = run_check(host_root, out, search_dirs=tuple(search_path or ()))
    write_json(report)
    render(report, Console(file=sys.stdout, width=None if sys.stdout.isatty() else 160))  # logs: wide rows
    raise typer.Exit(report.exit_code)
