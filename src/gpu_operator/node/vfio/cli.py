"""`gpu-operator vfio-manage`: bind/unbind on the command line, persist across reboots, reconcile in the cluster."""

from __future__ import annotations

import os
import time
from typing import Annotated, Any, Literal

import typer

from gpu_operator.node.options import HostRoot, host_fs

vfio_app = typer.Typer(
    help="Move NVIDIA GPUs to vfio-pci (bind) or back to the host's drivers (unbind); persist or reconcile that.",
    no_args_is_help=True,
)


def _loader(fs: Any) -> Any:
    from gpu_operator.node.host.runner import HostRunner
    from gpu_operator.node.vfio import manage as vfio

    def load() -> None:
        result = HostRunner(fs).run(["modprobe", vfio.VFIO_DRIVER], root="/", timeout=60)
        if not result.ok:
            typer.echo(f"could not load vfio-pci: {result.summary()}", err=True)

    return load


def _vfio(
    action: Literal["bind", "unbind"],
    all_gpus: bool,
    device: list[str] | None,
    dry_run: bool,
    host_root: str | None,
    load_module: bool,
) -> None:
    from gpu_operator.node.host.hostfs import KernelWriter
    from gpu_operator.node.vfio import manage as vfio

    fs = host_fs(host_root)
    try:
        if dry_run:
            plans = vfio.plan(fs, action, device or [], all_gpus)
        else:
            plans = vfio.execute(
                fs,
                KernelWriter(fs),
                action,
                device or [],
                all_gpus,
                load_vfio=_loader(fs) if load_module else None,
            )
    except vfio.VfioUsageError as err:
        raise typer.BadParameter(str(err)) from None
    if not plans:
        typer.echo("no NVIDIA GPU on this host; nothing to do")
    failed = False
    for p in plans:
        head = f"{p.gpu} {p.name or ''}".strip()
        if p.refused:
            failed = True
            typer.echo(f"{head}: REFUSED: {p.refused}", err=True)
            continue
        if dry_run:
            typer.echo(f"{head}: " + ("nothing to do" if not p.writes else f"{len(p.writes)} write(s)"))
            for path, value in p.writes:
                typer.echo(f"  echo {value.strip()!r} > {path}" if value.strip() else f"  echo > {path}")
            continue
        failed |= not p.ok
        typer.echo(f"{head}: {p.result}")
    if failed:
        raise typer.Exit(1)


AllGpus = Annotated[bool, typer.Option("--all", help="Every NVIDIA GPU on the host.")]
Devices = Annotated[list[str] | None, typer.Option("--device", help="A GPU's PCI address (repeatable).")]
DryRun = Annotated[bool, typer.Option("--dry-run", help="Print the sysfs writes instead of making them.")]


@vfio_app.command("bind")
def vfio_bind(
    all_gpus: AllGpus = False,
    device: Devices = None,
    dry_run: DryRun = False,
    load_module: Annotated[
        bool, typer.Option(help="modprobe vfio-pci on the host when it is not loaded.")
    ] = True,
    host_root: HostRoot = None,
) -> None:
    """Bind GPUs (and the NVIDIA functions of their IOMMU groups) to vfio-pci."""
    _vfio("bind", all_gpus, device, dry_run, host_root, load_module)


@vfio_app.command("unbind")
def vfio_unbind(
    all_gpus: AllGpus = False, device: Devices = None, dry_run: DryRun = False, host_root: HostRoot = None
) -> None:
    """Give GPUs back to the host: clear driver_override, unbind from vfio-pci, let the kernel re-probe."""
    _vfio("unbind", all_gpus, device, dry_run, host_root, False)


@vfio_app.command("persist")
def vfio_persist(
    all_gpus: AllGpus = False,
    device: Devices = None,
    remove: Annotated[bool, typer.Option("--remove", help="Remove exactly what persist wrote.")] = False,
    host_root: HostRoot = None,
) -> None:
    """Write the early-boot script (driver_override=vfio-pci before nvidia loads) and the vfio module lines.

    A GPU that bind would refuse for good (IOMMU off, its group shared with a non-NVIDIA device,
    group companions not named) is left out with the reason, the others are written, and the
    command exits 1."""
    from gpu_operator.node.host import persist
    from gpu_operator.node.vfio import manage as vfio

    fs = host_fs(host_root)
    left_out: dict[str, str] = {}
    try:
        if remove:
            if all_gpus or device:
                raise typer.BadParameter(
                    "--remove takes no --all/--device: it removes everything persist wrote"
                )
            result = persist.remove(fs)
        else:
            gpus = vfio.select_gpus(fs, device or [], all_gpus)
            addresses, left_out = vfio.persistable(fs, gpus)
            for address, why in left_out.items():
                typer.echo(f"left out {address}: {why}", err=True)
            if gpus and not addresses:
                typer.echo("no GPU may be persisted on vfio-pci; nothing written", err=True)
                raise typer.Exit(1)
            result = persist.persist(fs, addresses)
    except (vfio.VfioUsageError, persist.PersistError) as err:
        raise typer.BadParameter(str(err)) from None
    for path in result.written:
        typer.echo(f"wrote {path}")
    for path in result.removed:
        typer.echo(f"removed {path}")
    for path in result.unchanged:
        typer.echo(f"unchanged {path}")
    for note in result.notes:
        typer.echo(f"note: {note}")
    # (a GPU left out above makes the command exit 1 once the others are written)
    partial = not remove and bool(left_out)
    if not result.changed:
        typer.echo("nothing changed" + ("" if remove else "; the initramfs needs no rebuild for this"))
        raise typer.Exit(1 if partial else 0)
    typer.echo(
        f"next: regenerate the initramfs on the host ({result.flavor}): {persist.regenerate_command(result.flavor)}"
    )
    if not remove:
        typer.echo("then reboot; `gpu-operator doctor` afterwards shows every GPU on vfio-pci and persisted")
        for line in persist.rollback_text(result.flavor):
            typer.echo(f"roll back, {line}")
    if partial:
        typer.echo(f"persisted all but {len(left_out)} GPU(s): {', '.join(left_out)} (see above)", err=True)
        raise typer.Exit(1)


@vfio_app.command("reconcile")
def vfio_reconcile(
    host_root: HostRoot = None,
    once: Annotated[bool, typer.Option(help="One pass, then exit.")] = False,
    interval: Annotated[float, typer.Option(help="Seconds between passes.")] = 300.0,
    load_module: Annotated[
        bool, typer.Option(help="modprobe vfio-pci on the host when it is not loaded.")
    ] = True,
) -> None:
    """In-cluster (vfio-manager DaemonSet): bind NODE_NAME's passthrough GPUs and record the result on the Node."""
    from lightkube.core.exceptions import ConfigError

    from gpu_operator.node.cluster.kubeapi import KubeNodeView
    from gpu_operator.node.host.hostfs import KernelWriter
    from gpu_operator.node.vfio.incluster import reconcile

    node = os.environ.get("NODE_NAME", "")
    if not node:
        raise typer.BadParameter("reconcile needs NODE_NAME (the downward API's spec.nodeName)")
    fs = host_fs(host_root)
    try:
        view = KubeNodeView(
            node, os.environ.get("OPERATOR_NAMESPACE", ""), component="gpu-operator-vfio-manager"
        )
    except ConfigError as err:
        raise typer.BadParameter(
            f"reconcile needs Kubernetes API access (in-cluster or KUBECONFIG): {err}"
        ) from None
    from httpx2 import HTTPError
    from lightkube.core.exceptions import ApiError

    while True:
        try:
            record, written = reconcile(
                fs, KernelWriter(fs), view, load_vfio=_loader(fs) if load_module else None
            )
        except (ApiError, HTTPError) as err:
            if once:
                raise typer.BadParameter(f"Node {node}: the API refused or failed: {err}") from None
            typer.echo(f"Node {node}: API error, retrying in {interval:.0f}s: {err}", err=True)
            time.sleep(interval)
            continue
        typer.echo(
            f"{node}: vfio state {record['state']}"
            + (" (recorded on the Node)" if written else " (unchanged)")
        )
        for address, gpu in sorted(record["gpus"].items()):
            typer.echo(f"  {address}: {gpu['driver']}: {gpu['result']}")
        if record.get("error"):
            typer.echo(f"  {record['error']}", err=True)
        if once:
            if record["state"] in ("refused", "failed", "partial"):
                raise typer.Exit(1)
            return
        time.sleep(interval)
