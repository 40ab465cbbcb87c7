"""Starts and stops a real control plane on 127.0.0.1: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler and kwok (fake nodes), each logging to its own file.

`ControlPlane` runs them (start, stop, and kill/revive for chaos tests); their command lines are
in `planeargs`, the process of each in `processes.PlaneComponent`, and the client side (requests,
kubeconfigs, audit events) in `planeclient.PlaneClient`, its base."""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gpu_operator.sim.plane import pki as pki_mod
from gpu_operator.sim.plane import planeargs
from gpu_operator.sim.plane.binaries import Binaries
from gpu_operator.sim.plane.kubeconfig import write_kubeconfig
from gpu_operator.sim.plane.planeclient import PlaneClient
from gpu_operator.sim.plane.processes import (
    ControlPlaneError,
    PlaneComponent,
    free_port,
    http_ok,
    tail,
    unix_open,
)

# What callers import from here besides ControlPlane: its error and the port picker its users share.
__all__ = ["ControlPlane", "ControlPlaneError", "free_port"]


@dataclass
class ControlPlane(PlaneClient):
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
    components: list[PlaneComponent] = field(default_factory=list)
    apiserver_port: int = 0

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
                self.kubeconfig_for(identity),
                server=self.server,
                ca=pki.ca_cert,
                user=identity,
                client_cert=pki.client_cert(identity),
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

    def _launch(self, name: str, argv: list[str]) -> PlaneComponent:
        component = PlaneComponent(name, argv, self.workdir / "logs" / f"{name}.log")
        self.progress(f"starting {name}")
        component.start()
        self.components.append(component)
        return component

    def _wait(self, what: str, component: PlaneComponent, ready: Callable[[], bool], deadline: float) -> None:
        while True:
            component.check_alive()
            if ready():
                return
            if time.monotonic() > deadline:
                raise ControlPlaneError(
                    f"{component.name}: timed out waiting for {what}; log {component.log}:\n"
                    f"{tail(component.log)}"
                )
            time.sleep(0.2)

    def _start_etcd(self, deadline: float) -> None:
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        etcd = self._launch(
            "etcd", planeargs.etcd_argv(self.binaries.etcd, self.workdir / "etcd", self.etcd_url, peer)
        )
        self._wait("etcd /health", etcd, lambda: http_ok(f"{self.etcd_url}/health"), deadline)

    def _start_egress(self, deadline: float) -> Path:
        """The apiserver's `cluster` egress proxy (sim/plane/egress.py): how it reaches real nodes."""
        listen = self.workdir / "egress.sock"
        if len(str(listen)) > 100:  # a unix socket path has 108 bytes at most
            listen = Path(tempfile.mkdtemp(prefix="gpu-operator-sim-")) / "egress.sock"
        self.egress_routes.mkdir(parents=True, exist_ok=True)
        proxy = self._launch(
            "egress-proxy",
            [sys.executable, "-m", "gpu_operator.sim.plane.egress", str(listen), str(self.egress_routes)],
        )
        self._wait("the egress proxy listening", proxy, lambda: unix_open(listen), deadline)
        return listen

    def _start_apiserver(self, pki: pki_mod.Pki, egress: Path, deadline: float) -> None:
        apiserver = self._launch(
            "kube-apiserver",
            planeargs.apiserver_argv(
                self.binaries.kube,
                self.workdir,
                pki,
                etcd_url=self.etcd_url,
                port=self.apiserver_port,
                egress=egress,
                gates=planeargs.gate_flags(self.feature_gates),
                runtime_config=self.runtime_config,
                audit_log=self.audit_log if self.audit else None,
            ),
        )
        context = self.ssl_context("admin")
        self._wait("/readyz", apiserver, lambda: http_ok(f"{self.server}/readyz", context), deadline)

    def _start_controllers(self, pki: pki_mod.Pki, deadline: float) -> None:
        gates = planeargs.gate_flags(self.feature_gates)
        kcm = self._launch(
            "kube-controller-manager",
            planeargs.controller_manager_argv(
                self.binaries.kube,
                self.kubeconfig_for("controller-manager"),
                pki,
                gates,
                kubernetes=self.binaries.kubernetes,
                node_lease_seconds=self.node_lease_seconds,
            ),
        )
        scheduler = self._launch(
            "kube-scheduler",
            planeargs.scheduler_argv(self.binaries.kube, self.kubeconfig_for("scheduler"), gates),
        )
        components = [kcm, scheduler]
        if self.kwok:
            components.append(
                self._launch(
                    "kwok",
                    planeargs.kwok_argv(
                        self.binaries.kwok,
                        self.kubeconfig_for("kwok"),
                        self.workdir,
                        self.binaries.stages_yaml(),
                        self.node_lease_seconds,
                    ),
                )
            )
        # The controller-manager is working once its service-account controller has created the
        # default ServiceAccount; the scheduler and kwok only have to stay up.
        context = self.ssl_context("admin")
        self._wait(
            "the default ServiceAccount (service-account controller)",
            kcm,
            lambda: http_ok(f"{self.server}/api/v1/namespaces/default/serviceaccounts/default", context),
            deadline,
        )
        for component in components:
            component.check_alive()

    # -- faults (chaos tests) -----------------------------------------------------------------

    def component(self, name: str) -> PlaneComponent:
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
            self._wait("etcd /health", component, lambda: http_ok(f"{self.etcd_url}/health"), deadline)
            apiserver = self.component("kube-apiserver")
        elif name == "kube-apiserver":
            apiserver = component
        else:
            return
        self._wait("/readyz", apiserver, self.apiserver_ready, deadline)
        self._wait("watch caches caught up with etcd", apiserver, self._caches_fresh, deadline)

    def check_alive(self) -> None:
        for component in self.components:
            component.check_alive()
