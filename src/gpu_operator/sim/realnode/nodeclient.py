"""The client side of a real node: admin requests to the simulator's apiserver about it, waiting
until its Node is Ready or reports a resource allocatable (failing with the log of a daemon that
died), and GETs from inside its network. `NodeClient` is a base of `realnode.RealNode`."""

from __future__ import annotations

import contextlib
import json
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from gpu_operator.sim.plane import pki as pki_mod
from gpu_operator.sim.plane.processes import RealNodeError, tail
from gpu_operator.sim.realnode.nodens import Sandbox


class NodeClient:
    """Reaches the node `name` (its files under `base_dir`) through the apiserver on
    `apiserver_port`, as the admin of the PKI in `pki_dir`."""

    base_dir: Path
    name: str
    pki_dir: Path
    apiserver_port: int
    sandbox: Sandbox
    processes: dict[str, subprocess.Popen[bytes]]

    @property
    def logs(self) -> Path:
        return self.base_dir / "logs"

    @property
    def pod_logs(self) -> Path:
        return self.base_dir / "pod-logs"

    def admin(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        pki = pki_mod.Pki(self.pki_dir)
        context = ssl.create_default_context(cafile=str(pki.ca_cert))
        context.load_cert_chain(pki.client_cert("admin"), pki.client_key("admin"))
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            f"https://127.0.0.1:{self.apiserver_port}{path}",
            data=data,
            method=method,
            headers={"Content-Type": content_type},
        )
        with urllib.request.urlopen(req, context=context, timeout=10) as resp:
            return json.loads(resp.read() or b"null")

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            for name, proc in self.processes.items():
                if proc.poll() is not None:
                    raise RealNodeError(
                        f"real node {self.name}: {name} exited with code {proc.returncode}; "
                        f"log {self.logs / (name + '.log')}:\n{tail(self.logs / (name + '.log'))}"
                    )
            with contextlib.suppress(OSError, ValueError):
                node = self.admin("GET", f"/api/v1/nodes/{self.name}")
                conds = node.get("status", {}).get("conditions", [])
                if any(c["type"] == "Ready" and c["status"] == "True" for c in conds):
                    return
            if time.monotonic() > deadline:
                log = self.logs / "kubelet.log"
                raise RealNodeError(
                    f"real node {self.name} not Ready after {timeout:.0f}s; kubelet log {log}:\n"
                    f"{tail(log, 40)}"
                )
            time.sleep(0.5)

    def wait_allocatable(self, resource: str, value: str, timeout: float) -> None:
        """Until the kubelet reports `resource` allocatable as `value` (a registered device plugin,
        which runs only in a device-plugin pod: see `pluginimage`)."""
        deadline = time.monotonic() + timeout
        while True:
            status = self.admin("GET", f"/api/v1/nodes/{self.name}").get("status", {})
            if status.get("allocatable", {}).get(resource) == value:
                return
            if time.monotonic() > deadline:
                raise RealNodeError(
                    f"real node {self.name}: {resource} allocatable is "
                    f"{status.get('allocatable', {}).get(resource)!r}, not {value}, after {timeout:.0f}s; "
                    f"see the device plugin pod's log (pod logs under {self.pod_logs})"
                )
            time.sleep(0.5)

    def http_get(self, url: str, timeout: float = 10.0) -> str:
        """GET `url` from inside the node's network (pod IPs live there); raises with the output."""
        script = (
            "import sys, urllib.request\n"
            "sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=float(sys.argv[2])).read().decode())"
        )
        done = self.sandbox.run([sys.executable, "-c", script, url, str(timeout)], timeout=timeout + 20)
        if done.returncode != 0:
            raise RealNodeError(
                f"GET {url} inside real node {self.name} failed: {done.stderr.strip()[-500:]}"
            )
        return done.stdout
