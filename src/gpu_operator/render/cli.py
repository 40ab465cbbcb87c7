"""Commands of the render area: `render` (offline objects) and `crds generate|apply|print`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

crds_app = typer.Typer(help="The CustomResourceDefinitions generated from the API models.", no_args_is_help=True)


def _repo_root() -> Path:
    # src/gpu_operator/render/cli.py -> repository root
    return Path(__file__).resolve().parents[3]


@crds_app.command("generate")
def crds_generate(
    chart_dir: Annotated[
        Path | None, typer.Option(help="Helm chart CRD folder (default: deployments/gpu-operator/crds).")
    ] = None,
    check: Annotated[bool, typer.Option("--check", help="Only report stale files; exit 1 if any.")] = False,
) -> None:
    """Regenerate the CRDs into the package and the Helm chart."""
    from gpu_operator.api import crdgen

    targets = [crdgen.package_dir(), chart_dir or crdgen.chart_dir(_repo_root())]
    if check:
        stale = crdgen.stale(targets)
        for path in stale:
            typer.echo(f"stale: {path} (run `gpu-operator crds generate`)")
        raise typer.Exit(1 if stale else 0)
    for path in crdgen.write(targets):
        typer.echo(f"wrote {path}")


@crds_app.command("apply")
def crds_apply(
    kubeconfig: Annotated[str | None, typer.Option(
        envvar="KUBECONFIG", help="Kubeconfig file; in-cluster credentials when unset.")] = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait until every CRD is Established.")] = 60.0,
) -> None:
    """Apply the packaged CRDs (server-side apply, idempotent) and wait until they are served.
    The Helm chart's pre-install/pre-upgrade hook runs this."""
    from lightkube import Client, KubeConfig

    from gpu_operator.kube.crds import apply_crds

    config = KubeConfig.from_file(kubeconfig) if kubeconfig else KubeConfig.from_env()
    with Client(config) as client:
        for name in apply_crds(client, timeout=timeout):
            typer.echo(f"applied {name} (Established)")


@crds_app.command("print")
def crds_print() -> None:
    """Print every CRD as one multi-document YAML stream."""
    from gpu_operator.api import crdgen

    typer.echo("---\n".join(crdgen.render_yaml(crd) for crd in crdgen.crds().values()), nl=False)


def render_command(
    policy: Annotated[
        Path | None, typer.Option("--policy", exists=True, dir_okay=False, help="ClusterPolicy YAML file.")
    ] = None,
    nvidiadriver: Annotated[
        Path | None,
        typer.Option("--nvidiadriver", exists=True, dir_okay=False,
                     help="NVIDIADriver YAML file (one or more documents): render their driver DaemonSets, "
                     "one per node pool, instead of the ClusterPolicy's states (--policy then only supplies "
                     "host paths and the validator image)."),
    ] = None,
    nodes: Annotated[
        Path | None,
        typer.Option("--nodes", exists=True, dir_okay=False, help="Node manifests (YAML list or stream)."),
    ] = None,
    shape: Annotated[list[str] | None, typer.Option("--shape", help="Fake nodes NAME[:COUNT] (repeatable).")] = None,
    namespace: Annotated[str, typer.Option("--namespace", help="Operator namespace.")] = "gpu-operator",
    output: Annotated[str, typer.Option("-o", "--output", help="yaml or json.")] = "yaml",
    k8s_version: Annotated[str, typer.Option("--k8s-version", help="Kubernetes version.")] = "1.36.0",
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
    Needs --policy, --nvidiadriver, or both."""
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
    )
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    """Add this area's commands to the top-level app."""
    app.command("render")(render_command)
    app.add_typer(crds_app, name="crds")
