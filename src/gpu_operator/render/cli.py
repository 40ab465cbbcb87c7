"""Commands of the render area: `render` (offline objects)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def render_command(
    policy: Annotated[
        Path | None, typer.Option("--policy", exists=True, dir_okay=False, help="ClusterPolicy YAML file.")
    ] = None,
    nvidiadriver: Annotated[
        Path | None,
        typer.Option(
            "--nvidiadriver",
            exists=True,
            dir_okay=False,
            help="NVIDIADriver YAML file (one or more documents): render their driver DaemonSets, "
            "one per node pool, instead of the ClusterPolicy's states (--policy then only supplies "
            "host paths and the validator image).",
        ),
    ] = None,
    gpucluster: Annotated[
        Path | None,
        typer.Option(
            "--gpucluster",
            exists=True,
            dir_okay=False,
            help="GPUCluster YAML file: render the DRA stack's four states (DRA driver, DCGM, DCGM "
            "exporter, DRA validation) instead of a ClusterPolicy's.",
        ),
    ] = None,
    resource_api: Annotated[
        str,
        typer.Option(
            "--resource-api",
            help="With --gpucluster: the resource.k8s.io version the apiserver "
            "serves (v1, v1beta2, v1beta1; none = DRA not served).",
        ),
    ] = "v1",
    nodes: Annotated[
        Path | None,
        typer.Option("--nodes", exists=True, dir_okay=False, help="Node manifests (YAML list or stream)."),
    ] = None,
    shape: Annotated[
        list[str] | None, typer.Option("--shape", help="Fake nodes NAME[:COUNT] (repeatable).")
    ] = None,
    namespace: Annotated[str, typer.Option("--namespace", help="Operator namespace.")] = "gpu-operator",
    output: Annotated[str, typer.Option("-o", "--output", help="yaml or json.")] = "yaml",
    k8s_version: Annotated[str, typer.Option("--k8s-version", help="Kubernetes version.")] = "1.37.0",
    openshift: Annotated[bool, typer.Option("--openshift", help="Render for OpenShift.")] = False,
    as_labelled: Annotated[
        bool,
        typer.Option(
            "--as-labelled/--raw-nodes",
            help="Treat nodes with NFD GPU labels as nvidia.com/gpu.present=true, as the operator's "
            "node labelling would (default); --raw-nodes takes the labels as given.",
        ),
    ] = True,
) -> None:
    """Print every object of every state in apply order (offline: no cluster needed).
    Needs --policy, --nvidiadriver, both, or --gpucluster."""
    from gpu_operator.render.clitext import run_render

    code = run_render(
        policy=policy,
        nvidiadriver=nvidiadriver,
        nodes=nodes,
        shapes=list(shape or []),
        namespace=namespace,
        output=output,
        k8s_version=k8s_version,
        openshift=openshift,
        as_labelled=as_labelled,
        gpucluster=gpucluster,
        resource_api_version=resource_api,
    )
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    """Add this area's commands to the top-level app."""
    app.command("render")(render_command)
