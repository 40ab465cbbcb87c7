"""`gpu-operator images` against the real chart (rendered by Helm's engine) and our renderer: the list
is what the rendered objects pull, for the default values, the DRA stack and sandbox workloads; the
mirror values put every pod image and image-valued env under the mirror; bad input exits 2 with one
line naming the file or key."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from gpu_operator import shapes
from gpu_operator.cli import app
from gpu_operator.install.images import Install, mirror_text, render_install
from gpu_operator.render.images import IMAGE_ENV, containers, operator_container, pod_specs
from tests.support.chart import VGPU_IMAGE, preset

ROOT = Path(__file__).resolve().parents[3]
MIRROR = "registry.example.internal:5000/gpu"
# A reference with a registry host and a tag or digest, wherever it sits in an object.
REFERENCE = re.compile(
    r"^[a-z0-9-]+(\.[a-z0-9-]+)+(:[0-9]+)?/[a-z0-9._/-]+(:[A-Za-z0-9._-]+|@sha256:[0-9a-f]{64})$"
)
POLICY_KINDS = {"ClusterPolicy", "NVIDIADriver", "GPUCluster"}  # inputs of the renderer, not pods
NODES = shapes.nodes(["dgx-h100", "rke2"], settled=True)
DIGEST = "sha256:" + "ab" * 32
CASES: dict[str, list[dict[str, Any]]] = {
    "default": [],
    "dra": [{"clusterPolicy": {"deployCR": False}, "gpuCluster": {"deployCR": True}}],
    "passthrough": [preset("passthrough"), {"nodeStatusExporter": {"enabled": True}}],
    "vgpu": [preset("vgpu"), VGPU_IMAGE],
    "kata-and-extras": [
        {
            "sandboxWorkloads": {"enabled": True, "mode": "kata", "defaultWorkload": "vm-passthrough"},
            "ccManager": {"enabled": True},
            "gds": {"enabled": True},
            "gdrcopy": {"enabled": True},
            "dcgm": {"enabled": True},
        }
    ],
    "nvidiadriver-pinned": [
        {"driver": {"nvidiaDriverCRD": {"enabled": True}}, "devicePlugin": {"version": DIGEST}}
    ],
}
# What each case must list at least: an operand of the case's own (the scan below finds the rest).
EXPECTED = {
    "default": {
        "nvcr.io/nvidia/driver:595.91.07-ubuntu22.04",
        "nvcr.io/nvidia/cloud-native/k8s-driver-manager:v0.12.0",
        "nvcr.io/nvidia/gpu-operator:v26.7.0",
    },
    "dra": {"nvcr.io/nvidia/dra-driver-nvidia-gpu:v0.5.0"},
    "passthrough": {"nvcr.io/nvidia/kubevirt-gpu-device-plugin:v1.6.0"},
    "vgpu": {
        "registry.example.com/nvidia/vgpu-manager:17.4-ubuntu22.04",
        "nvcr.io/nvidia/cloud-native/vgpu-device-manager:v0.5.0",
    },
    "kata-and-extras": {
        "nvcr.io/nvidia/cloud-native/nvidia-sandbox-device-plugin:v0.0.5",
        "nvcr.io/nvidia/cloud-native/k8s-cc-manager:v0.4.3",
        "nvcr.io/nvidia/cloud-native/nvidia-fs:2.29.4-ubuntu22.04",
        "nvcr.io/nvidia/cloud-native/gdrdrv:v2.6-ubuntu22.04",
        "nvcr.io/nvidia/cloud-native/dcgm:4.6.0-1-ubuntu24.04",
    },
    "nvidiadriver-pinned": {
        f"nvcr.io/nvidia/k8s-device-plugin@{DIGEST}",
        "nvcr.io/nvidia/driver:595.91.07-ubuntu22.04",
    },
}


@pytest.fixture(scope="module", autouse=True)
def helm() -> Iterator[None]:
    """The helm `./dev test` sets up (GPU_OPERATOR_HELM), or the one tools/helm/build.sh keeps cached."""
    with pytest.MonkeyPatch.context() as patch:
        if not (os.environ.get("GPU_OPERATOR_HELM") or shutil.which("helm")):
            built = subprocess.run(
                [str(ROOT / "tools" / "helm" / "build.sh")], capture_output=True, text=True, check=True
            )
            patch.setenv("GPU_OPERATOR_HELM", built.stdout.splitlines()[-1])
        yield


def strings(node: Any, path: str = "") -> list[tuple[str, str]]:
    if isinstance(node, dict):
        return [s for key, value in node.items() for s in strings(value, f"{path}.{key}")]
    if isinstance(node, list):
        return [s for i, value in enumerate(node) for s in strings(value, f"{path}[{i}]")]
    return [(path, node)] if isinstance(node, str) else []


def scanned(install: Install) -> set[str]:
    """Every image reference anywhere in the rendered objects but the policies (the renderer's
    inputs) and the operator's env (fallbacks; what it renders from them is in the operands)."""
    fallbacks = operator_container(install.chart)
    found = set()
    for obj in install.chart + install.operands:
        if obj["kind"] in POLICY_KINDS:
            continue
        if (
            fallbacks is not None
            and obj["kind"] == "Deployment"
            and fallbacks in containers(next(iter(pod_specs(obj["spec"]))))
        ):
            obj = {**obj, "spec": {"template": {"spec": {"containers": [{**fallbacks, "env": []}]}}}}
        found |= {value for _, value in strings(obj) if REFERENCE.match(value)}
    return found


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request: pytest.FixtureRequest) -> tuple[str, Install]:
    return request.param, render_install(CASES[request.param], NODES, "gpu-operator")


def test_the_list_is_every_image_the_rendered_objects_name(case: tuple[str, Install]) -> None:
    name, install = case
    assert install.operands, f"{name}: the renderer made no operand"
    assert set(install.images()) == scanned(install)
    assert EXPECTED[name] <= set(install.images())


def test_the_mirror_values_put_every_pod_image_under_the_mirror(case: tuple[str, Install]) -> None:
    name, install = case
    values = yaml.safe_load(mirror_text(install, MIRROR, []))
    mirrored = render_install([*CASES[name], values], NODES, "gpu-operator")
    refs = []
    for obj in mirrored.chart + mirrored.operands:
        for pod in pod_specs(obj.get("spec")):
            for ctr in containers(pod):
                refs.append(ctr["image"])  # the operator's env fallbacks included here
                refs += [
                    v["value"] for v in ctr.get("env") or [] if IMAGE_ENV.search(v["name"]) and v.get("value")
                ]
    assert refs
    assert [r for r in refs if not r.startswith(MIRROR + "/")] == []
    # the same images, moved: path and tag or digest kept
    assert len(mirrored.images()) == len(install.images())
    assert {i.removeprefix(MIRROR + "/") for i in mirrored.images()} == {
        i.split("/", 1)[1] for i in install.images()
    }


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["images", *args])
    return result.exit_code, result.stderr


@pytest.mark.parametrize(
    ("content", "args", "first"),
    [
        (None, ["--values", "{tmp}/absent.yaml"], "error: --values {tmp}/absent.yaml: cannot read it"),
        ("driver: [unclosed\n", ["--values", "{tmp}/v.yaml"], "error: --values {tmp}/v.yaml: not valid YAML"),
        (
            None,
            ["--set", "gpuCluster.deployCR=true"],
            "error: the chart rejects these values (--set gpuCluster.deployCR=true): clusterPolicy.deployCR and",
        ),
        (
            None,
            ["--set", "driver.kernelModuleType=fast"],
            "error: the chart rejects these values (--set driver.kernelModuleType=fast): driver.kernelModuleType=",
        ),
        (
            None,
            ["--set", "cdi.enabled=maybe"],
            "error: values key cdi.enabled (ClusterPolicy spec.cdi.enabled): ",
        ),
        (
            None,
            ["--mirror", "https://registry.example.com"],
            "error: --mirror 'https://registry.example.com': ",
        ),
        (None, ["--copy-commands"], "error: --copy-commands needs --mirror REGISTRY"),
    ],
)
def test_bad_input_is_one_line_naming_it(
    content: str | None, args: list[str], first: str, tmp_path: Path
) -> None:
    if content is not None:
        (tmp_path / "v.yaml").write_text(content)
    code, err = run(*(a.replace("{tmp}", str(tmp_path)) for a in args))
    assert code == 2
    assert len(err.splitlines()) == 1, err
    assert err.startswith(first.replace("{tmp}", str(tmp_path))), err


def test_without_helm_it_says_where_to_get_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GPU_OPERATOR_HELM", "")
    monkeypatch.setenv("PATH", str(tmp_path))
    code, err = run()
    assert (code, len(err.splitlines())) == (2, 1)
    assert err.startswith("error: helm is not on PATH: install Helm"), err


def test_the_driver_tag_follows_the_nodes_given(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": shapes.nodes(["rke2"])}))
    result = CliRunner().invoke(app, ["images", "--nodes", str(nodes)])
    assert result.exit_code == 0, result.stderr
    drivers = [line for line in result.stdout.splitlines() if line.startswith("nvcr.io/nvidia/driver:")]
    assert drivers == ["nvcr.io/nvidia/driver:595.91.07-rocky9"]


def test_an_image_no_values_key_names_is_listed_and_said_not_to_be_mirrored(tmp_path: Path) -> None:
    extra = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "site-tool"},
        "spec": {"containers": [{"name": "tool", "image": "quay.io/site/tool:1"}]},
    }
    values = tmp_path / "extra.yaml"
    values.write_text(yaml.safe_dump({"extraObjects": [extra]}))
    listed = CliRunner().invoke(app, ["images", "-f", str(values)])
    assert listed.exit_code == 0 and "quay.io/site/tool:1" in listed.stdout.splitlines()
    result = CliRunner().invoke(app, ["images", "-f", str(values), "--mirror", MIRROR])
    assert result.exit_code == 1
    assert result.stderr.startswith(
        f"warning: quay.io/site/tool:1 (Pod/site-tool tool) does not come from {MIRROR}"
    )
    assert yaml.safe_load(result.stdout)["devicePlugin"] == {"repository": f"{MIRROR}/nvidia"}
