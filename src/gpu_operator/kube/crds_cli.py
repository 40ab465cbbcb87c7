"""`gpu-operator crds generate|apply|print`: the CRDs generated from the API models, and their
apply (the chart's pre-install/pre-upgrade hook). Beside kube/crds.py, the room that talks to the
apiserver."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpu_operator.kube.options import Kubeconfig

crds_app = typer.Typer(
    help="The CustomResourceDefinitions generated from the API models.", no_args_is_help=True
)


def _repo_root() -> Path:
    # src/gpu_operator/kube/crds_cli.py -> repository root
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
    kubeconfig: Kubeconfig = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait until every CRD is Established.")] = 60.0,
    node_feature: Annotated[
        bool,
        typer.Option(
            "--node-feature/--no-node-feature",
            help="Also create NFD's NodeFeature CRD (nodefeatures.nfd.k8s-sigs.io) where it is absent: GPU "
            "feature discovery publishes its labels there. One that exists is left as it is. "
            "The chart turns this off when NFD runs in the cluster (nfd.enabled=false).",
        ),
    ] = True,
    release: Annotated[
        str | None,
        typer.Option(
            "--release",
            metavar="NAMESPACE/NAME",
            help="The Helm release running this (the chart's hook passes its own). A CRD whose Helm "
            "ownership marks name another release is left as it is and reported; without this "
            "option every CRD with Helm's marks counts as another release's.",
        ),
    ] = None,
) -> None:
    """Apply the packaged CRDs (server-side apply, idempotent) and wait until they are served.
    The Helm chart's pre-install/pre-upgrade hook runs this."""
    from gpu_operator.kube.crdowners import LeftCRD, Release
    from gpu_operator.kube.crds import apply_crds
    from gpu_operator.kube.reach import sync_client

    try:
        ours = Release.parse(release) if release is not None else None
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--release") from None
    with sync_client(
        kubeconfig, "apply the CRDs", needs="it needs get/create/patch on customresourcedefinitions"
    ) as client:
        kept: list[str] = []
        left: list[LeftCRD] = []
        names = apply_crds(
            client, timeout=timeout, node_feature=node_feature, kept=kept, release=ours, left=left
        )
        owned = {crd.name: crd for crd in left}
        for name in names:
            if name in owned:
                typer.echo(owned[name].sentence())
            else:
                typer.echo(
                    f"left {name} as it was (it exists; Established)"
                    if name in kept
                    else f"applied {name} (Established)"
                )


@crds_app.command("print")
def crds_print() -> None:
    """Print every CRD as one multi-document YAML stream."""
    from gpu_operator.api import crdgen

    typer.echo("---\n".join(crdgen.render_yaml(crd) for crd in crdgen.crds().values()), nl=False)


def register(app: typer.Typer) -> None:
    """Add this area's commands to the top-level app."""
    app.add_typer(crds_app, name="crds")
