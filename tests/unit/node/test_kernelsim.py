"""The kernel simulator behaves like the kernel for the writes vfio-manage makes."""

from __future__ import annotations

import errno

import pytest

from gpu_operator.node.host import pci
from tests.support.hostsim.kernelsim import SimulatedHang

GPU = "0000:0a:00.0"


def _driver(fs, address: str) -> str | None:  # type: ignore[no-untyped-def]
    return pci.read_function(fs, address).driver


def test_unbind_removes_both_links(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("h100-nvidia-bound")
    kernel = host.kernel()
    kernel.write("/sys/bus/pci/drivers/nvidia/unbind", GPU)
    assert _driver(host.fs, GPU) is None
    assert GPU not in host.fs.listdir("/sys/bus/pci/drivers/nvidia")
    assert not host.fs.exists(f"/proc/driver/nvidia/gpus/{GPU}/information")


def test_unbind_from_the_wrong_driver_is_enodev(build_host) -> None:  # type: ignore[no-untyped-def]
    kernel = build_host("h100-nvidia-bound").kernel()
    with pytest.raises(OSError) as err:
        kernel.write("/sys/bus/pci/drivers/vfio-pci/unbind", GPU)
    assert err.value.errno == errno.ENODEV


def test_writes_to_a_driver_that_is_not_loaded_fail_with_enoent(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("h100-nvidia-bound", pci_drivers=["nvme", "nvidia"], modules=["nvidia"])
    with pytest.raises(OSError) as err:
        host.kernel().write("/sys/bus/pci/drivers/vfio-pci/bind", GPU)
    assert err.value.errno == errno.ENOENT


def test_bind_while_bound_is_ebusy_and_vfio_without_override_is_enodev(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("h100-nvidia-bound")
    kernel = host.kernel()
    with pytest.raises(OSError) as busy:
        kernel.write("/sys/bus/pci/drivers/vfio-pci/bind", GPU)
    assert busy.value.errno == errno.EBUSY
    kernel.write("/sys/bus/pci/drivers/nvidia/unbind", GPU)
    with pytest.raises(OSError) as nomatch:
        kernel.write("/sys/bus/pci/drivers/vfio-pci/bind", GPU)  # vfio-pci has no id table of its own
    assert nomatch.value.errno == errno.ENODEV


def test_drivers_probe_follows_driver_override(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("h100-nvidia-bound")
    kernel = host.kernel()
    kernel.write(f"/sys/bus/pci/devices/{GPU}/driver_override", "vfio-pci")
    kernel.write("/sys/bus/pci/drivers_probe", GPU)
    assert _driver(host.fs, GPU) == "nvidia"  # probing a bound device changes nothing
    kernel.write(f"/sys/bus/pci/devices/{GPU}/driver/unbind", GPU)
    kernel.write("/sys/bus/pci/drivers_probe", GPU)
    assert _driver(host.fs, GPU) == "vfio-pci"
    assert pci.read_function(host.fs, GPU).driver_override == "vfio-pci"


def test_override_to_an_unloaded_driver_leaves_the_device_unbound_until_it_loads(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("h100-nvidia-bound", pci_drivers=["nvme", "nvidia"], modules=["nvidia"])
    kernel = host.kernel()
    kernel.write(f"/sys/bus/pci/devices/{GPU}/driver_override", "vfio-pci")
    kernel.write("/sys/bus/pci/drivers/nvidia/unbind", GPU)
    kernel.write("/sys/bus/pci/drivers_probe", GPU)
    assert _driver(host.fs, GPU) is None
    kernel.load_driver("vfio-pci")
    assert _driver(host.fs, GPU) == "vfio-pci"
    assert _driver(host.fs, "0000:18:00.0") == "nvidia"
    # modprobe vfio-pci brings the vfio core and, by its soft dependency, the IOMMU backend.
    modules = [line.split()[0] for line in (host.fs.read_text("/proc/modules") or "").splitlines()]
    assert {"vfio", "vfio_iommu_type1", "vfio_pci"} <= set(modules) and len(modules) == len(set(modules))


def test_clearing_the_override_lets_the_default_driver_back(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("h100-vfio", pci_drivers=["vfio-pci", "nvme", "nvidia"])
    kernel = host.kernel()
    kernel.write(f"/sys/bus/pci/devices/{GPU}/driver_override", "\n")
    kernel.write("/sys/bus/pci/drivers/vfio-pci/unbind", GPU)
    kernel.write("/sys/bus/pci/drivers_probe", GPU)
    assert _driver(host.fs, GPU) == "nvidia"
    assert host.fs.exists(f"/proc/driver/nvidia/gpus/{GPU}/information")


def test_new_id_lets_vfio_claim_matching_unbound_devices(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("h100-nvidia-bound")
    kernel = host.kernel()
    kernel.write("/sys/bus/pci/drivers/nvidia/unbind", GPU)
    kernel.write("/sys/bus/pci/drivers/vfio-pci/new_id", "10de 2330")
    assert _driver(host.fs, GPU) == "vfio-pci"


def test_unbinding_a_held_gpu_from_nvidia_is_a_simulated_hang(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host(
        "h100-nvidia-bound", processes=[{"pid": 4242, "comm": "python", "fds": ["/dev/nvidia0"]}]
    )
    with pytest.raises(SimulatedHang, match="python\\[4242\\]"):
        host.kernel().write("/sys/bus/pci/drivers/nvidia/unbind", GPU)


def test_unmodelled_and_missing_paths(build_host) -> None:  # type: ignore[no-untyped-def]
    kernel = build_host("h100-vfio").kernel()
    with pytest.raises(OSError) as missing:
        kernel.write("/sys/bus/pci/devices/0000:ff:00.0/driver_override", "vfio-pci")
    assert missing.value.errno == errno.ENOENT
    with pytest.raises(OSError, match="does not model"):
        kernel.write(f"/sys/bus/pci/devices/{GPU}/numa_node", "1")
