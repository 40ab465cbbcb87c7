"""Commands of the install area: `images` (what an install pulls; a mirror's values and copy commands)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer


def images_command(
    values: Annotated[
        list[Path] | None,
        typer.Option(
            "--values",
            "-f",
            dir_okay=False,
            help="A values file of the chart, as `helm install -f` takes it (repeatable; later ones win).",
        ),
    ] = None,
    set_values: Annotated[
        list[str] | None,
        typer.Option("--set", help="KEY=VALUE on top of the files, as `helm install --set` (repeatable)."),
    ] = None,
    mirror: Annotated[
        str | None,
        typer.Option(
            "--mirror",
            metavar="REGISTRY",
            help="Print a values file instead that points every image at REGISTRY (a host, optionally with a "
            "path): the source registry's host is replaced, the path and tag or digest kept "
            "(nvcr.io/nvidia/k8s-device-plugin:v0.20.0 -> REGISTRY/nvidia/k8s-device-plugin:v0.20.0). "
            "Layer it after your own values.",
        ),
    ] = None,
    copy_commands: Annotated[
        bool,
        typer.Option(
            "--copy-commands",
            help="With --mirror: print one `skopeo copy --all --preserve-digests` per image (every "
            "architecture, digests kept) instead of the values.",
        ),
    ] = False,
    nodes: Annotated[
        Path | None,
        typer.Option(
            "--nodes",
            exists=True,
            dir_okay=False,
            help="Your nodes (`kubectl get nodes -o yaml`): the driver image is published per OS, so its tag "
            "follows the nodes' OS.",
        ),
    ] = None,
    shape: Annotated[
        list[str] | None,
        typer.Option(
            "--shape",
            help="Nodes as fake node shapes NAME[:COUNT] (repeatable; default dgx-h100, Ubuntu 22.04, "
            "when --nodes is not given either).",
        ),
    ] = None,
    namespace: Annotated[str, typer.Option("--namespace", help="The release's namespace.")] = "gpu-operator",
    wide: Annotated[
        bool, typer.Option("--wide", help="Under each image, the pods and containers that use it.")
    ] = False,
) -> None:
    """List every image an install of the chart (deployments/gpu-operator) with these values pulls.

    The chart is rendered with `helm template` (helm on PATH, or GPU_OPERATOR_HELM; as for a cluster that serves DRA).

    The operands are rendered from the ClusterPolicy, NVIDIADrivers and GPUCluster it makes, as the operator would.

    Listed: every container and init container image, every image handed to a pod in an env variable.

    Exit 2: a values file, --set or --mirror that cannot work, named with the fix. docs/install.md.
    """
    from gpu_operator.install.images import run_images

    raise typer.Exit(
        run_images(
            values=list(values or []),
            sets=list(set_values or []),
            nodes=nodes,
            shapes=list(shape or []),
            namespace=namespace,
            mirror=mirror,
            copy=copy_commands,
            wide=wide,
            argv=sys.argv[2:],
        )
    )


def register(app: typer.Typer) -> None:
    """Add this area's commands to the top-level app."""
    app.command("images")(images_command)
