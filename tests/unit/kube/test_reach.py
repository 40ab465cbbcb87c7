"""The commands that talk to a cluster, pointed at an apiserver that is not there (a closed local
port) or that refuses them: one line naming the apiserver, the kubeconfig and what to check,
exit 2, never a traceback (kube/reach.py). No control plane needed."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpu_operator.cli import app
from tests.support.fakeapi import closed_port, kubeconfig, serve, status

COMMANDS = [
    ["status"],
    ["upgrade", "status"],
    ["upgrade", "pause"],
    ["upgrade", "resume"],
    ["upgrade", "retry", "gpu-0"],
    ["cleanup", "--timeout", "5"],
    ["must-gather"],
    ["crds", "apply"],
]


def run(args: list[str], config: Path, tmp_path: Path) -> tuple[int, list[str], str]:
    extra = ["--out", str(tmp_path / "bundle.tar.gz")] if args == ["must-gather"] else []
    result = CliRunner().invoke(app, [*args, *extra, "--kubeconfig", str(config)])
    return result.exit_code, result.stderr.splitlines(), result.output


@pytest.mark.parametrize("args", COMMANDS, ids=" ".join)
def test_an_unreachable_apiserver_is_one_line_and_exit_2(args: list[str], tmp_path: Path) -> None:
    port = closed_port()
    config = kubeconfig(tmp_path / "kubeconfig", f"https://127.0.0.1:{port}")
    code, stderr, output = run(args, config, tmp_path)
    assert code == 2, output
    assert len(stderr) == 1, output
    assert stderr[0].startswith(
        f"error: cannot reach the Kubernetes API at https://127.0.0.1:{port} "
        f"(kubeconfig {config}, context c) to "
    ), stderr
    assert "ConnectError" in stderr[0] and "check that the apiserver is up" in stderr[0]
    assert "Traceback" not in output
    assert not (tmp_path / "bundle.tar.gz").exists()  # must-gather: nothing read, no bundle


@pytest.mark.parametrize(
    ("args", "request_line"),
    [
        (["status"], "GET /apis/nvidia.com/v1/clusterpolicies"),
        (["upgrade", "pause"], "GET /apis/nvidia.com/v1/clusterpolicies"),
        (["upgrade", "status"], "GET /apis/nvidia.com/v1/clusterpolicies"),
    ],
    ids=lambda a: " ".join(a) if isinstance(a, list) else "",
)
def test_a_refusal_names_the_request_and_the_apiservers_message(
    args: list[str], request_line: str, tmp_path: Path
) -> None:
    def route(path: str) -> tuple[int, object]:
        if path == "/api/v1/pods":  # status reads the chart's pods first; a 403 there is allowed
            return status(403, "Forbidden", "pods is forbidden")
        return status(403, "Forbidden", 'clusterpolicies.nvidia.com is forbidden: User "u" cannot list')

    with serve(route) as server:
        config = kubeconfig(tmp_path / "kubeconfig", server)
        code, stderr, output = run(args, config, tmp_path)
    assert code == 2, output
    assert len(stderr) == 1, output
    assert stderr[0].startswith(f"error: the Kubernetes API at {server} refused {request_line} (to "), stderr
    assert "403 Forbidden: clusterpolicies.nvidia.com is forbidden" in stderr[0], stderr
    assert "Traceback" not in output
    if args == ["status"]:
        assert "the status view needs get/list on nodes, daemonsets, pods, clusterpolicies" in stderr[0]


def test_a_kubeconfig_that_cannot_be_loaded_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("clusters: [\n")
    for config in (bad, tmp_path / "absent.yaml"):
        result = CliRunner().invoke(app, ["upgrade", "status", "--kubeconfig", str(config)])
        assert result.exit_code == 2, result.output
        text = "".join(result.output.replace("│", "").split())  # the error panel wraps long lines
        assert f"cannotloadakubeconfig({config})" in text and "Traceback" not in text
