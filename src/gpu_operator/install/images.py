"""`gpu-operator images`: the chart rendered with a user's values (sim/plane/helm.py), every operand our
renderer makes of it (render/images.py), then the image list, the mirror values or the copy
commands (render/mirror.py)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpu_operator import shapes as node_shapes
from gpu_operator.render.clitext import InputError, load_nodes
from gpu_operator.render.images import (
    ImageUse,
    PolicyError,
    image_uses,
    operand_objects,
    operator_container,
    operator_images,
)
from gpu_operator.render.mirror import (
    MirrorError,
    check_mirror,
    check_targets,
    copy_commands,
    mirror_values,
    under,
)
from gpu_operator.sim.plane.helm import (
    ChartRejected,
    HelmInstallError,
    chart_values,
    merge,
    template,
    user_layers,
)

# The nodes an install is listed for when none are given: the driver's image is published per OS
# (`<version>-ubuntu22.04`), so its tag depends on the nodes; every other image does not.
DEFAULT_SHAPES = ("dgx-h100",)
# Policy fields the chart writes under another values key (templates/_clusterpolicy.tpl)
RENAMED_KEYS = {"driver.upgradePolicy.podDeletion": "driver.upgradePolicy.gpuPodDeletion"}


@dataclass(frozen=True)
class Install:
    """What one set of values installs: the merged values, the chart's objects and the operands'."""

    values: dict[str, Any]
    chart: list[dict[str, Any]]
    operands: list[dict[str, Any]]

    def uses(self) -> list[ImageUse]:
        return image_uses(self.chart + self.operands)

    def images(self) -> list[str]:
        return sorted({use.image for use in self.uses()})


def render_install(layers: list[dict[str, Any]], nodes: list[dict[str, Any]], namespace: str) -> Install:
    """The chart rendered with `layers` (Helm's order) and the operands it makes on `nodes`."""
    user: dict[str, Any] = {}
    for layer in layers:
        user = merge(user, layer)
    chart = template(user, namespace=namespace)
    return Install(merge(chart_values(), user), chart, operand_objects(chart, nodes, namespace))


def values_key(err: PolicyError) -> str:
    """The values key the chart copies into the policy field `err` names (spec.driver.x -> driver.x)."""
    key = err.path.removeprefix("spec.")
    return RENAMED_KEYS.get(key, key)


def mirror_text(install: Install, mirror: str, argv: list[str]) -> str:
    operator = operator_container(install.chart) or {}
    values = mirror_values(
        install.values, mirror, str(operator.get("image", "")), operator_images(install.chart)
    )
    header = (
        f"# Every image of this install from {mirror} (`gpu-operator images {' '.join(argv)}`).\n"
        "# Pass it after your own values: helm install ... -f your-values.yaml -f this-file.yaml\n"
    )
    return header + yaml.safe_dump(values, sort_keys=True, width=120)


def not_mirrored(install: Install, mirror: str) -> list[ImageUse]:
    return [use for use in install.uses() if not under(use.image, mirror)]


def listing(install: Install, wide: bool) -> str:
    if not wide:
        return "".join(f"{image}\n" for image in install.images())
    lines = []
    for image in install.images():
        users = sorted({use.where() for use in install.uses() if use.image == image})
        lines.append(f"{image}\n" + "".join(f"    {where}\n" for where in users))
    return "".join(lines)


def run_images(
    *,
    values: list[Path],
    sets: list[str],
    nodes: Path | None,
    shapes: list[str],
    namespace: str,
    mirror: str | None,
    copy: bool,
    wide: bool,
    argv: list[str],
) -> int:
    try:
        if copy and not mirror:
            raise InputError("--copy-commands needs --mirror REGISTRY (where the images are copied to)")
        target = check_mirror(mirror) if mirror else None
        layers = user_layers(values, sets)
        cluster = load_nodes(nodes) if nodes else []
        cluster += node_shapes.nodes(shapes or ([] if nodes else list(DEFAULT_SHAPES)), settled=True)
        install = render_install(layers, cluster, namespace)
        if target is None:
            sys.stdout.write(listing(install, wide))
            return 0
        if copy:
            sys.stdout.write("".join(f"{line}\n" for line in copy_commands(install.images(), target)))
            return 0
        check_targets(install.images(), target)
        text = mirror_text(install, target, argv)
        # the check that the values do what they say: the same install rendered with them on top
        left = not_mirrored(render_install([*layers, yaml.safe_load(text)], cluster, namespace), target)
    except (InputError, MirrorError, node_shapes.ShapeError) as err:
        return _fail(str(err))
    except ChartRejected as err:
        given = (
            " ".join([*(f"--values {v}" for v in values), *(f"--set {s}" for s in sets)]) or "the defaults"
        )
        return _fail(f"the chart rejects these values ({given}): {err}")
    except HelmInstallError as err:
        return _fail(str(err))
    except PolicyError as err:
        return _fail(
            f"values key {values_key(err)} ({err.kind} {err.path}): {err.message}: fix it in your "
            "--values file or --set"
        )
    sys.stdout.write(text)
    for use in left:
        print(
            f"warning: {use.image} ({use.where()}) does not come from {target}: no values key names it "
            "(extraObjects?); point it at the mirror yourself",
            file=sys.stderr,
        )
    return 1 if left else 0


def _fail(message: str) -> int:
    print("error: " + " ".join(message.split()), file=sys.stderr)
    return 2
