"""`gpu-operator sim fault NODE ...`: find the node's host tree in a running simulator and play
the fault on it (`sim/hardware/faults.py`). A kwok node's tree is made from its shape at its first fault
(under <sim dir>/hosts) and the change is announced to the stand-ins; the real node's is its own
host tree, which its device-plugin stand-in (and our agents' pods there) read directly.

`--reboot` (a kwok vGPU host): the node's kubelet ends its pods at shutdown as graceful node
shutdown does (phase Failed, reason Terminated, "Pod was terminated in response to imminent node
shutdown.": kubernetes.io, "Node Shutdowns"), and the DaemonSet controller (the control plane's
own) deletes such failed daemon pods and makes new ones, which start once the node is back. A
kwok node cannot be down, and kwok starts a pod at once: so the host tree reboots first (its
state lost, a new boot) and the pods end after, so that no new pod can start on the old boot,
as none can on a real node, whose kubelet runs pods only once it is back."""

from __future__ import annotations

from pathlib import Path

from gpu_operator.sim.commands.state import SimState
from gpu_operator.sim.hardware.faults import FaultError, HostFaults, NodeHosts, node_host_spec, parse_xid
from gpu_operator.sim.hardware.vgpuhw import is_vgpu_host

ACTIONS = ("xid", "gone", "clear", "reboot")
SHUTDOWN_REASON = "Terminated"  # the kubelet's graceful node shutdown (kubernetes.io, "Node Shutdowns")
SHUTDOWN_MESSAGE = "Pod was terminated in response to imminent node shutdown."


def check_action(
    xid: str | None, gone: bool, clear: bool, gpu: int | None, reboot: bool = False
) -> tuple[str, int | None]:
    """The one action asked for (and the Xid); bad combinations named with the fix."""
    chosen = [
        name
        for name, on in (
            ("--xid", xid is not None),
            ("--gone", gone),
            ("--clear", clear),
            ("--reboot", reboot),
        )
        if on
    ]
    if len(chosen) != 1:
        raise FaultError(
            f"{' and '.join(chosen) or 'no fault'} given: give exactly one of --xid N, --gone, "
            "--clear or --reboot (see gpu-operator sim fault --help)"
        )
    if clear and gpu is not None:
        raise FaultError(
            "--gpu with --clear: --clear brings back every GPU of the node (a reboot): leave out --gpu"
        )
    if reboot and gpu is not None:
        raise FaultError("--gpu with --reboot: a reboot is the whole node's: leave out --gpu")
    if reboot:
        return "reboot", None
    if gpu is not None and gpu < 0:
        raise FaultError(f"--gpu {gpu}: give a GPU index from 0 (NVML's order, by PCI address)")
    if xid is not None:
        return "xid", parse_xid(xid)
    return ("gone" if gone else "clear"), None


def node_faults(state: SimState, node: str) -> tuple[HostFaults, NodeHosts | None]:
    """The node's host tree and book; for a kwok node also the simulator's trees (to announce)."""
    real = state.real_node or {}
    if node == real.get("name") and real.get("host_root"):
        root = Path(real["host_root"])
        return HostFaults(root, root.with_name(root.name + ".faults")), None
    shape = _kwok_shape(state, node)
    hosts = NodeHosts(Path(state.dir) / "hosts")
    return hosts.faults(node, node_host_spec(shape)), hosts


def _kwok_shape(state: SimState, node: str) -> str:
    from lightkube import Client, KubeConfig
    from lightkube.core.exceptions import ApiError
    from lightkube.resources.core_v1 import Node

    from gpu_operator.shapes import KWOK_ANNOTATION, KWOK_ANNOTATION_VALUE, SHAPE_LABEL

    client = Client(KubeConfig.from_file(state.kubeconfig))
    try:
        found = client.get(Node, node)
    except ApiError as err:
        if err.status.code != 404:
            raise
        names = sorted(str(n.metadata.name) for n in client.list(Node) if n.metadata is not None)
        shown = ", ".join(names[:8]) + (f" (and {len(names) - 8} more)" if len(names) > 8 else "")
        raise FaultError(
            f"NODE {node!r}: no such node in this simulator: give one of {shown or 'none (no nodes)'}"
            " (kubectl get nodes)"
        ) from err
    finally:
        client.close()
    meta = found.metadata
    labels, notes = (meta.labels or {}) if meta else {}, (meta.annotations or {}) if meta else {}
    if notes.get(KWOK_ANNOTATION) != KWOK_ANNOTATION_VALUE or SHAPE_LABEL not in labels:
        raise FaultError(
            f"NODE {node!r} is neither a simulated GPU node (kwok, label {SHAPE_LABEL}) nor the "
            "simulator's real node: give one of those"
        )
    return str(labels[SHAPE_LABEL])


def end_pods(state: SimState, node: str) -> list[str]:
    """The kubelet's graceful node shutdown: every pod still running on `node` ends (its status:
    phase Failed, reason Terminated); returns their names (namespace/name)."""
    from lightkube import Client, KubeConfig
    from lightkube.resources.core_v1 import Pod

    client = Client(KubeConfig.from_file(state.kubeconfig), field_manager="gpu-operator-sim-kubelet")
    ended = []
    try:
        for pod in client.list(Pod, namespace="*", fields={"spec.nodeName": node}):
            meta, status = pod.metadata, pod.status
            if (
                meta is None
                or meta.deletionTimestamp is not None
                or (status and status.phase in ("Succeeded", "Failed"))
            ):
                continue
            patch = {"status": {"phase": "Failed", "reason": SHUTDOWN_REASON, "message": SHUTDOWN_MESSAGE}}
            client.patch(Pod.Status, str(meta.name), patch, namespace=str(meta.namespace))
            ended.append(f"{meta.namespace}/{meta.name}")
    finally:
        client.close()
    return ended


def reboot(state: SimState, node: str) -> str:
    """Reboot a kwok vGPU host: its tree first (state lost, a new boot), then its pods end."""
    real = state.real_node or {}
    if node == real.get("name"):
        raise FaultError(
            f"--reboot: {node} is the simulator's real node, whose kubelet and host are real: "
            "--reboot plays a kwok vGPU host (shape vgpu-host-h100); --clear clears this node's faults"
        )
    shape = _kwok_shape(state, node)
    spec = node_host_spec(shape)
    if not is_vgpu_host(spec):
        raise FaultError(
            f"--reboot: node {node} (shape {shape}) is not a vGPU host: --reboot plays what a vGPU host "
            "loses at a reboot (shape vgpu-host-h100); --clear plays the reboot that clears other "
            "nodes' faults"
        )
    hosts = NodeHosts(Path(state.dir) / "hosts")
    faults = hosts.faults(node, spec)
    book = faults.reboot_vgpu_host(spec)
    hosts.announce(node)
    pods = end_pods(state, node)
    mig = "kept (the GPU keeps it)" if spec["vgpu"].get("mig_persists_reboot") else "off (the GPU keeps none)"
    return (
        f"node {node}: rebooted: {len(book.gpus)} GPU(s) with no VF or vGPU, MIG mode {mig}, a new boot_id; "
        f"{len(pods)} pod(s) ended by the node's shutdown, their DaemonSets make new ones (host tree {faults.root})"
    )


def inject(state: SimState, node: str, action: str, xid: int | None, gpu: int | None) -> str:
    """Play the fault; returns what was done, in one line."""
    if action == "reboot":
        return reboot(state, node)
    faults, hosts = node_faults(state, node)
    if action == "xid":
        assert xid is not None
        done = faults.xid(xid, gpu)
        said = f"GPU {done.index} ({done.address}): Xid {xid} written to the kernel log"
    elif action == "gone":
        done = faults.gone(gpu)
        said = (
            f"GPU {done.index} ({done.address}) fell off the bus: Xid 79 logged, gone from sysfs, "
            f"/proc/driver/nvidia and /dev/nvidia{done.minor}"
        )
    else:
        book = faults.clear()
        said = f"rebooted: all {len(book.gpus)} GPU(s) back, the kernel log empty, a new boot_id"
    if hosts is not None:
        hosts.announce(node)
    return f"node {node}: {said} (host tree {faults.root})"
