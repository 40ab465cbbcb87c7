"""Debugging a pod on the real node as on any cluster: its log, exec and the pods proxy through the
apiserver, which reaches the kubelet by the Node's InternalIP through its `cluster` egress proxy
(sim/plane/egress.py) and verifies the kubelet's serving certificate; the kubelet admits only clients
with a certificate of the cluster's CA."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import time
import urllib.error
import urllib.request
from typing import Any

import aiohttp
import pytest
import yaml

from gpu_operator.sim.plane.controlplane import ControlPlane
from gpu_operator.sim.realnode.nodens import NODE_IP
from gpu_operator.sim.realnode.realnode import RealNode
from tests.integration.realnode_fixtures import IMAGE, REAL_NODE, api_log
from tests.support.waiting import wait_for

# Prints a line, then serves HTTP on 8080 (read-only root: it serves /etc).
SERVE = (
    "import http.server, os, sys; print('hello from', os.uname().nodename, flush=True); "
    "os.chdir('/etc'); http.server.test(http.server.SimpleHTTPRequestHandler, port=8080, bind='0.0.0.0')"
)


@pytest.fixture
def serving_pod(control_plane: ControlPlane, real_node: RealNode, namespace: str) -> str:
    control_plane.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "web"},
            "spec": {
                "nodeName": REAL_NODE,
                "containers": [{"name": "main", "image": IMAGE, "command": ["python3.11", "-c", SERVE]}],
            },
        },
    )

    def running() -> bool:
        pod = control_plane.request("GET", f"/api/v1/namespaces/{namespace}/pods/web")
        return any(c.get("ready") for c in pod["status"].get("containerStatuses") or [])

    wait_for("the pod on the real node running", running, timeout=120)
    return "web"


def _raw(plane: ControlPlane, path: str) -> tuple[int, bytes]:
    req = urllib.request.Request(f"{plane.server}{path}")
    try:
        with urllib.request.urlopen(req, context=plane.ssl_context("admin"), timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_the_node_is_reached_by_its_internal_ip_with_a_verified_certificate(
    control_plane: ControlPlane, real_node: RealNode
) -> None:
    status = control_plane.request("GET", f"/api/v1/nodes/{REAL_NODE}")["status"]
    assert {"type": "InternalIP", "address": NODE_IP} in status["addresses"]
    assert status["daemonEndpoints"]["kubeletEndpoint"]["Port"] == 10250
    # The kubelet API through the egress proxy, as the apiserver reaches it: its certificate names
    # the node and chains to the cluster CA; without a client certificate it refuses (401).
    config = yaml.safe_load((control_plane.workdir / "egress-selector.yaml").read_text())
    proxy = config["egressSelections"][0]["connection"]["transport"]["uds"]["udsName"]
    with socket.socket(socket.AF_UNIX) as raw:
        raw.settimeout(10)
        raw.connect(proxy)
        raw.sendall(f"CONNECT {NODE_IP}:10250 HTTP/1.1\r\nHost: {NODE_IP}:10250\r\n\r\n".encode())
        assert raw.recv(4096).split(b"\r\n", 1)[0].split()[1] == b"200"
        context = ssl.create_default_context(cafile=str(control_plane.pki.ca_cert))
        with context.wrap_socket(raw, server_hostname=NODE_IP) as tls:
            cert = tls.getpeercert()
            assert cert is not None and ("DNS", REAL_NODE) in cert["subjectAltName"]
            tls.sendall(f"GET /pods HTTP/1.1\r\nHost: {NODE_IP}\r\nConnection: close\r\n\r\n".encode())
            assert tls.recv(4096).split(b"\r\n", 1)[0].split()[1] == b"401"


def test_logs_exec_and_the_pods_proxy_work_for_a_real_node_pod(
    control_plane: ControlPlane, namespace: str, serving_pod: str
) -> None:
    base = f"/api/v1/namespaces/{namespace}/pods/{serving_pod}"
    # `kubectl logs`
    lines = wait_for(
        "the pod's log through the API",
        lambda: api_log(control_plane, namespace, serving_pod, "main"),
        until=lambda got: any(line.startswith("hello from") for line in got),
        timeout=30,
    )
    assert f"hello from {serving_pod}" in lines
    # `kubectl exec` (the websocket protocol kubectl speaks): stdout on channel 1, status on 3
    out, status = asyncio.run(
        _exec(
            control_plane,
            f"{base}/exec?container=main&stdout=true&stderr=true&command=cat&command=/etc/hostname",
        )
    )
    assert out.strip() == serving_pod
    assert status["status"] == "Success", status
    # the pods proxy (`kubectl port-forward`'s sibling): the apiserver dials the pod IP through the egress proxy
    code, body = _raw(control_plane, f"{base}:8080/proxy/hostname")
    assert code == 200 and body.decode().strip() == serving_pod


async def _exec(plane: ControlPlane, path: str) -> tuple[str, dict[str, Any]]:
    stdout, status = b"", {}
    url = plane.server.replace("https://", "wss://") + path
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(
            url,
            ssl=plane.ssl_context("admin"),
            protocols=("v5.channel.k8s.io", "v4.channel.k8s.io"),
            timeout=aiohttp.ClientWSTimeout(ws_close=30),
        ) as ws,
    ):
        deadline = time.monotonic() + 30
        async for message in ws:
            if message.type != aiohttp.WSMsgType.BINARY or not message.data:
                continue
            channel, data = message.data[0], message.data[1:]
            if channel == 1:
                stdout += data
            elif channel == 3 and data:
                status = json.loads(data)
            if time.monotonic() > deadline:
                break
    return stdout.decode(), status
