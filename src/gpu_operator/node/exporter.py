"""node-status-exporter: the node's validation state as Prometheus metrics, read from the status files."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from gpu_operator.node.host import pci
from gpu_operator.node.host.driver import detect_driver
from gpu_operator.node.host.hostfs import HostFS
from gpu_operator.node.host.runner import CommandRunner
from gpu_operator.node.validate.base import StatusDir
from gpu_operator.vocabulary import VALIDATIONS_DIR

PREFIX = "gpu_operator_node"
_READY_FILES = {
    "driver": "driver-ready",
    "toolkit": "toolkit-ready",
    "plugin": "plugin-ready",
    "cuda": "cuda-ready",
}


class NodeStatusCollector(Collector):
    """Reads the status files at every scrape; checks that cost more (driver, plugin devices) are injected."""

    def __init__(
        self,
        fs: HostFS,
        output_dir: str = VALIDATIONS_DIR,
        *,
        driver_check: Callable[[], bool] | None = None,
        plugin_devices: Callable[[], int | None] | None = None,
        clock: Callable[[], float] = time.time,
        check_interval: float = 30.0,
    ) -> None:
        self.fs = fs
        self.status = StatusDir(fs, output_dir)
        self.driver_check = driver_check
        self.plugin_devices = plugin_devices
        self.clock = clock
        self.started = clock()
        self.driver_last_success: float | None = None
        # Upstream polls every 30 s; scrapes in between reuse the last driver check.
        self.check_interval = check_interval
        self._driver_checked: tuple[float, bool] | None = None
        self.plugin_last_success: float | None = None

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        return GaugeMetricFamily(name, doc, value=value)

    def collect(self) -> Iterator[Metric]:
        yield self._gauge(
            f"{PREFIX}_metrics_ready_ts_seconds", "Unix time the exporter became ready", self.started
        )
        for component, name in _READY_FILES.items():
            ready = 1.0 if self.status.exists(name) else 0.0
            yield self._gauge(f"{PREFIX}_{component}_ready", f"1 when {self.status.path(name)} exists", ready)
        if self.driver_check is not None:
            now = self.clock()
            if self._driver_checked is None or now - self._driver_checked[0] >= self.check_interval:
                self._driver_checked = (now, self.driver_check())
                if self._driver_checked[1]:
                    self.driver_last_success = now
            ok = self._driver_checked[1]
            yield self._gauge(
                f"{PREFIX}_driver_validation", "1 when the last driver check passed", 1.0 if ok else 0.0
            )
        if self.driver_last_success is not None:
            yield self._gauge(
                f"{PREFIX}_driver_validation_last_success_ts_seconds",
                "Unix time of the last passing driver check",
                self.driver_last_success,
            )
        devices = self.plugin_devices() if self.plugin_devices is not None else None
        if devices is not None:
            if devices > 0:
                self.plugin_last_success = self.clock()
            yield self._gauge(
                f"{PREFIX}_device_plugin_devices_total",
                "GPU devices the device plugin advertises",
                float(devices),
            )
        if self.plugin_last_success is not None:
            yield self._gauge(
                f"{PREFIX}_device_plugin_validation_last_success_ts_seconds",
                "Unix time the device plugin last advertised devices",
                self.plugin_last_success,
            )
        gpus = [f for f in pci.scan(self.fs, pci.NVIDIA_VENDOR) if f.is_gpu]
        yield self._gauge(
            "gpu_operator_nvidia_pci_devices_total", "NVIDIA GPU PCI functions on the node", float(len(gpus))
        )


def driver_answers(fs: HostFS, runner: CommandRunner, search_dirs: tuple[str, ...] = ()) -> bool:
    """Whether the node's driver (host or operator) answers nvidia-smi right now."""
    info = detect_driver(fs, extra_search_dirs=search_dirs)
    if info.smi_in_root is None:
        return False
    return runner.run([info.smi_in_root], root=info.run_root, timeout=60, env=info.smi_env).ok


def registry_for(collector: NodeStatusCollector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry
