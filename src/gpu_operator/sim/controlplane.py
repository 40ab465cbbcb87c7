"""Starts and stops a real control plane on 127.0.0.1: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler and kwok (fake nodes), each logging to its own file."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpu_operator.sim import pki as pki_mod
from gpu_operator.sim.auditlog import AuditReader
from gpu_operator.sim.binaries import Binaries
from gpu_operator.sim.egress import egress_config
from gpu_operator.sim.kubeconfig import write_kubeconfig

# Users whose writes are not logged by the audit policy: the control plane's own machinery.
_QUIET_USERS = ["system:kube-controller-manager", "system:kube-scheduler", "kwok-controller",
                "system:apiserver"]
_READ_VERBS = ("get", "list", "watch")


# kwok plays pod stages (a scheduled pod -> Running and Ready) 4 at a time by default: on a busy
# apiserver (~0.2 s per status patch) that is ~20 pods/s, and with 3,000 nodes 1,700 of 24,000
# operand pods were Ready 200 s after the policy while the DaemonSet controller had created
# 23,000; with 32 at a time 6,100 were Ready at the same point (kwok still at ~0.2 of a core).
# Given a KwokConfiguration, kwok v0.8.0 leaves unset options at zero (its node-lease controller
# then refuses to start), so its other defaults are spelled out.
KWOK_CONFIGURATION = """---
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options:
  podPlayStageParallelism: 32
  nodePlayStageParallelism: 16
  nodeLeaseParallelism: 4
  podsOnNodeSyncParallelism: 1
  enableDebuggingHandlers: true
  enableProfilingHandler: true
  enableContentionProfiling: false
  enablePodsOnNodeSyncListPager: true
  enablePodsOnNodeSyncStreamWatch: false
"""


def hold_initializing(stages: str) -> str:
    """kwok's stages with its pod-ready stage leaving alone a pod whose Initialized condition is
    False: the kubelet holds such a pod in its init containers (a stand-in of an init container
    says so, `sim/vgpustandin.py`, which writes it Running once they ran through)."""
    docs = [d for d in yaml.safe_load_all(stages) if d]
    for doc in docs:
        if doc.get("kind") == "Stage" and (doc.get("metadata") or {}).get("name") == "pod-ready":
            doc["spec"]["selector"]["matchExpressions"].append({
                "key": '.status.conditions.[] | select( .type == "Initialized" ) | .status',
                "operator": "NotIn", "values": ["False"]})
    return "---\n" + "\n---\n".join(yaml.safe_dump(d, sort_keys=False) for d in docs)


class ControlPlaneError(RuntimeError):
    """A component failed to start or died; the message names it and points to its log."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclass
class Component:
    name: str
    argv: list[str]
    log: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            # A session of its own: a Ctrl-C in the terminal goes to pytest, which then stops us
            # in order, instead of killing etcd under a live apiserver.
            self.process = subprocess.Popen(
                self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def check_alive(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            raise ControlPlaneError(
                f"{self.name} exited with code {self.process.returncode}; log {self.log}:\n"
                f"{_tail(self.log)}"
            )

    def kill(self) -> None:
        """SIGKILL, as a crashed machine would: no clean shutdown."""
        proc = self.process
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)

    def stop(self, timeout: float = 10.0) -> None:
        proc = self.process
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


@dataclass
class ControlPlane:
    """A running control plane. Use as a context manager, or call start() and stop()."""

    workdir: Path
    binaries: Binaries
    kwok: bool = True
    audit: bool = True
    node_lease_seconds: int = 40
    """kwok's node Lease duration: each fake node renews its Lease a few times per duration (the
    heartbeat that dominates the simulator's own apiserver load at thousands of nodes). Above 40 s
    the controller-manager's node grace period follows, so nodes stay Ready."""
    progress: Callable[[str], None] = lambda _msg: None
    feature_gates: dict[str, bool] = field(default_factory=dict)
    """Kubernetes feature gates for the apiserver, the controller-manager and the scheduler."""
    runtime_config: tuple[str, ...] = ()
    """API versions the apiserver serves besides its defaults (`--runtime-config`), e.g.
    resource.k8s.io/v1beta2=true."""
    components: list[Component] = field(default_factory=list)
    apiserver_port: int = 0

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

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- start / stop -------------------------------------------------------------------------

    def start(self, timeout: float = 120.0) -> ControlPlane:
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
        self.progress("generating PKI")
        pki = pki_mod.generate(self.workdir / "pki")
        self.apiserver_port = free_port()
        for identity in pki_mod.CLIENT_IDENTITIES:
            write_kubeconfig(
                self.kubeconfig_for(identity), server=self.server, ca=pki.ca_cert,
                user=identity, client_cert=pki.client_cert(identity),
                client_key=pki.client_key(identity),
            )
        try:
            deadline = time.monotonic() + timeout
            self._start_etcd(deadline)
            egress = self._start_egress(deadline)
            self._start_apiserver(pki, egress, deadline)
            self._start_controllers(pki, deadline)
        except BaseException:
            self.stop()
            raise
        (self.workdir / "server").write_text(self.server)
        return self

    def stop(self) -> None:
        for component in reversed(self.components):
            component.stop()

    def _launch(self, name: str, argv: list[str]) -> Component:
        component = Component(name, argv, self.workdir / "logs" / f"{name}.log")
        self.progress(f"starting {name}")
        component.start()
        self.components.append(component)
        return component

    def _wait(self, what: str, component: Component, ready: Callable[[], bool], deadline: float) -> None:
        while True:
            component.check_alive()
            if ready():
                return
            if time.monotonic() > deadline:
                raise ControlPlaneError(
                    f"{component.name}: timed out waiting for {what}; log {component.log}:\n"
                    f"{_tail(component.log)}"
                )
            time.sleep(0.2)

    def _start_etcd(self, deadline: float) -> None:
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        etcd = self._launch("etcd", [
            str(self.binaries.etcd), "--name=sim", f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls={self.etcd_url}", f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=sim=http://127.0.0.1:{peer}",
            "--quota-backend-bytes=8589934592", "--unsafe-no-fsync", "--log-level=warn",
        ])
        self._wait("etcd /health", etcd, lambda: _http_ok(f"{self.etcd_url}/health"), deadline)

    def _start_egress(self, deadline: float) -> Path:
        """The apiserver's `cluster` egress proxy (sim/egress.py): how it reaches real nodes."""
        listen = self.workdir / "egress.sock"
        if len(str(listen)) > 100:  # a unix socket path has 108 bytes at most
            listen = Path(tempfile.mkdtemp(prefix="gpu-operator-sim-")) / "egress.sock"
        self.egress_routes.mkdir(parents=True, exist_ok=True)
        proxy = self._launch("egress-proxy", [sys.executable, "-m", "gpu_operator.sim.egress", str(listen),
                                              str(self.egress_routes)])
        self._wait("the egress proxy listening", proxy, lambda: _unix_open(listen), deadline)
        return listen

    def _start_apiserver(self, pki: pki_mod.Pki, egress: Path, deadline: float) -> None:
        selector = self.workdir / "egress-selector.yaml"
        selector.write_text(yaml.safe_dump(egress_config(egress)))
        kubelet_cert, kubelet_key = pki_mod.issue_client_cert(pki, "apiserver-kubelet-client",
                                                              "kube-apiserver-kubelet-client", [])
        args = [
            str(self.binaries.kube), "kube-apiserver",
            f"--etcd-servers={self.etcd_url}", "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1", f"--secure-port={self.apiserver_port}",
            f"--tls-cert-file={pki.serving_cert}", f"--tls-private-key-file={pki.serving_key}",
            f"--client-ca-file={pki.ca_cert}",
            f"--service-account-key-file={pki.sa_pub}",
            f"--service-account-signing-key-file={pki.sa_key}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            "--service-cluster-ip-range=10.0.0.0/16", "--authorization-mode=Node,RBAC",
            "--allow-privileged=true", "--endpoint-reconciler-type=none",
            # The simulator is a single user's machine: no request throttling, so benchmarks
            # measure our operator rather than the apiserver's fairness queues.
            "--max-requests-inflight=0", "--max-mutating-requests-inflight=0",
            "--enable-priority-and-fairness=false",
            "--profiling=false", "--v=1",
            # To the kubelets (logs, exec, port-forward): through the egress proxy, to the node's
            # InternalIP (its name resolves nowhere), verifying its serving certificate.
            f"--egress-selector-config-file={selector}", "--kubelet-preferred-address-types=InternalIP",
            f"--kubelet-client-certificate={kubelet_cert}", f"--kubelet-client-key={kubelet_key}",
            f"--kubelet-certificate-authority={pki.ca_cert}",
        ]
        args += self._gates()
        if self.runtime_config:
            args.append(f"--runtime-config={','.join(self.runtime_config)}")
        if self.audit:
            policy = self.workdir / "audit-policy.yaml"
            policy.write_text(yaml.safe_dump(_audit_policy()))
            args += [f"--audit-policy-file={policy}", f"--audit-log-path={self.audit_log}",
                     "--audit-log-format=json", "--audit-log-mode=blocking"]
        apiserver = self._launch("kube-apiserver", args)
        context = self.ssl_context("admin")
        self._wait("/readyz", apiserver,
                   lambda: _http_ok(f"{self.server}/readyz", context), deadline)

    def _gates(self) -> list[str]:
        if not self.feature_gates:
            return []
        return ["--feature-gates=" + ",".join(f"{k}={str(v).lower()}" for k, v in sorted(self.feature_gates.items()))]

    def _start_controllers(self, pki: pki_mod.Pki, deadline: float) -> None:
        common = ["--leader-elect=false", "--bind-address=127.0.0.1", "--kube-api-qps=2000",
                  "--kube-api-burst=4000", *self._gates()]
        kcm = self._launch("kube-controller-manager", [
            str(self.binaries.kube), "kube-controller-manager",
            f"--kubeconfig={self.kubeconfig_for('controller-manager')}",
            f"--authentication-kubeconfig={self.kubeconfig_for('controller-manager')}",
            f"--authorization-kubeconfig={self.kubeconfig_for('controller-manager')}",
            f"--secure-port={free_port()}", f"--root-ca-file={pki.ca_cert}",
            f"--service-account-private-key-file={pki.sa_key}",
            "--use-service-account-credentials=false", "--cluster-name=sim",
            "--concurrent-gc-syncs=40", *common,
            # The DaemonSet controller's workers are a flag from 1.30 on; the floor keeps its 2.
            *(["--concurrent-daemonset-syncs=10"] if self.binaries.kubernetes == "current" else []),
            *([f"--node-monitor-grace-period={self.node_lease_seconds + 20}s"]
              if self.node_lease_seconds > 40 else []),
        ])
        scheduler = self._launch("kube-scheduler", [
            str(self.binaries.kube), "kube-scheduler",
            f"--kubeconfig={self.kubeconfig_for('scheduler')}",
            f"--authentication-kubeconfig={self.kubeconfig_for('scheduler')}",
            f"--authorization-kubeconfig={self.kubeconfig_for('scheduler')}",
            f"--secure-port={free_port()}", *common,
        ])
        components = [kcm, scheduler]
        if self.kwok:
            stages = self.workdir / "kwok-stages.yaml"
            stages.write_text(hold_initializing(self.binaries.stages_yaml()) + KWOK_CONFIGURATION)
            components.append(self._launch("kwok", [
                str(self.binaries.kwok), f"--kubeconfig={self.kubeconfig_for('kwok')}",
                "--manage-all-nodes=false",
                "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
                f"--config={stages}", f"--server-address=127.0.0.1:{free_port()}",
                "--cidr=10.244.0.0/16", "--node-ip=10.1.0.1",
                f"--node-lease-duration-seconds={self.node_lease_seconds}",
            ]))
        # The controller-manager is working once its service-account controller has created the
        # default ServiceAccount; the scheduler and kwok only have to stay up.
        context = self.ssl_context("admin")
        self._wait("the default ServiceAccount (service-account controller)", kcm, lambda: _http_ok(
            f"{self.server}/api/v1/namespaces/default/serviceaccounts/default", context), deadline)
        for component in components:
            component.check_alive()

    # -- faults (chaos tests) -----------------------------------------------------------------

    def component(self, name: str) -> Component:
        for component in self.components:
            if component.name == name:
                return component
        raise KeyError(f"no control plane component {name!r}; have {[c.name for c in self.components]}")

    def kill(self, name: str) -> None:
        """SIGKILL one component ("etcd", "kube-apiserver", ...); the others keep running."""
        self.component(name).kill()

    def revive(self, name: str, timeout: float = 60.0) -> None:
        """Start a killed component again with its original arguments (same ports, same etcd
        data) and wait until it serves: etcd's /health, the apiserver's /readyz, and the
        apiserver's watch caches caught up with etcd (`_caches_fresh`)."""
        component = self.component(name)
        if component.process is not None and component.process.poll() is None:
            raise ControlPlaneError(f"{name} is still running (pid {component.process.pid}); kill it first")
        component.start()
        deadline = time.monotonic() + timeout
        if name == "etcd":
            self._wait("etcd /health", component, lambda: _http_ok(f"{self.etcd_url}/health"), deadline)
            apiserver = self.component("kube-apiserver")
        elif name == "kube-apiserver":
            apiserver = component
        else:
            return
        self._wait("/readyz", apiserver, self.apiserver_ready, deadline)
        self._wait("watch caches caught up with etcd", apiserver, self._caches_fresh, deadline)

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
            now = self.request("GET", "/api/v1/namespaces/default/configmaps?limit=1")["metadata"]["resourceVersion"]
            for path in self._CACHED:  # served from the cache once it has caught up, else 504 after 3 s
                self.request("GET", f"{path}?resourceVersion={now}&resourceVersionMatch=NotOlderThan")
        except (OSError, ValueError, KeyError, TypeError):  # urllib's HTTPError is an OSError
            return False
        return True

    def apiserver_ready(self) -> bool:
        return _http_ok(f"{self.server}/readyz", self.ssl_context("admin"))

    # -- helpers for tests and tools -------------------------------------------------------------

    def ssl_context(self, identity: str) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        context.load_cert_chain(self.pki.client_cert(identity), self.pki.client_key(identity))
        return context

    def check_alive(self) -> None:
        for component in self.components:
            component.check_alive()

    def request(self, method: str, path: str, body: Any = None,
                content_type: str = "application/json") -> Any:
        """A raw admin request to the apiserver (for tests and the simulator's own setup)."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"{self.server}{path}", data=data, method=method,
                                     headers={"Content-Type": content_type})
        with urllib.request.urlopen(req, context=self.ssl_context("admin"), timeout=30) as resp:
            raw = resp.read()
        return json.loads(raw) if raw else None

    def serviceaccount_kubeconfig(self, namespace: str, name: str, *, create: bool = True,
                                  expiration_seconds: int = 86400) -> Path:
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
            "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
             "spec": {"expirationSeconds": expiration_seconds}},
        )["status"]["token"]
        target = self.workdir / f"sa-{namespace}-{name}.kubeconfig"
        write_kubeconfig(target, server=self.server, ca=self.pki.ca_cert, user=f"{namespace}-{name}",
                         token=token)
        return target

    def audit_events(self) -> Iterator[dict[str, Any]]:
        """Audit events of write requests (everyone but the control plane's own components)."""
        for event in self.audit_all():
            if event.get("verb") not in _READ_VERBS:
                yield event

    def audit_all(self) -> Iterator[dict[str, Any]]:
        """Every audit event: the writes of `audit_events()` and the reads of ServiceAccounts
        outside kube-system (pods and operator replicas), each with its `responseStatus.code`."""
        for line in AuditReader(self.audit_log).lines():  # every rotated file, then audit.log
            with contextlib.suppress(json.JSONDecodeError):
                yield json.loads(line)


def _audit_policy() -> dict[str, Any]:
    return {
        "apiVersion": "audit.k8s.io/v1",
        "kind": "Policy",
        "omitStages": ["RequestReceived"],
        "rules": [
            {"level": "None", "users": _QUIET_USERS},
            # Reads by ServiceAccounts (our pods, operator replicas) are kept so a test can read
            # a refusal's status code from responseStatus; everyone else's reads are not.
            {"level": "None", "userGroups": ["system:serviceaccounts:kube-system"]},
            {"level": "Metadata", "userGroups": ["system:serviceaccounts"], "verbs": list(_READ_VERBS)},
            {"level": "None", "verbs": list(_READ_VERBS)},
            {"level": "Metadata"},
        ],
    }


def _http_ok(url: str, context: ssl.SSLContext | None = None) -> bool:
    try:
        with urllib.request.urlopen(url, context=context, timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _unix_open(path: Path) -> bool:
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(str(path))
    except OSError:
        return False
    return True
