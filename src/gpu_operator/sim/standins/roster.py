"""The simulator's stand-ins for what node components do to the API on kwok nodes, which run no
container. Each acts only where its component would run, its pod on that node and Running (not
terminating), and only through the channel that component uses:

- GPU feature discovery (`sim/standins/gfd.py`): the NodeFeature object its pod publishes;
- the device plugin, through the kubelet (`sim/standins/kubeletdp.py`): `nvidia.com/gpu` in the Node's
  status capacity and allocatable;
- NVIDIA's DRA kubelet plugin (`sim/standins/draplugin.py`): the node's ResourceSlice; with its
  compute-domains container, the node's compute-domain slice and label (`sim/standins/computedomainplugin.py`);
- NVIDIA's compute-domain controller and the IMEX daemons it starts (`sim/standins/computedomain.py`): a
  ComputeDomain's DaemonSet, claim templates, cliques and status;
- NVIDIA's MIG manager (`sim/standins/migmanager.py`): the node's `nvidia.com/mig.config` applied to its
  GPUs, through the node's labels (state, paused clients) as NVIDIA's does;
- our GPU health agent (`sim/standins/health.py`, given the nodes' host trees: `sim up` does): its report
  annotation, from the agent's own code over the node's host tree, which `sim fault` changes;
- our GPU probe and vfio manager (`sim/standins/probestandin.py`): the probe's facts, labels and Events,
  the vfio manager's outcome label, from their own code over the node's host tree;
- our vGPU host-state agent (`sim/standins/vgpustandin.py`, given the nodes' host trees), the sandbox
  validator's init container on vGPU hosts: the VFs, vGPU types and MIG mode it restores in the
  node's own tree, its label, annotation and Event;
- NVIDIA's container toolkit (`sim/standins/toolkitconfig.py`, given the nodes' host trees), on nodes of a
  distribution's shape (k3s, RKE2, MicroK8s, k0s; CRI-O through `sim/standins/toolkitcrio.py`): the nvidia
  runtime in the containerd config, or CRI-O's drop-in or OCI hook, its DaemonSet's env and
  hostPath mounts point at, in the node's own host tree;
- KubeVirt's virt-handler as a device plugin (`sim/standins/virthandler.py`, given the nodes' host trees):
  the PCI host devices its KubeVirt CR permits, on vfio-pci, in the Node's capacity and
  allocatable; the kubelet's allocation of them to the VMs' pods (virt-launcher), in its checkpoint;
- optionally NFD's master (`sim/standins/nfdmaster.py`), for clusters whose user runs NFD: NodeFeature
  labels onto the Node. Never on by default (`sim up --nfd`).

What a node has comes from its shape (label gpu-operator.sim/shape), as the real components read
it from NVML. One list + watch of the components' pods (label-selected, every namespace) drives
every node stand-in; a write happens only when what the component would write changed, so
5,000 nodes cost one watch and a write per node and change. Everything runs on one asyncio loop:
`serve` in its own process (`gpu-operator sim stand-ins`, started by `sim up`), `StandIns` in a
background thread (tests, benches).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightkube import AsyncClient

from gpu_operator.node.cluster import kubetypes
from gpu_operator.sim.hardware.mighw import MigHardware
from gpu_operator.sim.standins import identity as ident
from gpu_operator.sim.standins import virthandler
from gpu_operator.sim.standins.computedomain import ComputeDomainController
from gpu_operator.sim.standins.draplugin import SlicePublisher
from gpu_operator.sim.standins.gfd import FeatureDiscovery
from gpu_operator.sim.standins.identity import Identities
from gpu_operator.sim.standins.kubeletdp import DevicePluginCapacity
from gpu_operator.sim.standins.migmanager import MigManager
from gpu_operator.sim.standins.nfdmaster import NfdMaster
from gpu_operator.sim.standins.podwatch import NodeStandIns, Player
from gpu_operator.sim.standins.toolkitconfig import ToolkitStandIn, toolkit_apps

log = logging.getLogger("gpu_operator.sim.standins")

# What the stand-ins play (module: component), for the lines that say so (`sim up`'s progress, the log).
PLAYED = {
    "sim/standins/gfd.py": "GPU feature discovery",
    "sim/standins/kubeletdp.py": "device-plugin capacity",
    "sim/standins/draplugin.py": "DRA ResourceSlices",
    "sim/standins/computedomain.py": "the compute-domain controller and IMEX daemons",
    "sim/standins/migmanager.py": "the MIG manager",
    "sim/standins/toolkitconfig.py": "the container toolkit",
    "sim/standins/virthandler.py": "KubeVirt's virt-handler",
    "sim/standins/health.py": "our health agent",
    "sim/standins/probestandin.py": "our GPU probe, our vfio manager",
    "sim/standins/vgpustandin.py": "our vGPU host-state agent",
}


@dataclass(frozen=True)
class Row:
    """One stand-in: the player class, the component, who its API calls go out as (an identity kind
    of `sim/standins/identity.py`), and the pod that must be on the node for it to act (label key, values,
    and the state it must be in). docs/simulator.md's stand-in table is this one
    (tests/unit/sim/test_standins_identity.py keeps them equal)."""

    player: str  # module.Class
    component: str
    identity: str  # identity.POD, identity.KUBELET or identity.NO_API
    label: str  # the pod label key
    apps: tuple[str, ...]  # its values (one per DaemonSet)
    pod_state: str  # what the pod must be doing

    @property
    def acts_while(self) -> str:
        pods = (
            f"{self.label}={self.apps[0]}"
            if len(self.apps) == 1
            else f"{self.label} in ({', '.join(self.apps)})"
        )
        return f"`{pods}` {self.pod_state}"

    def markdown(self) -> str:
        module, cls = self.player.split(".")
        return f"| `sim/standins/{module}.py` `{cls}` | {self.component} | {IDENTITY_TEXT[self.identity]} | {self.acts_while} |"


RUNNING = "Running (not terminating) on the node"
IDENTITY_TEXT = {
    ident.POD: "its pod's ServiceAccount (TokenRequest bound to the pod); the kubelet's for its pod's ConfigMap "
    "volumes and once the pod is gone",
    ident.KUBELET: "the kubelet (system:node:<node>) for the Node's status and its pod's ConfigMap volumes; its "
    "pod's ServiceAccount for its own reads",
    ident.NO_API: "none: no API call (the host's files only)",
}


def table() -> tuple[Row, ...]:
    """Every node stand-in `all_players` may run, in docs order."""
    from gpu_operator.sim.standins import (
        computedomain,
        draplugin,
        gfd,
        health,
        kubeletdp,
        migmanager,
        probestandin,
        vgpustandin,
    )

    return (
        Row("gfd.FeatureDiscovery", "GPU feature discovery", ident.POD, "app", (gfd.APP,), RUNNING),
        Row(
            "kubeletdp.DevicePluginCapacity",
            "NVIDIA's device plugin, through the kubelet",
            ident.KUBELET,
            "app",
            (kubeletdp.APP,),
            RUNNING,
        ),
        Row(
            "draplugin.SlicePublisher",
            "NVIDIA's DRA kubelet plugin (its compute-domains container: "
            "`sim/standins/computedomainplugin.py` `ChannelPlugin`)",
            ident.POD,
            "app",
            (draplugin.PLUGIN_APP,),
            RUNNING,
        ),
        Row(
            "computedomain.ComputeDomainController",
            "NVIDIA's compute-domain controller; the IMEX daemons it "
            "starts (each with its daemon pod's ServiceAccount, while that pod runs)",
            ident.POD,
            "app",
            (computedomain.CONTROLLER_APP,),
            RUNNING,
        ),
        Row("migmanager.MigManager", "NVIDIA's MIG manager", ident.POD, "app", (migmanager.APP,), RUNNING),
        Row(
            "toolkitconfig.ToolkitStandIn",
            "NVIDIA's container toolkit",
            ident.NO_API,
            "app",
            tuple(toolkit_apps()),
            RUNNING,
        ),
        Row(
            "virthandler.VirtHandler",
            "KubeVirt's virt-handler (its PCI device plugins)",
            ident.KUBELET,
            virthandler.LABEL,
            (virthandler.APP,),
            RUNNING,
        ),
        Row(
            "virthandler.LauncherAllocations",
            "the kubelet's allocation to VMs' pods",
            ident.NO_API,
            virthandler.LABEL,
            (virthandler.LAUNCHER,),
            "bound to the node, not ended",
        ),
        Row(
            "probestandin.ProbeStandIn", "our GPU probe", ident.POD, "app", (probestandin.PROBE_APP,), RUNNING
        ),
        Row(
            "probestandin.VfioManagerStandIn",
            "our vfio manager",
            ident.POD,
            "app",
            (probestandin.VFIO_APP,),
            RUNNING,
        ),
        Row(
            "vgpustandin.VgpuHostStandIn",
            "our vGPU host-state agent (init container)",
            ident.POD,
            "app",
            (vgpustandin.APP,),
            f"{RUNNING}, or held in its init containers, with the vgpu-host-state init container",
        ),
        Row(
            "health.HealthStandIn",
            "our GPU health agent",
            ident.POD,
            "app",
            (health.APP,),
            f"{RUNNING} with its {health.CONTAINER} container",
        ),
    )


def markdown_table() -> list[str]:
    """docs/simulator.md's stand-in table, line by line."""
    return [
        "| stand-in | component | identity | acts while |",
        "|---|---|---|---|",
        *(r.markdown() for r in table()),
    ]


def played() -> str:
    """The components the stand-ins play, as one phrase."""
    names = list(PLAYED.values())
    return f"{', '.join(names[:-1])} and {names[-1]}"


def default_players(grace_period: float | None = None, hosts: Path | None = None) -> list[Player]:
    """GFD, the device plugin through the kubelet (with `hosts`, the kwok nodes' host trees: its
    per-GPU health too), the DRA kubelet plugin (with `hosts`: its device taints), the MIG manager,
    which changes the GPUs' MIG state (`sim/hardware/mighw.py`, beside the host trees or in memory) the first
    three read; with `hosts`, the container toolkit on the nodes of a distribution's shape."""
    extra: dict[str, Any] = {} if grace_period is None else {"grace_period": grace_period}
    mig = MigHardware(hosts)
    players: list[Player] = [
        FeatureDiscovery(mig),
        DevicePluginCapacity(hosts=hosts, mig=mig, **extra),
        SlicePublisher(hosts=hosts, mig=mig),
        MigManager(mig),
        ComputeDomainController(),
    ]
    if hosts is not None:  # the container toolkit's writes on the hosts of a distribution's nodes
        players += [ToolkitStandIn(app, hosts) for app in toolkit_apps()]
        players += virthandler.players(hosts)  # KubeVirt's device plugin where virt-handler runs
    return players


def all_players(
    config: Any,
    nodes: bool = True,
    grace_period: float | None = None,
    hosts: Path | None = None,
    agents: bool | None = None,
) -> list[Player]:
    """The node stand-ins `run_all` runs (see there)."""
    players = default_players(grace_period, hosts) if nodes else []
    if (
        (nodes and hosts is not None) if agents is None else agents
    ):  # where their pods run (sandbox workloads)
        from gpu_operator.sim.standins.probestandin import node_agents

        players += node_agents(config, hosts)
        if (
            hosts is not None
        ):  # our vGPU host-state agent, in the sandbox validator's pod: it changes the trees
            from gpu_operator.sim.standins import vgpustandin

            players += vgpustandin.players(config, hosts)
    if hosts is not None:
        from gpu_operator.sim.standins.health import HealthStandIn

        players.append(HealthStandIn(config, hosts))
    return players


async def run_all(
    config: Any,
    stop: asyncio.Event,
    nodes: bool = True,
    nfd: bool = False,
    grace_period: float | None = None,
    ready: Callable[[], None] = lambda: None,
    hosts: Path | None = None,
    agents: bool | None = None,
    on_identities: Callable[[Identities], None] = lambda _i: None,
) -> None:
    """Run the NVIDIA components' node stand-ins (`nodes`), our health agent over the kwok nodes'
    host trees (`hosts`), our GPU probe and vfio manager over them (`agents`; by default with `nodes`
    wherever `hosts` is given), and/or NFD's master (`nfd`) until `stop` is set."""
    client = AsyncClient(config, field_manager="gpu-operator-sim")
    players = all_players(config, nodes=nodes, grace_period=grace_period, hosts=hosts, agents=agents)
    # each stand-in calls as its component: its pod's ServiceAccount, or the node's kubelet (sim/standins/identity.py)
    identities = Identities(client, config) if players else None
    if identities is not None:
        on_identities(identities)  # who the stand-ins are, and what was refused them (tests)
    runners: list[Any] = [NodeStandIns(client, players, identities=identities)] if players else []
    if nfd:
        runners.append(NfdMaster(client))
    tasks = [asyncio.create_task(r.run()) for r in runners]
    ready()
    try:
        waiter = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait([waiter, *tasks], return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if task is not waiter and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
    finally:
        for task in [*tasks]:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if identities is not None:
            await identities.close()
        await client.close()


class StandIns:
    """The stand-ins on an asyncio loop in a background thread: `start()`, then `stop()`."""

    def __init__(
        self,
        config: Any,
        nodes: bool = True,
        nfd: bool = False,
        grace_period: float | None = None,
        hosts: Path | None = None,
        agents: bool | None = None,
    ) -> None:
        self.config, self.nodes, self.nfd, self.grace_period = config, nodes, nfd, grace_period
        self.hosts, self.agents = hosts, agents
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name="sim-stand-ins", daemon=True)
        self.error: BaseException | None = None
        self.identities: Identities | None = None  # once running: the stand-ins' identities and refusals

    def _main(self) -> None:
        async def main() -> None:
            self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
            await run_all(
                self.config,
                self._stop,
                nodes=self.nodes,
                nfd=self.nfd,
                grace_period=self.grace_period,
                ready=self._ready.set,
                hosts=self.hosts,
                agents=self.agents,
                on_identities=self._identities,
            )

        try:
            asyncio.run(main())
        except BaseException as err:  # noqa: BLE001 - kept for the owner, who asked for a clean stop
            self.error = err
        finally:
            self._ready.set()

    def _identities(self, identities: Identities) -> None:
        self.identities = identities

    def start(self) -> StandIns:
        kubetypes.prepare()  # lightkube's types built here, before the stand-ins decode beside the caller
        self._thread.start()
        self._ready.wait(30)
        return self

    def stop(self, timeout: float = 15.0) -> None:
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"the simulator's stand-ins did not stop within {timeout:.0f}s")


@contextlib.contextmanager
def running(
    config: Any,
    nodes: bool = True,
    nfd: bool = False,
    grace_period: float | None = None,
    hosts: Path | None = None,
    agents: bool | None = None,
) -> Iterator[StandIns]:
    """The stand-ins in a background thread for the `with` block (tests, benches)."""
    standins = StandIns(
        config, nodes=nodes, nfd=nfd, grace_period=grace_period, hosts=hosts, agents=agents
    ).start()
    try:
        yield standins
    finally:
        standins.stop()


def serve(kubeconfig: str, nfd: bool = False, hosts: Path | None = None) -> None:
    """`gpu-operator sim stand-ins`: run until SIGTERM/SIGINT (the simulator starts it)."""
    import signal

    from lightkube import KubeConfig

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx2", "httpcore2"):  # one line per request otherwise
        logging.getLogger(noisy).setLevel(logging.WARNING)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        log.info(
            "stand-ins for kwok nodes: %s%s%s",
            played(),
            f" (host trees in {hosts})" if hosts else "",
            "; NFD's master" if nfd else "",
        )
        await run_all(KubeConfig.from_file(kubeconfig), stop, nfd=nfd, hosts=hosts)

    kubetypes.prepare()  # the stand-ins' worker threads (asyncio.to_thread) decode beside the loop
    asyncio.run(main())


def start_detached(kubeconfig: str, log_path: Path, nfd: bool = False, hosts: Path | None = None) -> int:
    """Start `serve` as its own session (the simulator records and stops it); returns its pid."""
    import subprocess
    import sys

    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpu_operator.cli",
                "sim",
                "stand-ins",
                f"--kubeconfig={kubeconfig}",
                *(["--nfd"] if nfd else []),
                *([f"--hosts={hosts}"] if hosts else []),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return proc.pid
