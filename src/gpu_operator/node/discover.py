"""GPU-node discovery without Node Feature Discovery: the NFD labels this operator reads, read from
the host by our own agent (the chart's gpu-operator-node-discovery DaemonSet, nfd.enabled).

The labels and their meaning are NFD's (kubernetes-sigs/node-feature-discovery; NVIDIA's chart
configures its PCI labels by vendor, so a node with an NVIDIA display-class function gets
`feature.node.kubernetes.io/pci-10de.present=true`):
- pci-10de.present           an NVIDIA GPU (PCI class 0300 or 0302) is on the bus
- pci-10de_<device>.present  each NVIDIA GPU model on the bus, by PCI device ID (NFD's label
                             with deviceLabelFields [vendor, device], e.g. pci-10de_2330.present
                             for an H100 SXM5): the operator tells MIG-capable nodes by it where
                             GPU feature discovery's nvidia.com/mig.capable is not there (yet)
- pci-10de_<device>.present  also for NVSwitches (PCI class 0680; H100's 22a3), so that a VM given
                             NVLink GPUs without their NVSwitches can be told from one given both
- cpu-cpuid.HYPERVISOR       a VM guest: the CPU's `hypervisor` flag (/proc/cpuinfo), NFD's CPUID label
- kernel-version.full        the running kernel (/proc/sys/kernel/osrelease)
- system-os_release.ID, .VERSION_ID, .VERSION_ID.major, .VERSION_ID.minor   from /etc/os-release

Only labels this agent wrote are ever removed (a GPU gone, say): it lists them in the annotation
`nvidia.com/gpu-operator.discovery.labels`; a label NFD or a person set is never touched.
"""

from __future__ import annotations

import json
import os
import re
import time
from typing import Annotated, Any

import typer

from gpu_operator.node.host import pci
from gpu_operator.node.host.driver import os_release
from gpu_operator.node.host.guest import NVSWITCH_CLASS_PREFIX, read_guest
from gpu_operator.node.host.hostfs import HostFS
from gpu_operator.node.options import HostRoot, host_fs
from gpu_operator.vocabulary import (
    KERNEL_FULL,
    LABEL_VALUE_PATTERN,
    NFD_DEVICE_LABEL_PREFIX,
    NFD_GPU_LABELS,
    NFD_HYPERVISOR,
    NVIDIA,
    OS_ID,
    OS_VERSION_ID,
    OS_VERSION_MAJOR,
)

OWNED_ANNOTATION = f"{NVIDIA}/gpu-operator.discovery.labels"
COMPONENT = "gpu-operator-node-discovery"
_VALUE = re.compile(LABEL_VALUE_PATTERN)


def discovered(fs: HostFS) -> tuple[dict[str, str], list[str]]:
    """The NFD labels this host earns, and why any label was left out (a value Kubernetes refuses)."""
    nvidia = pci.scan(fs, pci.NVIDIA_VENDOR)
    gpus = [f for f in nvidia if f.pci_class[:4] in ("0300", "0302") and f.physfn is None]
    models = gpus + [f for f in nvidia if f.pci_class.startswith(NVSWITCH_CLASS_PREFIX)]
    release = os_release(fs)
    version = release.get("VERSION_ID", "")
    wanted = {
        NFD_GPU_LABELS[0]: "true" if gpus else "",
        **{f"{NFD_DEVICE_LABEL_PREFIX}{g.device.lower()}.present": "true" for g in models},
        NFD_HYPERVISOR: "true" if read_guest(fs, []).hypervisor_flag else "",
        KERNEL_FULL: fs.read_value("/proc/sys/kernel/osrelease") or "",
        OS_ID: release.get("ID", ""),
        OS_VERSION_ID: version,
        OS_VERSION_MAJOR: version.split(".")[0] if version else "",
        f"{OS_VERSION_ID}.minor": version.split(".")[1] if version.count(".") >= 1 else "",
    }
    labels: dict[str, str] = {}
    skipped: list[str] = []
    for key, value in wanted.items():
        if not value:
            continue
        if len(value) > 63 or not _VALUE.match(value):
            skipped.append(
                f"{key}={value!r}: not a valid label value (63 characters, alphanumerics, '-', '_', '.')"
            )
            continue
        labels[key] = value
    return labels, skipped


def changes(
    labels: dict[str, str], current: dict[str, str], owned: list[str]
) -> tuple[dict[str, str | None], list[str]]:
    """The label patch (set what changed, remove what we wrote and no longer earn) and what we then own."""
    patch: dict[str, str | None] = {k: v for k, v in labels.items() if current.get(k) != v}
    patch.update({k: None for k in owned if k not in labels and k in current})
    # ours: what we write now, and what we wrote before and still earn (a label NFD set to the
    # same value stays NFD's)
    return patch, sorted(k for k in labels if k in patch or k in owned)


def publish_once(fs: HostFS, node: Any) -> tuple[dict[str, str | None], list[str]]:
    """One pass: read the host, write what changed. Returns the patch and the skipped labels."""
    labels, skipped = discovered(fs)
    current, annotations = node.node_metadata()
    try:
        owned = json.loads(annotations.get(OWNED_ANNOTATION) or "[]")
    except ValueError:
        owned = []
    patch, now_owned = changes(labels, current, owned if isinstance(owned, list) else [])
    text = json.dumps(now_owned)
    if patch or annotations.get(OWNED_ANNOTATION) != text:
        node.publish(patch, [], {OWNED_ANNOTATION: text})
    return patch, skipped


def discover(
    host_root: HostRoot = None,
    publish: Annotated[bool, typer.Option(help="Write the labels on NODE_NAME through the API.")] = False,
    interval: Annotated[float, typer.Option(help="With --publish: seconds between passes.")] = 300.0,
    once: Annotated[bool, typer.Option(help="With --publish: one pass, then exit.")] = False,
) -> None:
    """GPU-node discovery without NFD: print (or --publish on NODE_NAME) the NFD labels the operator
    reads (pci-10de.present, kernel-version.full, system-os_release.*), read from this host."""
    fs = host_fs(host_root)
    if not publish:
        labels, skipped = discovered(fs)
        typer.echo(json.dumps({"labels": labels, "skipped": skipped}, indent=2))
        return
    node_name = os.environ.get("NODE_NAME", "")
    if not node_name:
        raise typer.BadParameter("--publish needs NODE_NAME (the downward API's spec.nodeName)")
    from lightkube.core.exceptions import ConfigError

    from gpu_operator.node.cluster.kubeapi import KubeNodeView

    try:
        view = KubeNodeView(node_name, os.environ.get("OPERATOR_NAMESPACE", ""), component=COMPONENT)
    except ConfigError as err:
        raise typer.BadParameter(
            f"--publish needs Kubernetes API access (in-cluster or KUBECONFIG): {err}"
        ) from None
    while True:
        patch, skipped = publish_once(fs, view)
        for problem in skipped:
            typer.echo(f"{node_name}: left out {problem}", err=True)
        if patch:
            shown = ", ".join(f"{k}={v}" if v is not None else f"-{k}" for k, v in sorted(patch.items()))
            typer.echo(f"{node_name}: {shown}")
        if once:
            return
        time.sleep(interval)
