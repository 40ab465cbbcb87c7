"""`gpu-operator must-gather` against a real control plane with the operator reconciled: the
tarball holds what a bug report needs, no credential planted in the cluster, and says what it
could not read (kwok nodes have no kubelet to serve logs)."""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

import yaml
from lightkube import Client
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap, Node, Secret
from lightkube.types import PatchType

from gpu_operator.sim.plane.controlplane import ControlPlane
from gpu_operator.sim.plane.operator_process import OperatorProcess
from gpu_operator.vocabulary import PROBE_FACTS_ANNOTATION
from tests.support.status import reconciled

PLANTED = (
    "nvapi-PLANTED-secret-value",
    "planted-licence-token",
    "planted-env-password",
    "planted-proxy-password",
    "planted-annotation-token",
)


def _members(path: Path) -> dict[str, str]:
    with tarfile.open(path) as tar:
        top = {m.name.split("/", 1)[0] for m in tar.getmembers()}
        assert len(top) == 1, top
        return {
            m.name.split("/", 1)[1]: tar.extractfile(m).read().decode()
            for m in tar.getmembers()
            if m.isfile()
        }


def test_must_gather_collects_the_cluster_state_without_credentials(
    kube: Client,
    control_plane: ControlPlane,
    fake_nodes: Callable[..., list[str]],
    start_operator: Callable[..., OperatorProcess],
    cluster_policies: Callable[..., str],
    operator_namespace: str,
    tmp_path: Path,
) -> None:
    (node,) = fake_nodes("dgx-h100:1")
    dockerconfig = json.dumps(
        {"auths": {"nvcr.io": {"auth": base64.b64encode(PLANTED[0].encode()).decode()}}}
    )
    kube.create(
        Secret(
            metadata=ObjectMeta(name="ngc-pull", namespace=operator_namespace),
            type="kubernetes.io/dockerconfigjson",
            stringData={".dockerconfigjson": dockerconfig},
        )
    )
    kube.create(
        ConfigMap(
            metadata=ObjectMeta(name="licensing-config", namespace=operator_namespace),
            data={"client_configuration_token.tok": PLANTED[1], "gridd.conf": "FeatureType=1\n"},
        )
    )
    facts = {
        "driverSource": "none",
        "gpus": [
            {
                "address": "0000:3b:00.0",
                "vendorDevice": "10de:2330",
                "name": "GH100 [H100 SXM5 80GB]",
                "product": "H100 SXM5 80GB",
                "driver": "",
            }
        ],
    }
    kube.patch(
        Node,
        node,
        {
            "metadata": {
                "annotations": {
                    PROBE_FACTS_ANNOTATION: json.dumps(facts),
                    "nvidia.com/example-registry-token": PLANTED[4],
                }
            }
        },
        patch_type=PatchType.MERGE,
    )
    operator = start_operator()
    proxy = f"http://proxyuser:{PLANTED[3]}@proxy.example.com:3128"
    name = cluster_policies(
        {
            "driver": {
                "env": [
                    {"name": "LICENSE_PASSWORD", "value": PLANTED[2]},
                    {"name": "HTTPS_PROXY", "value": proxy},
                ]
            }
        }
    )
    reconciled(kube, name, context=operator.log_text)

    out = tmp_path / "bundle.tar.gz"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpu_operator.cli",
            "must-gather",
            "--out",
            str(out),
            "--namespace",
            operator_namespace,
            "--kubeconfig",
            str(control_plane.admin_kubeconfig),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(out)
    files = _members(out)

    everything = "\n".join(files.values())
    for planted in PLANTED:
        assert planted not in everything, planted
    assert base64.b64encode(PLANTED[0].encode()).decode() not in everything

    policies = yaml.safe_load(files["cluster/ClusterPolicy.yaml"])
    (policy,) = [p for p in policies if p["metadata"]["name"] == name]
    assert policy["status"]["state"] == "ready"
    env = policy["spec"]["driver"]["env"]
    assert env == [
        {"name": "LICENSE_PASSWORD", "value": "<redacted>"},
        {"name": "HTTPS_PROXY", "value": "http://proxyuser:<redacted>@proxy.example.com:3128"},
    ]
    # the driver DaemonSet the operator rendered from it carries the proxy, redacted the same way
    (driver,) = [
        d
        for d in yaml.safe_load(files["owned/DaemonSet.yaml"])
        if d["metadata"]["name"] == "nvidia-driver-daemonset"
    ]
    driver_env = {
        e["name"]: e.get("value")
        for c in driver["spec"]["template"]["spec"]["containers"]
        for e in c.get("env", [])
    }
    assert driver_env.get("HTTPS_PROXY") == "http://proxyuser:<redacted>@proxy.example.com:3128", driver_env

    owned = yaml.safe_load(files["owned/DaemonSet.yaml"])
    assert {d["metadata"]["name"] for d in owned} >= {
        "nvidia-operator-validator",
        "nvidia-device-plugin-daemonset",
    }
    secrets = yaml.safe_load(files[f"namespaces/{operator_namespace}/secrets.yaml"])
    assert {
        "name": "ngc-pull",
        "namespace": operator_namespace,
        "type": "kubernetes.io/dockerconfigjson",
        "keys": [".dockerconfigjson"],
    } in secrets
    cms = yaml.safe_load(files[f"namespaces/{operator_namespace}/ConfigMap.yaml"])
    (licensing,) = [c for c in cms if c["metadata"]["name"] == "licensing-config"]
    assert licensing["data"] == {
        "client_configuration_token.tok": "<redacted>",
        "gridd.conf": "FeatureType=1\n",
    }
    pods = yaml.safe_load(files[f"namespaces/{operator_namespace}/Pod.yaml"])
    assert pods and all(p["status"].get("phase") for p in pods)

    nodes = {n["name"]: n for n in yaml.safe_load(files["nodes.yaml"])}
    assert nodes[node]["labels"].get("nvidia.com/gpu.present") == "true"
    assert PROBE_FACTS_ANNOTATION in nodes[node]["annotations"]
    assert nodes[node]["annotations"]["nvidia.com/example-registry-token"] == "<redacted>"
    assert json.loads(files[f"nodes/{node}/probe-facts.json"]) == facts
    versions = json.loads(files["versions.json"])
    assert versions["kubernetes"].startswith("v1.") and "clusterpolicies.nvidia.com" in versions["crds"]

    # What could not be read is said, per item: ServiceMonitor is not served here (no Prometheus
    # operator CRD), and the kwok node has no kubelet for the apiserver to fetch logs from. Our
    # own CRDs (GPUCluster's too) are served, so their lists are no error.
    errors = files["errors.txt"].splitlines()
    assert any(e.startswith("ServiceMonitor: ") and "HTTP 404" in e for e in errors), errors
    assert not [e for e in errors if e.startswith(("ClusterPolicy: ", "NVIDIADriver: ", "GPUCluster: "))], (
        errors
    )
    log_errors = [e for e in errors if e.startswith("logs of ")]
    assert log_errors and len(log_errors) == sum(
        len((p["status"].get("initContainerStatuses") or []) + (p["status"].get("containerStatuses") or []))
        for p in pods
    ), log_errors
    # each says why (a fake node), and the summary groups them into one line that says so
    assert all(
        e.endswith("is a fake (kwok) node: no kubelet behind it serves container logs)") for e in log_errors
    )
    assert (
        f"{len(log_errors)} container log(s) of pods on 1 fake (kwok) node(s), which serve no logs"
        in done.stderr
    )
    assert "README.txt" in files and "errors.txt" in files
    assert io.BytesIO(out.read_bytes()).getbuffer().nbytes < 5_000_000
