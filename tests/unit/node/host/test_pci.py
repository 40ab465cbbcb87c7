"""PCI functions from sysfs and names from pci.ids."""

from __future__ import annotations

from gpu_operator.node.host import pci

PCI_IDS = """# comment
1002  Advanced Micro Devices, Inc. [AMD/ATI]
\t74a1  Aqua Vanjaram [Instinct MI300X]
10de  NVIDIA Corporation
\t2330  GH100 [H100 SXM5 80GB] (host copy)
\t\t10de 16c1  a subsystem line that must not match
\t26b9  AD102GL [L40S]
10df  Emulex Corporation
\t2330  not NVIDIA
"""


def test_parse_pci_ids_takes_one_vendor_and_skips_subsystems() -> None:
    names = pci.parse_pci_ids(PCI_IDS, "10de")
    assert names == {"2330": "GH100 [H100 SXM5 80GB] (host copy)", "26b9": "AD102GL [L40S]"}


def test_host_pci_ids_wins_over_the_bundled_table(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("h100-vfio", files={"/usr/share/misc/pci.ids": PCI_IDS})
    assert {f.name for f in pci.scan(host.fs, "10de")} == {"GH100 [H100 SXM5 80GB] (host copy)"}


def test_bundled_table_names_when_the_host_has_none(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("h100-vfio")
    assert {f.name for f in pci.scan(host.fs, "10de")} == {"GH100 [H100 SXM5 80GB]"}


def test_unknown_device_has_an_empty_name(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host(
        "cpu-only",
        devices=[{"address": "0000:05:00.0", "vendor": "10de", "device": "ffff", "class": "030200"}],
    )
    (func,) = pci.scan(host.fs, "10de")
    assert func.name == "" and func.driver is None and func.is_gpu


def test_function_attributes(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("ubuntu-apt-driver")
    funcs = {f.address: f for f in pci.scan(host.fs, "10de")}
    gpu, audio = funcs["0000:c1:00.0"], funcs["0000:c1:00.1"]
    assert (gpu.vendor_device, gpu.pci_class, gpu.driver, gpu.numa_node) == (
        "10de:26b9",
        "030200",
        "nvidia",
        1,
    )
    assert gpu.driver_override is None  # "(null)" in sysfs
    assert audio.iommu_group == gpu.iommu_group and not audio.is_gpu and audio.driver == "snd_hda_intel"


def test_no_numa_affinity_reads_as_none(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host(
        "cpu-only",
        devices=[
            {
                "address": "0000:05:00.0",
                "vendor": "10de",
                "device": "2330",
                "class": "030200",
                "numa_node": -1,
            }
        ],
    )
    assert pci.scan(host.fs, "10de")[0].numa_node is None


def test_bridges_are_real_functions_in_their_own_groups(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("h100-vfio")
    bridges = [f for f in pci.scan(host.fs) if f.is_bridge]
    assert len(bridges) == 9 and all(b.driver == "pcieport" for b in bridges)


def test_sriov_virtual_functions_are_not_counted_as_gpus(build_host) -> None:  # type: ignore[no-untyped-def]
    devices = [
        {
            "address": "0000:41:00.0",
            "vendor": "10de",
            "device": "26b9",
            "class": "030200",
            "driver": "nvidia",
            "attributes": {"sriov_totalvfs": 32, "sriov_numvfs": 1},
        },
        {
            "address": "0000:41:00.4",
            "vendor": "10de",
            "device": "26b9",
            "class": "030200",
            "physfn": "0000:41:00.0",
        },
    ]
    host = build_host("ubuntu-apt-driver", devices=devices)
    funcs = {f.address: f for f in pci.scan(host.fs, "10de")}
    assert funcs["0000:41:00.4"].physfn == "0000:41:00.0" and not funcs["0000:41:00.4"].is_gpu
    assert funcs["0000:41:00.0"].is_gpu and funcs["0000:41:00.0"].sriov_totalvfs == 32
