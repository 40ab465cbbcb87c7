"""A detached simulator session: start the control plane, fake nodes and operator so that they
outlive the command, record them in the state dir, report on them and tear them down."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gpu_operator.sim.commands.state import STATE_FILE, Proc, SimState
from gpu_operator.sim.plane import binaries as binaries_mod
from gpu_operator.sim.plane.controlplane import ControlPlane, ControlPlaneError

if TYPE_CHECKING:
    from gpu_operator.sim.plane.helm import Progress

OPERATOR_NAMESPACE = "gpu-operator"
OPERATOR_SA = "gpu-operator"
DEFAULT_SHAPES = ["dgx-h100:4"]


class SimError(RuntimeError):
    """The simulator cannot start or be found; the message says what to do."""


def attach(state: SimState) -> ControlPlane:
    """A ControlPlane object for an already running control plane (requests, identities, audit)."""
    port = int(state.server.rsplit(":", 1)[1])
    return ControlPlane(Path(state.dir), binaries_mod.Binaries(Path(state.binaries)), apiserver_port=port)


def running(directory: Path) -> SimState | None:
    """The state of a live simulator in `directory`, or None (nothing recorded, or it died)."""
    state = SimState.load(directory)
    if state is None:
        return None
    core = [state.proc(n) for n in ("etcd", "kube-apiserver")]
    if all(p is not None and p.alive for p in core) and apiserver_ready(state):
        return state
    return None


def apiserver_ready(state: SimState) -> bool:
    plane = attach(state)
    try:
        with urllib.request.urlopen(
            f"{plane.server}/readyz", context=plane.ssl_context("admin"), timeout=3
        ) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _prepare_dir(directory: Path, progress: Progress) -> None:
    """Clear what a previous (dead or half-stopped) session left; refuse foreign directories."""
    stale = SimState.load(directory)
    if stale is not None:
        stop_real_node(stale)
        stopped = stale.stop()
        if stopped:
            progress(f"stopped leftovers of a previous session: {', '.join(stopped)}")
    if directory.exists() and any(directory.iterdir()):
        if not (directory / STATE_FILE).exists() and not (directory / "pki").exists():
            raise SimError(f"{directory} is not empty and holds no simulator state: choose another --dir")
        shutil.rmtree(directory)
    directory.mkdir(parents=True, exist_ok=True)


def up(
    directory: Path,
    shapes: list[str],
    progress: Progress,
    build: bool = True,
    real_node: str | None = None,
    kubernetes: str = "current",
    nfd: bool = False,
    registry: bool = False,
) -> tuple[SimState, bool]:
    """Start (or reuse) a detached simulator; returns its state and whether it was started now.
    `kubernetes` "floor" runs the oldest Kubernetes we support (binaries.KUBERNETES); `nfd` also
    plays NFD's master (NodeFeature labels onto Nodes) in the stand-ins process."""
    from gpu_operator import shapes as shapes_mod

    if kubernetes not in binaries_mod.KUBERNETES:
        raise SimError(f"--kubernetes {kubernetes}: choose one of {', '.join(binaries_mod.KUBERNETES)}")
    if real_node and kubernetes != "current":
        raise SimError(
            "--real-node runs the current Kubernetes' kubelet: leave out --kubernetes floor "
            "(the floor is tested on fake nodes)"
        )
    for spec in [*shapes, *([real_node] if real_node else [])]:  # bad input fails before anything starts
        shapes_mod.parse_spec(spec)
    existing = running(directory)
    if existing is not None:
        if existing.kubernetes != kubernetes:
            raise SimError(
                f"the simulator running in {directory} runs Kubernetes {existing.kubernetes}, not "
                f"{kubernetes}: stop it first (gpu-operator sim down) or choose another --dir"
            )
        if registry and not existing.registry:
            raise SimError(
                f"the simulator running in {directory} has no registry: stop it first (gpu-operator "
                "sim down) and start it with --registry, or choose another --dir"
            )
        progress(f"reusing the simulator already running in {directory}")
        return existing, False
    _prepare_dir(directory, progress)
    progress("locating the control-plane binaries (a first build takes ~10 min; later runs reuse it)")
    try:
        found = binaries_mod.locate(build=build, kubernetes=kubernetes)
    except binaries_mod.BinariesMissing as err:
        raise SimError(str(err)) from err
    plane = ControlPlane(directory, found, progress=progress)
    t0 = time.monotonic()
    # On a failure half-way the ControlPlane stops what it started before raising.
    try:
        plane.start()
    except ControlPlaneError as err:
        raise SimError(f"the control plane did not start: {err}") from err
    state = SimState(
        dir=str(directory),
        server=plane.server,
        kubeconfig=str(plane.admin_kubeconfig),
        binaries=str(found.root),
        shapes=list(shapes),
        kubernetes=kubernetes,
        nfd=nfd,
    )
    for component in plane.components:
        assert component.process is not None
        state.add(Proc.of(component.name, component.process.pid, component.log))
    state.save()
    progress(f"control plane up in {time.monotonic() - t0:.1f}s at {plane.server}")
    try:
        if shapes:
            state.nodes = add_fake_nodes(state, shapes, progress)
            state.save()
        start_standins(state, progress, nfd=nfd)
        if registry:
            start_registry(state, progress)
        if real_node:
            add_real_node(state, found, real_node, progress)
    except BaseException:
        stop_real_node(state)
        state.stop()
        raise
    return state, True


REAL_NODE_NAME = "real-node-0"


def add_real_node(state: SimState, found: binaries_mod.Binaries, shape: str, progress: Progress) -> None:
    """Start the real node (kubelet + containerd) of `shape` with our image imported; record it."""
    from gpu_operator.sim.hardware import hosttree
    from gpu_operator.sim.realnode import realnode, realspec

    archive = realnode.image_archive()
    progress(f"starting the real node {REAL_NODE_NAME} ({shape}): kubelet + containerd")
    t0 = time.monotonic()
    host = Path(state.dir) / "real-node-host"
    hosttree.build(realspec.host_spec(shape), host)
    node = realnode.RealNode(
        Path(state.dir) / "real-node",
        REAL_NODE_NAME,
        found,
        Path(state.dir) / "pki",
        int(state.server.rsplit(":", 1)[1]),
        labels=realspec.node_labels(shape),
        host_root=host,
        egress_routes=Path(state.dir) / "egress",
    )
    node.sandbox.start()  # recorded before anything else starts in it, so `down` finds it all
    state.real_node = {
        "name": REAL_NODE_NAME,
        "dir": str(node.base_dir),
        "shape": shape,
        "host_root": str(host),
    }
    state.add(Proc.of("real-node-sandbox", node.sandbox.holder, node.sandbox.log))
    state.save()
    node.start(sandbox_started=True)
    if state.registry:
        from gpu_operator.sim.plane import helm

        node.trust_registry(state.registry["host"], Path(state.registry["ca"]))
        # what a chart installed from the registry needs for the real node (as `--helm` writes it)
        _, values = helm.values_for(Path(state.dir), REAL_NODE_NAME, str(host), [], [])
        progress(f"the real node pulls from the registry; the values the real node needs: {values}")
    for name, (pid, log) in node.pids().items():
        state.add(Proc.of(name, pid, log))
    state.save()
    progress(f"real node Ready in {time.monotonic() - t0:.1f}s; importing our image {archive.name}")
    node.import_images(archive)
    progress(f"real node {REAL_NODE_NAME} runs our image (logs {node.logs}, pod logs {node.pod_logs})")


def start_registry(state: SimState, progress: Progress) -> None:
    """The OCI registry (sim/plane/registry.py) with TLS from the simulator's CA and basic auth; its
    password is written to registry/password and, as a containers auth file, registry/auth.json
    (both 0600), recorded in the state."""
    from gpu_operator.sim.plane.registry import Registry

    reg = Registry(Path(state.dir) / "registry", Path(state.dir) / "pki")
    progress("starting the OCI registry (tools/registry; a first build takes ~40 s)")
    reg.start()
    state.add(Proc.of("registry", reg.process.pid if reg.process else 0, reg.log))
    secret = reg.base_dir / "password"
    secret.write_text(reg.password)
    secret.chmod(0o600)
    state.registry = {
        "host": reg.host,
        "user": reg.user,
        "password_file": str(secret),
        "ca": str(reg.ca_cert),
        "auth_file": str(reg.auth_file()),
    }  # the login for skopeo --authfile (0600)
    state.save()
    progress(f"registry at https://{reg.host} (user {reg.user}, password in {secret}, CA {reg.ca_cert})")
    state.registry["chart_repo"] = start_chart_repo(state, reg.base_dir / "charts")
    state.save()
    progress(f"chart repository at {state.registry['chart_repo']} (our packaged chart and index.yaml)")


def start_chart_repo(state: SimState, directory: Path, timeout: float = 30.0) -> str:
    """A classic chart repository over HTTPS (sim/plane/chartrepo.py, a process of its own) serving our
    packaged chart and its index.yaml from `directory`; returns its URL."""
    import helm_python

    from gpu_operator.sim.plane.helm import packaged_chart

    packaged_chart(directory)
    helm_python.repo_index_generate(directory)
    log = Path(state.dir) / "logs" / "chart-repo.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpu_operator.sim.plane.chartrepo",
                str(directory),
                str(Path(state.dir) / "pki"),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    state.add(Proc.of("chart-repo", proc.pid, log))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        served = [
            ln for ln in log.read_text(errors="replace").splitlines() if ln.startswith("serving https://")
        ]
        if served:
            return served[-1].removeprefix("serving ")
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    raise SimError(
        f"the chart repository did not start; log {log}:\n{log.read_text(errors='replace')[-2000:]}"
    )


def stop_real_node(state: SimState) -> bool:
    """Kill everything inside the real node's sandbox (kubelet, containerd, shims, containers) and
    remove its cgroups; its mounts and network go with the namespaces. True if it was running."""
    from gpu_operator.sim.realnode import realnode

    info, holder = state.real_node, state.proc("real-node-sandbox")
    if not info:
        return False
    running = holder is not None and holder.alive  # (pid, start time): never a recycled pid
    realnode.cleanup(Path(info["dir"]), info["name"], holder.pid if running and holder else 0)
    return running


def install_chart(state: SimState, files: list[Path], sets: list[str], progress: Progress) -> None:
    """Our chart with real Helm, the operator on the real node (see sim/plane/helm.py)."""
    from gpu_operator.sim.plane import helm

    info = state.real_node
    if not info:
        raise SimError("no real node in this simulator: start it with --real-node")
    try:
        values, path = helm.values_for(Path(state.dir), info["name"], info["host_root"], files, sets)
        progress(f"the real node's values ({path}):\n{path.read_text()}")
        helm.install(Path(state.kubeconfig), Path(state.dir), values, progress)
    except helm.HelmInstallError as err:
        raise SimError(str(err)) from err
    except Exception as err:  # Helm's own errors: its message says what failed
        raise SimError(f"helm install failed: {err}") from err
    progress(f"installed; the operator runs as a pod: kubectl -n {helm.NAMESPACE} get pods -o wide")


def admin_client(state: SimState, field_manager: str = "gpu-operator-sim"):  # type: ignore[no-untyped-def]
    from lightkube import Client, KubeConfig

    return Client(KubeConfig.from_file(state.kubeconfig), field_manager=field_manager)


def add_fake_nodes(state: SimState, shapes: list[str], progress: Progress) -> list[str]:
    """The kwok nodes, Ready; what node agents publish comes later, from the stand-ins, where
    their pods run."""
    from gpu_operator.sim.plane import nodes

    client = admin_client(state)
    try:
        progress(f"adding fake nodes: {' '.join(shapes)}")
        names = nodes.add_nodes(client, shapes)
        nodes.wait_ready(client, names)
        progress(f"{len(names)} node(s) Ready")
        return names
    finally:
        client.close()


def start_standins(state: SimState, progress: Progress, nfd: bool = False) -> None:
    """The stand-ins for what node components do on kwok nodes (sim/standins/roster.py `PLAYED`, over the
    host trees in <dir>/hosts; with `nfd` NFD's master too), one detached process, recorded."""
    from gpu_operator.sim.standins.roster import played, start_detached

    log = Path(state.dir) / "logs" / "stand-ins.log"
    pid = start_detached(state.kubeconfig, log, nfd=nfd, hosts=Path(state.dir) / "hosts")
    state.add(Proc.of("stand-ins", pid, log))
    state.save()
    progress(
        f"node stand-ins started (pid {pid}): {played()} on kwok nodes where their pods run"
        f"{'; NFD master' if nfd else ''}"
    )


def operator_kubeconfig(plane: ControlPlane) -> Path:
    """A kubeconfig for the operator's own ServiceAccount, bound to cluster-admin: its writes show
    up in the audit log under its own name (system:serviceaccount:gpu-operator:gpu-operator)."""
    import contextlib

    kubeconfig = plane.serviceaccount_kubeconfig(OPERATOR_NAMESPACE, OPERATOR_SA)
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "gpu-operator-sim"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": OPERATOR_SA, "namespace": OPERATOR_NAMESPACE}],
    }
    with contextlib.suppress(urllib.error.HTTPError):  # 409: bound by an earlier run
        plane.request("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", binding)
    return kubeconfig


def start_operator(state: SimState, progress: Progress, extra_args: list[str] | None = None) -> Proc:
    """Apply the CRDs and start the operator detached (recorded as "operator" in the state)."""
    from gpu_operator.kube.crds import apply_crds
    from gpu_operator.sim.plane.operator_process import OperatorProcess

    existing = state.proc("operator")
    if existing is not None and existing.alive:
        progress(f"reusing the running operator (pid {existing.pid})")
        return existing
    client = admin_client(state)
    try:
        progress("applying the CRDs")
        apply_crds(client)
    finally:
        client.close()
    kubeconfig = operator_kubeconfig(attach(state))
    log = Path(state.dir) / "logs" / "operator.log"
    operator = OperatorProcess(
        kubeconfig=kubeconfig, namespace=OPERATOR_NAMESPACE, log=log, extra_args=extra_args or []
    ).start()
    assert operator.process is not None
    proc = Proc.of("operator", operator.process.pid, log)
    state.add(proc)
    state.operator_namespace, state.metrics_port = OPERATOR_NAMESPACE, operator.metrics_port
    state.save()
    progress(
        f"operator started (pid {proc.pid}, log {log}, metrics http://127.0.0.1:{operator.metrics_port}/metrics)"
    )
    wait_operator_ready(operator.health_port, proc)
    return proc


def wait_operator_ready(health_port: int, proc: Proc, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not proc.alive:
            raise SimError(f"the operator exited during start-up; see {proc.log}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{health_port}/readyz", timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.3)
    raise SimError(f"the operator did not report ready within {timeout:.0f}s; see {proc.log}")


def down(directory: Path, progress: Progress) -> list[str]:
    """Stop everything recorded in `directory` (SIGTERM, then SIGKILL); safe to repeat."""
    state = SimState.load(directory)
    if state is None:
        return []
    real = stop_real_node(state)  # first: the sandbox's members are found through its holder
    stopped = state.stop()
    if real:
        stopped.insert(0, "real node")
    state.path.unlink(missing_ok=True)
    if stopped:
        progress(f"stopped {', '.join(stopped)} (logs kept in {directory / 'logs'})")
    return stopped


@dataclass
class Report:
    state: SimState | None
    alive: list[str]
    dead: list[str]
    apiserver_ready: bool


def report(directory: Path) -> Report:
    state = SimState.load(directory)
    if state is None:
        return Report(None, [], [], False)
    alive = [p.name for p in state.processes if p.alive]
    dead = [p.name for p in state.processes if p.name not in alive]
    return Report(state, alive, dead, "kube-apiserver" in alive and apiserver_ready(state))
