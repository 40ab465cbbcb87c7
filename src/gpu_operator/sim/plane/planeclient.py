"""The client side of the control plane, for tests, tools and the simulator's own setup: where
its files are (PKI, kubeconfigs, audit log, egress routes), TLS to its apiserver, raw admin
requests, a ServiceAccount's kubeconfig, its audit events, and the readiness checks
`ControlPlane.revive` waits on. `PlaneClient` is a base of `controlplane.ControlPlane`."""

from __future__ import annotations

import contextlib
import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpu_operator.sim.plane import pki as pki_mod
from gpu_operator.sim.plane.auditlog import AuditReader
from gpu_operator.sim.plane.kubeconfig import write_kubeconfig
from gpu_operator.sim.plane.planeargs import READ_VERBS
from gpu_operator.sim.plane.processes import http_ok


class PlaneClient:
    """Reaches a control plane laid out under `workdir` whose apiserver listens on `apiserver_port`."""

    workdir: Path
    apiserver_port: int

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    @property
    def pki(self) -> pki_mod.Pki:
        return pki_mod.Pki(self.workdir / "pki")

    def kubeconfig_for(self, identity: str) -> Path:
        return self.workdir / f"{identity}.kubeconfig"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.kubeconfig_for("admin")

    @property
    def egress_routes(self) -> Path:
        """Where real nodes register their network namespaces for the apiserver's egress proxy."""
        return self.workdir / "egress"

    @property
    def audit_log(self) -> Path:
        return self.workdir / "logs" / "audit.log"

    # -- readiness ------------------------------------------------------------------------------

    def apiserver_ready(self) -> bool:
        return http_ok(f"{self.server}/readyz", self.ssl_context("admin"))

    # The caches a fake node's life goes through: kwok holds a node by its Lease and plays the pods
    # bound to it only while its own copy of that Lease says so.
    _CACHED = ("/apis/coordination.k8s.io/v1/leases", "/api/v1/nodes", "/api/v1/pods")

    def _caches_fresh(self) -> bool:
        """True once the apiserver's watch caches of Leases, Nodes and Pods hold etcd's current
        revision. After etcd returns, /readyz answers before every resource's etcd watch has
        resumed: in one CI run and 4 of 42 local runs of the etcd chaos test, the Lease watch
        resumed 0.4-1.2 s after a node that joined at /readyz had been given its Lease. kwok
        (v0.8.0) plays a node's pods only while its cached Lease names it the holder, and looks
        at a node's pods again only when it takes the Lease: the pods bound in that gap were
        skipped for good and stayed Pending (its log: the Lease created, no pod patched; the
        apiserver's: the Lease cacher's backlog arriving after)."""
        try:
            # A paginated list is read from etcd itself: its resourceVersion is etcd's revision.
            now = self.request("GET", "/api/v1/namespaces/default/configmaps?limit=1")["metadata"][
                "resourceVersion"
            ]
            for path in self._CACHED:  # served from the cache once it has caught up, else 504 after 3 s
                self.request("GET", f"{path}?resourceVersion={now}&resourceVersionMatch=NotOlderThan")
        except (OSError, ValueError, KeyError, TypeError):  # urllib's HTTPError is an OSError
            return False
        return True

    # -- helpers for tests and tools -------------------------------------------------------------

    def ssl_context(self, identity: str) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        context.load_cert_chain(self.pki.client_cert(identity), self.pki.client_key(identity))
        return context

    def request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> Any:
        """A raw admin request to the apiserver (for tests and the simulator's own setup)."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            f"{self.server}{path}", data=data, method=method, headers={"Content-Type": content_type}
        )
        with urllib.request.urlopen(req, context=self.ssl_context("admin"), timeout=30) as resp:
            raw = resp.read()
        return json.loads(raw) if raw else None

    def serviceaccount_kubeconfig(
        self, namespace: str, name: str, *, create: bool = True, expiration_seconds: int = 86400
    ) -> Path:
        """A kubeconfig that authenticates as ServiceAccount `namespace/name` (bound token), so
        tests exercise RBAC as a workload's real identity. Creates the namespace and SA if asked."""
        if create:
            for path, body in (
                ("/api/v1/namespaces", {"metadata": {"name": namespace}}),
                (f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": name}}),
            ):
                with contextlib.suppress(urllib.error.HTTPError):
                    self.request("POST", path, body)
        token = self.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": expiration_seconds},
            },
        )["status"]["token"]
        target = self.workdir / f"sa-{namespace}-{name}.kubeconfig"
        write_kubeconfig(
            target, server=self.server, ca=self.pki.ca_cert, user=f"{namespace}-{name}", token=token
        )
        return target

    def audit_events(self) -> Iterator[dict[str, Any]]:
        """Audit events of write requests (everyone but the control plane's own components)."""
        for event in self.audit_all():
            if event.get("verb") not in READ_VERBS:
                yield event

    def audit_all(self) -> Iterator[dict[str, Any]]:
        """Every audit event: the writes of `audit_events()` and the reads of ServiceAccounts
        outside kube-system (pods and operator replicas), each with its `responseStatus.code`."""
        for line in AuditReader(self.audit_log).lines():  # every rotated file, then audit.log
            with contextlib.suppress(json.JSONDecodeError):
                yield json.loads(line)
