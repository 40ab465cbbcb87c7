"""`gpu-operator diff [--policy FILE] [--values F]`: the command line of admin/diff.py. The chart's
values are turned into a ClusterPolicy by a function the top-level cli hands in (install/, which
renders the chart; this room does not import it)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from gpu_operator.kube.options import Kubeconfig

PolicyFromValues = Callable[[list[Path], list[str], str], dict[str, Any]]
EXIT_SAME, EXIT_DIFFERENT, EXIT_ERROR = 0, 1, 2


def _fail(message: str) -> typer.Exit:
    typer.echo("error: " + " ".join(message.split()), err=True)
    return typer.Exit(EXIT_ERROR)


def _read_policy(path: Path) -> dict[str, Any]:
    import yaml

    try:
        loaded = yaml.safe_load(path.read_text())
    except OSError as err:
        raise _fail(
            f"--policy {path}: cannot read it ({err.strerror}): give the path of a ClusterPolicy manifest"
        ) from err
    except yaml.YAMLError as err:
        raise _fail(f"--policy {path}: not YAML ({err}): give a ClusterPolicy manifest") from err
    if not isinstance(loaded, dict):
        raise _fail(f"--policy {path}: not a mapping: give a ClusterPolicy manifest (apiVersion, kind, spec)")
    return loaded


def register(app: typer.Typer, policy_from_values: PolicyFromValues) -> None:
    """Add `diff` to the top-level app."""

    @app.command("diff")
    def diff(
        policy: Annotated[
            Path | None,
            typer.Option(
                "--policy",
                dir_okay=False,
                help="A proposed ClusterPolicy manifest; default: the cluster's active ClusterPolicy.",
            ),
        ] = None,
        values: Annotated[
            list[Path] | None,
            typer.Option(
                "--values",
                "-f",
                dir_okay=False,
                help="Chart values files (repeatable, later ones win): the ClusterPolicy the chart renders from "
                "them is the proposed one.",
            ),
        ] = None,
        set_values: Annotated[
            list[str] | None,
            typer.Option("--set", help="KEY=VALUE on top of the --values files, as `helm install --set`."),
        ] = None,
        namespace: Annotated[
            str, typer.Option("--namespace", envvar="OPERATOR_NAMESPACE", help="The operator's namespace.")
        ] = "gpu-operator",
        operator_deployment: Annotated[
            str,
            typer.Option(
                "--operator-deployment",
                help="The operator's Deployment in --namespace, whose *_IMAGE variables the operator renders "
                "with (the chart's defaults where it is not found).",
            ),
        ] = "gpu-operator",
        kubeconfig: Kubeconfig = None,
    ) -> None:
        """Show what the operator would create, change and delete for the active ClusterPolicy, or
        a proposed one (--policy, or the one the chart renders from --values/--set), as `kubectl
        diff` shows it: one unified diff per object, LIVE/ against MERGED/. The change of each
        object is the apiserver's answer to the operator's server-side apply sent with dryRun=All;
        nothing is written. Exit 0: no difference; 1: differences; 2: an error. docs/diff.md."""
        from gpu_operator.admin.diff import DiffError, plan
        from gpu_operator.kube.reach import run_kube

        if policy is not None and (values or set_values):
            raise _fail("--policy and --values/--set both name a proposed policy: give one of them")
        proposed: dict[str, Any] | None = None
        if policy is not None:
            proposed = _read_policy(policy)
        elif values or set_values:
            try:
                proposed = policy_from_values(list(values or []), list(set_values or []), namespace)
            except ValueError as err:
                raise _fail(str(err)) from err
        try:
            diffs = run_kube(
                kubeconfig,
                "compare the desired objects with the cluster's",
                lambda kube: plan(
                    kube, proposed, namespace=namespace, deployment=operator_deployment, environ=os.environ
                ),
            )
        except DiffError as err:
            raise _fail(str(err)) from err
        for one in diffs:
            typer.echo(one.text(), nl=False)
        raise typer.Exit(EXIT_DIFFERENT if diffs else EXIT_SAME)
