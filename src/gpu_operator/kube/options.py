"""The option every command that reaches a cluster takes, spelled once (typer only: the client's
imports stay inside the commands, so `--help` needs none of them)."""

from __future__ import annotations

from typing import Annotated

import typer

Kubeconfig = Annotated[
    str | None, typer.Option(envvar="KUBECONFIG", help="Kubeconfig file; in-cluster credentials when unset.")
]
