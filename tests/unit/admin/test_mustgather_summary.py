"""`gpu-operator must-gather` against a stand-in apiserver: the summary names what could not be
read and why (logs on fake kwok nodes as one line that says so), and an apiserver that stops
answering half-way still gets the bundle of what was read, then one line and exit 1. (The
unreachable-from-the-start case: tests/unit/kube/test_reach.py; the whole bundle on a real
control plane: tests/integration/test_must_gather.py.)"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from gpu_operator.cli import app
from gpu_operator.shapes import KWOK_ANNOTATION
from tests.support.fakeapi import Answer, kubeconfig, serve, status

NS = "gpu-operator"
NODE = {
    "metadata": {
        "name": "gpu-0",
        "annotations": {KWOK_ANNOTATION: "fake"},
        "labels": {"nvidia.com/gpu.present": "true"},
    }
}
IDLE = {
    "metadata": {"name": "cpu-0", "annotations": {KWOK_ANNOTATION: "fake"}}
}  # a fake node with no pod of ours
POD = {
    "metadata": {"name": "nvidia-device-plugin-x", "namespace": NS},
    "spec": {"nodeName": "gpu-0"},
    "status": {"phase": "Running", "containerStatuses": [{"name": "plugin", "restartCount": 0}]},
}


def healthy(path: str) -> Answer:
    if path == "/version":
        return 200, {"gitVersion": "v1.36.3"}
    if path == "/api/v1/nodes":
        return 200, {"items": [NODE, IDLE], "metadata": {}}
    if path == f"/api/v1/namespaces/{NS}/pods":
        return 200, {"items": [POD], "metadata": {}}
    if path.endswith("/log"):  # the apiserver cannot dial a kwok node's kubelet
        return status(502, "InternalError", "dial tcp 10.0.0.1:10250: connect: connection refused")
    if "monitoring.coreos.com" in path:
        return 404, "404 page not found"
    return 200, {"items": [], "metadata": {}}


def gather(route: Any, tmp_path: Path) -> tuple[int, list[str], dict[str, str], str]:
    out = tmp_path / "bundle.tar.gz"
    with serve(route) as server:
        result = CliRunner().invoke(
            app,
            [
                "must-gather",
                "--out",
                str(out),
                "--namespace",
                NS,
                "--kubeconfig",
                str(kubeconfig(tmp_path / "kubeconfig", server)),
            ],
        )
    files: dict[str, str] = {}
    if out.exists():
        with tarfile.open(fileobj=io.BytesIO(out.read_bytes())) as tar:
            files = {
                m.name.split("/", 1)[1]: tar.extractfile(m).read().decode()  # type: ignore[union-attr]
                for m in tar.getmembers()
                if m.isfile()
            }
    return result.exit_code, result.stderr.splitlines(), files, result.output


def test_the_summary_says_which_items_could_not_be_read_and_why(tmp_path: Path) -> None:
    code, stderr, files, output = gather(healthy, tmp_path)
    assert code == 0, output
    errors = files["errors.txt"].splitlines()
    assert len(errors) == 2, errors
    (log_error,) = [e for e in errors if e.startswith("logs of nvidia-device-plugin-x/plugin: HTTP 502")]
    assert log_error.endswith(
        "(node gpu-0 is a fake (kwok) node: no kubelet behind it serves container logs)"
    )
    assert stderr[0].endswith("; 2 item(s) could not be read (each in errors.txt):"), stderr
    assert stderr[1] == (
        "  1 container log(s) of pods on 1 fake (kwok) node(s), which serve no logs "
        "(expected on the simulator)"
    )
    assert stderr[2].startswith(
        "  ServiceMonitor: /apis/monitoring.coreos.com/v1/servicemonitors: HTTP 404"
    ), stderr
    assert len(stderr) == 3


def test_an_apiserver_that_stops_answering_still_gets_the_bundle_then_exit_1(tmp_path: Path) -> None:
    def route(path: str) -> Answer:
        return healthy(path) if path == "/version" else None  # then every connection is dropped

    code, stderr, files, output = gather(route, tmp_path)
    assert code == 1, output
    assert "versions.json" in files and "v1.36.3" in files["versions.json"]
    assert stderr[-1].startswith("error: cannot reach the Kubernetes API at http://127.0.0.1:"), stderr
    assert "to collect the rest of the bundle" in stderr[-1] and "holds what was read" in stderr[-1]
    assert "Traceback" not in output
