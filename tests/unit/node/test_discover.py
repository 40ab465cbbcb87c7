"""GPU-node discovery without NFD: the NFD labels the operator reads, from host fixtures; only
labels the agent wrote are ever removed."""

from __future__ import annotations

import json

from gpu_operator.node.discover import OWNED_ANNOTATION, changes, discovered, publish_once
from gpu_operator.vocabulary import KERNEL_FULL, OS_ID, OS_VERSION_ID, OS_VERSION_MAJOR
from tests.unit.node.nodekit import RecordedNode

PCI = "feature.node.kubernetes.io/pci-10de.present"


def test_a_gpu_host_gets_nfds_pci_kernel_and_os_labels(build_host) -> None:  # type: ignore[no-untyped-def]
    labels, skipped = discovered(build_host("ubuntu-apt-driver").fs)
    assert labels == {
        PCI: "true",
        KERNEL_FULL: "6.8.0-48-generic",
        OS_ID: "ubuntu",
        OS_VERSION_ID: "24.04",
        OS_VERSION_MAJOR: "24",
        f"{OS_VERSION_ID}.minor": "04",
        # NFD's per-model label (deviceLabelFields [vendor, device]): an L40S, 10de:26b9
        "feature.node.kubernetes.io/pci-10de_26b9.present": "true",
    }
    assert skipped == []


def test_gpus_on_vfio_count_and_a_cpu_host_has_no_pci_label(build_host) -> None:  # type: ignore[no-untyped-def]
    assert discovered(build_host("h100-vfio").fs)[0][PCI] == "true"
    cpu, _ = discovered(build_host("cpu-only").fs)
    assert PCI not in cpu and cpu[KERNEL_FULL] == "5.15.0-119-generic"


def test_a_value_kubernetes_refuses_is_left_out_with_the_reason(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("cpu-only", kernel="6.8.0+custom build")
    labels, skipped = discovered(host.fs)
    assert KERNEL_FULL not in labels
    assert skipped and skipped[0].startswith(f"{KERNEL_FULL}='6.8.0+custom build': not a valid label value")


def test_only_labels_the_agent_wrote_are_removed() -> None:
    # NFD (or a person) set the PCI label; this host no longer shows a GPU: we leave it alone
    patch, owned = changes({KERNEL_FULL: "6.8"}, {PCI: "true", KERNEL_FULL: "6.8"}, [KERNEL_FULL])
    assert patch == {} and owned == [KERNEL_FULL]
    # the agent wrote it before: now it goes
    patch, owned = changes({KERNEL_FULL: "6.8"}, {PCI: "true", KERNEL_FULL: "6.8"}, [PCI, KERNEL_FULL])
    assert patch == {PCI: None} and owned == [KERNEL_FULL]
    # a label NFD already set to the value we would write stays NFD's: never claimed, never removed
    patch, owned = changes({PCI: "true"}, {PCI: "true"}, [])
    assert patch == {} and owned == []


def test_publish_writes_once_records_ownership_and_then_stays_quiet(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("ubuntu-apt-driver")
    node = RecordedNode(labels={"kubernetes.io/hostname": "gpu-1"})
    patch, _ = publish_once(host.fs, node)
    assert patch[PCI] == "true" and node.labels[PCI] == "true"
    assert set(json.loads(node.annotations[OWNED_ANNOTATION])) == {
        k for k in node.labels if k.startswith("feature.")
    }
    assert publish_once(host.fs, node)[0] == {} and node.patches == 1  # nothing changed: no write
