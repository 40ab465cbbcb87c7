"""node-status-exporter: metrics from fixture status files, and one real scrape on 127.0.0.1."""

from __future__ import annotations

import urllib.request

from prometheus_client import start_http_server
from prometheus_client.parser import text_string_to_metric_families

from gpu_operator.node.exporter import NodeStatusCollector, registry_for
from tests.support.ports import free_port


def _values(registry) -> dict[str, float]:  # type: ignore[no-untyped-def]
    from prometheus_client import generate_latest

    text = generate_latest(registry).decode()
    return {s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_ready_gauges_follow_the_status_files(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("operator-driver")
    collector = NodeStatusCollector(host.fs, clock=lambda: 1000.0)
    registry = registry_for(collector)
    values = _values(registry)
    assert values["gpu_operator_node_driver_ready"] == 0 and values["gpu_operator_node_cuda_ready"] == 0
    assert values["gpu_operator_nvidia_pci_devices_total"] == 2
    assert values["gpu_operator_node_metrics_ready_ts_seconds"] == 1000.0
    for name in ("driver-ready", "toolkit-ready", "plugin-ready"):
        host.fs.write_text(f"/run/nvidia/validations/{name}", "")
    values = _values(registry)
    assert [values[f"gpu_operator_node_{c}_ready"] for c in ("driver", "toolkit", "plugin", "cuda")] == [
        1,
        1,
        1,
        0,
    ]


def test_driver_check_and_plugin_devices(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("h100-vfio")
    results = iter([True, False])
    now = iter([10.0, 20.0, 30.0, 40.0, 50.0])
    collector = NodeStatusCollector(
        host.fs,
        driver_check=lambda: next(results),
        plugin_devices=lambda: 8,
        clock=lambda: next(now),
        check_interval=5,
    )
    registry = registry_for(collector)
    first = _values(registry)
    assert first["gpu_operator_node_driver_validation"] == 1
    assert first["gpu_operator_node_driver_validation_last_success_ts_seconds"] == 20.0
    assert first["gpu_operator_node_device_plugin_devices_total"] == 8
    assert first["gpu_operator_nvidia_pci_devices_total"] == 8
    second = _values(registry)
    assert second["gpu_operator_node_driver_validation"] == 0
    assert second["gpu_operator_node_driver_validation_last_success_ts_seconds"] == 20.0


def test_one_scrape_over_http(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("talos")
    host.fs.write_text("/run/nvidia/validations/driver-ready", "IS_HOST_DRIVER=true\n")
    port = free_port()
    server, thread = start_http_server(
        port, addr="127.0.0.1", registry=registry_for(NodeStatusCollector(host.fs))
    )
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
    assert "gpu_operator_node_driver_ready 1.0" in body
    assert "gpu_operator_nvidia_pci_devices_total 1.0" in body


def test_driver_checks_are_throttled_and_run_nvidia_smi(build_host) -> None:  # type: ignore[no-untyped-def]
    from gpu_operator.node.exporter import driver_answers
    from gpu_operator.node.host.runner import HostRunner

    host = build_host("ubuntu-apt-driver")
    runner = HostRunner(host.fs, chroot=False)
    assert driver_answers(host.fs, runner) is True
    calls: list[int] = []
    clock = iter([0.0, 1.0, 2.0, 40.0])

    def driver_check() -> bool:
        calls.append(1)
        return True

    collector = NodeStatusCollector(host.fs, driver_check=driver_check, clock=lambda: next(clock))
    registry = registry_for(collector)
    _values(registry)  # t=1: checks
    _values(registry)  # t=2: reuses
    _values(registry)  # t=40: checks again
    assert len(calls) == 2
    host.fs.write_text("/usr/bin/nvidia-smi", "#!/bin/sh\nexit 9\n")
    assert driver_answers(host.fs, runner) is False
    assert driver_answers(build_host("cpu-only").fs, runner) is False
