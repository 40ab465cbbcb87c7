"""The ClusterPolicy a set of chart values makes: the chart rendered with them (sim/plane/helm.py, as
`gpu-operator images --values` renders it), its ClusterPolicy picked out. `gpu-operator diff
--values` compares that policy's objects with the cluster's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpu_operator.sim.plane.helm import ChartRejected, HelmInstallError, merge, template, user_layers


def policy_from_values(files: list[Path], sets: list[str], namespace: str) -> dict[str, Any]:
    """The chart's ClusterPolicy for these `--values` files and `--set` pairs (Helm's order);
    ValueError names what is wrong with them."""
    given = " ".join([*(f"--values {f}" for f in files), *(f"--set {s}" for s in sets)])
    try:
        user: dict[str, Any] = {}
        for layer in user_layers(files, sets):
            user = merge(user, layer)
        chart = template(user, namespace=namespace)
    except ChartRejected as err:
        raise ValueError(f"the chart rejects these values ({given}): {err}") from err
    except HelmInstallError as err:
        raise ValueError(str(err)) from err
    policies = [o for o in chart if o.get("kind") == "ClusterPolicy"]
    if not policies:
        raise ValueError(
            f"the chart renders no ClusterPolicy with these values ({given}): "
            "the chart makes one only when no GPUCluster takes its place (gpuCluster.deployCR: false)"
        )
    return policies[0]
