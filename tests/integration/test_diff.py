"""`gpu-operator diff` on the real control plane with the operator reconciled: the same policy shows
nothing (exit 0); a changed one (an env, the device plugin's version, from --policy or from chart
values) names the DaemonSet and the changed field (exit 1) and writes nothing; a component turned
off is listed as deleted; a policy the API refuses is an error naming the field (exit 2).

The output is read as kubectl diff's: one block per object, `diff -u -N LIVE/<file> MERGED/<file>`,
the file named group.version.Kind.namespace.name; a changed line is read as YAML."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from lightkube import Client
from lightkube.resources.apps_v1 import DaemonSet

from gpu_operator.install.policyvalues import policy_from_values
from gpu_operator.sim.plane.controlplane import ControlPlane
from gpu_operator.sim.plane.images import DEFAULT_IMAGES
from gpu_operator.sim.plane.operator_process import OperatorProcess
from tests.support.status import reconciled

PLUGIN = "nvidia-device-plugin-daemonset"
EXPORTER = "nvidia-dcgm-exporter"
MPS = "nvidia-device-plugin-mps-control-daemon"


@dataclass
class Block:
    """One object of the output: its file name on both sides and its changed lines."""

    live: str
    merged: str
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)


@dataclass
class Diff:
    code: int
    out: str
    err: str

    def blocks(self) -> dict[str, Block]:
        """{file name: block}; a block's header names the same file on both sides."""
        found: dict[str, Block] = {}
        current: Block | None = None
        for line in self.out.splitlines():
            if line.startswith("diff -u -N "):
                live, merged = line.removeprefix("diff -u -N ").split(" ")
                current = Block(live.removeprefix("LIVE/"), merged.removeprefix("MERGED/"))
                assert current.live == current.merged, line
                found[current.live] = current
            elif line.startswith(("---", "+++", "@@")):
                continue
            elif current is not None and line.startswith("+"):
                current.added.append(line[1:])
            elif current is not None and line.startswith("-"):
                current.removed.append(line[1:])
        return found


def _yaml(lines: list[str]) -> list[Any]:
    """Each changed line as YAML (`  - name: X` -> [{'name': 'X'}], `image: I` -> {'image': 'I'})."""
    return [yaml.safe_load(line) for line in lines if line.strip()]


def _diff(control_plane: ControlPlane, namespace: str, *args: str) -> Diff:
    env = {
        **os.environ,
        **DEFAULT_IMAGES,
    }  # the operator process's images (a Deployment's env in a real install)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpu_operator.cli",
            "diff",
            "--namespace",
            namespace,
            "--kubeconfig",
            str(control_plane.admin_kubeconfig),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    return Diff(done.returncode, done.stdout, done.stderr)


def _file(namespace: str, kind: str, name: str) -> str:
    return f"apps.v1.{kind}.{namespace}.{name}"


def _policy_file(tmp_path: Path, spec: dict[str, Any], name: str = "proposed.yaml") -> Path:
    path = tmp_path / name
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "nvidia.com/v1",
                "kind": "ClusterPolicy",
                "metadata": {"name": "cluster-policy"},
                "spec": spec,
            }
        )
    )
    return path


def test_diff_shows_what_the_operator_would_change(
    kube: Client,
    control_plane: ControlPlane,
    fake_nodes: Callable[..., list[str]],
    start_operator: Callable[..., OperatorProcess],
    cluster_policies: Callable[..., str],
    operator_namespace: str,
    tmp_path: Path,
) -> None:
    fake_nodes("dgx-h100:1")
    # the chart's own ClusterPolicy, so that chart values can be compared with it below
    chart_policy = policy_from_values([], [], operator_namespace)
    spec = chart_policy["spec"]
    operator = start_operator()
    cluster_policies(spec)
    reconciled(kube, context=operator.log_text)
    plugin_version = kube.get(DaemonSet, PLUGIN, namespace=operator_namespace).metadata.resourceVersion

    same = _diff(control_plane, operator_namespace)
    assert (same.code, same.out) == (0, ""), same.err
    proposed_same = _diff(control_plane, operator_namespace, "--policy", str(_policy_file(tmp_path, spec)))
    assert (proposed_same.code, proposed_same.out) == (0, ""), proposed_same.err

    # an env on the device plugin: its DaemonSets (the plugin's and its MPS control daemon's, which
    # takes the plugin's env as upstream's does), and only they, change; the env is an added line
    env = {**spec, "devicePlugin": {**spec["devicePlugin"], "env": [{"name": "DIFF_PROBE", "value": "on"}]}}
    changed = _diff(control_plane, operator_namespace, "--policy", str(_policy_file(tmp_path, env)))
    assert changed.code == 1, changed.err
    print(f"--- diff --policy (devicePlugin env)\n{changed.out}")
    blocks = changed.blocks()
    assert set(blocks) == {
        _file(operator_namespace, "DaemonSet", PLUGIN),
        _file(operator_namespace, "DaemonSet", MPS),
    }, changed.out
    added = _yaml(blocks[_file(operator_namespace, "DaemonSet", PLUGIN)].added)
    assert [{"name": "DIFF_PROBE"}] in added or [{"name": "DIFF_PROBE", "value": "on"}] in added, added
    assert {"value": "on"} in added or [{"name": "DIFF_PROBE", "value": "on"}] in added, added

    # a component turned off: its DaemonSet is listed as deleted (every line removed, none added)
    off = {**spec, "dcgmExporter": {**spec["dcgmExporter"], "enabled": False}}
    deleted = _diff(
        control_plane, operator_namespace, "--policy", str(_policy_file(tmp_path, off, "off.yaml"))
    )
    assert deleted.code == 1, deleted.err
    print(f"--- diff --policy (dcgmExporter off)\n{deleted.out}")
    exporter = deleted.blocks()[_file(operator_namespace, "DaemonSet", EXPORTER)]
    assert exporter.added == [] and {"kind": "DaemonSet"} in _yaml(exporter.removed), deleted.out

    # chart values: the device plugin's version, from --values
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"devicePlugin": {"version": "v0.99.0"}}))
    from_values = _diff(control_plane, operator_namespace, "--values", str(values))
    assert from_values.code == 1, from_values.err
    print(f"--- diff --values\n{from_values.out}")
    plugin = from_values.blocks()[_file(operator_namespace, "DaemonSet", PLUGIN)]
    images = [line["image"] for line in _yaml(plugin.added) if isinstance(line, dict) and "image" in line]
    assert images == [f"{spec['devicePlugin']['repository']}/{spec['devicePlugin']['image']}:v0.99.0"], (
        from_values.out
    )

    # nothing was written: the DaemonSet is as the operator left it
    assert (
        kube.get(DaemonSet, PLUGIN, namespace=operator_namespace).metadata.resourceVersion == plugin_version
    )

    # a policy the API models refuse: exit 2 naming the field
    bad = {**spec, "devicePlugin": {**spec["devicePlugin"], "enabled": "sometimes"}}
    refused = _diff(
        control_plane, operator_namespace, "--policy", str(_policy_file(tmp_path, bad, "bad.yaml"))
    )
    assert (refused.code, refused.out) == (2, ""), refused.err
    print(f"--- diff --policy (bad)\n{refused.err}")
    assert refused.err.startswith("error: spec.devicePlugin.enabled"), refused.err
