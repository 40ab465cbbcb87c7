"""The `gpu-operator` command line: one typer app; each area registers its own commands."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

app = typer.Typer(
    name="gpu-operator",
    help=(
        "A drop-in Python implementation of the NVIDIA GPU Operator.\n\n"
        "Operator: `run`. Offline: `render`, `images` (what an install pulls; an air-gapped mirror's values). Against a cluster: `status`, `diff`, `upgrade`, `cleanup`, "
        "`must-gather`, `crds`. Node agents (run inside pods, or "
        "against a host-root directory): `node`, `validate`, `vfio-manage`, "
        "`node-status-exporter`, `doctor`. Simulator (a real control plane with fake GPU "
        "nodes): `sim`."
    ),
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _register_all() -> None:
    # Each area owns its commands; heavy imports stay inside the command bodies so that
    # `gpu-operator --help` and the node agents start fast.
    from gpu_operator.admin import cli as admin_cli
    from gpu_operator.controllers import cli as controllers_cli
    from gpu_operator.install import cli as install_cli
    from gpu_operator.kube import crds_cli
    from gpu_operator.node import cli as node_cli
    from gpu_operator.render import cli as render_cli
    from gpu_operator.sim.commands import cli as sim_cli
    from gpu_operator.statusview import cli as statusview_cli

    for module in (
        admin_cli,
        controllers_cli,
        render_cli,
        install_cli,
        crds_cli,
        node_cli,
        sim_cli,
        statusview_cli,
    ):
        module.register(app)
    # `diff --values`: the chart's ClusterPolicy (install/, which renders the chart) for admin/'s diff
    from gpu_operator.admin import diff_cli

    def policy_from_values(files: list[Path], sets: list[str], namespace: str) -> dict[str, Any]:
        from gpu_operator.install.policyvalues import policy_from_values as from_values

        return from_values(files, sets, namespace)

    diff_cli.register(app, policy_from_values)


_register_all()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
