"""`gpu-operator render` and `gpu-operator crds` end to end (in-process)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from typer.testing import CliRunner

from gpu_operator import shapes
from gpu_operator.cli import app

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
runner = CliRunner()


def test_render_default_policy_on_dgx_h100() -> None:
    out = runner.invoke(
        app, ["render", "--policy", str(EXAMPLES / "clusterpolicy-default.yaml"), "--shape", "dgx-h100:2"]
    )
    assert out.exit_code == 0, out.output
    assert "# state state-driver: enabled (spec.driver.enabled=true (default))" in out.output
    assert "# state state-vfio-manager: disabled (spec.sandboxWorkloads.enabled=false)" in out.output
    docs = [d for d in yaml.safe_load_all(out.output) if d]
    states = {d["metadata"]["labels"]["nvidia.com/gpu-operator.state"] for d in docs}
    assert "state-vfio-manager" not in states and "state-driver" in states
    assert sum(d["kind"] == "DaemonSet" for d in docs) == 9  # the 9 container-stack operands


def test_render_json_from_a_nodes_file(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text(
        yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": shapes.nodes(["host-driver:1"])})
    )
    out = runner.invoke(
        app,
        [
            "render",
            "--policy",
            str(EXAMPLES / "clusterpolicy-container-host-driver.yaml"),
            "--nodes",
            str(nodes),
            "-o",
            "json",
            "--namespace",
            "gpu",
        ],
    )
    assert out.exit_code == 0, out.output
    items = json.loads(out.output)["items"]
    assert all(i["metadata"].get("namespace", "gpu") == "gpu" for i in items)
    assert not any(i["metadata"]["name"] == "nvidia-driver-daemonset" for i in items)


def test_render_raw_nodes_leave_daemonsets_out() -> None:
    out = runner.invoke(
        app,
        [
            "render",
            "--policy",
            str(EXAMPLES / "clusterpolicy-default.yaml"),
            "--shape",
            "dgx-h100",
            "--raw-nodes",
        ],
    )
    assert out.exit_code == 0
    assert "kind: DaemonSet" not in out.output
    assert "DaemonSets wait for a GPU node" in out.output


def test_render_errors_name_the_problem(tmp_path: Path) -> None:
    bad = tmp_path / "p.yaml"
    bad.write_text(
        "apiVersion: nvidia.com/v1\nkind: ClusterPolicy\nmetadata: {name: p}\n"
        "spec: {cdi: {enabled: false, nriPluginEnabled: true}}\n"
    )
    out = runner.invoke(app, ["render", "--policy", str(bad), "--shape", "dgx-h100"])
    assert out.exit_code == 2
    assert "spec.cdi.nriPluginEnabled" in out.output
    out = runner.invoke(app, ["render", "--policy", str(bad), "--shape", "nope:1"])
    assert out.exit_code == 2 and "unknown node shape" in out.output


def test_crds_print_and_check() -> None:
    out = runner.invoke(app, ["crds", "print"])
    assert out.exit_code == 0
    names = [d["metadata"]["name"] for d in yaml.safe_load_all(out.output) if d]
    assert names == [
        "clusterpolicies.nvidia.com",  # ours by module name (api/crdgen.py, `ours()`)
        "gpuclusters.nvidia.com",
        "nvidiadrivers.nvidia.com",
        "computedomains.resource.nvidia.com",
        "computedomaincliques.resource.nvidia.com",
    ]
    assert runner.invoke(app, ["crds", "generate", "--check"]).exit_code == 0


def test_the_nvidiadriver_examples_of_docs_api_md_are_in_examples_and_render() -> None:
    path = EXAMPLES / "nvidiadrivers.yaml"
    examples = [d for d in yaml.safe_load_all(path.read_text()) if d]
    page = (EXAMPLES.parent / "docs" / "api.md").read_text()
    blocks = [
        d
        for block in page.split("```yaml\n")[1:]
        for d in yaml.safe_load_all(block.split("```")[0])
        if d and d.get("kind") == "NVIDIADriver"
    ]
    assert blocks == examples  # the page shows exactly the file's objects
    assert f"render --nvidiadriver examples/{path.name}" in page
    out = runner.invoke(
        app,
        [
            "render",
            "--nvidiadriver",
            str(path),
            "--shape",
            "dgx-h100:2,pool=a",
            "--shape",
            "host-driver:1,pool=b",
        ],
    )
    assert out.exit_code == 0, out.output
    daemonsets = [d for d in yaml.safe_load_all(out.stdout) if d and d["kind"] == "DaemonSet"]
    images = sorted(
        c["image"]
        for d in daemonsets
        for c in d["spec"]["template"]["spec"]["containers"]
        if c["name"] == "nvidia-driver-ctr"
    )
    assert images == [
        "nvcr.io/nvidia/driver:570.172.08-ubuntu22.04",
        "nvcr.io/nvidia/driver:580.82.07-ubuntu24.04",
    ]
