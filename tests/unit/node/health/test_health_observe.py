"""What the health agent reads from the PCI bus at each step: a function's vendor and class once
while it stays listed (they do not change under a listed address), its bound driver every time."""

from __future__ import annotations

import os
from typing import Any

from gpu_operator.node.health.observe import pci_gpus
from gpu_operator.node.host.hostfs import HostFS

BUS = "0000:18:00.0"


class CountingFS(HostFS):
    def __init__(self, root: Any) -> None:
        super().__init__(root)
        self.reads: list[str] = []

    def read_value(self, path: str, *args: Any, **kwargs: Any) -> str | None:
        self.reads.append(path)
        return super().read_value(path, *args, **kwargs)


def test_vendor_and_class_are_read_once_per_listing_and_the_driver_every_step(build_host: Any) -> None:
    fs = CountingFS(build_host("h100-nvidia-bound").fs.root)
    kinds: dict[str, bool] = {}
    first = pci_gpus(fs, kinds)
    assert len(first) == 8 and {g.driver for g in first.values()} == {"nvidia"}
    assert f"/sys/bus/pci/devices/{BUS}/vendor" in fs.reads
    fs.reads.clear()

    (fs.resolve(f"/sys/bus/pci/devices/{BUS}") / "driver").unlink()  # unbound: read again at once
    second = pci_gpus(fs, kinds)
    assert fs.reads == [] and second[BUS].driver is None and second.keys() == first.keys()

    link = fs.resolve("/sys/bus/pci/devices") / BUS  # removed from the bus as the kernel does it
    target = os.readlink(link)
    link.unlink()
    assert BUS not in pci_gpus(fs, kinds) and BUS not in kinds  # gone: forgotten
    os.symlink(target, link)  # back (a rescan): read again
    assert BUS in pci_gpus(fs, kinds) and fs.reads == [
        f"/sys/bus/pci/devices/{BUS}/vendor",
        f"/sys/bus/pci/devices/{BUS}/class",
    ]


def test_without_a_kept_table_every_call_reads_afresh(build_host: Any) -> None:
    fs = CountingFS(build_host("h100-nvidia-bound").fs.root)
    pci_gpus(fs)
    once = len(fs.reads)
    pci_gpus(fs)
    assert once > 0 and len(fs.reads) == 2 * once
