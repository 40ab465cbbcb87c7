"""Commands of the node area (registered on the top-level app by gpu_operator.cli)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add this area's commands to the top-level app."""
