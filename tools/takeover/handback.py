"""Hand a cluster back to NVIDIA's operator after ours took it over, and see whether NVIDIA's
operator manages it (a check run by hand with NVIDIA's binary; docs/migrate.md quotes it).

On a fresh simulator with our CRDs (as our chart leaves them): the recorded v26.7.0 state
(tests/fixtures/nvidia-v26.7.0) is loaded, our operator takes it over and is stopped with the
ClusterPolicy kept (as `helm uninstall` of ours with the ClusterPolicy kept and no cleanup hook
leaves it; ours carries NVIDIA's DaemonSet selectors, so nothing is deleted); then NVIDIA's operator runs until its ClusterPolicy is ready or
`--timeout`. Prints what happened to the driver pods and NVIDIA's operator's errors.

    .venv/bin/python -m tools.takeover.handback --operator /tmp/peer/gpu-operator
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from lightkube import Client, KubeConfig

from gpu_operator.kube.crds import apply_crds
from gpu_operator.sim.plane import binaries, nodes
from gpu_operator.sim.plane.controlplane import ControlPlane, free_port
from gpu_operator.sim.plane.operator_process import OperatorProcess
from gpu_operator.sim.standins import roster
from tests.support import takeover

NAMESPACE = "gpu-operator"


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def driver_pods(plane: ControlPlane) -> dict[str, str]:
    pods = plane.request(
        "GET", f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector=app%3Dnvidia-driver-daemonset"
    )
    return {
        p["metadata"]["uid"]: p["spec"].get("nodeName", "")
        for p in pods["items"]
        if not p["metadata"].get("deletionTimestamp")
    }


def policy(plane: ControlPlane) -> dict[str, Any]:
    result: dict[str, Any] = plane.request("GET", "/apis/nvidia.com/v1/clusterpolicies/cluster-policy")
    return result


def wait(what: str, check: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            say(f"{what}: yes")
            return True
        time.sleep(1)
    say(f"{what}: NOT within {timeout:.0f} s")
    return False


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--operator", type=Path, required=True, help="NVIDIA's gpu-operator binary")
    parser.add_argument("--timeout", type=float, default=120)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="takeover-handback-"))
    plane = ControlPlane(workdir, binaries.locate(build=False), progress=lambda m: None).start()
    peer: subprocess.Popen[bytes] | None = None
    ours: OperatorProcess | None = None
    try:
        config = KubeConfig.from_file(plane.admin_kubeconfig)
        client = Client(config, field_manager="takeover-handback")
        apply_crds(client)
        names = nodes.add_nodes(client, ["dgx-h100:3"])
        nodes.wait_ready(client, names)
        kubeconfig = plane.serviceaccount_kubeconfig(NAMESPACE, "gpu-operator")
        plane.request(
            "POST",
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": "takeover-handback"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "cluster-admin",
                },
                "subjects": [{"kind": "ServiceAccount", "name": "gpu-operator", "namespace": NAMESPACE}],
            },
        )
        with roster.running(config):
            loaded = takeover.load(client, NAMESPACE, names)
            wait("NVIDIA's driver pods running", lambda: len(driver_pods(plane)) == 3, 120)
            nvidia_pods = driver_pods(plane)
            ours = OperatorProcess(
                kubeconfig=kubeconfig, namespace=NAMESPACE, log=workdir / "ours.log"
            ).start()
            wait(
                "ours: every driver pod replaced and the policy ready",
                lambda: (
                    len(driver_pods(plane)) == 3
                    and not set(driver_pods(plane)) & set(nvidia_pods)
                    and (policy(plane).get("status") or {}).get("state") == "ready"
                ),
                180,
            )
            ours.stop()
            our_pods = driver_pods(plane)
            say(f"ours stopped; policy uid kept: {policy(plane)['metadata']['uid'] == loaded.policy_uid}")
            sets = plane.request("GET", f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets")["items"]
            unlike = [
                d["metadata"]["name"]
                for d in sets
                if d["spec"]["selector"]["matchLabels"]
                != takeover.NVIDIA_SELECTORS.get(d["metadata"]["name"])
            ]
            say(f"DaemonSets whose selector is not NVIDIA's: {unlike or 'none'} of {len(sets)}")
            # NVIDIA's operator writes its own status; clear ours so its 'ready' is its own.
            plane.request(
                "PATCH",
                "/apis/nvidia.com/v1/clusterpolicies/cluster-policy/status",
                {"status": {"state": "notReady", "conditions": []}},
                "application/merge-patch+json",
            )
            env = {
                **os.environ,
                "OPERATOR_NAMESPACE": NAMESPACE,
                "WATCH_NAMESPACE": "",
                "DRIVER_MANAGER_IMAGE": "nvcr.io/nvidia/cloud-native/k8s-driver-manager:v0.12.0",
                "VALIDATOR_IMAGE": "nvcr.io/nvidia/gpu-operator:v26.7.0",
            }
            log = workdir / "nvidia.log"
            with log.open("wb") as out:
                peer = subprocess.Popen(
                    [
                        str(args.operator),
                        f"--kubeconfig={kubeconfig}",
                        f"--metrics-bind-address=127.0.0.1:{free_port()}",
                        f"--health-probe-bind-address=127.0.0.1:{free_port()}",
                    ],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                )
            ready = wait(
                "NVIDIA's operator: ClusterPolicy ready",
                lambda: (policy(plane).get("status") or {}).get("state") == "ready",
                args.timeout,
            )
            time.sleep(10)
            after = driver_pods(plane)
            say(
                f"driver pods kept through the hand-back: {len(set(after) & set(our_pods))} of {len(our_pods)}"
            )
            errors: dict[str, int] = {}
            for line in log.read_text().splitlines():
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                if entry.get("level") == "error":
                    key = f"{entry.get('msg')}: {str(entry.get('error'))[:160]}"
                    errors[key] = errors.get(key, 0) + 1
            for key, count in sorted(errors.items(), key=lambda kv: -kv[1])[:8]:
                say(f"NVIDIA error x{count}: {key}")
            return 0 if ready else 1
    finally:
        if peer is not None and peer.poll() is None:
            peer.send_signal(signal.SIGTERM)
            peer.wait(20)
        if ours is not None:
            ours.stop()
        plane.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
